//! Which cluster a command talks to: the kubeconfig file and context, as kubectl takes them;
//! and which EnvoyConfig in it, for the commands that act on one.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Debug, Clone, Default, Args)]
pub struct ClusterArgs {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: the current one).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// A client for the chosen cluster; its default namespace is the context's.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .context("loading the kubeconfig")?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .context("loading the kubeconfig")?,
            // As kubectl inside a pod: the kubeconfig if there is one, else in-cluster.
            (None, None) => kube::Config::infer()
                .await
                .context("finding the cluster (no kubeconfig, not in a pod)")?,
        };
        kube::Client::try_from(config).context("connecting to the cluster")
    }
}

/// One EnvoyConfig, by name and namespace, in the chosen cluster: what `marin3r rollout`
/// commands act on.
#[derive(Debug, Args)]
pub struct ConfigTarget {
    /// The EnvoyConfig.
    pub name: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

impl ConfigTarget {
    /// The EnvoyConfigs of the target's namespace, and its name.
    pub async fn config_api(
        &self,
    ) -> anyhow::Result<(kube::Api<marin3r_api::EnvoyConfig>, String)> {
        let client = self.cluster.client().await?;
        let ns = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        Ok((kube::Api::namespaced(client, &ns), self.name.clone()))
    }
}
