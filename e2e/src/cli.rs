//! The `marin3r` binary run as a user runs it, against a cluster's kubeconfig.

use std::path::Path;

/// `marin3r proxy-status --kubeconfig KUBECONFIG ARGS...`: its standard output, or an error
/// with both outputs when it fails.
pub async fn proxy_status(
    marin3r: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> anyhow::Result<String> {
    command(marin3r, "proxy-status", kubeconfig, args).await
}

/// `marin3r version --kubeconfig KUBECONFIG ARGS...`, as [`proxy_status`].
pub async fn version(marin3r: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    command(marin3r, "version", kubeconfig, args).await
}

async fn command(
    marin3r: &Path,
    subcommand: &str,
    kubeconfig: &Path,
    args: &[&str],
) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(marin3r)
        .args([subcommand, "--kubeconfig"])
        .arg(kubeconfig)
        .args(args)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "marin3r {subcommand} {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}
