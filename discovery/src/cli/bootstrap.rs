//! `marin3r bootstrap`: write an Envoy bootstrap for a proxy, from a client certificate folder
//! laid out like a Kubernetes TLS Secret.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use marin3r_webhook::bootstrap::{Admin, AdsMode, BootstrapOptions, render};

#[derive(Debug, Args)]
pub struct BootstrapArgs {
    /// The proxy's node id (what EnvoyConfigs select with `nodeID`).
    #[arg(long)]
    node_id: String,
    /// The proxy's cluster (defaults to the node id).
    #[arg(long)]
    cluster_id: Option<String>,
    /// Host name or IP of the discovery service; its certificate must carry it.
    #[arg(long)]
    xds_host: String,
    #[arg(long, default_value_t = 18000)]
    xds_port: u16,
    /// Folder with tls.crt, tls.key and ca.crt (a kubernetes.io/tls Secret's layout).
    #[arg(long)]
    cert_dir: PathBuf,
    /// Folder to write config.json and its SDS files into (created if missing).
    #[arg(long)]
    out_dir: PathBuf,
    /// Use incremental (delta) ADS instead of state of the world.
    #[arg(long)]
    delta: bool,
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    admin_address: IpAddr,
}

pub fn run(args: BootstrapArgs) -> anyhow::Result<()> {
    let cert_dir = absolute(&args.cert_dir)?;
    check_certificates(&cert_dir)?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let out_dir = absolute(&args.out_dir)?;
    let opts = BootstrapOptions {
        cluster_id: Some(args.cluster_id.unwrap_or_else(|| args.node_id.clone())),
        node_id: Some(args.node_id),
        ads_mode: if args.delta {
            AdsMode::Delta
        } else {
            AdsMode::StateOfTheWorld
        },
        admin: Admin {
            bind_address: args.admin_address,
            port: args.admin_port,
            ..Admin::default()
        },
        bootstrap_dir: out_dir.clone(),
        client_cert_dir: cert_dir,
        ..BootstrapOptions::new(args.xds_host, args.xds_port)
    };
    let bootstrap = render(&opts)?;
    bootstrap
        .write_to(&out_dir)
        .with_context(|| format!("writing into {}", out_dir.display()))?;
    for (name, _) in bootstrap.files() {
        println!("wrote {}", out_dir.join(name).display());
    }
    Ok(())
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))
}

/// Fails early, naming the file, if Envoy could not use the certificate folder.
fn check_certificates(dir: &Path) -> anyhow::Result<()> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let (cert, key, ca) = (read("tls.crt")?, read("tls.key")?, read("ca.crt")?);
    let file = |name: &str| dir.join(name).display().to_string();
    marin3r_certs::CertificateInfo::from_pem(&cert).with_context(|| file("tls.crt"))?;
    marin3r_certs::key_matches(&cert, &key)
        .with_context(|| format!("{} does not belong to {}", file("tls.key"), file("tls.crt")))?;
    if let Err(err) = marin3r_certs::verify_signed_by(&cert, &ca) {
        let err = marin3r_controller::chain(&err);
        bail!(
            "{} is not signed by {}: {err}",
            file("tls.crt"),
            file("ca.crt")
        );
    }
    Ok(())
}
