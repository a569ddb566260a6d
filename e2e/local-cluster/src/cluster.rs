//! The whole local cluster in one value: the API server (listening on the pod network's
//! bridge address, so pods reach it), the pod runner and the Deployment controller, started
//! in that order and stopped in reverse.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::apiserver::{ApiServer, ApiServerConfig};
use crate::deployments::DeploymentController;
use crate::kubelet::{ClusterAccess, ImageMap, Kubelet, Node, NodeConfig};

/// How to start a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalClusterConfig {
    pub images: ImageMap,
    /// Where the API listens for HTTPS. By default the pod network's bridge address (so
    /// pods reach it too) on a free port; 127.0.0.1 when no pods are run.
    pub listen: Option<SocketAddr>,
    /// Also serve plain HTTP on loopback (tests).
    pub plain_http: bool,
    /// Where container logs are kept (the run's folder, removed at the end, when unset).
    pub log_dir: Option<std::path::PathBuf>,
    /// More names for the API's certificate.
    pub extra_hosts: Vec<String>,
    /// Run pods (needs root). Without, the API and Deployment controller run alone.
    pub run_pods: bool,
    /// How late a changed Secret or ConfigMap reaches running pods' volumes, as a real
    /// kubelet's sync period makes it (see `NodeConfig::volume_update_delay`); zero: at once.
    pub volume_update_delay: std::time::Duration,
}

impl Default for LocalClusterConfig {
    fn default() -> Self {
        Self {
            images: ImageMap::default(),
            listen: None,
            plain_http: false,
            log_dir: None,
            extra_hosts: Vec::new(),
            run_pods: true,
            volume_update_delay: std::time::Duration::ZERO,
        }
    }
}

/// A running local cluster. Dropping it kills every pod at once; `shutdown` stops them
/// gracefully. Field order is drop order.
pub struct LocalCluster {
    kubelet: Option<Kubelet>,
    deployments: Option<DeploymentController>,
    client: kube::Client,
    api: ApiServer,
    node: Option<Arc<Node>>,
}

/// Whether a pod is Ready and not being deleted.
pub fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Ready pods of namespace `ns` that match the label `selector`.
pub async fn ready_pods(
    client: &kube::Client,
    ns: &str,
    selector: &str,
) -> kube::Result<Vec<k8s_openapi::api::core::v1::Pod>> {
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(selector))
        .await?;
    Ok(pods.items.into_iter().filter(pod_ready).collect())
}

/// Creates a namespace enforcing Pod Security `restricted`, as a real cluster's may.
pub async fn create_restricted_namespace(client: &kube::Client, name: &str) -> kube::Result<()> {
    let mut ns = k8s_openapi::api::core::v1::Namespace::default();
    ns.metadata.name = Some(name.to_owned());
    ns.metadata.labels = Some(
        [(
            "pod-security.kubernetes.io/enforce".to_owned(),
            "restricted".to_owned(),
        )]
        .into(),
    );
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&kube::api::PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// A kube-rs client for a kubeconfig's text.
pub async fn client_for(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

impl LocalCluster {
    pub async fn start(config: LocalClusterConfig) -> anyhow::Result<Self> {
        let node = if config.run_pods {
            Some(Node::start(NodeConfig {
                images: config.images,
                log_dir: config.log_dir,
                volume_update_delay: config.volume_update_delay,
                ..NodeConfig::default()
            })?)
        } else {
            None
        };
        let listen = config.listen.unwrap_or_else(|| match &node {
            Some(node) => SocketAddr::new(IpAddr::V4(node.host_ip()), 0),
            None => SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0),
        });
        let mut extra_hosts = config.extra_hosts;
        if let Some(node) = &node {
            extra_hosts.push(node.host_ip().to_string());
        }
        let api = ApiServer::start(ApiServerConfig {
            https_addr: listen,
            extra_hosts,
            plain_http: config.plain_http,
            ..ApiServerConfig::default()
        })
        .await
        .context("starting the API server")?;
        let client = client_for(&api.kubeconfig()).await?;
        let mut kubelet = None;
        if let Some(node) = &node {
            let ip = api.https_addr().ip();
            if !(ip.is_unspecified() || ip == IpAddr::V4(node.host_ip())) {
                tracing::warn!(
                    "the API listens on {ip}, which pods cannot reach: in-cluster clients will fail"
                );
            }
            node.set_cluster_access(ClusterAccess {
                host: node.host_ip().to_string(),
                port: api.https_addr().port(),
                ca_pem: api.ca_pem().to_owned(),
                tokens: crate::kubelet::TokenSource::new(api.token_issuer()),
            })?;
            // `kubectl logs` reads the files the kubelet writes (only the folder is shared, so
            // the API server never keeps the node alive).
            let log_dir = node.log_dir();
            api.set_pod_logs(Arc::new(move |ns: &str, pod: &str, container: &str| {
                let path = crate::kubelet::container_log_path(&log_dir, ns, pod, container);
                path.is_file().then_some(path)
            }));
            let started = Kubelet::start(node.clone(), client.clone())
                .await
                .context("starting the pod runner")?;
            api.set_pod_ports(started.pod_ports());
            kubelet = Some(started);
        }
        let deployments = DeploymentController::start(client.clone())
            .await
            .context("starting the deployment controller")?;
        Ok(Self {
            kubelet,
            deployments: Some(deployments),
            client,
            api,
            node,
        })
    }

    /// A client for the API (HTTPS, the cluster's CA).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    pub fn api(&self) -> &ApiServer {
        &self.api
    }

    /// The node running pods (none when started without pods).
    pub fn node(&self) -> Option<&Arc<Node>> {
        self.node.as_ref()
    }

    /// The fault "kill a pod's process" (see [`Kubelet::kill_container`]).
    pub fn kill_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> anyhow::Result<()> {
        self.kubelet
            .as_ref()
            .context("this cluster runs no pods")?
            .kill_container(namespace, pod, container)
    }

    /// `GET url` from inside a pod's network namespace, as `kubectl exec POD -- curl URL`
    /// would: the pod's loopback (a sidecar's admin) is reachable, as from its containers.
    /// Blocking; runs on a thread of its own, which alone enters the namespace.
    pub fn get_in_pod(&self, namespace: &str, pod: &str, url: &str) -> anyhow::Result<String> {
        let netns = self
            .kubelet
            .as_ref()
            .context("this cluster runs no pods")?
            .netns_path(namespace, pod)
            .with_context(|| format!("pod {namespace}/{pod} is not running on this node"))?;
        let (url, shown) = (url.to_owned(), url.to_owned());
        std::thread::spawn(move || -> anyhow::Result<String> {
            let file = std::fs::File::open(&netns).with_context(|| format!("open {netns}"))?;
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&file),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .with_context(|| format!("setns {netns}"))?;
            http_get(&url)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("GET {shown} in pod {namespace}/{pod}: the thread panicked"))?
    }

    /// A running container's log file.
    pub fn log_path(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<std::path::PathBuf> {
        self.kubelet.as_ref()?.log_path(namespace, pod, container)
    }

    /// Stops the controllers, then every pod (SIGTERM, SIGKILL after `grace`), then the API
    /// server and the pod network.
    pub async fn shutdown(mut self, grace: Duration) {
        self.deployments = None;
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.shutdown(grace).await;
        }
    }
}

/// `GET url` over plain HTTP: the body, whatever the status.
fn http_get(url: &str) -> anyhow::Result<String> {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build(),
    );
    let mut response = agent
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    Ok(response.body_mut().read_to_string()?)
}
