//! The local cluster's pod runner, a small kubelet: each Pod gets a network namespace on a
//! per-run bridge, its volumes written the Kubernetes way, and its containers run as local
//! processes in private mount namespaces. `Node` works without an API server (tests feed it
//! Pods and objects directly); `sync` drives it from the cluster's API through kube-rs.

pub mod env;
mod health;
mod hooks;
pub mod hosts;
pub mod images;
pub mod launcher;
mod lifecycle;
pub mod net;
pub mod pod;
pub mod probe;
pub mod runtime;
pub mod service_proxy;
pub mod sidecars;
mod supervisor;
pub mod sync;
pub mod volumes;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};

pub use images::ImageMap;
pub use net::Network;
pub use pod::PodHandle;
pub use sync::Kubelet;

/// The source of a small Python HTTP server that answers with what its container sees
/// (files, name resolution, env, the API through in-cluster credentials): run it with
/// `python3 -c` under an image mapped to python3, to test the pod runner from outside.
pub const PROBE_SERVER_PY: &str = include_str!("probe_server.py");

/// Everything a pod may read from the cluster besides itself: the Secrets and ConfigMaps its
/// env and volumes name, and the Services and Pods its `/etc/hosts` is built from.
pub trait Objects: Send + Sync {
    fn secret(&self, namespace: &str, name: &str) -> Option<Secret>;
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap>;
    fn services(&self) -> Vec<Service>;
    fn pods(&self) -> Vec<Pod>;
}

/// `Objects` held in memory, for driving a `Node` without an API server.
#[derive(Default)]
pub struct StaticObjects {
    inner: Mutex<StaticInner>,
}

#[derive(Default)]
struct StaticInner {
    secrets: BTreeMap<(String, String), Secret>,
    config_maps: BTreeMap<(String, String), ConfigMap>,
    services: BTreeMap<(String, String), Service>,
    pods: BTreeMap<(String, String), Pod>,
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

impl StaticObjects {
    fn with<R>(&self, f: impl FnOnce(&mut StaticInner) -> R) -> R {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }
    pub fn put_secret(&self, secret: Secret) {
        self.with(|i| i.secrets.insert(key(&secret.metadata), secret));
    }
    pub fn put_config_map(&self, cm: ConfigMap) {
        self.with(|i| i.config_maps.insert(key(&cm.metadata), cm));
    }
    pub fn put_service(&self, svc: Service) {
        self.with(|i| i.services.insert(key(&svc.metadata), svc));
    }
    /// Records a pod as the cluster sees it (with its status), for Service resolution.
    pub fn put_pod(&self, pod: Pod) {
        self.with(|i| i.pods.insert(key(&pod.metadata), pod));
    }
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.with(|i| i.pods.remove(&(namespace.to_owned(), name.to_owned())));
    }
    pub fn remove_service(&self, namespace: &str, name: &str) {
        self.with(|i| i.services.remove(&(namespace.to_owned(), name.to_owned())));
    }
}

impl Objects for StaticObjects {
    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.with(|i| i.secrets.get(&(namespace.into(), name.into())).cloned())
    }
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.with(|i| i.config_maps.get(&(namespace.into(), name.into())).cloned())
    }
    fn services(&self) -> Vec<Service> {
        self.with(|i| i.services.values().cloned().collect())
    }
    fn pods(&self) -> Vec<Pod> {
        self.with(|i| i.pods.values().cloned().collect())
    }
}

/// `<dir>/<namespace>_<pod>_<container>.log`.
pub fn container_log_path(dir: &Path, namespace: &str, pod: &str, container: &str) -> PathBuf {
    dir.join(format!("{namespace}_{pod}_{container}.log"))
}

/// How pods reach the API server from inside the cluster: what in-cluster kube-rs config
/// reads from `KUBERNETES_SERVICE_HOST/PORT` and the service account folder.
#[derive(Clone, Debug)]
pub struct ClusterAccess {
    pub host: String,
    pub port: u16,
    pub ca_pem: String,
    /// Issues the token of a service account (namespace, name), mounted into each pod.
    pub tokens: TokenSource,
}

/// What issues service-account tokens: the API server's token authority.
#[derive(Clone)]
pub struct TokenSource(std::sync::Arc<IssueToken>);

type IssueToken = dyn Fn(&str, &str) -> String + Send + Sync;

impl TokenSource {
    pub fn new(issue: impl Fn(&str, &str) -> String + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(issue))
    }

    /// A token for the service account `namespace/name`.
    pub fn issue(&self, namespace: &str, name: &str) -> String {
        (self.0)(namespace, name)
    }
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenSource")
    }
}

/// How a `Node` is set up.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub images: ImageMap,
    pub access: Option<ClusterAccess>,
    /// Probes run at most this far apart, whatever `periodSeconds` says, so tests see
    /// readiness changes quickly (the Kubernetes default period is 10 s).
    pub max_probe_period: Duration,
    /// The longest wait between restarts of a crashing container.
    pub max_restart_backoff: Duration,
    /// Node name written to `spec.nodeName`-aware fields and `status.hostIP`.
    pub node_name: String,
    /// Where container logs go (`<namespace>_<pod>_<container>.log`); the run's folder when
    /// unset, which is removed at shutdown.
    pub log_dir: Option<PathBuf>,
    /// How late a changed Secret or ConfigMap reaches the volumes of a running pod. A real
    /// kubelet takes up to its sync period plus its cache's age (a minute or more by
    /// default); zero writes the change at once.
    pub volume_update_delay: Duration,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            images: ImageMap::default(),
            access: None,
            max_probe_period: Duration::from_secs(1),
            max_restart_backoff: Duration::from_secs(5),
            node_name: "local".into(),
            log_dir: None,
            volume_update_delay: Duration::ZERO,
        }
    }
}

/// One machine running pods: the run's network and folder. Dropping it removes the bridge
/// and the folder; pods must be dropped first (each holds an `Arc` to it).
pub struct Node {
    pub(crate) config: NodeConfig,
    access: std::sync::OnceLock<ClusterAccess>,
    pub(crate) network: Network,
    pub(crate) run_dir: RunDir,
}

impl Node {
    /// Checks we can create namespaces, removes what dead earlier runs left behind, and
    /// creates this run's bridge and folder.
    pub fn start(config: NodeConfig) -> anyhow::Result<Arc<Self>> {
        net::require_root()?;
        net::cleanup_stale();
        let run_dir = RunDir::create()?;
        let network = Network::create(run_dir.id())?;
        let access = std::sync::OnceLock::new();
        if let Some(a) = &config.access {
            let _ = access.set(a.clone());
        }
        Ok(Arc::new(Self {
            config,
            access,
            network,
            run_dir,
        }))
    }

    /// Sets how pods reach the API server, for a server started after the node (it listens
    /// on the node's bridge address). Pods started before keep what they had; a second call
    /// is refused.
    pub fn set_cluster_access(&self, access: ClusterAccess) -> anyhow::Result<()> {
        self.access
            .set(access)
            .map_err(|_| anyhow::anyhow!("the node's cluster access is already set"))
    }

    pub fn cluster_access(&self) -> Option<&ClusterAccess> {
        self.access.get()
    }

    /// The bridge's address on the host: how pods reach servers on the host (the API server).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.network.host_ip()
    }

    /// The virtual IP of Service `namespace/name`, once a `ServiceProxy` gave it one.
    pub fn service_ip(&self, namespace: &str, name: &str) -> Option<Ipv4Addr> {
        self.network.service_ip(namespace, name)
    }

    /// This run's name prefix, shared by its network namespaces, links and folder.
    pub fn prefix(&self) -> String {
        format!("{}{}", net::PREFIX, self.run_dir.id())
    }

    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Where container logs go: `log_dir`, or the run's folder (removed at shutdown).
    pub fn log_dir(&self) -> PathBuf {
        self.config
            .log_dir
            .clone()
            .unwrap_or_else(|| self.run_dir.path().join("logs"))
    }

    /// The log file of a container (stdout and stderr, every run appended).
    pub fn log_path(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        container_log_path(&self.log_dir(), namespace, pod, container)
    }
}

/// This run's folder (`<tmp>/m3r<id>`), with an `owner` file naming the live process that owns
/// it so a later run can tell which leftovers are stale.
pub(crate) struct RunDir {
    id: String,
    path: PathBuf,
}

impl RunDir {
    fn create() -> anyhow::Result<Self> {
        let id = net::random_run_id();
        let path = std::env::temp_dir().join(format!("{}{id}", net::PREFIX));
        // The folder appears with its owner file already in it (a rename), so a concurrent
        // start never takes it for a dead run's.
        let staging = path.with_extension("new");
        std::fs::create_dir_all(&staging)?;
        std::fs::write(staging.join("owner"), net::owner_token(std::process::id()))?;
        std::fs::rename(&staging, &path)?;
        Ok(Self { id, path })
    }
    pub(crate) fn id(&self) -> &str {
        &self.id
    }
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
