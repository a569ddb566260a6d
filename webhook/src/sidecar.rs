//! The Envoy sidecar a [`SidecarSpec`] describes: its container (command line, downward-API
//! environment, ports, resources, probes, mounts) and the two volumes it mounts.
//!
//! How the admin settings reach Envoy: the bootstrap ConfigMap is shared by every pod of a
//! namespace, so per-pod settings cannot live in it. The sidecar passes one `--config-yaml`
//! that Envoy merges over the bootstrap file: `node.metadata` (`pod_name`, `pod_namespace`,
//! from the downward API through Kubernetes' `$(VAR)` expansion) and `admin` (address from
//! `admin.bind-address`/`admin.port`, plus a file access log when `admin.access-log-path` is
//! set). The bootstrap renderer should therefore leave `admin` out (or expect it overridden).
//!
//! Readiness and stats: the admin binds loopback by default (its API can stop Envoy and dump
//! its config), so neither kubelet nor Prometheus can reach it. The overlay also adds, per
//! pod, a static listener on the readiness port (every pod address) whose only routes are
//! `GET /ready` and `GET /stats/prometheus`, proxied to the admin through a static cluster
//! (`crate::readiness`); anything else gets 404. Envoy merges the overlay's
//! `static_resources` lists after the bootstrap's, so the shared bootstrap keeps its own.

use std::collections::BTreeMap;

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    ExecAction, HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, ObjectFieldSelector, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use crate::annotations::{Admin, Layout, ShutdownManager, SidecarSpec};
use crate::config::{
    BOOTSTRAP_FILE, BOOTSTRAP_MOUNT_PATH, CLIENT_CERT_MOUNT_PATH, ENVOY_UID, HOLD_CONTAINER,
    HOLD_TIMEOUT_SECONDS, SHUTDOWN_MANAGER_CONTAINER, XdsProtocol,
};

/// The downward-API variables the sidecar gets, named in its `--config-yaml` node metadata.
pub const POD_NAME_ENV: &str = "POD_NAME";
pub const POD_NAMESPACE_ENV: &str = "POD_NAMESPACE";
/// The node-metadata keys the xDS server reads to name the pod behind a proxy.
pub const METADATA_POD_NAME: &str = "pod_name";
pub const METADATA_POD_NAMESPACE: &str = "pod_namespace";
/// The node metadata key of the readiness listener's port, where the discovery service reads
/// the proxy's stats during a rollout's health analysis.
pub const METADATA_STATS_PORT: &str = "stats_port";
pub use crate::readiness::{
    ADMIN_CLUSTER, READINESS_LISTENER, READY_PATH, STATS_PATH, STATS_PORT_NAME, admin_target,
    any_address, ipv6_available,
};

/// The shutdown manager's endpoints (`marin3r shutdown-manager`): liveness, "drain and wait
/// for it" (the preStop of the manager and of `extra-lifecycle-hooks` containers), and "drain,
/// then stop Envoy" (Envoy's preStop).
pub const HEALTHZ_PATH: &str = "/healthz";
pub const DRAIN_PATH: &str = "/drain";
pub const SHUTDOWN_PATH: &str = "/shutdown";

/// The sidecar's args exactly as they go into the container spec: `$(POD_NAME)` and
/// `$(POD_NAMESPACE)` are still unexpanded (kubelet expands them; see [`expand_env`]).
pub fn sidecar_args(spec: &SidecarSpec) -> Vec<String> {
    let mut args = vec![
        "-c".to_owned(),
        format!("{BOOTSTRAP_MOUNT_PATH}/{BOOTSTRAP_FILE}"),
        "--service-node".to_owned(),
        spec.node_id.clone(),
        "--service-cluster".to_owned(),
        spec.cluster_id.clone(),
        "--config-yaml".to_owned(),
        config_yaml(spec),
    ];
    if let Some(manager) = &spec.shutdown_manager {
        args.extend([
            "--drain-time-s".to_owned(),
            manager.drain_time.to_string(),
            "--drain-strategy".to_owned(),
            manager.drain_strategy.as_str().to_owned(),
        ]);
    }
    args.extend(spec.extra_args.iter().cloned());
    args
}

/// The `--config-yaml` overlay: node metadata and the admin interface (JSON is YAML).
///
/// It depends only on the admin settings and the readiness port, which nearly every pod takes
/// from the cluster defaults, and building it is about half the cost of an admission: each
/// thread keeps the last one it rendered.
fn config_yaml(spec: &SidecarSpec) -> String {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(OverlayKey, String)>> =
            const { std::cell::RefCell::new(None) };
    }
    let key = (spec.admin.clone(), spec.readiness_port, spec.xds_protocol);
    LAST.with_borrow_mut(|last| {
        if let Some((cached, yaml)) = last.as_ref()
            && *cached == key
        {
            return yaml.clone();
        }
        let yaml = render_config_yaml(spec);
        *last = Some((key, yaml.clone()));
        yaml
    })
}

/// What the `--config-yaml` overlay depends on.
type OverlayKey = (Admin, u16, XdsProtocol);

fn render_config_yaml(spec: &SidecarSpec) -> String {
    let mut admin = json!({
        "address": {
            "socket_address": {
                "address": spec.admin.bind_address.to_string(),
                "port_value": spec.admin.port,
            }
        }
    });
    if let Some(path) = &spec.admin.access_log_path {
        admin["access_log"] = json!([{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                // `$$` keeps kubelet from expanding a `$(...)` the user meant literally.
                "path": path.replace('$', "$$"),
            }
        }]);
    }
    let admin_address =
        std::net::SocketAddr::new(admin_target(spec.admin.bind_address), spec.admin.port);
    let also = spec.admin.stats_on_port.then_some(spec.admin.port);
    if also.is_some() {
        admin["socket_options"] = crate::readiness::admin_sharing_its_port();
    }
    let (listener, cluster) =
        crate::readiness::listener_and_cluster(spec.readiness_port, also, admin_address);
    let mut overlay = json!({
        "node": {
            "metadata": {
                METADATA_POD_NAME: format!("$({POD_NAME_ENV})"),
                METADATA_POD_NAMESPACE: format!("$({POD_NAMESPACE_ENV})"),
                METADATA_STATS_PORT: spec.readiness_port,
            }
        },
        "admin": admin,
        "static_resources": {
            "listeners": [listener],
            "clusters": [cluster],
        },
    });
    // The shared bootstrap speaks state of the world; Envoy merges this scalar over it and
    // keeps the bootstrap's gRPC service.
    if spec.xds_protocol == XdsProtocol::Delta {
        overlay["dynamic_resources"] = json!({"ads_config": {"api_type": "DELTA_GRPC"}});
    }
    overlay.to_string()
}

/// Expands `$(VAR)` references in args the way kubelet does (`$$` is a literal `$`, unknown
/// variables stay as written), so a test can run the exact command line a pod would.
pub fn expand_env(args: &[String], env: &BTreeMap<String, String>) -> Vec<String> {
    args.iter().map(|arg| expand_one(arg, env)).collect()
}

fn expand_one(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The sidecar container.
pub fn container(spec: &SidecarSpec) -> Container {
    let mut ports: Vec<ContainerPort> = spec
        .ports
        .iter()
        .map(|p| ContainerPort {
            name: Some(p.name.clone()),
            container_port: i32::from(p.port),
            host_port: p.host_port.map(i32::from),
            protocol: Some(p.protocol.as_str().into()),
            ..Default::default()
        })
        .collect();
    // The readiness listener, named for PodMonitors: it serves Envoy's stats.
    ports.push(ContainerPort {
        name: Some(STATS_PORT_NAME.into()),
        container_port: i32::from(spec.readiness_port),
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    let probe = |initial_delay, period, failures| {
        ready_probe(spec.readiness_port, initial_delay, period, failures)
    };
    let native = spec.layout == Layout::Native;
    Container {
        name: spec.container_name.clone(),
        image: Some(spec.envoy_image.clone()),
        // A native sidecar: kept running (and restarted) for the pod's life, whatever the
        // pod's restartPolicy, and stopped after the applications.
        restart_policy: native.then(|| "Always".to_owned()),
        // Kubelet starts the next container once this passes: Envoy has its first
        // configuration (or gave up waiting for it, after its initial fetch timeout).
        startup_probe: native.then(|| probe(0, 1, STARTUP_FAILURES)),
        command: Some(vec!["envoy".into()]),
        args: Some(sidecar_args(spec)),
        env: Some(vec![
            field_env(POD_NAME_ENV, "metadata.name"),
            field_env(POD_NAMESPACE_ENV, "metadata.namespace"),
        ]),
        ports: Some(ports),
        resources: resources(spec),
        // Ready once Envoy has its first configuration; a proxy that stays unready for
        // minutes (not merely waiting for xDS) is restarted.
        readiness_probe: Some(probe(0, 5, 3)),
        liveness_probe: Some(probe(30, 10, 10)),
        security_context: Some(security_context()),
        // Kubelet runs this before SIGTERM: the manager drains Envoy's listeners, waits for
        // the connections to go (at most the drain time), then stops Envoy.
        lifecycle: spec
            .shutdown_manager
            .as_ref()
            .map(|m| pre_stop_hook(m, SHUTDOWN_PATH)),
        volume_mounts: Some(vec![
            read_only_mount(&spec.config_volume, BOOTSTRAP_MOUNT_PATH),
            read_only_mount(&spec.tls_volume, CLIENT_CERT_MOUNT_PATH),
        ]),
        ..Default::default()
    }
}

/// Seconds (one probe each) a native Envoy sidecar has to get ready before kubelet restarts it.
const STARTUP_FAILURES: i32 = 120;

/// The URL of Envoy's readiness inside the pod: its readiness listener, on loopback of the
/// listener's family.
pub fn ready_url(spec: &SidecarSpec) -> String {
    let host = match spec.admin.bind_address {
        IpAddr::V4(_) => "127.0.0.1".to_owned(),
        IpAddr::V6(_) => "[::1]".to_owned(),
    };
    format!("http://{host}:{}{READY_PATH}", spec.readiness_port)
}

/// The classic layout's hold (`hold-application-until-proxy-starts`): a container started
/// right after Envoy whose postStart hook returns once Envoy is ready. Kubelet starts a pod's
/// containers one by one, each after the previous one's postStart hook, so the applications
/// after it start with Envoy ready. It then idles until the pod stops.
pub fn hold_container(spec: &SidecarSpec, image: &str) -> Container {
    let url = ready_url(spec);
    Container {
        name: HOLD_CONTAINER.into(),
        image: Some(image.to_owned()),
        args: Some(vec![
            "wait-for-proxy".into(),
            format!("--url={url}"),
            "--then-idle".into(),
        ]),
        lifecycle: Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(vec![
                        MARIN3R_BINARY.into(),
                        "wait-for-proxy".into(),
                        format!("--url={url}"),
                        format!("--timeout={HOLD_TIMEOUT_SECONDS}"),
                    ]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: quantities("1m", "8Mi"),
            limits: quantities("20m", "32Mi"),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_user: None,
            run_as_group: None,
            ..security_context()
        }),
        ..Default::default()
    }
}

/// A `cpu` and `memory` pair of requests or limits.
fn quantities(cpu: &str, memory: &str) -> Option<BTreeMap<String, Quantity>> {
    Some(BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.to_owned())),
        ("memory".to_owned(), Quantity(memory.to_owned())),
    ]))
}

/// Where the marin3r image keeps its binary (the Dockerfile's `COPY`): exec hooks name it.
pub const MARIN3R_BINARY: &str = "/usr/local/bin/marin3r";

/// An environment variable set from a field of the pod (the downward API).
fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: path.to_owned(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A probe of the readiness listener's `GET /ready`.
fn ready_probe(port: u16, initial_delay: i32, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(READY_PATH.into()),
            port: IntOrString::Int(i32::from(port)),
            scheme: Some("HTTP".into()),
            ..Default::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(1),
        success_threshold: Some(1),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn read_only_mount(volume: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: volume.to_owned(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    }
}

/// A preStop hook that GETs `path` from the shutdown manager (kubelet calls the pod's address).
pub fn pre_stop_hook(manager: &ShutdownManager, path: &str) -> Lifecycle {
    let mut get = manager_get(manager, path);
    if !manager.token.is_empty() {
        get.http_headers = Some(vec![HTTPHeader {
            name: "Authorization".into(),
            value: format!("Bearer {}", manager.token),
        }]);
    }
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            http_get: Some(get),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The environment variable the shutdown manager reads its token from (an argument would
/// show in every process listing of the node).
pub const SHUTDOWN_TOKEN_ENV: &str = "MARIN3R_SHUTDOWN_MANAGER_TOKEN";

/// The system's random source failed, so no token can be drawn (the machine's fault, not the
/// spec's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the system's random source failed")]
pub struct NoRandomness;

/// A new shutdown manager token: 128 random bits, hex. Each injected pod gets its own, so
/// holding one pod's spec says nothing of another's.
pub fn shutdown_token() -> Result<String, NoRandomness> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| NoRandomness)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn manager_get(manager: &ShutdownManager, path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(manager.port)),
        scheme: Some("HTTP".into()),
        ..Default::default()
    }
}

/// The `marin3r shutdown-manager` container: it listens on every pod address (kubelet's hooks
/// call the pod's address) and reaches Envoy's admin inside the pod. Its own preStop waits for
/// the drain, so it outlives it. Restricted Pod Security as the image's own non-root user.
pub fn shutdown_manager_container(spec: &SidecarSpec, manager: &ShutdownManager) -> Container {
    let admin = std::net::SocketAddr::new(admin_target(spec.admin.bind_address), spec.admin.port);
    Container {
        name: SHUTDOWN_MANAGER_CONTAINER.into(),
        image: Some(manager.image.clone()),
        // Native: declared before Envoy, so kubelet stops it after Envoy, whose preStop
        // calls it.
        restart_policy: (spec.layout == Layout::Native).then(|| "Always".to_owned()),
        args: Some(
            [
                "shutdown-manager".into(),
                format!("--port={}", manager.port),
                format!("--envoy-admin-address={admin}"),
                format!("--drain-time={}", manager.drain_time),
            ]
            .into_iter()
            .chain(manager.json_logs.then(|| "--log-format=json".into()))
            .collect(),
        ),
        env: (!manager.token.is_empty()).then(|| {
            vec![EnvVar {
                name: SHUTDOWN_TOKEN_ENV.into(),
                value: Some(manager.token.clone()),
                ..Default::default()
            }]
        }),
        ports: Some(vec![ContainerPort {
            name: Some("shtdn-mgr".into()),
            container_port: i32::from(manager.port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // The original's requests and limits: an idle HTTP server.
        resources: Some(ResourceRequirements {
            requests: quantities("5m", "25Mi"),
            limits: quantities("50m", "50Mi"),
            ..Default::default()
        }),
        readiness_probe: Some(Probe {
            http_get: Some(manager_get(manager, HEALTHZ_PATH)),
            period_seconds: Some(10),
            timeout_seconds: Some(1),
            ..Default::default()
        }),
        lifecycle: Some(pre_stop_hook(manager, DRAIN_PATH)),
        security_context: Some(SecurityContext {
            run_as_user: None,
            run_as_group: None,
            ..security_context()
        }),
        ..Default::default()
    }
}

/// Pod Security `restricted`: Envoy needs no privilege, no capability (its ports are above
/// 1024) and writes nothing to its root filesystem (hot-restart shared memory lives in
/// `/dev/shm`, a separate tmpfs; an `admin.access-log-path` must point at a volume or
/// `/dev/stdout`).
pub fn security_context() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(ENVOY_UID),
        run_as_group: Some(ENVOY_UID),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(spec: &SidecarSpec) -> Option<ResourceRequirements> {
    let r = &spec.resources;
    if r.is_empty() {
        return None;
    }
    let map = |cpu: &Option<String>, memory: &Option<String>| {
        let mut m = BTreeMap::new();
        if let Some(cpu) = cpu {
            m.insert("cpu".to_owned(), Quantity(cpu.clone()));
        }
        if let Some(memory) = memory {
            m.insert("memory".to_owned(), Quantity(memory.clone()));
        }
        (!m.is_empty()).then_some(m)
    };
    Some(ResourceRequirements {
        requests: map(&r.requests_cpu, &r.requests_memory),
        limits: map(&r.limits_cpu, &r.limits_memory),
        ..Default::default()
    })
}

/// The bootstrap ConfigMap volume and the client certificate Secret volume.
pub fn volumes(spec: &SidecarSpec) -> Vec<Volume> {
    vec![
        Volume {
            name: spec.config_volume.clone(),
            config_map: Some(ConfigMapVolumeSource {
                name: spec.bootstrap_config_map.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: spec.tls_volume.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(spec.client_certificate.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("POD_NAME".to_owned(), "web-7d4b9".to_owned()),
            ("POD_NAMESPACE".to_owned(), "shop".to_owned()),
        ])
    }

    #[test]
    fn expansion_follows_kubelet_rules() {
        let cases = [
            ("$(POD_NAME)", "web-7d4b9"),
            ("a-$(POD_NAMESPACE)-b", "a-shop-b"),
            ("$$(POD_NAME)", "$(POD_NAME)"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$", "$"),
            ("$(", "$("),
            ("cost: $5", "cost: $5"),
            ("$$$(POD_NAME)", "$web-7d4b9"),
        ];
        for (input, want) in cases {
            assert_eq!(expand_one(input, &env()), want, "{input}");
        }
    }
}
