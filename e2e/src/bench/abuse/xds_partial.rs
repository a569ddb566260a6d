//! R4: a holder of one namespace's client certificate opens SotW streams, sends
//! a valid first request on each, then a gRPC length prefix declaring a request of almost
//! the largest size and all of it but its last bytes, and holds it. The review's run was 20
//! connections of 15 streams each: 338 MiB of RSS while the byte gauge read 0. Now each
//! request begun is charged to the namespace's budget and refused past it (and one not
//! finished within the request deadline, 10 s, is ended: a long run loses its first streams
//! to it, a short one only to the budget).

use std::time::{Duration, Instant};

use anyhow::Context;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use marin3r_testkit::webhook::TlsClient;
use marin3r_testkit::xds::client::{ClientTls, connect};
use marin3r_testkit::xds::partial::PartialStream;
use marin3r_xds::resource::ResourceType;

use super::process::{Discovery, metric, nonzero_by_label};
use super::xds_names::Bystander;
use super::{ADMISSION_P99_GOAL, Goals, NODE, Setup, WEBHOOK_HOST};
use crate::bench::{Row, human, mib};

const REQUEST_BYTES: &str = "marin3r_xds_request_bytes";
/// The review's run: streams per connection, and what each request declares and sends.
const STREAMS_PER_CONNECTION: usize = 15;
const DECLARED: u32 = 1_048_512;
const SENT: usize = 1_048_496;
/// How long a stream is given to be refused before it counts as held.
const REFUSAL_WAIT: Duration = Duration::from_millis(300);

pub(super) fn run(setup: &Setup, scale: f64, goals: &mut Goals) -> anyhow::Result<Vec<Row>> {
    let defaults = marin3r_xds::Limits::default();
    // Below scale 1 the namespace's budget shrinks with it, so a quick run reaches it.
    let budget = ((defaults.max_subscription_bytes_per_namespace as f64 * scale.min(1.0)) as usize)
        .clamp(8 << 20, defaults.max_subscription_bytes_per_namespace);
    let connections = ((20.0 * scale).round() as usize).max(2);
    let reviews = ((50.0 * scale).round() as usize).max(10);
    let flags = vec![
        "--xds-max-subscription-bytes-per-namespace".into(),
        budget.to_string(),
    ];
    let label = "R4 partial requests";
    let process = setup.discovery("r4", &flags)?;
    let (attacker, bystander_tls) = (
        setup.xds_tls(&setup.attacker)?,
        setup.xds_tls(&setup.bystander)?,
    );
    let mut bystander = setup
        .rt
        .block_on(Bystander::connect(&process, &bystander_tls))?;
    setup.rt.block_on(bystander.next(setup, 20))?;
    let baseline_rss = process.memory("VmRSS")?;
    let sampler = process.sample(Some(REQUEST_BYTES));
    let started = Instant::now();
    let attack = setup
        .rt
        .block_on(attack(&process, &attacker, connections))
        .context(label)?;
    let attack_time = started.elapsed();
    let during = setup.rt.block_on(bystander.next(setup, 21))?;
    let http1 = TlsClient::new(setup.pki.ca_pem(), WEBHOOK_HOST, &[b"http/1.1"])?;
    let admissions = super::webhook_slots::valid_reviews(http1, process.webhook, reviews)?;
    let held_gauge = metric(&process.metrics()?, REQUEST_BYTES).unwrap_or(0.0);
    let peaks = sampler.stop();
    let peak_rss = process.memory("VmHWM")?.max(peaks.rss);
    let refusals = nonzero_by_label(&process.metrics()?, "marin3r_xds_refused_streams_total");
    let held = attack.held.len();
    drop(attack.held);

    goals.rss(
        label,
        ("the namespace's byte budget", budget as u64),
        baseline_rss,
        peak_rss,
    );
    let describe = |t: Option<Duration>| t.map_or("nothing within 30 s".into(), human);
    goals.check(
        label,
        "another namespace's proxy gets its next config during the attack",
        describe(during),
        during.is_some(),
    );
    let (met, admitted) = super::webhook_slots::admissions(&admissions);
    goals.check(
        label,
        &format!(
            "valid admissions during the attack, p99 < {}",
            human(ADMISSION_P99_GOAL)
        ),
        admitted,
        met,
    );
    let row = Row {
        benchmark: "R4: xDS requests begun and never finished, one namespace's certificate".into(),
        case: format!(
            "{connections} connections × {STREAMS_PER_CONNECTION} SotW streams, each a CDS \
             request then {SENT} B of a request declaring {DECLARED} B; namespace budget {}",
            mib(budget as u64)
        ),
        samples: attack.streams,
        result: format!(
            "streams opened: {}, held: {}, refused: {} ({}); in {}; server RSS {} before, \
             peak {} (VmHWM); marin3r_xds_request_bytes peak {}, {} while held; the bystander's \
             proxy got its next config {} during the attack",
            attack.streams,
            held,
            attack.refused,
            if refusals.is_empty() {
                "none"
            } else {
                refusals.as_str()
            },
            human(attack_time),
            mib(baseline_rss),
            mib(peak_rss),
            mib(peaks.gauge as u64),
            mib(held_gauge as u64),
            describe(during),
        ),
    };
    Ok(vec![row])
}

/// The streams of an attack: those still held, and how many the server ended.
struct Attack {
    streams: usize,
    held: Vec<PartialStream>,
    refused: usize,
}

async fn attack(
    process: &Discovery,
    tls: &ClientTls,
    connections: usize,
) -> anyhow::Result<Attack> {
    let first = DiscoveryRequest {
        node: Some(Node {
            id: NODE.into(),
            ..Default::default()
        }),
        type_url: ResourceType::Cluster.type_url().into(),
        ..Default::default()
    };
    let mut out = Attack {
        streams: 0,
        held: Vec::new(),
        refused: 0,
    };
    for _ in 0..connections {
        let channel = connect(process.xds, tls).await?;
        for _ in 0..STREAMS_PER_CONNECTION {
            out.streams += 1;
            let Ok(mut stream) = PartialStream::open(channel.clone(), &first).await else {
                out.refused += 1;
                continue;
            };
            // A refused stream may be reset before all of it is sent.
            let _ = stream.begin(DECLARED, SENT).await;
            match tokio::time::timeout(REFUSAL_WAIT, stream.status()).await {
                Ok(_) => out.refused += 1,
                Err(_) => out.held.push(stream),
            }
        }
    }
    Ok(out)
}
