//! `marin3r operator`: the controllers that manage certificates (and, later, discovery
//! services), until SIGINT or SIGTERM.

use std::collections::BTreeSet;

use clap::Args;
use marin3r_certs::controller;

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Namespaces whose certificates may write Secrets to and read CAs from other namespaces
    /// (repeatable). Defaults to the operator's own namespace (POD_NAMESPACE).
    #[arg(long = "trusted-namespace", value_name = "NAMESPACE")]
    trusted_namespaces: Vec<String>,
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default().await?;
    let mut trusted: BTreeSet<String> = args.trusted_namespaces.into_iter().collect();
    if trusted.is_empty()
        && let Ok(ns) = std::env::var("POD_NAMESPACE")
    {
        trusted.insert(ns);
    }
    tracing::info!(?trusted, "starting the certificate controller");
    let config = controller::Config {
        trusted_namespaces: trusted,
    };
    controller::run(client, config, super::shutdown_signal()).await;
    Ok(())
}
