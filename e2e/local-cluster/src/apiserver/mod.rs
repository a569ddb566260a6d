//! The local cluster's API server: the Kubernetes REST API for the kinds marin3r uses and
//! every CRD, served over HTTPS with its own CA (and optionally plain HTTP on loopback), with
//! admission webhooks and fault injection. The admin token (`local-cluster`) may do
//! anything; service-account tokens the kubelet mounts into pods are held to RBAC (see
//! `rbac`); requests without a token are `system:anonymous`.

mod admission;
mod autoscaling;
mod builtin_schema;
mod crds;
mod delete;
mod discovery;
mod endpointslices;
mod error;
mod events;
mod faults;
mod gc;
mod handlers;
mod hooks;
mod logs;
mod meta;
mod openapi;
mod patch;
mod pod_security;
mod pod_spec;
mod portforward;
mod priority;
mod protobuf;
mod rbac;
mod registry;
mod schema;
mod selectors;
mod ssa;
mod store;
mod table;
mod tls;
mod validation;
mod watch;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

pub use delete::{DeleteOptions, Propagation};
pub use error::ApiError;
pub use faults::{FaultScope, Faults};
pub use logs::PodLogs;
pub use portforward::PodPorts;
pub use rbac::ADMIN_TOKEN;
pub use registry::ResourceInfo;
pub use store::Store;

/// How to start an [`ApiServer`].
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// The address to listen on for HTTPS (port 0 picks a free port).
    pub https_addr: SocketAddr,
    /// Extra DNS names or IP addresses for the serving certificate (such as the pod
    /// network's bridge address, so pods reach the API by it).
    pub extra_hosts: Vec<String>,
    /// Also serve plain HTTP on a free loopback port (for tests; never for pods).
    pub plain_http: bool,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            https_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            extra_hosts: Vec::new(),
            plain_http: false,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot issue the API server's certificates: {0}")]
    Certificate(#[from] crate::pki::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(String),
}

/// What every request handler shares.
pub(crate) struct ServerState {
    store: Arc<Store>,
    faults: Arc<Faults>,
    bookmark_interval: Duration,
    pod_logs: std::sync::RwLock<Option<Arc<dyn PodLogs>>>,
    pod_ports: std::sync::RwLock<Option<Arc<dyn PodPorts>>>,
    /// `METHOD path?query` of every request, in order (what tests assert access patterns on).
    requests: std::sync::Mutex<Vec<String>>,
    tokens: Arc<rbac::Tokens>,
}

/// A running API server; stops (listeners, connections, watches) when dropped.
pub struct ApiServer {
    state: Arc<ServerState>,
    https_addr: SocketAddr,
    http_addr: Option<SocketAddr>,
    ca_pem: String,
    tasks: Vec<JoinHandle<()>>,
}

impl ApiServer {
    /// Issues a CA and serving certificate and starts listening; the API answers once
    /// this returns.
    pub async fn start(config: ApiServerConfig) -> Result<Self, StartError> {
        let store = Arc::new(Store::new());
        let faults = Arc::new(Faults::default());
        let state = Arc::new(ServerState {
            store: store.clone(),
            faults,
            bookmark_interval: config.bookmark_interval,
            pod_logs: std::sync::RwLock::new(None),
            pod_ports: std::sync::RwLock::new(None),
            requests: std::sync::Mutex::new(Vec::new()),
            tokens: Arc::new(rbac::Tokens::default()),
        });
        // Bodies up to 3 MiB, the limit of a real API server (axum's default is 2 MiB).
        let router = axum::Router::new()
            .route(
                "/api/v1/namespaces/{namespace}/pods/{name}/portforward",
                axum::routing::any(portforward::handle),
            )
            .fallback(handlers::handle)
            .layer(axum::extract::DefaultBodyLimit::max(
                validation::MAX_REQUEST_BYTES,
            ))
            .with_state(state.clone());
        let bind = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Listen { addr, source })
        };
        let https = bind(config.https_addr).await?;
        let https_addr = https.local_addr().map_err(|source| StartError::Listen {
            addr: config.https_addr,
            source,
        })?;
        let (ca, serving) = tls::issue(https_addr.ip(), &config.extra_hosts)?;
        let acceptor = tls::acceptor(&serving)?;
        let mut tasks = vec![
            tokio::spawn(tls::serve(https, Some(acceptor), router.clone())),
            tokio::spawn(store.clone().run_collector()),
        ];
        let mut http_addr = None;
        if config.plain_http {
            let loopback = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
            let http = bind(loopback).await?;
            http_addr = Some(http.local_addr().map_err(|source| StartError::Listen {
                addr: loopback,
                source,
            })?);
            // Plain HTTP on loopback is the administrator's, like the old insecure port.
            let router = router.layer(axum::Extension(handlers::PlainHttp));
            tasks.push(tokio::spawn(tls::serve(http, None, router)));
        }
        Ok(Self {
            state,
            https_addr,
            http_addr,
            ca_pem: ca.cert_pem(),
            tasks,
        })
    }

    pub fn https_addr(&self) -> SocketAddr {
        self.https_addr
    }

    /// `https://<addr>:<port>` of the API, as clients on this host reach it (loopback when
    /// listening on all addresses).
    pub fn https_url(&self) -> String {
        let mut addr = self.https_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        format!("https://{addr}")
    }

    /// `http://127.0.0.1:<port>`, when plain HTTP was asked for.
    pub fn http_url(&self) -> Option<String> {
        self.http_addr.map(|a| format!("http://{a}"))
    }

    /// The CA that signed the serving certificate (what in-cluster clients trust).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.state.store
    }

    /// Issues a token for the service account `namespace/name`, as the kubelet mounts into
    /// pods: requests with it are `system:serviceaccount:<namespace>:<name>`, held to RBAC,
    /// and answered 401 once the ServiceAccount is gone.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        self.state.tokens.issue(namespace, name)
    }

    /// What the kubelet calls to issue pods' tokens (keeps only the token table alive).
    pub fn token_issuer(&self) -> impl Fn(&str, &str) -> String + Send + Sync + 'static {
        let tokens = self.state.tokens.clone();
        move |ns: &str, name: &str| tokens.issue(ns, name)
    }

    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// Every request served so far, as `METHOD path?query`, in arrival order.
    pub fn requests(&self) -> Vec<String> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A kubeconfig for this cluster over HTTPS, as its administrator.
    pub fn kubeconfig(&self) -> String {
        tls::kubeconfig(&self.https_url(), &self.ca_pem)
    }

    /// Creates `crds` and waits (10 s at most each) until they are established.
    pub async fn install_crds(
        &self,
        crds: impl IntoIterator<
            Item = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >,
    ) -> anyhow::Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::runtime::wait::{await_condition, conditions};
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(self.kube_client().await?);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.create(&Default::default(), &crd).await?;
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(Duration::from_secs(10), established)
                .await
                .map_err(|_| anyhow::anyhow!("CRD {name} not established within 10 s"))??;
        }
        Ok(())
    }

    /// Serves `kubectl logs` from the log files `logs` finds (the pod runner's).
    pub fn set_pod_logs(&self, logs: Arc<dyn PodLogs>) {
        let mut slot = self
            .state
            .pod_logs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(logs);
    }

    /// Serves `pods/portforward` by connecting through `ports` (the pod runner's).
    pub fn set_pod_ports(&self, ports: Arc<dyn PodPorts>) {
        let mut slot = self
            .state
            .pod_ports
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(ports);
    }

    /// A kube-rs client for this cluster, over HTTPS through [`Self::kubeconfig`], as a user
    /// would connect.
    pub async fn kube_client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig())?;
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Writes [`Self::kubeconfig`] to `path`, creating its folder.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.kubeconfig())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.state.faults.drop_watches();
        for task in &self.tasks {
            task.abort();
        }
    }
}
