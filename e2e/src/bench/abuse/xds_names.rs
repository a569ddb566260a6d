//! N1: a holder of one namespace's client certificate subscribes over delta xDS to long
//! resource names, which the server keeps for the stream's life. Two cases, each against a
//! fresh process: the review's run (one stream, 600 names of 900 KiB, one per request), and
//! the most the limits let one namespace keep (names of the longest allowed length, every
//! type of each stream filled to just under its per-type bytes, new streams until the
//! namespace's budget refuses them). Meanwhile another namespace's proxy must get its next
//! config.

use std::time::{Duration, Instant};

use anyhow::Context;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use marin3r_testkit::webhook::TlsClient;
use marin3r_testkit::xds::client::{ClientTls, DeltaStream, SotwStream, connect};
use marin3r_xds::resource::ResourceType;
use tokio::task::JoinHandle;

use super::process::{Discovery, metric, nonzero_by_label};
use super::{ADMISSION_P99_GOAL, Goals, NODE, Setup, WEBHOOK_HOST};
use crate::bench::{Row, human, mib};

const SUBSCRIPTION_BYTES: &str = "marin3r_xds_subscription_bytes";
/// The largest request the server takes by default (`--xds-max-request-bytes`), less room
/// for the request's other fields.
const REQUEST_BYTES: usize = (1 << 20) - (16 << 10);
/// Streams the fill opens at most, and refused streams after which it stops.
const MAX_STREAMS: usize = 256;
const REFUSALS: usize = 3;
const WAIT: Duration = Duration::from_secs(30);

/// The byte limits the process runs with.
#[derive(Debug, Clone, Copy)]
struct ByteLimits {
    name: usize,
    per_type: usize,
    per_namespace: usize,
}

impl ByteLimits {
    /// The product's defaults; below scale 1 the per-type and namespace budgets shrink with
    /// it (the name limit stays), so a quick run fills them in less time.
    fn at(scale: f64) -> Self {
        let defaults = marin3r_xds::Limits::default();
        let shrink = |bytes: usize, floor: usize| {
            ((bytes as f64 * scale.min(1.0)) as usize).clamp(floor, bytes)
        };
        Self {
            name: defaults.max_name_bytes,
            per_type: shrink(defaults.max_subscription_bytes_per_type, 256 << 10),
            per_namespace: shrink(defaults.max_subscription_bytes_per_namespace, 8 << 20),
        }
    }

    fn flags(&self) -> Vec<String> {
        vec![
            "--xds-max-name-bytes".into(),
            self.name.to_string(),
            "--xds-max-subscription-bytes-per-type".into(),
            self.per_type.to_string(),
            "--xds-max-subscription-bytes-per-namespace".into(),
            self.per_namespace.to_string(),
        ]
    }
}

#[derive(Debug, Clone, Copy)]
enum Case {
    /// The review's run: `count` names of `bytes` each, one per request, on one stream.
    AsReviewed { count: usize, bytes: usize },
    /// Up to the limits: streams filled until the namespace's budget refuses them.
    UpToTheLimits,
}

impl Case {
    fn describe(self, limits: &ByteLimits) -> String {
        match self {
            Self::AsReviewed { count, bytes } => format!(
                "as reviewed: 1 delta stream, {count} CDS names of {} KiB, one per request",
                bytes >> 10
            ),
            Self::UpToTheLimits => format!(
                "up to the limits: names of {} B, each of the 8 types of a stream filled to \
                 just under {} per type, streams added until {} for the namespace refuses them",
                limits.name,
                mib(limits.per_type as u64),
                mib(limits.per_namespace as u64)
            ),
        }
    }
}

pub(super) fn run(setup: &Setup, scale: f64, goals: &mut Goals) -> anyhow::Result<Vec<Row>> {
    let limits = ByteLimits::at(scale);
    let reviews = ((50.0 * scale).round() as usize).max(10);
    let count = ((600.0 * scale).round() as usize).clamp(10, 600);
    let cases = [
        (
            "N1 as reviewed",
            Case::AsReviewed {
                count,
                bytes: 900 << 10,
            },
        ),
        ("N1 up to the limits", Case::UpToTheLimits),
    ];
    let mut rows = Vec::new();
    for (generation, (label, case)) in (2u64..).step_by(2).zip(cases) {
        let name = format!("n{}", rows.len() + 1);
        let process = setup.discovery(&name, &limits.flags())?;
        let measured =
            measure(setup, &process, &limits, case, generation, reviews).context(label)?;
        let budget = ("the namespace's byte budget", limits.per_namespace as u64);
        goals.rss(label, budget, measured.baseline_rss, measured.peak_rss);
        goals.check(
            label,
            "another namespace's proxy gets its next config during the attack",
            measured.bystander_during.clone(),
            measured.bystander_served,
        );
        let (met, admitted) = super::webhook_slots::admissions(&measured.admissions);
        goals.check(
            label,
            &format!(
                "valid admissions during the attack, p99 < {}",
                human(ADMISSION_P99_GOAL)
            ),
            admitted,
            met,
        );
        rows.push(measured.row(case.describe(&limits)));
    }
    Ok(rows)
}

/// What one case measured.
struct Measured {
    attack: Outcome,
    attack_time: Duration,
    baseline_rss: u64,
    peak_rss: u64,
    peak_accounted: f64,
    accounted_while_held: f64,
    refusals: String,
    bystander_before: String,
    bystander_during: String,
    bystander_served: bool,
    /// Valid AdmissionReviews sent while the attack's streams were held: each one's time to
    /// its answer, or why it failed.
    admissions: Vec<Result<Duration, String>>,
}

impl Measured {
    fn row(&self, case: String) -> Row {
        let a = &self.attack;
        Row {
            benchmark: "N1: long xDS resource names from one namespace's certificate".into(),
            case,
            samples: a.names,
            result: format!(
                "streams opened: {}; names written: {} ({}, in {}) before the server closed or \
                 kept each stream; streams kept: {}, ended: {}; server RSS \
                 {} before, peak {} (VmHWM); marin3r_xds_subscription_bytes peak {}, {} while \
                 the attack held; refused streams: {}; the bystander's proxy got its next config \
                 {} before the attack, {} during it",
                a.streams,
                a.names,
                mib(a.bytes as u64),
                human(self.attack_time),
                a.held.len(),
                a.endings(),
                mib(self.baseline_rss),
                mib(self.peak_rss),
                mib(self.peak_accounted as u64),
                mib(self.accounted_while_held as u64),
                self.refusals,
                self.bystander_before,
                self.bystander_during,
            ),
        }
    }
}

fn measure(
    setup: &Setup,
    process: &Discovery,
    limits: &ByteLimits,
    case: Case,
    generation: u64,
    reviews: usize,
) -> anyhow::Result<Measured> {
    let (attacker, bystander_tls) = (
        setup.xds_tls(&setup.attacker)?,
        setup.xds_tls(&setup.bystander)?,
    );
    let mut bystander = setup
        .rt
        .block_on(Bystander::connect(process, &bystander_tls))?;
    let before = setup.rt.block_on(bystander.next(setup, generation))?;
    let baseline_rss = process.memory("VmRSS")?;
    let sampler = process.sample(Some(SUBSCRIPTION_BYTES));
    let started = Instant::now();
    let mut attack = setup.rt.block_on(async {
        match case {
            Case::AsReviewed { count, bytes } => {
                as_reviewed(process, &attacker, count, bytes).await
            }
            Case::UpToTheLimits => up_to_the_limits(process, &attacker, limits).await,
        }
    })?;
    let attack_time = started.elapsed();
    let during = setup.rt.block_on(bystander.next(setup, generation + 1))?;
    let http1 = TlsClient::new(setup.pki.ca_pem(), WEBHOOK_HOST, &[b"http/1.1"])?;
    let admissions = super::webhook_slots::valid_reviews(http1, process.webhook, reviews)?;
    setup.rt.block_on(attack.settle());
    let accounted_while_held = metric(&process.metrics()?, SUBSCRIPTION_BYTES).unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(1));
    let peaks = sampler.stop();
    let peak_rss = process.memory("VmHWM")?.max(peaks.rss);
    let refusals = nonzero_by_label(&process.metrics()?, "marin3r_xds_refused_streams_total");
    let describe = |t: Option<Duration>| t.map_or(format!("nothing within {WAIT:?}"), human);
    Ok(Measured {
        attack,
        attack_time,
        baseline_rss,
        peak_rss,
        peak_accounted: peaks.gauge,
        accounted_while_held,
        refusals,
        bystander_before: describe(before),
        bystander_during: describe(during),
        bystander_served: during.is_some(),
        admissions,
    })
}

/// The other namespace's proxy: a SotW stream of its runtime layer.
pub(super) struct Bystander {
    stream: SotwStream,
    version: String,
}

impl Bystander {
    pub(super) async fn connect(process: &Discovery, tls: &ClientTls) -> anyhow::Result<Self> {
        let channel = connect(process.xds, tls).await?;
        let mut stream = SotwStream::open(channel, NODE, Some("bystander")).await?;
        let names = vec!["runtime".to_owned()];
        stream
            .subscribe(ResourceType::Runtime.type_url(), &names)
            .await?;
        let first = tokio::time::timeout(WAIT, stream.recv())
            .await
            .context("the bystander got no config")??;
        stream.ack(&first, &names).await?;
        Ok(Self {
            stream,
            version: first.version_info,
        })
    }

    /// Publishes `generation` and waits for the new layer: how long it took, or `None` when
    /// it did not come within [`WAIT`].
    pub(super) async fn next(
        &mut self,
        setup: &Setup,
        generation: u64,
    ) -> anyhow::Result<Option<Duration>> {
        let started = Instant::now();
        setup.publish(&setup.bystander, generation).await?;
        let names = vec!["runtime".to_owned()];
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let Ok(resp) = tokio::time::timeout_at(deadline, self.stream.recv()).await else {
                return Ok(None);
            };
            let resp = resp.context("the bystander's stream ended")?;
            self.stream.ack(&resp, &names).await?;
            if resp.version_info != self.version {
                self.version = resp.version_info;
                return Ok(Some(started.elapsed()));
            }
        }
    }
}

/// What an attack did; its streams stay open (their drain tasks run) until it is dropped.
#[derive(Default)]
struct Outcome {
    streams: usize,
    names: usize,
    bytes: usize,
    held: Vec<JoinHandle<String>>,
    ended: Vec<String>,
}

impl Outcome {
    /// Moves the kept streams that have ended since (refused later than [`keep_or_end`]
    /// waited) to the ended ones.
    async fn settle(&mut self) {
        let (ended, held): (Vec<_>, Vec<_>) = self.held.drain(..).partition(|t| t.is_finished());
        self.held = held;
        for task in ended {
            self.ended
                .push(task.await.unwrap_or_else(|e| format!("drain task: {e}")));
        }
    }

    /// How the streams that ended did, by status, with counts.
    fn endings(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for e in &self.ended {
            match counts.iter_mut().find(|(s, _)| s == e) {
                Some((_, n)) => *n += 1,
                None => counts.push((e.clone(), 1)),
            }
        }
        match counts.is_empty() {
            true => "none".into(),
            false => counts
                .iter()
                .map(|(s, n)| format!("{n} × \"{s}\""))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        for task in &self.held {
            task.abort();
        }
    }
}

/// A name of `len` bytes, distinct for each `i`.
fn long_name(i: usize, len: usize) -> String {
    let head = format!("{i:010}-");
    let tail = "x".repeat(len.saturating_sub(head.len()));
    head + &tail
}

/// Reads a stream's responses until it ends: the status it ended with.
async fn until_end(stream: &mut DeltaStream) -> String {
    loop {
        if let Err(e) = stream.recv().await {
            return match e.downcast_ref::<tonic::Status>() {
                Some(s) => format!("{:?}: {}", s.code(), s.message()),
                None => format!("{e:#}"),
            };
        }
    }
}

/// Sends `req`; false when the stream no longer takes requests.
async fn send(stream: &mut DeltaStream, req: DeltaDiscoveryRequest) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.send(req)).await,
        Ok(Ok(()))
    )
}

async fn as_reviewed(
    process: &Discovery,
    tls: &ClientTls,
    count: usize,
    bytes: usize,
) -> anyhow::Result<Outcome> {
    let mut stream = DeltaStream::open(connect(process.xds, tls).await?, NODE, Some("a")).await?;
    let mut out = Outcome::default();
    out.streams = 1;
    for i in 0..count {
        let req = DeltaDiscoveryRequest {
            type_url: ResourceType::Cluster.type_url().into(),
            resource_names_subscribe: vec![long_name(i, bytes)],
            ..Default::default()
        };
        if !send(&mut stream, req).await {
            break;
        }
        out.names += 1;
        out.bytes += bytes;
    }
    keep_or_end(stream, &mut out).await;
    Ok(out)
}

/// Waits a moment for the stream to be ended by the server; else keeps it open, draining it.
async fn keep_or_end(mut stream: DeltaStream, out: &mut Outcome) {
    match tokio::time::timeout(Duration::from_millis(500), until_end(&mut stream)).await {
        Ok(status) => out.ended.push(status),
        Err(_) => out
            .held
            .push(tokio::spawn(async move { until_end(&mut stream).await })),
    }
}

async fn up_to_the_limits(
    process: &Discovery,
    tls: &ClientTls,
    limits: &ByteLimits,
) -> anyhow::Result<Outcome> {
    let per_type = limits.per_type / limits.name - 1;
    let per_request = REQUEST_BYTES / (limits.name + 8);
    let mut out = Outcome::default();
    let mut next = 0usize;
    while out.streams < MAX_STREAMS && out.ended.len() < REFUSALS {
        let channel = connect(process.xds, tls).await?;
        let pod = format!("attacker-{}", out.streams);
        let mut stream = DeltaStream::open(channel, NODE, Some(&pod)).await?;
        out.streams += 1;
        'types: for kind in ResourceType::ALL {
            let mut left = per_type;
            while left > 0 {
                let n = left.min(per_request);
                let req = DeltaDiscoveryRequest {
                    type_url: kind.type_url().into(),
                    resource_names_subscribe: (next..next + n)
                        .map(|i| long_name(i, limits.name))
                        .collect(),
                    ..Default::default()
                };
                next += n;
                left -= n;
                if !send(&mut stream, req).await {
                    break 'types;
                }
                out.names += n;
                out.bytes += n * limits.name;
            }
        }
        keep_or_end(stream, &mut out).await;
    }
    Ok(out)
}
