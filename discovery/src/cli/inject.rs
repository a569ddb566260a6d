//! `marin3r inject -f FILE`: the webhook's mutation applied offline to Pods and to the pod
//! templates of workloads, printed as YAML; a denial is an error naming the annotation.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use marin3r_webhook::{InjectionConfig, inject_yaml};

#[derive(Debug, Args)]
pub struct InjectArgs {
    /// YAML file with Pods or workloads (Deployment, StatefulSet, DaemonSet, ReplicaSet,
    /// ReplicationController, Job, CronJob); `-` reads standard input. Other documents are
    /// printed unchanged.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// The Envoy image used when a pod does not set marin3r.3scale.net/envoy-image.
    #[arg(long, value_name = "IMAGE", default_value = marin3r_webhook::config::DEFAULT_ENVOY_IMAGE)]
    envoy_image: String,
    /// The shutdown manager image used when a pod enables it without
    /// marin3r.3scale.net/shutdown-manager.image.
    #[arg(long, value_name = "IMAGE", default_value = crate::IMAGE)]
    shutdown_manager_image: String,
    /// Inject Envoy as a native sidecar (an init container with restartPolicy Always,
    /// Kubernetes 1.29+) unless a pod sets marin3r.3scale.net/native-sidecar: what a
    /// DiscoveryService does on such a cluster. Without it, the classic layout.
    #[arg(long)]
    native_sidecars: bool,
    /// In the classic layout, start the applications once Envoy is ready unless a pod sets
    /// marin3r.3scale.net/hold-application-until-proxy-starts.
    #[arg(long)]
    hold_application_until_proxy_starts: bool,
}

pub fn run(args: InjectArgs) -> anyhow::Result<ExitCode> {
    let input = if args.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let config = InjectionConfig {
        envoy_image: args.envoy_image,
        shutdown_manager_image: args.shutdown_manager_image,
        native_sidecars: args.native_sidecars,
        hold_application: args.hold_application_until_proxy_starts,
        ..InjectionConfig::default()
    };
    let injected =
        inject_yaml(&input, &config).with_context(|| format!("{}", args.file.display()))?;
    for note in &injected.notes {
        eprintln!("note: {note}");
    }
    std::io::stdout()
        .lock()
        .write_all(injected.yaml.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
