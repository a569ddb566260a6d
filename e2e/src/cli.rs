//! The `marin3r` binary run as a user runs it, against a cluster's kubeconfig.

use std::path::Path;

/// `marin3r proxy-status --kubeconfig KUBECONFIG ARGS...`: its standard output, or an error
/// with both outputs when it fails.
pub async fn proxy_status(
    marin3r: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(marin3r)
        .args(["proxy-status", "--kubeconfig"])
        .arg(kubeconfig)
        .args(args)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "marin3r proxy-status {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}
