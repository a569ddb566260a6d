//! A real Envoy process for tests: started with a given bootstrap, its admin address found
//! through `--admin-address-path`, its log kept, and stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub struct Envoy {
    child: Child,
    admin: String,
    dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy with a bootstrap (YAML or JSON text) and waits until its admin interface
    /// answers. The bootstrap's admin address should use port 0; the real one is read back.
    pub fn start(bootstrap: &str, extra_args: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("marin3r-envoy-")
            .tempdir()?;
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(&config, bootstrap)?;
        Self::start_with_file(dir, &config, extra_args)
    }

    /// Starts Envoy with a bootstrap file that already exists (e.g. one `marin3r bootstrap`
    /// rendered); `dir` holds the log and is removed when the process is dropped.
    pub fn start_with_file(
        dir: tempfile::TempDir,
        config: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        let envoy = crate::tools::envoy()?;
        let admin_path = dir.path().join("admin-address");
        let log = std::fs::File::create(dir.path().join("envoy.log"))?;
        let child = Command::new(&envoy)
            .arg("-c")
            .arg(config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            // Several Envoys run at once in tests: no shared memory between them.
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", envoy.display()))?;
        let mut envoy = Self {
            child,
            admin: String::new(),
            dir,
        };
        envoy.admin = envoy.wait_for_admin(&admin_path, Duration::from_secs(30))?;
        Ok(envoy)
    }

    fn wait_for_admin(&mut self, path: &Path, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "envoy exited with {status} before its admin answered:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(addr) = std::fs::read_to_string(path) {
                let addr = addr.trim().to_owned();
                if !addr.is_empty() && ureq::get(format!("http://{addr}/ready")).call().is_ok() {
                    return Ok(addr);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "envoy admin did not answer within {timeout:?}:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `host:port` of the admin interface.
    pub fn admin_address(&self) -> &str {
        &self.admin
    }

    /// GETs an admin path (such as `/server_info`) and returns the body, whatever the status.
    pub fn admin_get(&self, path: &str) -> anyhow::Result<String> {
        get_body(&format!("http://{}{path}", self.admin))
    }

    /// The last lines of Envoy's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("envoy.log")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether Envoy has exited (asked to by its admin, say), without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GETs a plain-HTTP URL and returns the body whatever the status code.
/// `GET` or `POST` (empty body) `url`: the status code and the body, whatever the status.
pub fn request(method: &str, url: &str) -> anyhow::Result<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = match method {
        "GET" => agent.get(url).call(),
        "POST" => agent.post(url).send_empty(),
        other => anyhow::bail!("request: unsupported method {other}"),
    }
    .with_context(|| format!("{method} {url}"))?;
    let status = response.status().as_u16();
    Ok((status, response.body_mut().read_to_string()?))
}

pub fn get_body(url: &str) -> anyhow::Result<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let mut response = agent
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    Ok(response.body_mut().read_to_string()?)
}
