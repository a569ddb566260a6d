//! What ties the product to a real cluster (`hack/cluster`, or the one
//! `MARIN3R_E2E_KUBECONFIG` names): this build's images written by `hack/image` and loaded,
//! and marin3r installed from `manifests/` as the seed's journey does it.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use marin3r_testkit::cluster::Cluster;
use marin3r_testkit::tools;

/// The images of `hack/image` a scenario asks for (`marin3r`, `envoy`, `python`...), the
/// marin3r one holding this build's `marin3r` ([`crate::product::marin3r_bin`]), written (or
/// kept when unchanged) and loaded into the cluster; pods running an older marin3r image are
/// started again on this one. An attached cluster must have them already.
pub fn load_images(cluster: &Cluster, images: &[&str]) -> anyhow::Result<()> {
    if !cluster.is_local() {
        return Ok(());
    }
    let marin3r = crate::product::marin3r_bin()
        .context("no built marin3r for the image (cargo build -p marin3r-discovery)")?;
    let out = Command::new(tools::repo_root().join("hack/image"))
        .args(images)
        .arg("--marin3r")
        .arg(&marin3r)
        .output()
        .context("running hack/image")?;
    if !out.status.success() {
        bail!(
            "hack/image {images:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for archive in String::from_utf8_lossy(&out.stdout).lines() {
        cluster.load(&PathBuf::from(archive))?;
    }
    Ok(())
}

/// `kubectl apply -k manifests/`, then waits until the operator's Deployment has rolled out.
pub async fn install(cluster: &Cluster) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl()?;
    let manifests = tools::repo_root().join("manifests");
    kubectl
        .ok(&["apply", "-k", &manifests.to_string_lossy()])
        .await?;
    let mut last = String::new();
    for _ in 0..60 {
        let out = kubectl
            .run(&[
                "rollout",
                "status",
                "-n",
                "marin3r-system",
                "deployment/marin3r-operator",
                "--timeout=5s",
            ])
            .await?;
        if out.success {
            return Ok(());
        }
        last = out.stderr;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("the operator never rolled out: {last}")
}
