//! `demo`, run by `hack/demo`: tells marin3r's story step by step on a real cluster that runs
//! our images (`--kubeconfig`, which `hack/demo` passes after `hack/cluster up` and `hack/cluster
//! load`), then leaves it for a look around (or, with `--exit`, exits 0 only if every step
//! succeeded).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use marin3r_e2e::demo::{Demo, Narrator, find_repo};
use marin3r_testkit::kubectl::Kubectl;

#[derive(Debug, Parser)]
#[command(about = "marin3r's quick start on a real cluster")]
struct Args {
    /// Run the story once and exit: 0 only if every step succeeded.
    #[arg(long)]
    exit: bool,
    /// The marin3r binary pods and `proxy-status` run (default: MARIN3R_BIN, else the one
    /// built beside this demo).
    #[arg(long)]
    marin3r: Option<PathBuf>,
    /// Install from this rendered install.yaml (`hack/render-install -o FILE`) instead of
    /// `kubectl apply -k manifests/`.
    #[arg(long, value_name = "FILE")]
    install_yaml: Option<PathBuf>,
    /// marin3r is installed already (with helm, say): wait for it instead of installing.
    #[arg(long, conflicts_with = "install_yaml")]
    installed: bool,
    /// Seconds one step may take.
    #[arg(long, default_value_t = 90)]
    step_timeout: u64,
    /// Tell the story on the cluster of this kubeconfig (one that has the marin3r and Envoy
    /// images: `hack/cluster up`, `hack/cluster load`).
    #[arg(long, value_name = "PATH")]
    kubeconfig: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let repo = find_repo(&std::env::current_dir()?)?;
    tell(&args, repo, &args.kubeconfig).await
}

/// The story on a running cluster that has our images; it is left running, with what the
/// story made, for a look around.
async fn tell(
    args: &Args,
    repo: PathBuf,
    kubeconfig: &std::path::Path,
) -> anyhow::Result<std::process::ExitCode> {
    let kubeconfig = std::fs::canonicalize(kubeconfig)
        .with_context(|| format!("--kubeconfig {}", kubeconfig.display()))?;
    let marin3r = match &args.marin3r {
        Some(path) => {
            std::fs::canonicalize(path).with_context(|| format!("--marin3r {}", path.display()))?
        }
        None => marin3r_testkit::image::marin3r_bin()
            .context("no marin3r binary for proxy-status (cargo build -p marin3r-discovery)")?,
    };
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let demo = Demo {
        client: kube::Client::try_from(config)?,
        kubectl: Kubectl::new(&kubeconfig)?,
        kubeconfig: kubeconfig.clone(),
        repo,
        marin3r: marin3r.clone(),
        step_timeout: Duration::from_secs(args.step_timeout),
        install_yaml: match &args.install_yaml {
            Some(file) => Some(
                std::fs::canonicalize(file)
                    .with_context(|| format!("--install-yaml {}", file.display()))?,
            ),
            None => None,
        },
        installed: args.installed,
    };
    let mut n = Narrator::new();
    let interrupted = tokio::select! {
        () = demo.story(&mut n) => false,
        r = signal() => { r?; true }
    };
    summary(
        &n,
        interrupted,
        &format!(
            "kubectl --kubeconfig {} logs ... shows the containers' logs",
            kubeconfig.display()
        ),
    );
    if !args.exit && !interrupted {
        println!("{}", look_around(&kubeconfig, &marin3r));
    }
    Ok(if n.failed.is_empty() && !interrupted {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// The story's outcome: every step succeeded, interrupted, or how many failed and where
/// the containers' logs are (`logs`).
fn summary(n: &Narrator, interrupted: bool, logs: &str) {
    println!();
    if n.failed.is_empty() && !interrupted {
        println!("every step succeeded ({} steps)", n.passed);
    } else if interrupted {
        println!("interrupted");
    } else {
        println!("{} step(s) failed; {logs}", n.failed.len());
    }
}

/// The commands to look around the cluster the story left running.
fn look_around(kubeconfig: &std::path::Path, marin3r: &std::path::Path) -> String {
    format!(
        "\nThe cluster keeps running. Look around:\n\
         \x20 export KUBECONFIG={kc}\n\
         \x20 kubectl get envoyconfigs,envoyconfigrevisions,dsc -A\n\
         \x20 kubectl describe envoyconfig demo-proxy -n demo\n\
         \x20 kubectl logs -n demo deployment/demo -c envoy-sidecar\n\
         \x20 {m} proxy-status -n demo\n\
         \x20 curl http://<pod IP>:8080/   (kubectl get pods -A -o wide shows the IPs)",
        kc = kubeconfig.display(),
        m = marin3r.display(),
    )
}

async fn signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
        _ = term.recv() => {}
    }
    Ok(())
}
