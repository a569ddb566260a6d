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
#[derive(Clone, Debug, Default)]
pub struct LocalClusterConfig {
    pub images: ImageMap,
    /// The HTTPS port of the API (0 picks a free one); it listens on the bridge address.
    pub port: u16,
    /// Also serve plain HTTP on loopback (tests).
    pub plain_http: bool,
    /// Where container logs are kept (the run's folder, removed at the end, when unset).
    pub log_dir: Option<std::path::PathBuf>,
    /// More names for the API's certificate.
    pub extra_hosts: Vec<String>,
}

/// A running local cluster. Dropping it kills every pod at once; `shutdown` stops them
/// gracefully. Field order is drop order.
pub struct LocalCluster {
    kubelet: Option<Kubelet>,
    deployments: Option<DeploymentController>,
    client: kube::Client,
    api: ApiServer,
    node: Arc<Node>,
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
        let node = Node::start(NodeConfig {
            images: config.images,
            log_dir: config.log_dir,
            ..NodeConfig::default()
        })?;
        let api = ApiServer::start(ApiServerConfig {
            https_addr: SocketAddr::new(IpAddr::V4(node.host_ip()), config.port),
            extra_hosts: config.extra_hosts,
            plain_http: config.plain_http,
            ..ApiServerConfig::default()
        })
        .await
        .context("starting the API server")?;
        node.set_cluster_access(ClusterAccess {
            host: node.host_ip().to_string(),
            port: api.https_addr().port(),
            ca_pem: api.ca_pem().to_owned(),
            token: "local-cluster".into(),
        })?;
        let client = client_for(&api.kubeconfig()).await?;
        let kubelet = Kubelet::start(node.clone(), client.clone())
            .await
            .context("starting the pod runner")?;
        let deployments = DeploymentController::start(client.clone())
            .await
            .context("starting the deployment controller")?;
        Ok(Self {
            kubelet: Some(kubelet),
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

    pub fn node(&self) -> &Arc<Node> {
        &self.node
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
            .context("the cluster is shutting down")?
            .kill_container(namespace, pod, container)
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
