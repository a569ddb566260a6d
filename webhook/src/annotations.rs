//! The pod annotations that drive injection (SPEC §4): their names, their grammar and their
//! validation. Parsing is pure and collects every bad annotation, each error naming the
//! annotation and its value, so a user fixes them all in one round.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::IpAddr;

use crate::config::InjectionConfig;
use crate::quantity::parse_quantity;

pub const PREFIX: &str = "marin3r.3scale.net/";
pub const NODE_ID: &str = "marin3r.3scale.net/node-id";
pub const CLUSTER_ID: &str = "marin3r.3scale.net/cluster-id";
pub const CONTAINER_NAME: &str = "marin3r.3scale.net/container-name";
pub const PORTS: &str = "marin3r.3scale.net/ports";
pub const HOST_PORT_MAPPINGS: &str = "marin3r.3scale.net/host-port-mappings";
pub const ENVOY_IMAGE: &str = "marin3r.3scale.net/envoy-image";
pub const CONFIG_VOLUME: &str = "marin3r.3scale.net/config-volume";
pub const TLS_VOLUME: &str = "marin3r.3scale.net/tls-volume";
pub const CLIENT_CERTIFICATE: &str = "marin3r.3scale.net/client-certificate";
pub const ENVOY_EXTRA_ARGS: &str = "marin3r.3scale.net/envoy-extra-args";
pub const REQUESTS_CPU: &str = "marin3r.3scale.net/resources.requests.cpu";
pub const REQUESTS_MEMORY: &str = "marin3r.3scale.net/resources.requests.memory";
pub const LIMITS_CPU: &str = "marin3r.3scale.net/resources.limits.cpu";
pub const LIMITS_MEMORY: &str = "marin3r.3scale.net/resources.limits.memory";
pub const ADMIN_PORT: &str = "marin3r.3scale.net/admin.port";
pub const ADMIN_BIND_ADDRESS: &str = "marin3r.3scale.net/admin.bind-address";
pub const ADMIN_ACCESS_LOG_PATH: &str = "marin3r.3scale.net/admin.access-log-path";
/// The port of the sidecar's readiness listener, the only one kubelet probes.
pub const READINESS_PORT: &str = "marin3r.3scale.net/readiness.port";
/// Accepted from original MARIN3R manifests: only `v3` exists in today's Envoy.
pub const ENVOY_API_VERSION: &str = "marin3r.3scale.net/envoy-api-version";
/// The bootstrap ConfigMap the sidecar mounts (default: the one the operator writes into
/// every enabled namespace).
pub const ADS_CONFIGMAP: &str = "marin3r.3scale.net/ads-configmap";
/// The bootstrap ConfigMap the original operator wrote for Envoy v3 (its pods named it in
/// `ads-configmap`); marin3r writes one bootstrap, v3, under its own name.
pub const ORIGINAL_V3_BOOTSTRAP_CONFIG_MAP: &str = "envoy-sidecar-bootstrap-v3";
/// The DiscoveryService that must serve the pod; the webhook of another one denies it.
pub const DISCOVERY_SERVICE_NAME: &str = "marin3r.3scale.net/discovery-service.name";
/// The original's init container image. marin3r injects no init container (per-pod settings
/// travel in the sidecar's `--config-yaml` overlay), so it is accepted with a warning.
pub const INIT_MANAGER_IMAGE: &str = "marin3r.3scale.net/init-manager.image";
/// Graceful drain on pod termination: a `marin3r shutdown-manager` container and preStop
/// hooks (see [`ShutdownManager`]).
pub const SHUTDOWN_MANAGER_ENABLED: &str = "marin3r.3scale.net/shutdown-manager.enabled";
pub const SHUTDOWN_MANAGER_PORT: &str = "marin3r.3scale.net/shutdown-manager.port";
pub const SHUTDOWN_MANAGER_IMAGE: &str = "marin3r.3scale.net/shutdown-manager.image";
pub const SHUTDOWN_MANAGER_DRAIN_TIME: &str = "marin3r.3scale.net/shutdown-manager.drain-time";
pub const SHUTDOWN_MANAGER_DRAIN_STRATEGY: &str =
    "marin3r.3scale.net/shutdown-manager.drain-strategy";
pub const SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS: &str =
    "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks";
/// Written by the webhook on every pod it injects; a pod carrying it is left alone.
pub const INJECTED: &str = "marin3r.3scale.net/injected";
/// The pod label (value `enabled`) that opts a pod into injection.
pub const STATUS_LABEL: &str = "marin3r.3scale.net/status";

/// Every pod annotation under [`PREFIX`] the webhook reads or writes. Any other one gets an
/// admission warning ([`unknown_warnings`]): a misspelt name would otherwise be ignored
/// without a word. Add every new annotation here.
pub const KNOWN: &[&str] = &[
    NODE_ID,
    CLUSTER_ID,
    CONTAINER_NAME,
    PORTS,
    HOST_PORT_MAPPINGS,
    ENVOY_IMAGE,
    CONFIG_VOLUME,
    TLS_VOLUME,
    CLIENT_CERTIFICATE,
    ENVOY_EXTRA_ARGS,
    REQUESTS_CPU,
    REQUESTS_MEMORY,
    LIMITS_CPU,
    LIMITS_MEMORY,
    ADMIN_PORT,
    ADMIN_BIND_ADDRESS,
    ADMIN_ACCESS_LOG_PATH,
    READINESS_PORT,
    ENVOY_API_VERSION,
    ADS_CONFIGMAP,
    DISCOVERY_SERVICE_NAME,
    INIT_MANAGER_IMAGE,
    SHUTDOWN_MANAGER_ENABLED,
    SHUTDOWN_MANAGER_PORT,
    SHUTDOWN_MANAGER_IMAGE,
    SHUTDOWN_MANAGER_DRAIN_TIME,
    SHUTDOWN_MANAGER_DRAIN_STRATEGY,
    SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
    INJECTED,
];

/// The shutdown-manager annotations besides `enabled`: they only mean something when it is.
const SHUTDOWN_MANAGER_SETTINGS: [&str; 5] = [
    SHUTDOWN_MANAGER_PORT,
    SHUTDOWN_MANAGER_IMAGE,
    SHUTDOWN_MANAGER_DRAIN_TIME,
    SHUTDOWN_MANAGER_DRAIN_STRATEGY,
    SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
];

/// Envoy flags the sidecar sets when the shutdown manager is enabled (from its annotations).
const DRAIN_ARGS: [(&str, &str); 2] = [
    ("--drain-time-s", SHUTDOWN_MANAGER_DRAIN_TIME),
    ("--drain-strategy", SHUTDOWN_MANAGER_DRAIN_STRATEGY),
];

/// At most this many unknown annotations are named one by one; the rest are counted.
const MAX_UNKNOWN_WARNINGS: usize = 10;

/// One admission warning per `marin3r.3scale.net/*` annotation not in [`KNOWN`], naming it
/// and, when one is a few typos away, the known name it was probably meant to be.
pub fn unknown_warnings(annotations: &BTreeMap<String, String>) -> Vec<String> {
    let unknown: Vec<&str> = annotations
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with(PREFIX) && !KNOWN.contains(k))
        .collect();
    let mut out: Vec<String> = unknown
        .iter()
        .take(MAX_UNKNOWN_WARNINGS)
        .map(|name| {
            let shown: String = name.chars().take(100).collect();
            let shown = if shown.len() < name.len() {
                format!("{shown}…")
            } else {
                shown
            };
            match closest_known(name) {
                Some(known) => format!(
                    "annotation {shown} is not a marin3r annotation and has no effect; did you mean {known}?"
                ),
                None => format!(
                    "annotation {shown} is not a marin3r annotation and has no effect"
                ),
            }
        })
        .collect();
    if unknown.len() > MAX_UNKNOWN_WARNINGS {
        out.push(format!(
            "{} more marin3r.3scale.net/ annotations are not marin3r annotations and have no effect",
            unknown.len() - MAX_UNKNOWN_WARNINGS
        ));
    }
    out
}

/// The known annotation `name` is most likely a typo of: the nearest by edit distance, if
/// it is near enough (two edits, or a quarter of the name for long names).
fn closest_known(name: &str) -> Option<&'static str> {
    let suffix = name.strip_prefix(PREFIX)?;
    // Longer than any known name by more than the allowed edits: no candidate is near.
    if suffix.len() > 64 {
        return None;
    }
    KNOWN
        .iter()
        .filter(|k| **k != INJECTED)
        .filter_map(|known| {
            let known_suffix = known.strip_prefix(PREFIX)?;
            let distance = edit_distance(suffix, known_suffix);
            let allowed = (known_suffix.len() / 4).max(2);
            (distance <= allowed).then_some((distance, *known))
        })
        .min()
        .map(|(_, known)| known)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Arguments the sidecar's command line already sets; `envoy-extra-args` may not repeat them
/// (Envoy refuses a flag given twice, and a second bootstrap would silently win).
const RESERVED_ARGS: [&str; 5] = [
    "-c",
    "--config-path",
    "--service-node",
    "--service-cluster",
    "--config-yaml",
];

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

/// Kubernetes quantities as written in the annotations (already validated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    pub requests_cpu: Option<String>,
    pub requests_memory: Option<String>,
    pub limits_cpu: Option<String>,
    pub limits_memory: Option<String>,
}

impl Resources {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub port: u16,
    pub bind_address: IpAddr,
    pub access_log_path: Option<String>,
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
    /// Accepted annotations the user should hear about (admission warnings).
    pub warnings: Vec<String>,
}

/// Reads the sidecar spec from a pod's annotations, with `config` supplying the defaults.
/// Returns every bad annotation, in the order of the list above.
pub fn parse(
    annotations: &BTreeMap<String, String>,
    config: &InjectionConfig,
) -> Result<SidecarSpec, Vec<AnnotationError>> {
    let mut errors = Vec::new();
    let get = |name: &str| annotations.get(name).map(String::as_str);
    let mut check = |name: &'static str, value: &str, result: Result<(), String>| {
        if let Err(reason) = result {
            errors.push(AnnotationError {
                annotation: name,
                value: value.to_owned(),
                reason,
            });
        }
    };

    let node_id = get(NODE_ID).unwrap_or_default().to_owned();
    if get(NODE_ID).is_none() {
        check(
            NODE_ID,
            "",
            Err("the annotation is required to inject the Envoy sidecar".into()),
        );
    } else {
        check(NODE_ID, &node_id, node_id_value(&node_id));
    }
    let cluster_id = get(CLUSTER_ID).unwrap_or(&node_id).to_owned();
    if let Some(v) = get(CLUSTER_ID) {
        check(CLUSTER_ID, v, command_line_arg(v));
    }
    let container_name = get(CONTAINER_NAME)
        .unwrap_or(&config.container_name)
        .to_owned();
    if let Some(v) = get(CONTAINER_NAME) {
        check(CONTAINER_NAME, v, dns_label(v));
    }

    let mut ports = Vec::new();
    let mut ports_invalid = false;
    if let Some(v) = get(PORTS) {
        match parse_ports(v) {
            Ok(p) => ports = p,
            Err((entry, reason)) => {
                ports_invalid = true;
                check(PORTS, &entry, Err(reason));
            }
        }
    }
    let mut unmapped = Vec::new();
    if let Some(v) = get(HOST_PORT_MAPPINGS) {
        match apply_host_port_mappings(v, &mut ports, ports_invalid) {
            Ok(unknown) => unmapped = unknown,
            Err((entry, reason)) => check(HOST_PORT_MAPPINGS, &entry, Err(reason)),
        }
    }

    let envoy_image = get(ENVOY_IMAGE).unwrap_or(&config.envoy_image).to_owned();
    if let Some(v) = get(ENVOY_IMAGE) {
        check(ENVOY_IMAGE, v, image_reference(v));
    }
    let config_volume = get(CONFIG_VOLUME)
        .unwrap_or(&config.config_volume)
        .to_owned();
    if let Some(v) = get(CONFIG_VOLUME) {
        check(CONFIG_VOLUME, v, dns_label(v));
    }
    let tls_volume = get(TLS_VOLUME).unwrap_or(&config.tls_volume).to_owned();
    if let Some(v) = get(TLS_VOLUME) {
        let distinct = if v == config_volume {
            Err(format!(
                "the same volume name as {CONFIG_VOLUME} ({config_volume:?}); the two volumes need distinct names"
            ))
        } else {
            Ok(())
        };
        check(TLS_VOLUME, v, dns_label(v).and(distinct));
    }
    let client_certificate = get(CLIENT_CERTIFICATE)
        .unwrap_or(&config.client_certificate)
        .to_owned();
    if let Some(v) = get(CLIENT_CERTIFICATE) {
        check(CLIENT_CERTIFICATE, v, dns_subdomain(v));
    }
    let mut warnings = Vec::new();
    let mut bootstrap_config_map = get(ADS_CONFIGMAP)
        .unwrap_or(&config.bootstrap_config_map)
        .to_owned();
    if let Some(v) = get(ADS_CONFIGMAP) {
        check(ADS_CONFIGMAP, v, dns_subdomain(v));
        if v == ORIGINAL_V3_BOOTSTRAP_CONFIG_MAP && v != config.bootstrap_config_map {
            bootstrap_config_map = config.bootstrap_config_map.clone();
            warnings.push(format!(
                "{ADS_CONFIGMAP}={v:?} is the original MARIN3R's v3 bootstrap, which marin3r \
                 does not create: the sidecar mounts {:?}, marin3r's bootstrap (v3)",
                config.bootstrap_config_map
            ));
        }
    }
    if let Some(v) = get(DISCOVERY_SERVICE_NAME)
        && let Some(serving) = &config.discovery_service
        && v != serving
    {
        check(
            DISCOVERY_SERVICE_NAME,
            v,
            Err(format!(
                "the pod's namespace is served by the DiscoveryService {serving:?}; label the \
                 namespace marin3r.3scale.net/discovery-service={v} to be served by {v:?}, or \
                 remove the annotation"
            )),
        );
    }
    if let Some(v) = get(INIT_MANAGER_IMAGE) {
        warnings.push(format!(
            "{INIT_MANAGER_IMAGE}={v:?} has no effect: marin3r injects no init container (the \
             sidecar's per-pod settings travel on its command line)"
        ));
    }
    let shutdown_manager = match get(SHUTDOWN_MANAGER_ENABLED) {
        None => None,
        Some(v) => match parse_bool(v) {
            Err(e) => {
                check(SHUTDOWN_MANAGER_ENABLED, v, Err(e));
                None
            }
            Ok(false) => None,
            Ok(true) => Some(parse_shutdown_manager(&get, config, &mut check)),
        },
    };
    if shutdown_manager.is_none() {
        let ignored: Vec<&str> = SHUTDOWN_MANAGER_SETTINGS
            .into_iter()
            .filter(|name| get(name).is_some())
            .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "{} {} no effect unless {SHUTDOWN_MANAGER_ENABLED} is \"true\"",
                ignored.join(", "),
                if ignored.len() == 1 { "has" } else { "have" }
            ));
        }
    }
    let mut extra_args = Vec::new();
    if let Some(v) = get(ENVOY_EXTRA_ARGS) {
        match parse_extra_args(v, shutdown_manager.is_some()) {
            Ok(a) => extra_args = a,
            Err(e) => check(ENVOY_EXTRA_ARGS, v, Err(e)),
        }
    }

    let mut resources = Resources::default();
    let mut quantity = |name: &'static str, slot: &mut Option<String>| -> Option<f64> {
        let v = get(name)?;
        match parse_quantity(v) {
            Ok(q) => {
                *slot = Some(v.to_owned());
                Some(q)
            }
            Err(e) => {
                check(name, v, Err(e));
                None
            }
        }
    };
    let req_cpu = quantity(REQUESTS_CPU, &mut resources.requests_cpu);
    let req_mem = quantity(REQUESTS_MEMORY, &mut resources.requests_memory);
    let lim_cpu = quantity(LIMITS_CPU, &mut resources.limits_cpu);
    let lim_mem = quantity(LIMITS_MEMORY, &mut resources.limits_memory);
    for (name, request, limit, limit_name) in [
        (REQUESTS_CPU, req_cpu, lim_cpu, LIMITS_CPU),
        (REQUESTS_MEMORY, req_mem, lim_mem, LIMITS_MEMORY),
    ] {
        if let (Some(r), Some(l)) = (request, limit)
            && r > l
        {
            check(
                name,
                get(name).unwrap_or_default(),
                Err(format!(
                    "the request is greater than the limit {limit_name}={:?}",
                    get(limit_name).unwrap_or_default()
                )),
            );
        }
    }

    let mut admin = Admin {
        port: config.admin_port,
        bind_address: config.admin_bind_address,
        access_log_path: config.admin_access_log_path.clone(),
    };
    if let Some(v) = get(ADMIN_PORT) {
        match parse_port_number(v) {
            Ok(p) => {
                admin.port = p;
            }
            Err(e) => check(ADMIN_PORT, v, Err(e)),
        }
    }
    if let Some(clash) = ports
        .iter()
        .find(|p| p.port == admin.port && p.protocol == Protocol::Tcp)
    {
        check(
            ADMIN_PORT,
            get(ADMIN_PORT).unwrap_or(&admin.port.to_string()),
            Err(format!(
                "Envoy's admin port clashes with the port {:?} declared in {PORTS}",
                clash.name
            )),
        );
    }
    let mut readiness_port = config.readiness_port;
    if let Some(v) = get(READINESS_PORT) {
        match parse_port_number(v) {
            Ok(p) => readiness_port = p,
            Err(e) => check(READINESS_PORT, v, Err(e)),
        }
    }
    let readiness_value = get(READINESS_PORT)
        .map(str::to_owned)
        .unwrap_or_else(|| readiness_port.to_string());
    if readiness_port == admin.port {
        check(
            READINESS_PORT,
            &readiness_value,
            Err("the readiness listener's port is Envoy's admin port".into()),
        );
    } else if let Some(clash) = ports
        .iter()
        .find(|p| p.port == readiness_port && p.protocol == Protocol::Tcp)
    {
        check(
            READINESS_PORT,
            &readiness_value,
            Err(format!(
                "the readiness listener's port clashes with the port {:?} declared in {PORTS}",
                clash.name
            )),
        );
    }
    if let Some(manager) = &shutdown_manager {
        let value = get(SHUTDOWN_MANAGER_PORT)
            .map(str::to_owned)
            .unwrap_or_else(|| manager.port.to_string());
        let clash = if manager.port == admin.port {
            Some("Envoy's admin port".to_owned())
        } else if manager.port == readiness_port {
            Some("the readiness listener's port".to_owned())
        } else {
            ports
                .iter()
                .find(|p| p.port == manager.port && p.protocol == Protocol::Tcp)
                .map(|p| format!("the port {:?} declared in {PORTS}", p.name))
        };
        if let Some(clash) = clash {
            check(
                SHUTDOWN_MANAGER_PORT,
                &value,
                Err(format!("the shutdown manager's port clashes with {clash}")),
            );
        }
    }
    if let Some(v) = get(ADMIN_BIND_ADDRESS) {
        match parse_bind_address(v) {
            Ok(ip) => admin.bind_address = ip,
            Err(e) => check(ADMIN_BIND_ADDRESS, v, Err(e)),
        }
    }
    if let Some(v) = get(ADMIN_ACCESS_LOG_PATH) {
        match absolute_path(v) {
            Ok(()) => admin.access_log_path = Some(v.to_owned()),
            Err(e) => check(ADMIN_ACCESS_LOG_PATH, v, Err(e)),
        }
    }
    if let Some(v) = get(ENVOY_API_VERSION)
        && v != "v3"
    {
        let reason = if v == "v2" {
            "Envoy's v2 API is gone from Envoy; only v3 is supported".to_string()
        } else {
            "unknown Envoy API version; only v3 is supported".to_string()
        };
        check(ENVOY_API_VERSION, v, Err(reason));
    }

    if !errors.is_empty() {
        return Err(errors);
    }
    if !unmapped.is_empty() {
        // The original ignored these silently; a manifest written for it still applies.
        warnings.push(format!(
            "{HOST_PORT_MAPPINGS}: {} not declared in {PORTS}; ignored",
            unmapped
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
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
        warnings,
    })
}

/// The `shutdown-manager.*` settings of a pod that enables it, defaults from `config`.
fn parse_shutdown_manager<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    config: &InjectionConfig,
    check: &mut impl FnMut(&'static str, &str, Result<(), String>),
) -> ShutdownManager {
    let mut manager = ShutdownManager {
        port: config.shutdown_manager_port,
        image: config.shutdown_manager_image.clone(),
        drain_time: config.drain_time,
        drain_strategy: DrainStrategy::Gradual,
        extra_lifecycle_hooks: Vec::new(),
    };
    if let Some(v) = get(SHUTDOWN_MANAGER_PORT) {
        match parse_port_number(v) {
            Ok(p) => manager.port = p,
            Err(e) => check(SHUTDOWN_MANAGER_PORT, v, Err(e)),
        }
    }
    if let Some(v) = get(SHUTDOWN_MANAGER_IMAGE) {
        match image_reference(v) {
            Ok(()) => manager.image = v.to_owned(),
            Err(e) => check(SHUTDOWN_MANAGER_IMAGE, v, Err(e)),
        }
    }
    if let Some(v) = get(SHUTDOWN_MANAGER_DRAIN_TIME) {
        match parse_drain_time(v) {
            Ok(t) => manager.drain_time = t,
            Err(e) => check(SHUTDOWN_MANAGER_DRAIN_TIME, v, Err(e)),
        }
    }
    if let Some(v) = get(SHUTDOWN_MANAGER_DRAIN_STRATEGY) {
        match v.to_ascii_lowercase().as_str() {
            "gradual" => manager.drain_strategy = DrainStrategy::Gradual,
            "immediate" => manager.drain_strategy = DrainStrategy::Immediate,
            _ => check(
                SHUTDOWN_MANAGER_DRAIN_STRATEGY,
                v,
                Err("must be gradual or immediate".into()),
            ),
        }
    }
    if let Some(v) = get(SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS) {
        for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if let Err(e) = dns_label(name) {
                check(
                    SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
                    v,
                    Err(format!("container name {name:?} {e}")),
                );
                break;
            }
            if !manager.extra_lifecycle_hooks.iter().any(|n| n == name) {
                manager.extra_lifecycle_hooks.push(name.to_owned());
            }
        }
    }
    manager
}

/// The longest drain Kubernetes can wait for: the pod's terminationGracePeriodSeconds is the
/// drain time plus a margin, and stays well inside what the API server accepts.
pub const MAX_DRAIN_TIME: u32 = 7 * 24 * 3600;

fn parse_drain_time(value: &str) -> Result<u32, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be a whole number of seconds".into());
    }
    match value.parse::<u32>() {
        Ok(t) if t <= MAX_DRAIN_TIME => Ok(t),
        _ => Err(format!("must be at most {MAX_DRAIN_TIME} seconds (7 days)")),
    }
}

/// The forms Go's `strconv.ParseBool` takes, as the original read the annotation.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "True" | "TRUE" => Ok(true),
        "0" | "f" | "F" | "false" | "False" | "FALSE" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// Any string Envoy can take as one argument (a process argument cannot hold a NUL).
fn command_line_arg(value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err("must not contain a NUL character".into());
    }
    Ok(())
}

/// `name:port[:TCP|UDP|SCTP]`, comma separated. An error carries the bad entry and why.
fn parse_ports(value: &str) -> Result<Vec<PortSpec>, (String, String)> {
    let mut ports: Vec<PortSpec> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let bad = |reason: String| (entry.to_owned(), reason);
        let parts: Vec<&str> = entry.split(':').collect();
        let (name, port, protocol) = match parts.as_slice() {
            [name, port] => (*name, *port, None),
            [name, port, protocol] => (*name, *port, Some(*protocol)),
            _ => return Err(bad("expected name:port or name:port:protocol".into())),
        };
        port_name(name).map_err(bad)?;
        let port = parse_port_number(port).map_err(bad)?;
        let protocol = match protocol.map(str::to_ascii_uppercase).as_deref() {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(_) => return Err(bad("protocol must be TCP, UDP or SCTP".into())),
        };
        if ports.iter().any(|p| p.name == name) {
            return Err(bad(format!("port name {name:?} is declared twice")));
        }
        if ports
            .iter()
            .any(|p| p.port == port && p.protocol == protocol)
        {
            return Err(bad(format!(
                "port {port}/{} is declared twice",
                protocol.as_str()
            )));
        }
        ports.push(PortSpec {
            name: name.to_owned(),
            port,
            protocol,
            host_port: None,
        });
    }
    Ok(ports)
}

/// `name:hostPort`, comma separated. Returns the names that are not ports of `ports`, which
/// the original ignored (ours warns).
fn apply_host_port_mappings(
    value: &str,
    ports: &mut [PortSpec],
    ports_invalid: bool,
) -> Result<Vec<String>, (String, String)> {
    let mut unknown = Vec::new();
    let mut seen: HashSet<(u16, Protocol)> = HashSet::new();
    for entry in value.split(',').map(str::trim) {
        let bad = |reason: String| (entry.to_owned(), reason);
        let Some((name, host_port)) = entry.split_once(':') else {
            return Err(bad("expected name:hostPort".into()));
        };
        let host_port = parse_port_number(host_port).map_err(bad)?;
        let Some(port) = ports.iter_mut().find(|p| p.name == name) else {
            // A bad `ports` annotation is reported on its own; do not blame the mapping too.
            if !ports_invalid {
                unknown.push(name.to_owned());
            }
            continue;
        };
        if port.host_port.is_some() {
            return Err(bad(format!("port {name:?} is mapped twice")));
        }
        if !seen.insert((host_port, port.protocol)) {
            return Err(bad(format!(
                "host port {host_port}/{} is mapped twice",
                port.protocol.as_str()
            )));
        }
        port.host_port = Some(host_port);
    }
    Ok(unknown)
}

fn parse_port_number(value: &str) -> Result<u16, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {value:?} is not a number"));
    }
    match value.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err("port must be between 1 and 65535".into()),
    }
}

/// Envoy's extra arguments, split as the original split them (on spaces), minus the flags the
/// sidecar owns (and, with the shutdown manager, the drain flags it sets).
fn parse_extra_args(value: &str, drain_flags_set: bool) -> Result<Vec<String>, String> {
    let args = split_extra_args(value);
    let owned = RESERVED_ARGS.iter().map(|r| (*r, None)).chain(
        DRAIN_ARGS
            .iter()
            .filter(|_| drain_flags_set)
            .map(|(flag, annotation)| (*flag, Some(*annotation))),
    );
    for (flag, annotation) in owned {
        let given = args.iter().any(|arg| {
            arg == flag
                || arg
                    .strip_prefix(flag)
                    .is_some_and(|rest| rest.starts_with('='))
        });
        if given {
            return Err(match annotation {
                None => format!("{flag} is set by the injector and may not be given again"),
                Some(annotation) => format!(
                    "{flag} is set from {annotation} when {SHUTDOWN_MANAGER_ENABLED} is true; set \
                     it there"
                ),
            });
        }
    }
    Ok(args)
}

/// The original split the value on single spaces and passed every piece to Envoy as written,
/// quotes included. Every value it split into working arguments is split the same way here.
/// Two loosenings only change values that gave Envoy a broken command line: runs of
/// whitespace separate arguments (the original passed empty arguments and kept tabs and
/// newlines inside them), and a quoted span (`"..."` or `'...'`) that contains whitespace is
/// one piece of an argument, quotes removed (the original cut it into pieces Envoy refuses).
/// A quoted span without whitespace keeps its quotes, as in the original (`--log-format '%v'`
/// logs the quotes); backslashes are literal.
fn split_extra_args(value: &str) -> Vec<String> {
    let chars: Vec<char> = value.chars().collect();
    let mut args = Vec::new();
    let mut current: Option<String> = None;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        if c.is_whitespace() {
            args.extend(current.take());
            i += 1;
            continue;
        }
        let arg = current.get_or_insert_with(String::new);
        if matches!(c, '"' | '\'')
            && let Some(len) = chars[i + 1..].iter().position(|&d| d == c)
        {
            let inner = &chars[i + 1..i + 1 + len];
            if inner.iter().any(|ch| ch.is_whitespace()) {
                arg.extend(inner);
            } else {
                arg.extend(&chars[i..i + len + 2]);
            }
            i += len + 2;
            continue;
        }
        arg.push(c);
        i += 1;
    }
    args.extend(current);
    args
}

/// Any address: loopback (the default) keeps the admin API inside the pod; 0.0.0.0, :: or a
/// pod address opens it to whoever reaches the pod. Probes never need it open.
fn parse_bind_address(value: &str) -> Result<IpAddr, String> {
    value
        .parse()
        .map_err(|_| "not an IPv4 or IPv6 address".to_string())
}

fn absolute_path(value: &str) -> Result<(), String> {
    if !value.starts_with('/') {
        return Err("must be an absolute path".into());
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

fn image_reference(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("the image must not be empty".into());
    }
    if value.len() > 1024 || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("not a container image reference".into());
    }
    Ok(())
}

/// A label value (the node id is also a label on revisions): at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric.
fn label_value(value: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    if !value.chars().all(ok_char)
        || !value.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !value.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(
            "must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A node id names the config's revisions (`<node-id>-<version>`, a DNS-1123 subdomain) and
/// labels them (a label value): a node id fit for only one of the two could never publish.
fn node_id_value(value: &str) -> Result<(), String> {
    label_value(value)?;
    if !marin3r_certs::is_dns_subdomain(value) {
        return Err(
            "must be lowercase letters, digits, '-' or '.', each dot-separated part starting and \
             ending with a letter or digit: it names the EnvoyConfigRevision <node-id>-<version>"
                .into(),
        );
    }
    Ok(())
}

/// An RFC 1123 label, as container and volume names must be.
fn dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > 63 {
        return Err("must be at most 63 characters".into());
    }
    if !marin3r_certs::is_dns_label(value) {
        return Err(
            "must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"
                .into(),
        );
    }
    Ok(())
}

/// An RFC 1123 subdomain, as Secret names must be.
fn dns_subdomain(value: &str) -> Result<(), String> {
    if value.len() > 253 {
        return Err("must be at most 253 characters".into());
    }
    if !marin3r_certs::is_dns_subdomain(value) {
        return Err(
            "must be an RFC 1123 subdomain (lower-case letters, digits, '-' and '.')".into(),
        );
    }
    Ok(())
}

/// An IANA service name, as Kubernetes port names must be.
fn port_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 15 {
        return Err(format!("port name {name:?} must be 1 to 15 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        || !name.chars().any(|c| c.is_ascii_lowercase())
        || name.starts_with('-')
        || name.ends_with('-')
        || name.contains("--")
    {
        return Err(format!(
            "port name {name:?} must be lower-case letters, digits and single '-' (not at either end), with at least one letter"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "annotations_tests.rs"]
mod tests;
