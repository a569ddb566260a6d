//! xDS convergence under load: N simulated Envoys, each its own mTLS connection and ADS
//! stream (state of the world or delta, one table row per protocol), subscribed like Envoy (CDS and LDS wildcard, EDS and RDS by name, the RTDS layer)
//! and ACKing every response; one realistic configuration (~100 KB) shared by all of them,
//! as the replicas of one Deployment share a node id. Measures, per snapshot change, the time
//! until each stream ACKed it (p50/p99/max over streams, and until all did), the server's CPU
//! seconds per push, and its peak RSS per stream. The server runs as a child process (this
//! binary with `--xds-bench-server`) so its CPU and memory are its own. Beside every row, the
//! same push served by a writer of nothing but TLS and HTTP/2 ([`super::xds_bound`], this
//! binary with `--xds-bound-server`) gives the bound the server's CPU per stream is measured
//! against.
//!
//! Every simulated Envoy is a proxy of one namespace, with the limits a user sets for a
//! namespace of that many proxies: `--xds-max-connections-per-namespace` and
//! `--xds-max-streams-per-namespace` raised to it (docs/operations.md), read through the
//! product's own flags.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use marin3r_certs::{
    CertificateAuthority, CertificateRequest, Usage, issue_self_signed, spiffe_id,
};
use marin3r_discovery::cli::XdsLimitArgs;
use marin3r_xds::resource::ResourceType;
use marin3r_xds::{Cache, Limits, Server, Snapshot, TlsFiles, server_config};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{Semaphore, mpsc};

use super::{Row, Stats, human};
use marin3r_testkit::xds::client::{ClientTls, DeltaStream, SotwStream, connect};
use marin3r_testkit::xds::resources::realistic_config;

const NAMESPACE: &str = "bench";
const NODE: &str = "bench-node";

/// The types the simulated Envoys subscribe to, with the names they ask for.
fn subscriptions() -> Vec<(ResourceType, Vec<String>)> {
    let named = |prefix: &str| (0..50).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    vec![
        (ResourceType::Cluster, vec![]),
        (ResourceType::Endpoint, named("cluster")),
        (ResourceType::Listener, vec![]),
        (ResourceType::Route, named("route")),
        (ResourceType::Runtime, vec!["runtime".into()]),
    ]
}

/// The types the simulated Envoys subscribe to.
pub(super) fn subscribed_kinds() -> Vec<ResourceType> {
    subscriptions().into_iter().map(|(k, _)| k).collect()
}

pub(super) fn snapshot(generation: u64) -> anyhow::Result<Snapshot> {
    Ok(Snapshot::new(realistic_config(generation))?)
}

/// The limits of `marin3r discovery-service` run with the flags docs/operations.md gives a
/// namespace of `proxies` proxies (the defaults are 4,096 of each).
fn limits_for(proxies: usize) -> anyhow::Result<Limits> {
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        xds: XdsLimitArgs,
    }
    let n = proxies.to_string();
    let flags = <Flags as clap::Parser>::try_parse_from([
        "marin3r",
        "--xds-max-connections-per-namespace",
        &n,
        "--xds-max-streams-per-namespace",
        &n,
    ])?;
    Ok(flags.xds.limits())
}

/// The body of the child process: serves ADS on an ephemeral port with the TLS files in
/// `dir` to `proxies` proxies of one namespace, prints `ready <addr>`, then obeys
/// `set <generation>` and `quit` lines on stdin.
pub fn run_server(dir: &Path, proxies: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let tls = server_config(&TlsFiles::in_dir(dir))?;
        let cache = Cache::new();
        cache.set_snapshot(NAMESPACE, NODE, snapshot(0)?);
        let (server, _nacks) = Server::builder(cache.clone())
            .limits(limits_for(proxies)?)
            .build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let serve = tokio::spawn(server.serve(listener, tls, async {
            let _ = stop_rx.await;
        }));
        println!("ready {addr}");
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["set", g] => {
                    cache.set_snapshot(NAMESPACE, NODE, snapshot(g.parse()?)?);
                    println!("set {g}");
                }
                ["quit"] => break,
                _ => bail!("unknown command {line:?}"),
            }
        }
        let _ = stop_tx.send(());
        serve.await??;
        Ok(())
    })
}

struct ServerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: SocketAddr,
}

/// Which server a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// marin3r's xDS server.
    Product,
    /// The minimal writer of [`super::xds_bound`].
    Bound,
}

impl ServerProcess {
    fn start(writer: Writer, dir: &Path, proxies: usize) -> anyhow::Result<Self> {
        // `MARIN3R_BENCH_SERVER_WRAPPER="heaptrack -o /tmp/xds"` profiles the product's
        // server (`MARIN3R_BENCH_BOUND_WRAPPER` the bound's).
        let variable = match writer {
            Writer::Product => "MARIN3R_BENCH_SERVER_WRAPPER",
            Writer::Bound => "MARIN3R_BENCH_BOUND_WRAPPER",
        };
        let wrapper = std::env::var(variable).unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let exe = std::env::current_exe()?;
        let mut command = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        match writer {
            Writer::Product => command
                .arg("--xds-bench-server")
                .arg(dir)
                .args(["--xds-bench-proxies", &proxies.to_string()]),
            Writer::Bound => command.arg("--xds-bound-server").arg(dir),
        };
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the xDS bench server")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        // A profiler wrapping the server may print lines of its own first.
        let mut line = String::new();
        for _ in 0..50 {
            line.clear();
            if stdout.read_line(&mut line)? == 0 || line.starts_with("ready ") {
                break;
            }
        }
        let addr = line
            .strip_prefix("ready ")
            .context("the bench server did not start")?
            .trim()
            .parse()?;
        Ok(Self {
            child,
            stdin,
            stdout,
            addr,
        })
    }

    fn command(&mut self, cmd: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(
            line.trim() == cmd,
            "bench server answered {line:?} to {cmd:?}"
        );
        Ok(())
    }

    /// User plus system CPU seconds so far.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("bad /proc stat")?
            .1
            .split_whitespace()
            .collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in
        // clock ticks of 1/100 s on Linux.
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / 100.0)
    }

    /// A `/proc/<pid>/status` field in bytes (`VmRSS`, `VmHWM`).
    fn memory(&self, field: &str) -> anyhow::Result<u64> {
        super::process_memory(self.child.id(), field)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One ACK seen by a simulated Envoy.
struct Acked {
    stream: usize,
    kind: ResourceType,
    version: String,
    at: Instant,
}

/// Which ADS flavour the simulated Envoys speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    Sotw,
    Delta,
}

impl Protocol {
    fn label(self) -> &'static str {
        match self {
            Self::Sotw => "SotW",
            Self::Delta => "delta",
        }
    }
}

/// What a simulated Envoy reads of a response, state of the world or delta (both messages
/// number these fields alike): its version, type and nonce; the resources are skipped. The
/// clients share the machine's two cores with the server; decoding every resource of every
/// response (as Envoy does, on its own machine) would time the clients as much as the server.
#[derive(Clone, PartialEq, prost::Message)]
struct Reply {
    /// `version_info`, or delta's `system_version_info`.
    #[prost(string, tag = "1")]
    version: String,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
}

/// Runs one simulated Envoy until its stream ends. At most `connecting` of them connect and
/// subscribe at once; then each ACKs every response and reports it on `acks`.
async fn simulated_envoy(
    protocol: Protocol,
    index: usize,
    addr: SocketAddr,
    tls: ClientTls,
    acks: mpsc::UnboundedSender<Acked>,
    connecting: Arc<Semaphore>,
) -> anyhow::Result<()> {
    let permit = connecting.acquire_owned().await?;
    let channel = connect(addr, &tls).await?;
    let pod = format!("pod-{index}");
    let report = move |type_url: &str, version: String| {
        if let Some(kind) = ResourceType::from_type_url(type_url) {
            let _ = acks.send(Acked {
                stream: index,
                kind,
                version,
                at: Instant::now(),
            });
        }
    };
    match protocol {
        Protocol::Sotw => {
            let mut stream = SotwStream::<Reply>::open_as(channel, NODE, Some(&pod)).await?;
            let subs: HashMap<String, Vec<String>> = subscriptions()
                .into_iter()
                .map(|(k, names)| (k.type_url().to_owned(), names))
                .collect();
            for (kind, names) in subscriptions() {
                stream.subscribe(kind.type_url(), &names).await?;
            }
            drop(permit);
            while let Ok(resp) = stream.recv().await {
                let names = subs.get(&resp.type_url).cloned().unwrap_or_default();
                stream
                    .send(&resp.type_url, &names, &resp.version, &resp.nonce, None)
                    .await?;
                report(&resp.type_url, resp.version);
            }
        }
        // As Envoy runs delta: one request per type naming what it subscribes to (an empty
        // list is the wildcard), then an ACK (the nonce) for every response; the version is
        // the response's `system_version_info`, the type's version.
        Protocol::Delta => {
            let mut stream = DeltaStream::<Reply>::open_as(channel, NODE, Some(&pod)).await?;
            for (kind, names) in subscriptions() {
                stream
                    .send(
                        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
                            type_url: kind.type_url().to_owned(),
                            resource_names_subscribe: names,
                            ..Default::default()
                        },
                    )
                    .await?;
            }
            drop(permit);
            while let Ok(resp) = stream.recv().await {
                stream.ack_nonce(&resp.type_url, &resp.nonce).await?;
                report(&resp.type_url, resp.version);
            }
        }
    }
    Ok(())
}

/// Tracks which streams have ACKed a target set of versions.
struct Convergence {
    acked: Vec<HashMap<ResourceType, String>>,
    target: HashMap<ResourceType, String>,
    done: Vec<Option<Instant>>,
    remaining: usize,
}

impl Convergence {
    fn new(n: usize) -> Self {
        Self {
            acked: vec![HashMap::new(); n],
            target: HashMap::new(),
            done: vec![None; n],
            remaining: n,
        }
    }

    fn retarget(&mut self, snapshot: &Snapshot) {
        self.target = subscriptions()
            .into_iter()
            .map(|(k, _)| (k, snapshot.version(k).to_owned()))
            .collect();
        self.done = vec![None; self.acked.len()];
        self.remaining = self.acked.len();
        for i in 0..self.acked.len() {
            self.check(i, Instant::now());
        }
    }

    fn check(&mut self, i: usize, at: Instant) {
        if self.done[i].is_none()
            && self
                .target
                .iter()
                .all(|(k, v)| self.acked[i].get(k) == Some(v))
        {
            self.done[i] = Some(at);
            self.remaining -= 1;
        }
    }

    fn record(&mut self, a: Acked) {
        self.acked[a.stream].insert(a.kind, a.version);
        self.check(a.stream, a.at);
    }

    async fn wait(
        &mut self,
        rx: &mut mpsc::UnboundedReceiver<Acked>,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.remaining > 0 {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(a)) => self.record(a),
                Ok(None) => bail!("every simulated Envoy stopped"),
                Err(_) => bail!(
                    "{} streams did not converge within {timeout:?}",
                    self.remaining
                ),
            }
        }
        Ok(())
    }
}

/// The numbers of one run at one N.
struct RunResult {
    per_stream: Vec<Duration>,
    all_acked: Vec<Duration>,
    cpu_per_push: Vec<f64>,
    idle_rss_per_stream: f64,
    rss_per_stream: f64,
    steady_rss_per_stream: f64,
    peak_rss: u64,
    connect_time: Duration,
}

fn run_at(
    writer: Writer,
    protocol: Protocol,
    n: usize,
    pushes: u64,
    dir: &Path,
    tls: &ClientTls,
) -> anyhow::Result<RunResult> {
    let mut server = ServerProcess::start(writer, dir, n)?;
    let baseline_rss = server.memory("VmRSS")?;
    let rt = tokio::runtime::Runtime::new()?;
    let (acks_tx, mut acks) = mpsc::unbounded_channel();
    let connecting = Arc::new(Semaphore::new(128));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        tasks.push(rt.spawn(simulated_envoy(
            protocol,
            i,
            server.addr,
            tls.clone(),
            acks_tx.clone(),
            Arc::clone(&connecting),
        )));
    }
    drop(acks_tx);
    let mut conv = Convergence::new(n);
    conv.retarget(&snapshot(0)?);
    rt.block_on(conv.wait(&mut acks, Duration::from_secs(600)))
        .context("initial configuration")?;
    let connect_time = started.elapsed();
    // Idle: every stream connected and synced, nothing in flight (after a moment for the
    // last ACKs and any freed memory to settle).
    std::thread::sleep(Duration::from_secs(2));
    let idle_rss = server.memory("VmRSS")?;

    let mut result = RunResult {
        per_stream: Vec::new(),
        all_acked: Vec::new(),
        cpu_per_push: Vec::new(),
        idle_rss_per_stream: idle_rss.saturating_sub(baseline_rss) as f64 / n as f64,
        rss_per_stream: 0.0,
        steady_rss_per_stream: 0.0,
        peak_rss: 0,
        connect_time,
    };
    for generation in 1..=pushes {
        let next = snapshot(generation)?;
        let cpu_before = server.cpu_seconds()?;
        let t0 = Instant::now();
        server.command(&format!("set {generation}"))?;
        conv.retarget(&next);
        rt.block_on(conv.wait(&mut acks, Duration::from_secs(300)))
            .with_context(|| format!("push {generation}"))?;
        let times: Vec<Duration> = conv.done.iter().flatten().map(|t| *t - t0).collect();
        result
            .all_acked
            .push(times.iter().max().copied().unwrap_or_default());
        result.per_stream.extend(times);
        result.cpu_per_push.push(server.cpu_seconds()? - cpu_before);
    }
    let peak = server.memory("VmHWM")?;
    result.peak_rss = peak;
    result.rss_per_stream = peak.saturating_sub(baseline_rss) as f64 / n as f64;
    std::thread::sleep(Duration::from_secs(2));
    let steady = server.memory("VmRSS")?;
    result.steady_rss_per_stream = steady.saturating_sub(baseline_rss) as f64 / n as f64;
    drop(server);
    for t in tasks {
        t.abort();
    }
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(result)
}

/// How many streams the file-descriptor limit allows (each process holds one socket per
/// stream, plus some slack).
fn fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| {
            l.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(1024)
}

/// Runs the benchmark at N = 100, 2,000 and 10,000 (up to `max_streams`, and when the fd
/// limit allows) for each of `protocols`, each N first against the bound then against the
/// product; `scale` multiplies the number of pushes per N.
pub fn convergence(
    scale: f64,
    max_streams: usize,
    protocols: &[Protocol],
) -> anyhow::Result<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("marin3r-xds-bench-")
        .tempdir()?;
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("bench-ca", day))?;
    let ca = CertificateAuthority::from_issued(&ca)?;
    let server_cert = ca
        .issue(&CertificateRequest::new("marin3r", Usage::Server, day).with_hosts(["127.0.0.1"]))?;
    let client = ca.issue(
        &CertificateRequest::new("envoy", Usage::Client, day)
            .with_hosts([spiffe_id("cluster.local", NAMESPACE)]),
    )?;
    std::fs::write(dir.path().join("tls.crt"), &server_cert.cert_pem)?;
    std::fs::write(dir.path().join("tls.key"), &server_cert.key_pem)?;
    std::fs::write(dir.path().join("ca.crt"), ca.cert_pem())?;
    let tls = ClientTls {
        ca_pem: ca.cert_pem().to_owned(),
        identity: Some((client.cert_pem, client.key_pem)),
        server_name: "127.0.0.1".into(),
    };

    let config = snapshot(0)?;
    let size: usize = ResourceType::ALL
        .iter()
        .flat_map(|k| config.of_type(*k).resources().values())
        .map(|r| r.resource.body.len())
        .sum();
    let pushed: usize = [ResourceType::Route, ResourceType::Runtime]
        .iter()
        .flat_map(|k| config.of_type(*k).resources().values())
        .map(|r| r.resource.body.len())
        .sum();

    let limit = fd_limit();
    let mut rows = Vec::new();
    let runs = protocols.iter().copied().flat_map(|p| {
        [(100usize, 20u64), (2_000, 10), (10_000, 3)]
            .into_iter()
            .map(move |(n, pushes)| (p, n, pushes))
    });
    for (protocol, n, base_pushes) in runs {
        if n > max_streams {
            continue;
        }
        if n + 512 > limit {
            rows.push(Row {
                benchmark: format!("xDS convergence ({})", protocol.label()),
                case: format!("N={n}"),
                samples: 0,
                result: format!("skipped: the open-file limit is {limit}"),
            });
            continue;
        }
        let pushes = ((base_pushes as f64 * scale).round() as u64).max(1);
        let run = |writer| {
            run_at(writer, protocol, n, pushes, dir.path(), &tls)
                .with_context(|| format!("{} N={n} ({writer:?})", protocol.label()))
        };
        let bound = run(Writer::Bound)?;
        let product = run(Writer::Product)?;
        let bound_per_stream = bound.cpu_per_stream(n);
        for (writer, r) in [(Writer::Bound, &bound), (Writer::Product, &product)] {
            let against = match writer {
                Writer::Bound => "the bound".to_owned(),
                Writer::Product => format!(
                    "{:.2}x the bound",
                    r.cpu_per_stream(n) / bound_per_stream.max(f64::MIN_POSITIVE)
                ),
            };
            rows.push(row(writer, protocol, n, r, &against, (size, pushed))?);
        }
    }
    Ok(rows)
}

impl RunResult {
    /// Mean server CPU seconds per push.
    fn cpu(&self) -> f64 {
        self.cpu_per_push.iter().sum::<f64>() / self.cpu_per_push.len().max(1) as f64
    }

    /// Mean server CPU seconds per stream per push.
    fn cpu_per_stream(&self, n: usize) -> f64 {
        self.cpu() / n.max(1) as f64
    }
}

fn row(
    writer: Writer,
    protocol: Protocol,
    n: usize,
    r: &RunResult,
    against: &str,
    (size, pushed): (usize, usize),
) -> anyhow::Result<Row> {
    let s = Stats::of(&r.per_stream).context("no samples")?;
    let all = Stats::of(&r.all_acked).context("no samples")?;
    let what = match writer {
        Writer::Product => "xDS convergence",
        Writer::Bound => "xDS push bound (TLS + HTTP/2 only)",
    };
    Ok(Row {
        benchmark: format!(
            "{what} ({}, mTLS, one push = routes + runtime changed)",
            protocol.label()
        ),
        case: format!(
            "N={n}, config {} KB, {} KB pushed per stream",
            size / 1000,
            pushed / 1000
        ),
        samples: r.per_stream.len(),
        result: format!(
            "per stream p50 {}, p99 {}, max {}; all {n} ACKed: median {}, max {}; \
             server CPU {:.3} s/push, {:.1} µs per stream ({against}); server RSS per \
             stream: idle {:.1} KiB, peak {:.1} KiB, idle after the pushes {:.1} KiB; peak RSS \
             {}; {n} streams connected and synced in {}",
            human(s.p50),
            human(s.p99),
            human(s.max),
            human(all.p50),
            human(all.max),
            r.cpu(),
            r.cpu_per_stream(n) * 1e6,
            r.idle_rss_per_stream / 1024.0,
            r.rss_per_stream / 1024.0,
            r.steady_rss_per_stream / 1024.0,
            super::mib(r.peak_rss),
            human(r.connect_time),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_namespace_is_served_with_the_two_caps_raised_and_the_rest_default() {
        let limits = limits_for(10_000).unwrap();
        assert_eq!(
            (
                limits.max_connections_per_namespace,
                limits.max_streams_per_namespace
            ),
            (10_000, 10_000)
        );
        assert_eq!(
            Limits {
                max_connections_per_namespace: Limits::default().max_connections_per_namespace,
                max_streams_per_namespace: Limits::default().max_streams_per_namespace,
                ..limits
            },
            Limits::default()
        );
    }
}
