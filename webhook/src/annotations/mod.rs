//! The pod annotations that drive injection (SPEC §4), read into a [`SidecarSpec`]. Their
//! names live in `names`, the grammar of each value in `grammar`; this module reads them in
//! groups and holds the checks that look at several annotations at once. Parsing is pure and
//! collects every bad annotation, each error naming the annotation and its value, so a user
//! fixes them all in one round.

mod grammar;
mod names;
mod resources;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::config::{InjectionConfig, Resources};
use crate::readiness::{READY_PATH, STATS_PATH, STATS_PORT_NAME};
pub use grammar::{MAX_DRAIN_TIME, check_extra_args, parse_bool};
use grammar::{
    absolute_path, apply_host_port_mappings, command_line_arg, dns_label, dns_subdomain,
    envoy_api_version, image_reference, node_id_value, parse_bind_address, parse_container_names,
    parse_drain_strategy, parse_drain_time, parse_extra_args, parse_port_number, parse_ports,
};
pub use names::*;

/// One bad annotation: which, its value, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationError {
    pub annotation: &'static str,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}: {}", self.annotation, self.value, self.reason)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// A port the sidecar exposes (`ports`), with its host port if `host-port-mappings` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
    pub host_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub port: u16,
    pub bind_address: IpAddr,
    pub access_log_path: Option<String>,
    /// `marin3r.3scale.net/ports` declares the admin's port while the admin is on loopback
    /// (the original's `envoy-metrics:9901`): on the pod's addresses that port serves what
    /// the readiness listener serves, `GET /ready` and `GET /stats/prometheus`, and the admin
    /// keeps loopback.
    pub stats_on_port: bool,
}

/// How Envoy drains its listeners (`--drain-strategy`): `gradual` asks a growing share of the
/// connections to close over the drain time, `immediate` asks all of them at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStrategy {
    Gradual,
    Immediate,
}

impl DrainStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gradual => "gradual",
            Self::Immediate => "immediate",
        }
    }
}

/// The graceful drain on pod termination (`shutdown-manager.*`): a `marin3r shutdown-manager`
/// container on `port`; Envoy's preStop asks it to drain and then stop Envoy, and the
/// preStop of every container in `extra_lifecycle_hooks` waits for the drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownManager {
    pub port: u16,
    pub image: String,
    /// Seconds: Envoy's `--drain-time-s`, and the longest the manager waits for connections.
    pub drain_time: u32,
    pub drain_strategy: DrainStrategy,
    /// Containers of the pod that wait for the drain before they get SIGTERM.
    pub extra_lifecycle_hooks: Vec<String>,
    /// What the pod's preStop hooks present to the manager (`Authorization: Bearer`), so that
    /// no other pod can drain or stop this pod's Envoy. Drawn at injection
    /// ([`crate::sidecar::shutdown_token`]); empty here.
    pub token: String,
    /// The manager logs one JSON object per line (`--log-format json`), as the process that
    /// injected it.
    pub json_logs: bool,
}

/// Where Envoy goes in the pod (`native-sidecar`, `hold-application-until-proxy-starts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Appended to `spec.containers`; `hold: true` puts Envoy first and holds the
    /// applications until it is ready.
    Classic { hold: bool },
    /// Init containers with `restartPolicy: Always`: started (Envoy ready, by its startup
    /// probe) before every other container, stopped after them, and not counted when the
    /// applications finish, so a Job's pod completes.
    Native,
}

/// Everything a pod's annotations say about its sidecar, defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidecarSpec {
    pub node_id: String,
    pub cluster_id: String,
    pub container_name: String,
    pub ports: Vec<PortSpec>,
    pub envoy_image: String,
    pub config_volume: String,
    pub tls_volume: String,
    pub client_certificate: String,
    pub extra_args: Vec<String>,
    pub resources: Resources,
    pub admin: Admin,
    /// The static listener serving only `GET /ready` (proxied to the admin) on every pod
    /// address: what kubelet probes, so the admin can stay on loopback.
    pub readiness_port: u16,
    /// The ConfigMap holding the bootstrap (`ads-configmap`).
    pub bootstrap_config_map: String,
    pub shutdown_manager: Option<ShutdownManager>,
    /// Where Envoy goes in the pod.
    pub layout: Layout,
    /// How Envoy speaks ADS (`xds-protocol`).
    pub xds_protocol: crate::config::XdsProtocol,
    /// Annotate the pod `prometheus.io/scrape|port|path` for Envoy's stats (unless it has
    /// any of them already).
    pub prometheus_annotations: bool,
    /// Secrets added to the pod's `imagePullSecrets` (the cluster's default, see
    /// [`InjectionConfig::image_pull_secrets`]).
    pub image_pull_secrets: Vec<String>,
    /// Accepted annotations the user should hear about (admission warnings).
    pub warnings: Vec<String>,
}

/// Reads the sidecar spec from a pod's annotations, with `config` supplying the defaults.
/// Returns every bad annotation, group by group in the order below (the order users have
/// always seen them in).
pub fn parse(
    annotations: &BTreeMap<String, String>,
    config: &InjectionConfig,
) -> Result<SidecarSpec, Vec<AnnotationError>> {
    let mut read = Reader {
        annotations,
        config,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let (node_id, cluster_id, container_name) = read.identity();
    let (ports, unmapped) = read.ports();
    let envoy_image = read.image(ENVOY_IMAGE, &config.envoy_image);
    let (config_volume, tls_volume, client_certificate) = read.volumes();
    let bootstrap_config_map = read.bootstrap();
    let shutdown_manager = read.shutdown_manager();
    let extra_args = read.extra_args(shutdown_manager.is_some());
    let resources = read.resources();
    let (admin, readiness_port) = read.admin_and_readiness(&ports, shutdown_manager.as_ref());
    let layout = read.layout();
    let xds_protocol = read
        .value(XDS_PROTOCOL, crate::config::XdsProtocol::parse)
        .unwrap_or(config.xds_protocol);
    let prometheus_annotations = read.prometheus_annotations();
    read.envoy_api_version();
    let warnings = read.finish(&unmapped)?;
    Ok(SidecarSpec {
        node_id,
        cluster_id,
        container_name,
        ports,
        envoy_image,
        config_volume,
        tls_volume,
        client_certificate,
        extra_args,
        resources,
        admin,
        readiness_port,
        bootstrap_config_map,
        shutdown_manager,
        layout,
        xds_protocol,
        prometheus_annotations,
        image_pull_secrets: config.image_pull_secrets.clone(),
        warnings,
    })
}

/// One of the sidecar's own listeners: the annotation that sets its port, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Listener {
    annotation: &'static str,
    what: &'static str,
}

impl Listener {
    const ADMIN: Self = Self {
        annotation: ADMIN_PORT,
        what: "Envoy's admin port",
    };
    const READINESS: Self = Self {
        annotation: READINESS_PORT,
        what: "the readiness listener's port",
    };
    const SHUTDOWN_MANAGER: Self = Self {
        annotation: SHUTDOWN_MANAGER_PORT,
        what: "the shutdown manager's port",
    };
}

/// One pass over a pod's annotations: each group parser reads its annotations, falls back to
/// `config` for the absent ones and records what is wrong, so every error is reported at once.
struct Reader<'a> {
    annotations: &'a BTreeMap<String, String>,
    config: &'a InjectionConfig,
    errors: Vec<AnnotationError>,
    warnings: Vec<String>,
}

impl<'a> Reader<'a> {
    fn get(&self, name: &str) -> Option<&'a str> {
        self.annotations.get(name).map(String::as_str)
    }

    fn reject(&mut self, annotation: &'static str, value: &str, reason: String) {
        self.errors.push(AnnotationError {
            annotation,
            value: value.to_owned(),
            reason,
        });
    }

    fn check(&mut self, annotation: &'static str, value: &str, result: Result<(), String>) {
        if let Err(reason) = result {
            self.reject(annotation, value, reason);
        }
    }

    /// The annotation's value read by `grammar`, or `None` when it is absent or bad (then
    /// the error is recorded).
    fn value<T>(
        &mut self,
        annotation: &'static str,
        grammar: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let value = self.get(annotation)?;
        grammar(value)
            .map_err(|reason| self.reject(annotation, value, reason))
            .ok()
    }

    /// The annotation's value if it passes `grammar`, else `default` (a bad one is recorded).
    fn name_or(
        &mut self,
        annotation: &'static str,
        default: &str,
        grammar: impl FnOnce(&str) -> Result<(), String>,
    ) -> String {
        let Some(value) = self.get(annotation) else {
            return default.to_owned();
        };
        self.check(annotation, value, grammar(value));
        value.to_owned()
    }

    /// The node id (required), the cluster id (the node id by default) and the sidecar's
    /// container name.
    fn identity(&mut self) -> (String, String, String) {
        let node_id = match self.get(NODE_ID) {
            None => {
                let reason = "the annotation is required to inject the Envoy sidecar";
                self.reject(NODE_ID, "", reason.into());
                String::new()
            }
            Some(v) => {
                self.check(NODE_ID, v, node_id_value(v));
                v.to_owned()
            }
        };
        let cluster_id = self.name_or(CLUSTER_ID, &node_id, command_line_arg);
        let config = self.config;
        let container_name = self.name_or(CONTAINER_NAME, &config.container_name, dns_label);
        (node_id, cluster_id, container_name)
    }

    /// The declared ports with their host ports, and the mapped names that are no port.
    fn ports(&mut self) -> (Vec<PortSpec>, Vec<String>) {
        let mut ports = Vec::new();
        let mut ports_invalid = false;
        if let Some(v) = self.get(PORTS) {
            match parse_ports(v) {
                Ok(p) => {
                    ports = p;
                    if let Some(taken) = ports.iter().find(|p| p.name == STATS_PORT_NAME) {
                        let entry = format!("{}:{}", taken.name, taken.port);
                        let reason = format!(
                            "{STATS_PORT_NAME:?} names the sidecar's own port for Envoy's stats \
                             (its readiness listener); give this port another name"
                        );
                        self.reject(PORTS, &entry, reason);
                    }
                }
                Err((entry, reason)) => {
                    ports_invalid = true;
                    self.reject(PORTS, &entry, reason);
                }
            }
        }
        let mut unmapped = Vec::new();
        if let Some(v) = self.get(HOST_PORT_MAPPINGS) {
            match apply_host_port_mappings(v, &mut ports, ports_invalid) {
                Ok(unknown) => unmapped = unknown,
                Err((entry, reason)) => self.reject(HOST_PORT_MAPPINGS, &entry, reason),
            }
        }
        (ports, unmapped)
    }

    /// A container image: the annotation's if it is one, else `default`.
    fn image(&mut self, annotation: &'static str, default: &str) -> String {
        self.value(annotation, |v| image_reference(v).map(|()| v.to_owned()))
            .unwrap_or_else(|| default.to_owned())
    }

    /// The config and TLS volumes (two distinct names) and the client certificate's Secret.
    fn volumes(&mut self) -> (String, String, String) {
        let config = self.config;
        let config_volume = self.name_or(CONFIG_VOLUME, &config.config_volume, dns_label);
        let tls_volume = self.name_or(TLS_VOLUME, &config.tls_volume, |v| {
            dns_label(v)?;
            if v == config_volume {
                return Err(format!(
                    "the same volume name as {CONFIG_VOLUME} ({config_volume:?}); the two \
                     volumes need distinct names"
                ));
            }
            Ok(())
        });
        let client_certificate = self.name_or(
            CLIENT_CERTIFICATE,
            &config.client_certificate,
            dns_subdomain,
        );
        (config_volume, tls_volume, client_certificate)
    }

    /// The bootstrap ConfigMap, the DiscoveryService the pod asks for, and the original's
    /// init container image (accepted, with a warning).
    fn bootstrap(&mut self) -> String {
        let config = self.config;
        let mut bootstrap_config_map =
            self.name_or(ADS_CONFIGMAP, &config.bootstrap_config_map, dns_subdomain);
        if let Some(v) = self.get(ADS_CONFIGMAP)
            && v == ORIGINAL_V3_BOOTSTRAP_CONFIG_MAP
            && v != config.bootstrap_config_map
        {
            bootstrap_config_map = config.bootstrap_config_map.clone();
            self.warnings.push(format!(
                "{ADS_CONFIGMAP}={v:?} is the original MARIN3R's v3 bootstrap, which marin3r \
                 does not create: the sidecar mounts {:?}, marin3r's bootstrap (v3)",
                config.bootstrap_config_map
            ));
        }
        if let Some(v) = self.get(DISCOVERY_SERVICE_NAME)
            && let Some(serving) = &config.discovery_service
            && v != serving
        {
            let reason = format!(
                "the pod's namespace is served by the DiscoveryService {serving:?}, and a \
                 namespace has one DiscoveryService (it owns the namespace's EnvoyConfigs, \
                 revisions and rollbacks; the original let pods choose among several, see \
                 docs/migrating.md): remove the annotation, or serve the namespace from {v:?} \
                 instead (for a central one, label the namespace \
                 marin3r.3scale.net/discovery-service={v})"
            );
            self.reject(DISCOVERY_SERVICE_NAME, v, reason);
        }
        if let Some(v) = self.get(INIT_MANAGER_IMAGE) {
            self.warnings.push(format!(
                "{INIT_MANAGER_IMAGE}={v:?} has no effect: marin3r injects no init container (the \
                 sidecar's per-pod settings travel on its command line)"
            ));
        }
        bootstrap_config_map
    }

    /// The shutdown manager if the pod enables it; its settings without it get a warning.
    fn shutdown_manager(&mut self) -> Option<ShutdownManager> {
        let manager = match self.value(SHUTDOWN_MANAGER_ENABLED, parse_bool) {
            Some(true) => Some(self.shutdown_manager_settings()),
            Some(false) | None => None,
        };
        if manager.is_none() {
            let ignored: Vec<&str> = SHUTDOWN_MANAGER_SETTINGS
                .into_iter()
                .filter(|name| self.get(name).is_some())
                .collect();
            if !ignored.is_empty() {
                self.warnings.push(format!(
                    "{} {} no effect unless {SHUTDOWN_MANAGER_ENABLED} is \"true\"",
                    ignored.join(", "),
                    if ignored.len() == 1 { "has" } else { "have" }
                ));
            }
        }
        manager
    }

    /// The `shutdown-manager.*` settings of a pod that enables it, defaults from `config`.
    fn shutdown_manager_settings(&mut self) -> ShutdownManager {
        let config = self.config;
        let port = self.value(SHUTDOWN_MANAGER_PORT, parse_port_number);
        let image = self.image(SHUTDOWN_MANAGER_IMAGE, &config.shutdown_manager_image);
        let drain_time = self.value(SHUTDOWN_MANAGER_DRAIN_TIME, parse_drain_time);
        let drain_strategy = self.value(SHUTDOWN_MANAGER_DRAIN_STRATEGY, parse_drain_strategy);
        let hooks = self.value(
            SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
            parse_container_names,
        );
        ShutdownManager {
            port: port.unwrap_or(config.shutdown_manager_port),
            image,
            drain_time: drain_time.unwrap_or(config.drain_time),
            drain_strategy: drain_strategy.unwrap_or(DrainStrategy::Gradual),
            extra_lifecycle_hooks: hooks.unwrap_or_default(),
            token: String::new(),
            json_logs: config.json_logs,
        }
    }

    /// Envoy's extra arguments; with the shutdown manager, the drain flags are its own.
    fn extra_args(&mut self, shutdown_manager: bool) -> Vec<String> {
        self.value(ENVOY_EXTRA_ARGS, |v| parse_extra_args(v, shutdown_manager))
            .unwrap_or_default()
    }

    /// Envoy's admin (port, bind address, access log) and the readiness listener's port; the
    /// sidecar's three listeners may not share a port with each other or a declared port.
    fn admin_and_readiness(
        &mut self,
        ports: &[PortSpec],
        shutdown_manager: Option<&ShutdownManager>,
    ) -> (Admin, u16) {
        let config = self.config;
        let bind_address = self
            .value(ADMIN_BIND_ADDRESS, parse_bind_address)
            .unwrap_or(config.admin_bind_address);
        let admin = Listener::ADMIN;
        // The admin's port may be declared in `ports` (the original's examples name it
        // `envoy-metrics`): it is the admin itself when the admin is on the pod's addresses,
        // and Envoy's stats alone when the admin is on loopback.
        let admin_port = self.listener_port(admin, config.admin_port, &[], &[]);
        let declared = bind_address
            .is_loopback()
            .then(|| {
                ports
                    .iter()
                    .find(|p| p.port == admin_port && p.protocol == Protocol::Tcp)
            })
            .flatten();
        if let Some(declared) = declared {
            self.warnings.push(format!(
                "{PORTS}: {:?} is Envoy's admin port {admin_port}, and the admin listens on \
                 loopback: on the pod's addresses that port serves only GET {READY_PATH} and \
                 GET {STATS_PATH}, as {STATS_PORT_NAME:?} does ({ADMIN_BIND_ADDRESS} \
                 \"0.0.0.0\" would put the whole admin API there, where any pod can reach it)",
                declared.name
            ));
        }
        let readiness = Listener::READINESS;
        let earlier = [(admin_port, admin)];
        let readiness_port = self.listener_port(readiness, config.readiness_port, &earlier, ports);
        if let Some(manager) = shutdown_manager {
            let earlier = [(admin_port, admin), (readiness_port, readiness)];
            self.check_port_clashes(Listener::SHUTDOWN_MANAGER, manager.port, &earlier, ports);
        }
        let admin = Admin {
            port: admin_port,
            bind_address,
            access_log_path: self
                .value(ADMIN_ACCESS_LOG_PATH, |v| {
                    absolute_path(v).map(|()| v.to_owned())
                })
                .or_else(|| config.admin_access_log_path.clone()),
            stats_on_port: declared.is_some(),
        };
        (admin, readiness_port)
    }

    /// The port of one of the sidecar's listeners (`default` unless its annotation sets a
    /// good one), checked against the listeners before it and the declared ports.
    fn listener_port(
        &mut self,
        listener: Listener,
        default: u16,
        earlier: &[(u16, Listener)],
        ports: &[PortSpec],
    ) -> u16 {
        let port = self
            .value(listener.annotation, parse_port_number)
            .unwrap_or(default);
        self.check_port_clashes(listener, port, earlier, ports);
        port
    }

    /// The cross-annotation check of a sidecar listener's port: it may be neither the port of
    /// an `earlier` listener nor a TCP port declared in `ports`.
    fn check_port_clashes(
        &mut self,
        listener: Listener,
        port: u16,
        earlier: &[(u16, Listener)],
        ports: &[PortSpec],
    ) {
        let what = listener.what;
        let reason = if let Some((_, other)) = earlier.iter().find(|(p, _)| *p == port) {
            if listener == Listener::READINESS {
                format!("{what} is {}", other.what)
            } else {
                format!("{what} clashes with {}", other.what)
            }
        } else if let Some(clash) = ports
            .iter()
            .find(|p| p.port == port && p.protocol == Protocol::Tcp)
        {
            let name = &clash.name;
            format!("{what} clashes with the port {name:?} declared in {PORTS}")
        } else {
            return;
        };
        let value = self
            .get(listener.annotation)
            .map_or_else(|| port.to_string(), str::to_owned);
        self.reject(listener.annotation, &value, reason);
    }

    /// A pod written for the original may still say `v2`; only `v3` exists today.
    fn envoy_api_version(&mut self) {
        if let Some(v) = self.get(ENVOY_API_VERSION) {
            self.check(ENVOY_API_VERSION, v, envoy_api_version(v));
        }
    }

    /// The warnings, or every error found; host-port mappings of undeclared ports are warned
    /// about only when nothing is wrong.
    fn finish(mut self, unmapped: &[String]) -> Result<Vec<String>, Vec<AnnotationError>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        if !unmapped.is_empty() {
            // The original ignored these silently; a manifest written for it still applies.
            self.warnings.push(format!(
                "{HOST_PORT_MAPPINGS}: {} not declared in {PORTS}; ignored",
                unmapped
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(self.warnings)
    }
}

#[cfg(test)]
mod tests;
