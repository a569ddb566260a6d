//! Running the real kubectl against a cluster's kubeconfig, as a user would.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

/// kubectl bound to one kubeconfig, with a private HOME (so no cache is shared between tests).
pub struct Kubectl {
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

/// What one kubectl run printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            kubeconfig: kubeconfig.to_path_buf(),
            home: tempfile::tempdir()?,
        })
    }

    /// A kubectl command with the kubeconfig and HOME set; killed when dropped.
    pub fn command(&self, args: &[&str]) -> anyhow::Result<Command> {
        let mut cmd = Command::new(crate::tools::kubectl()?);
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .stdin(Stdio::piped())
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Runs kubectl with `stdin` (30 s at most).
    pub async fn run_with(&self, args: &[&str], stdin: &str) -> anyhow::Result<Output> {
        let mut child = self
            .command(args)?
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl")?;
        if let Some(mut input) = child.stdin.take() {
            use tokio::io::AsyncWriteExt;
            input.write_all(stdin.as_bytes()).await?;
        }
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .with_context(|| format!("kubectl {args:?} did not finish within 30 s"))??;
        Ok(Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    pub async fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.run_with(args, "").await
    }

    /// Runs kubectl and fails, with its output, unless it succeeds; returns stdout.
    pub async fn ok_with(&self, args: &[&str], stdin: &str) -> anyhow::Result<String> {
        let out = self.run_with(args, stdin).await?;
        if !out.success {
            bail!("kubectl {args:?} failed:\n{}\n{}", out.stdout, out.stderr);
        }
        Ok(out.stdout)
    }

    pub async fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        self.ok_with(args, "").await
    }
}
