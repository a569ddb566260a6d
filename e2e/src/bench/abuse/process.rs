//! The `marin3r discovery-service` process the attacks are mounted against: started with
//! real TLS and its own ports on loopback, read from outside (its `/proc` memory, its
//! `/metrics`), and a sampler that keeps the peaks while an attack runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use marin3r_testkit::envoy::get_body;
use marin3r_testkit::ports::free_port;

use crate::bench::process_memory;

/// The release `marin3r` beside this benchmark binary (`MARIN3R_BIN` overrides it): the
/// attacks are measured against the build `hack/bench` made, not a debug one.
pub fn marin3r_beside_bench() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MARIN3R_BIN") {
        return Ok(PathBuf::from(path));
    }
    let bin = marin3r_testkit::image::beside_this_build("marin3r")
        .context("the benchmark binary has no folder")?;
    anyhow::ensure!(
        bin.is_file(),
        "{} not found: build it with `cargo build --release -p marin3r-discovery` \
         (hack/bench does), or set MARIN3R_BIN",
        bin.display()
    );
    Ok(bin)
}

/// A running discovery process; killed when dropped, and its temporary folder (where the judge
/// writes the configs it runs, left behind by a kill mid-judgment) removed with it.
pub struct Discovery {
    child: Child,
    _tmp: tempfile::TempDir,
    pub xds: SocketAddr,
    pub webhook: SocketAddr,
    metrics: u16,
    log: PathBuf,
}

impl Discovery {
    /// Starts `bin discovery-service` with the server certificate folder `certs` (tls.crt,
    /// tls.key, ca.crt), the API server of `kubeconfig` and `extra` flags (the limits), logging
    /// to `log`; returns once `/readyz` says ready.
    pub fn start(
        bin: &Path,
        certs: &Path,
        kubeconfig: &Path,
        log: PathBuf,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let (xds, metrics, webhook) = (free_port(), free_port(), free_port());
        let (probe, admin) = (free_port(), free_port());
        let log_file = std::fs::File::create(&log)?;
        let tmp = tempfile::Builder::new()
            .prefix("marin3r-bench-tmp-")
            .tempdir()?;
        let child = Command::new(bin)
            .args([
                "discovery-service",
                "--no-leader-election",
                "--server-cert-dir",
            ])
            .arg(certs)
            .args(["--bind-address", "127.0.0.1"])
            .args(["--xds-port", &xds.to_string()])
            .args(["--metrics-port", &metrics.to_string()])
            .args(["--webhook-port", &webhook.to_string()])
            .args(["--probe-port", &probe.to_string()])
            .args(["--admin-address", &format!("127.0.0.1:{admin}")])
            .args(["--shutdown-grace-period", "1", "--shutdown-delay", "0"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .env("TMPDIR", tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let process = Self {
            child,
            _tmp: tmp,
            xds: SocketAddr::from(([127, 0, 0, 1], xds)),
            webhook: SocketAddr::from(([127, 0, 0, 1], webhook)),
            metrics,
            log,
        };
        process.wait_ready(Duration::from_secs(30))?;
        Ok(process)
    }

    fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics);
        let deadline = Instant::now() + within;
        while get_body(&url).ok().as_deref() != Some("ready\n") {
            if Instant::now() > deadline {
                anyhow::bail!(
                    "the discovery service was not ready within {within:?}; its log:\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A `/proc/<pid>/status` memory field in bytes (`VmRSS`, `VmHWM`).
    pub fn memory(&self, field: &str) -> anyhow::Result<u64> {
        process_memory(self.pid(), field)
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> anyhow::Result<String> {
        get_body(&format!("http://127.0.0.1:{}/metrics", self.metrics))
    }

    /// Starts sampling the process's RSS every 20 ms and, if given, the gauge `series` of its
    /// metrics every 250 ms, until [`Sampler::stop`].
    pub fn sample(&self, series: Option<&'static str>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let (pid, port, flag) = (self.pid(), self.metrics, stop.clone());
        let thread = std::thread::spawn(move || {
            let url = format!("http://127.0.0.1:{port}/metrics");
            let mut peaks = Peaks::default();
            let mut last_scrape: Option<Instant> = None;
            while !flag.load(Ordering::Relaxed) {
                if let Ok(rss) = process_memory(pid, "VmRSS") {
                    peaks.rss = peaks.rss.max(rss);
                }
                let due = last_scrape.is_none_or(|t| t.elapsed() >= Duration::from_millis(250));
                if let Some(series) = series.filter(|_| due) {
                    last_scrape = Some(Instant::now());
                    let value = get_body(&url).ok().and_then(|t| metric(&t, series));
                    peaks.gauge = peaks.gauge.max(value.unwrap_or(0.0));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peaks
        });
        Sampler { stop, thread }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The highest values a [`Sampler`] saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Peaks {
    /// VmRSS, bytes.
    pub rss: u64,
    /// The sampled metric.
    pub gauge: f64,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Peaks>,
}

impl Sampler {
    pub fn stop(self) -> Peaks {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The value of one series (`name` or `name{labels}`, as exposed) in Prometheus text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Every series of `family` with a non-zero value, as `label=value` (the label values of the
/// series, which `marin3r_*_total{limit=...}` families have one of), joined by commas.
pub fn nonzero_by_label(text: &str, family: &str) -> String {
    let found: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix(family)?.strip_prefix('{'))
        .filter_map(|rest| {
            let (labels, value) = rest.split_once("} ")?;
            let value: f64 = value.trim().parse().ok()?;
            let label = labels.split_once('=')?.1.trim_matches('"');
            (value > 0.0).then(|| format!("{label}={value}"))
        })
        .collect();
    match found.is_empty() {
        true => "none".to_owned(),
        false => found.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x y\n\
        marin3r_xds_subscription_bytes 4096\n\
        marin3r_xds_refused_streams_total{limit=\"name_size\"} 1\n\
        marin3r_xds_refused_streams_total{limit=\"request_size\"} 0\n\
        marin3r_xds_refused_streams_total{limit=\"subscription_bytes_per_namespace\"} 3\n";

    #[test]
    fn series_are_read_from_prometheus_text() {
        assert_eq!(metric(TEXT, "marin3r_xds_subscription_bytes"), Some(4096.0));
        assert_eq!(metric(TEXT, "marin3r_xds_subscription"), None);
        assert_eq!(
            nonzero_by_label(TEXT, "marin3r_xds_refused_streams_total"),
            "name_size=1, subscription_bytes_per_namespace=3"
        );
        assert_eq!(
            nonzero_by_label(TEXT, "marin3r_webhook_refused_total"),
            "none"
        );
    }
}
