//! `local-cluster`: a Kubernetes stand-in on this machine for kubectl and kube-rs.
//! Starts the API server, the pod runner and the Deployment controller, writes a kubeconfig
//! once the API answers, runs until SIGINT or SIGTERM, then stops every pod.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_local_cluster::kubelet::ImageMap;

#[derive(Debug, Parser)]
#[command(
    about = "Run the local cluster: an in-memory Kubernetes API server for kubectl and kube-rs, \
             with pods run as local processes"
)]
struct Args {
    /// Where to write the kubeconfig.
    #[arg(long, default_value = ".local-cluster/kubeconfig")]
    kubeconfig: PathBuf,
    /// The HTTPS address of the API. Default: the pod network's bridge address (so pods
    /// reach it) on a free port, or 127.0.0.1 with --no-pods.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Extra DNS names or IPs for the API's serving certificate (repeatable).
    #[arg(long = "tls-san")]
    tls_sans: Vec<String>,
    /// Also serve plain HTTP on a loopback port (printed at start).
    #[arg(long)]
    plain_http: bool,
    /// Map an image to a local binary, NAME=PATH (repeatable); NAME matches the image as
    /// written, without its tag, or its last path segment.
    #[arg(long = "image", value_name = "NAME=PATH")]
    images: Vec<String>,
    /// The binary `envoyproxy/envoy*` images run (default: `envoy` on PATH).
    #[arg(long)]
    envoy: Option<PathBuf>,
    /// Where container logs go (`<namespace>_<pod>_<container>.log`).
    #[arg(long, default_value = ".local-cluster/logs")]
    logs: PathBuf,
    /// Run only the API server and controllers, no pods (no root needed).
    #[arg(long)]
    no_pods: bool,
}

fn images(args: &Args) -> anyhow::Result<ImageMap> {
    let mut map = ImageMap::new();
    let on_path = || {
        let paths = std::env::var_os("PATH")?;
        std::env::split_paths(&paths)
            .map(|dir| dir.join("envoy"))
            .find(|p| p.is_file())
    };
    match args.envoy.clone().or_else(on_path) {
        Some(path) => {
            anyhow::ensure!(path.is_file(), "--envoy {}: not a file", path.display());
            map = map.with_envoy(path);
        }
        None => tracing::warn!("no envoy on PATH: envoyproxy/envoy images will not run"),
    }
    for flag in &args.images {
        map = map.with_flag(flag)?;
    }
    Ok(map)
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
    let config = LocalClusterConfig {
        images: images(&args)?,
        listen: args.listen,
        plain_http: args.plain_http,
        log_dir: (!args.no_pods).then(|| args.logs.clone()),
        extra_hosts: args.tls_sans.clone(),
        run_pods: !args.no_pods,
        volume_update_delay: std::time::Duration::ZERO,
    };
    let cluster = LocalCluster::start(config)
        .await
        .context("starting the local cluster")?;
    let server = cluster.api();
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
    server
        .write_kubeconfig(&args.kubeconfig)
        .with_context(|| format!("writing the kubeconfig to {}", args.kubeconfig.display()))?;
    println!("local cluster API at {}", server.https_url());
    if let Some(http) = server.http_url() {
        println!("plain HTTP (loopback only) at {http}");
    }
    if let Some(node) = cluster.node() {
        println!(
            "pods run as local processes: pod network on bridge {}br, host address {}; \
             container logs in {}",
            node.prefix(),
            node.host_ip(),
            args.logs.display()
        );
    }
    println!("kubeconfig written to {}", args.kubeconfig.display());
    println!(
        "use it with:  export KUBECONFIG={}  then e.g.  kubectl get namespaces",
        args.kubeconfig.display()
    );
    wait_for_signal().await?;
    println!("stopping the local cluster");
    cluster.shutdown(Duration::from_secs(10)).await;
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
