//! `local-cluster`: a Kubernetes stand-in on this machine for kubectl, kube-rs and the demo.
//! Starts the API server, writes a kubeconfig once the API answers, runs until SIGINT or
//! SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use marin3r_e2e::apiserver::{ApiServer, ApiServerConfig};

#[derive(Debug, Parser)]
#[command(
    about = "Run the local cluster: an in-memory Kubernetes API server for kubectl and kube-rs"
)]
struct Args {
    /// Where to write the kubeconfig.
    #[arg(long, default_value = ".local-cluster/kubeconfig")]
    kubeconfig: PathBuf,
    /// The HTTPS address of the API (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Extra DNS names or IPs for the API's serving certificate (repeatable).
    #[arg(long = "tls-san")]
    tls_sans: Vec<String>,
    /// Also serve plain HTTP on a loopback port (printed at start).
    #[arg(long)]
    plain_http: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = ApiServerConfig {
        https_addr: args.listen,
        extra_hosts: args.tls_sans,
        plain_http: args.plain_http,
        ..ApiServerConfig::default()
    };
    let server = ApiServer::start(config)
        .await
        .context("starting the API server")?;
    // Only hand out a kubeconfig for an API that answers, through the kubeconfig itself.
    let client = server
        .kube_client()
        .await
        .context("building a client for the API")?;
    let version = client
        .apiserver_version()
        .await
        .context("the API server does not answer")?;
    tracing::info!(version = %version.git_version, "API server answers");
    // The pod runner and the deployment controller start here, given `client`.
    server
        .write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("writing the kubeconfig to {}", args.kubeconfig.display()))?;
    println!("local cluster API at {}", server.https_url());
    if let Some(http) = server.http_url() {
        println!("plain HTTP (loopback only) at {http}");
    }
    println!("kubeconfig written to {}", args.kubeconfig.display());
    println!(
        "use it with:  export KUBECONFIG={}  then e.g.  kubectl get namespaces",
        args.kubeconfig.display()
    );
    wait_for_signal().await?;
    println!("stopping the local cluster");
    drop(server);
    // Nothing else is left behind: the kubeconfig would name a dead server.
    let _ = std::fs::remove_file(&args.kubeconfig);
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
