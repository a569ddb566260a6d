//! N2: HTTP/2 connections to the webhook, which anyone reaching its port may open, each
//! always busy with a request whose body never ends (a new one every 2 s, as the review's
//! script did, so the connection is never idle), reconnecting a second after the server
//! closes it; from one client address, then from several. Meanwhile valid AdmissionReviews
//! come from another address (the API server's), each on a new connection, and are timed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use marin3r_testkit::webhook::{SlowH2, TlsClient, h2_from, slow_review};

use super::process::{Discovery, nonzero_by_label};
use super::{ADMISSION_P99_GOAL, Goals, Setup, WEBHOOK_HOST};
use crate::bench::{Row, Stats, human, mib};

/// The API server's address; the attackers' are 127.0.0.1 and 127.0.0.3 onwards.
const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const NEW_SLOW_REQUEST_EVERY: Duration = Duration::from_secs(2);
const RECONNECT_AFTER: Duration = Duration::from_secs(1);
const REVIEW_EVERY: Duration = Duration::from_millis(200);
const REVIEW_TIMEOUT: Duration = Duration::from_secs(15);

fn attacker(i: usize) -> IpAddr {
    let last = if i == 0 { 1 } else { i + 2 };
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last.min(254) as u8))
}

pub(super) fn run(setup: &Setup, scale: f64, goals: &mut Goals) -> anyhow::Result<Vec<Row>> {
    let scaled = |n: f64| ((n * scale).round() as usize).max(4);
    let reviews = ((50.0 * scale).round() as usize).max(10);
    let several = several_addresses_work();
    let cases = [(1, scaled(256.0)), (4, scaled(64.0)), (8, scaled(64.0))];
    let mut rows = Vec::new();
    for (addresses, per_address) in cases {
        let label = match addresses {
            1 => format!("N2 1 address × {per_address} connections"),
            n => format!("N2 {n} addresses × {per_address} connections"),
        };
        if addresses > 1 && !several {
            rows.push(Row {
                benchmark: "N2: slow-body connections to the webhook".into(),
                case: label,
                samples: 0,
                result: "skipped: this machine does not route 127.0.0.3 to loopback".into(),
            });
            continue;
        }
        let name = format!("n2-{addresses}x{per_address}");
        let process = setup.discovery(&name, &[])?;
        let m = measure(setup, &process, addresses, per_address, reviews)
            .with_context(|| label.clone())?;
        let answered = m.latencies.len();
        let p99 = Stats::of(&m.latencies).map(|s| s.p99);
        goals.check(
            &label,
            "valid admissions p99 < 1 s, every one answered",
            format!(
                "{answered}/{reviews} answered, p99 {}",
                p99.map_or("-".into(), human)
            ),
            answered == reviews && p99.is_some_and(|p| p < ADMISSION_P99_GOAL),
        );
        let budget = ("no byte budget: the webhook has none", 0);
        goals.rss(&label, budget, m.baseline_rss, m.peak_rss);
        rows.push(m.row(addresses, per_address, reviews));
    }
    Ok(rows)
}

/// The valid reviews' answers against the goal: (all answered and p99 under the goal, what
/// was measured, for a row and a goal).
pub(super) fn admissions(results: &[Result<Duration, String>]) -> (bool, String) {
    let latencies: Vec<Duration> = results.iter().filter_map(|r| r.clone().ok()).collect();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let stats = Stats::of(&latencies);
    let p99 = stats.as_ref().map(|s| s.p99);
    let measured = format!(
        "{}/{} answered, {}{}",
        latencies.len(),
        results.len(),
        stats.map_or("none answered".into(), |s| format!(
            "p50 {}, p99 {}, max {}",
            human(s.p50),
            human(s.p99),
            human(s.max)
        )),
        match failed.first() {
            Some(f) => format!(" ({} failed, first: {f})", failed.len()),
            None => String::new(),
        }
    );
    let met = failed.is_empty() && p99.is_some_and(|p| p < ADMISSION_P99_GOAL);
    (met, measured)
}

/// Whether a socket can be bound to 127.0.0.3 (Linux routes all of 127/8 to loopback).
fn several_addresses_work() -> bool {
    std::net::TcpListener::bind((attacker(1), 0)).is_ok()
}

/// What the attacking connections saw, counted as they go.
#[derive(Default)]
struct Tally {
    attempts: AtomicUsize,
    connected: AtomicUsize,
    open: AtomicUsize,
    max_open: AtomicUsize,
    slow_requests: AtomicUsize,
    status_408: AtomicUsize,
    status_429: AtomicUsize,
    unanswered: AtomicUsize,
}

impl Tally {
    fn get(n: &AtomicUsize) -> usize {
        n.load(Ordering::Relaxed)
    }

    fn answered(&self, status: Option<u16>) {
        let counter = match status {
            Some(408) => &self.status_408,
            Some(429) => &self.status_429,
            _ => &self.unanswered,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn summary(&self) -> String {
        format!(
            "{} connections opened ({} attempts), at most {} open at once as they saw it (a \
             closed connection is noticed at its next request, within 2 s); {} slow requests: \
             {} got 408, {} got 429, {} dropped with their connection or still open",
            Self::get(&self.connected),
            Self::get(&self.attempts),
            Self::get(&self.max_open),
            Self::get(&self.slow_requests),
            Self::get(&self.status_408),
            Self::get(&self.status_429),
            Self::get(&self.unanswered),
        )
    }
}

/// One attacking connection, forever: connect, keep it busy until the server closes it,
/// reconnect a second later.
async fn hold_a_slot(tls: TlsClient, from: IpAddr, addr: SocketAddr, tally: Arc<Tally>) {
    loop {
        tally.attempts.fetch_add(1, Ordering::Relaxed);
        if let Ok(send) = h2_from(&tls, Some(from), addr).await {
            tally.connected.fetch_add(1, Ordering::Relaxed);
            let open = tally.open.fetch_add(1, Ordering::Relaxed) + 1;
            tally.max_open.fetch_max(open, Ordering::Relaxed);
            keep_busy(send, &tally).await;
            tally.open.fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// A new slow request every [`NEW_SLOW_REQUEST_EVERY`] while the connection lasts.
async fn keep_busy(mut send: SlowH2, tally: &Arc<Tally>) {
    loop {
        if send.ready().await.is_err() {
            return;
        }
        let pending = slow_review(&mut send, WEBHOOK_HOST);
        tally.slow_requests.fetch_add(1, Ordering::Relaxed);
        let t = tally.clone();
        tokio::spawn(async move { t.answered(pending.await.ok().flatten()) });
        tokio::time::sleep(NEW_SLOW_REQUEST_EVERY).await;
        if send.is_closed() {
            return;
        }
    }
}

struct Measured {
    latencies: Vec<Duration>,
    failures: Vec<String>,
    baseline_rss: u64,
    peak_rss: u64,
    attack: String,
    refusals: String,
}

impl Measured {
    fn row(&self, addresses: usize, per_address: usize, reviews: usize) -> Row {
        let stats = Stats::of(&self.latencies).map_or("none answered".into(), |s| {
            format!(
                "p50 {}, p99 {}, max {}",
                human(s.p50),
                human(s.p99),
                human(s.max)
            )
        });
        let from = match addresses {
            1 => "127.0.0.1".to_owned(),
            n => format!(
                "{n} addresses (127.0.0.1, 127.0.0.3 to 127.0.0.{}), {per_address} each",
                n + 1
            ),
        };
        Row {
            benchmark: "N2: slow-body HTTP/2 connections to the webhook".into(),
            case: format!(
                "{} connections from {from}; each starts a slow body every 2 s",
                addresses * per_address
            ),
            samples: reviews,
            result: format!(
                "valid reviews from 127.0.0.2 on new connections: {}/{reviews} answered, {stats}{}; \
                 server RSS {} before, peak {} (VmHWM); attackers: {}; webhook refusals: {}",
                self.latencies.len(),
                match self.failures.first() {
                    Some(f) => format!(" ({} failed, first: {f})", self.failures.len()),
                    None => String::new(),
                },
                mib(self.baseline_rss),
                mib(self.peak_rss),
                self.attack,
                self.refusals,
            ),
        }
    }
}

fn measure(
    setup: &Setup,
    process: &Discovery,
    addresses: usize,
    per_address: usize,
    reviews: usize,
) -> anyhow::Result<Measured> {
    let ca = setup.pki.ca_pem();
    let baseline_rss = process.memory("VmRSS")?;
    let sampler = process.sample(None);
    let attack_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let tally = Arc::new(Tally::default());
    let h2 = TlsClient::new(ca, WEBHOOK_HOST, &[b"h2"])?;
    for i in 0..addresses {
        for _ in 0..per_address {
            let task = hold_a_slot(h2.clone(), attacker(i), process.webhook, tally.clone());
            attack_rt.spawn(task);
        }
    }
    // Full strength: every connection tried once and had its first slow body sent.
    let total = addresses * per_address;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Tally::get(&tally.attempts) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    let http1 = TlsClient::new(ca, WEBHOOK_HOST, &[b"http/1.1"])?;
    let results = valid_reviews(http1, process.webhook, reviews)?;
    let peaks = sampler.stop();
    let peak_rss = process.memory("VmHWM")?.max(peaks.rss);
    let refusals = nonzero_by_label(&process.metrics()?, "marin3r_webhook_refused_total");
    attack_rt.shutdown_background();
    let (mut latencies, mut failures) = (Vec::new(), Vec::new());
    for r in results {
        match r {
            Ok(t) => latencies.push(t),
            Err(e) => failures.push(e),
        }
    }
    Ok(Measured {
        latencies,
        failures,
        baseline_rss,
        peak_rss,
        attack: tally.summary(),
        refusals,
    })
}

/// `count` valid reviews from [`API_SERVER`], one every [`REVIEW_EVERY`], each on a new
/// connection, on a runtime of their own (the attack's tasks do not delay them there): each
/// one's time to the answer, or why it failed.
pub(super) fn valid_reviews(
    tls: TlsClient,
    addr: SocketAddr,
    count: usize,
) -> anyhow::Result<Vec<Result<Duration, String>>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let body = Bytes::from(crate::bench::admission::admission_review().to_string());
    Ok(rt.block_on(async {
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            let result = tokio::time::timeout(REVIEW_TIMEOUT, review(&tls, addr, body.clone()))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {REVIEW_TIMEOUT:?}")));
            out.push(
                result
                    .map(|()| started.elapsed())
                    .map_err(|e| format!("{e:#}")),
            );
            tokio::time::sleep(REVIEW_EVERY.saturating_sub(started.elapsed())).await;
        }
        out
    }))
}

/// One AdmissionReview over a new HTTPS connection; an error unless it is answered and
/// allowed.
async fn review(tls: &TlsClient, addr: SocketAddr, body: Bytes) -> anyhow::Result<()> {
    let stream = tls.connect(Some(API_SERVER), addr).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::post("/pod-v1-mutate")
        .header("host", WEBHOOK_HOST)
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let response = send.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    const ALLOWED: &[u8] = b"\"allowed\":true";
    anyhow::ensure!(
        status == 200 && bytes.windows(ALLOWED.len()).any(|w| w == ALLOWED),
        "{status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(())
}
