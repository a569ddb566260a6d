//! Cluster-level injection settings: the defaults every pod annotation falls back to, and the
//! names of the objects the operator creates in each enabled namespace.

use std::net::{IpAddr, Ipv4Addr};

/// The Envoy image a sidecar runs unless the pod asks for another (`envoy-image`).
pub const DEFAULT_ENVOY_IMAGE: &str = "envoyproxy/envoy:v1.40.0";
/// The shutdown manager's image when nothing else says (`marin3r inject` and tests): the
/// image of the marin3r release this crate belongs to, named as `marin3r::IMAGE` names it.
pub const DEFAULT_SHUTDOWN_MANAGER_IMAGE: &str = concat!("marin3r:v", env!("CARGO_PKG_VERSION"));
/// The sidecar container's name unless `container-name` says otherwise.
pub const DEFAULT_CONTAINER_NAME: &str = "envoy-sidecar";
/// The bootstrap ConfigMap the operator writes into every enabled namespace; also the default
/// name of the pod volume that mounts it (`config-volume`).
pub const DEFAULT_BOOTSTRAP_CONFIG_MAP: &str = "envoy-sidecar-bootstrap";
/// The default name of the pod volume holding the client certificate (`tls-volume`).
pub const DEFAULT_TLS_VOLUME: &str = "envoy-sidecar-tls";
/// The client certificate Secret the operator issues in every enabled namespace
/// (`client-certificate`).
pub const DEFAULT_CLIENT_CERTIFICATE: &str = "envoy-sidecar-client-cert";
/// Envoy's admin port unless `admin.port` says otherwise.
pub const DEFAULT_ADMIN_PORT: u16 = 9901;
/// The sidecar's readiness listener (kubelet's probes) unless `readiness.port` says
/// otherwise: the port after the admin's, on every pod address, proxying only `/ready`.
pub const DEFAULT_READINESS_PORT: u16 = 9902;
/// The shutdown manager's port unless `shutdown-manager.port` says otherwise (the original's).
pub const DEFAULT_SHUTDOWN_MANAGER_PORT: u16 = 8090;
/// Seconds Envoy drains for unless `shutdown-manager.drain-time` says otherwise (the
/// original's).
pub const DEFAULT_DRAIN_TIME: u32 = 300;
/// The shutdown manager container's name (the original's).
pub const SHUTDOWN_MANAGER_CONTAINER: &str = "envoy-shtdn-mgr";
/// Seconds the pod's terminationGracePeriodSeconds leaves after the drain time: Envoy's exit
/// and the other containers' SIGTERM happen after the drain.
pub const DRAIN_GRACE_MARGIN: i64 = 15;
/// The user the sidecar runs as: the `envoy` user (101) of the `envoyproxy/envoy` images,
/// whose default user is root (their entrypoint drops privileges, the sidecar's `command`
/// bypasses it), so `runAsNonRoot` needs an explicit user.
pub const ENVOY_UID: i64 = 101;

// The sidecar's file layout, defined once: the webhook mounts the volumes at these paths and
// points Envoy at the bootstrap; the bootstrap renderer (`crate::bootstrap`, also
// `marin3r bootstrap --out-dir`) writes these files and points Envoy's SDS at them. Import
// them from here rather than repeating them.

/// Where the bootstrap ConfigMap is mounted; it holds [`BOOTSTRAP_FILE`],
/// [`TLS_CERTIFICATE_SDS_FILE`] and [`VALIDATION_CONTEXT_SDS_FILE`].
pub const BOOTSTRAP_MOUNT_PATH: &str = "/etc/envoy/bootstrap";
/// The Envoy bootstrap inside the bootstrap ConfigMap (Envoy's `-c`).
pub const BOOTSTRAP_FILE: &str = "config.json";
/// The file-based SDS resource the bootstrap points at for the client certificate (read from
/// [`CLIENT_CERT_MOUNT_PATH`]).
pub const TLS_CERTIFICATE_SDS_FILE: &str = "tls_certificate_sds_secret.json";
/// The file-based SDS resource the bootstrap points at for the CA that signs the discovery
/// service's certificate (read from [`CLIENT_CERT_MOUNT_PATH`]).
pub const VALIDATION_CONTEXT_SDS_FILE: &str = "validation_context_sds_secret.json";
/// Where the client certificate Secret (`tls.crt`, `tls.key`, `ca.crt`) is mounted.
pub const CLIENT_CERT_MOUNT_PATH: &str = "/etc/envoy/tls/client";

/// The container that holds a classic-layout pod's applications until Envoy is ready
/// (`hold-application-until-proxy-starts`): it runs `marin3r wait-for-proxy`, whose postStart
/// hook returns once Envoy's readiness listener answers.
pub const HOLD_CONTAINER: &str = "marin3r-hold";
/// How long the hold container's postStart hook waits for Envoy before it gives up (kubelet
/// then starts the applications anyway, after recording `FailedPostStartHook`).
pub const HOLD_TIMEOUT_SECONDS: u32 = 120;

/// Settings shared by every injection; pod annotations override the per-pod ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectionConfig {
    pub envoy_image: String,
    pub container_name: String,
    /// The ConfigMap holding the bootstrap unless `ads-configmap` names another.
    pub bootstrap_config_map: String,
    pub config_volume: String,
    pub tls_volume: String,
    pub client_certificate: String,
    pub admin_port: u16,
    pub admin_bind_address: IpAddr,
    pub readiness_port: u16,
    /// `None`: Envoy's admin interface writes no access log.
    pub admin_access_log_path: Option<String>,
    /// The image of the `marin3r shutdown-manager` container unless `shutdown-manager.image`
    /// names another: the discovery pod's own marin3r image, passed by the operator.
    pub shutdown_manager_image: String,
    pub shutdown_manager_port: u16,
    pub drain_time: u32,
    /// The DiscoveryService this webhook belongs to; a pod whose `discovery-service.name`
    /// names another is denied. `None` (offline injection): any name is taken.
    pub discovery_service: Option<String>,
    /// Envoy's requests and limits unless the pod's `resources.*` annotations say otherwise
    /// (each quantity on its own).
    pub resources: Resources,
    /// Added to every injected pod's `imagePullSecrets` (Secrets of the pod's namespace), so
    /// a private mirror of the Envoy image needs no annotation on every pod.
    pub image_pull_secrets: Vec<String>,
    /// Inject Envoy as a native sidecar (an init container with `restartPolicy: Always`,
    /// Kubernetes 1.29+) unless the pod's `native-sidecar` annotation says otherwise.
    pub native_sidecars: bool,
    /// In the classic layout, start the pod's applications only once Envoy is ready, unless
    /// the pod's `hold-application-until-proxy-starts` annotation says otherwise.
    pub hold_application: bool,
    /// The xDS protocol of injected sidecars unless a pod's `xds-protocol` says otherwise.
    pub xds_protocol: XdsProtocol,
    /// Annotate injected pods `prometheus.io/scrape|port|path` for Envoy's stats, unless the
    /// pod's `prometheus-annotations` annotation says otherwise.
    pub prometheus_annotations: bool,
    /// Injected shutdown managers log one JSON object per line (`--log-format json`): the
    /// discovery pod passes its own log format on.
    pub json_logs: bool,
}

impl Default for InjectionConfig {
    fn default() -> Self {
        Self {
            envoy_image: DEFAULT_ENVOY_IMAGE.into(),
            container_name: DEFAULT_CONTAINER_NAME.into(),
            bootstrap_config_map: DEFAULT_BOOTSTRAP_CONFIG_MAP.into(),
            config_volume: DEFAULT_BOOTSTRAP_CONFIG_MAP.into(),
            tls_volume: DEFAULT_TLS_VOLUME.into(),
            client_certificate: DEFAULT_CLIENT_CERTIFICATE.into(),
            admin_port: DEFAULT_ADMIN_PORT,
            // Envoy's admin API has no authentication and can stop Envoy: only the pod's own
            // containers reach it. Kubelet probes the readiness listener instead.
            admin_bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            readiness_port: DEFAULT_READINESS_PORT,
            admin_access_log_path: None,
            shutdown_manager_image: DEFAULT_SHUTDOWN_MANAGER_IMAGE.into(),
            shutdown_manager_port: DEFAULT_SHUTDOWN_MANAGER_PORT,
            drain_time: DEFAULT_DRAIN_TIME,
            discovery_service: None,
            resources: Resources::default(),
            image_pull_secrets: Vec::new(),
            native_sidecars: false,
            hold_application: false,
            xds_protocol: XdsProtocol::Sotw,
            prometheus_annotations: true,
            json_logs: false,
        }
    }
}

/// How an injected Envoy speaks ADS to the discovery service: state of the world (every
/// resource of a type in each response) or delta (only what changed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum XdsProtocol {
    #[default]
    Sotw,
    Delta,
}

impl XdsProtocol {
    /// `sotw` or `delta`, as the annotation, the flag and the metrics' `protocol` label say.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sotw => "sotw",
            Self::Delta => "delta",
        }
    }

    /// Parses `sotw` or `delta`.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "sotw" => Ok(Self::Sotw),
            "delta" => Ok(Self::Delta),
            _ => Err("must be sotw (state of the world) or delta".into()),
        }
    }
}

/// Envoy's requests and limits, Kubernetes quantities (already validated): the cluster's
/// defaults ([`InjectionConfig::resources`]), each overridden by its pod annotation.
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
