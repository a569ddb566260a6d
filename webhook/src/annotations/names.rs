//! The names of the pod annotations the webhook reads and writes, the hand-kept list of them
//! ([`KNOWN`]), and the warnings for a `marin3r.3scale.net/` annotation that is none of them.

use std::collections::BTreeMap;

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
/// `true`: Envoy (and the shutdown manager) as native sidecars, init containers with
/// `restartPolicy: Always` (Kubernetes 1.29+); `false`: the classic layout, appended to
/// `spec.containers`. Default: the DiscoveryService's.
pub const NATIVE_SIDECAR: &str = "marin3r.3scale.net/native-sidecar";
/// `true`, in the classic layout: the pod's applications start only once Envoy is ready
/// (Envoy first, then a container whose postStart hook waits for it). Native sidecars always
/// start before the applications.
pub const HOLD_APPLICATION: &str = "marin3r.3scale.net/hold-application-until-proxy-starts";
/// `sotw` or `delta`: how Envoy speaks ADS (state of the world, or incremental). Default: the
/// DiscoveryService's (`spec.sidecar.xdsProtocol`), else `sotw`.
pub const XDS_PROTOCOL: &str = "marin3r.3scale.net/xds-protocol";
/// `false`: the webhook adds no `prometheus.io/scrape|port|path` annotations pointing at
/// Envoy's stats (it never adds them to a pod that has any of the three). Default: the
/// DiscoveryService's (`spec.sidecar.prometheusAnnotations`, true unless set).
pub const PROMETHEUS_ANNOTATIONS: &str = "marin3r.3scale.net/prometheus-annotations";
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
    NATIVE_SIDECAR,
    HOLD_APPLICATION,
    XDS_PROTOCOL,
    PROMETHEUS_ANNOTATIONS,
    INJECTED,
];

/// The shutdown-manager annotations besides `enabled`: they only mean something when it is.
pub(super) const SHUTDOWN_MANAGER_SETTINGS: [&str; 5] = [
    SHUTDOWN_MANAGER_PORT,
    SHUTDOWN_MANAGER_IMAGE,
    SHUTDOWN_MANAGER_DRAIN_TIME,
    SHUTDOWN_MANAGER_DRAIN_STRATEGY,
    SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
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
