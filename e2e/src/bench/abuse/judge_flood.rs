//! R3 (reliability review of 2026-11-27): one tenant floods EnvoyConfig writes whose judging
//! is slow. They reach the webhook as the API server sends them: from its address
//! (127.0.0.2), on a few HTTP/2 connections, each validation replaced by another as soon as
//! it is answered (after a second when it was refused). Every one of them is judged by an "Envoy" that takes 5 s: a stand-in
//! script given as `--envoy-binary`, which sleeps on configs naming
//! [`SLOW_MARKER`] and accepts the others at once (the reviewer slowed the real Envoy with a
//! Lua filter, which the judge no longer runs). Meanwhile pod admissions and another tenant's
//! validations come from the same address, on a connection of their own, and are timed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use marin3r_testkit::webhook::TlsClient;
use serde_json::{Value, json};

use super::process::nonzero_by_label;
use super::{Goals, Setup, WEBHOOK_HOST};
use crate::bench::Row;

const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const VALIDATE_PATH: &str = "/validate-marin3r-3scale-net-v1alpha1-envoyconfig";
/// What makes the stand-in Envoy slow.
const SLOW_MARKER: &str = "bench-slow-judge";
const SLOW_JUDGE_SECONDS: u32 = 5;
/// The flood's HTTP/2 connections (the reviewer's script used 6).
const FLOOD_CONNECTIONS: usize = 6;
const REVIEW_EVERY: Duration = Duration::from_millis(200);
/// Past the API server's 10 s timeout for the webhook an answer is a failed admission anyway.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(11);
/// The reviewer's 192, 32 per connection (the webhook's HTTP/2 stream limit), at any scale:
/// the attack costs little, and below the 64 decision permits the webhook shared before, the
/// case would show nothing.
const FLOOD_IN_FLIGHT: usize = 192;
const RETRY_AFTER: Duration = Duration::from_secs(1);

type H2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

pub(super) fn run(setup: &Setup, scale: f64, goals: &mut Goals) -> anyhow::Result<Vec<Row>> {
    let in_flight = FLOOD_IN_FLIGHT;
    let reviews = ((50.0 * scale).round() as usize).max(10);
    let envoy = slow_envoy(setup)?;
    let flags = [format!("--envoy-binary={}", envoy.display())];
    let process = setup.discovery("judge-flood", &flags)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tls = TlsClient::new(setup.pki.ca_pem(), WEBHOOK_HOST, &[b"h2"])?;
    let m = rt.block_on(measure(tls, process.webhook, in_flight, reviews))?;
    let refusals = nonzero_by_label(&process.metrics()?, "marin3r_webhook_refused_total");
    let throttled = super::process::metric(
        &process.metrics()?,
        "marin3r_webhook_admissions_total{webhook=\"envoyconfig-validation\",outcome=\"throttled\"}",
    );
    rt.shutdown_background();

    let case = format!(
        "{in_flight} validations of team-a in flight from 127.0.0.2 on {FLOOD_CONNECTIONS} HTTP/2 \
         connections, each judged {SLOW_JUDGE_SECONDS} s"
    );
    let (pods_met, pods) = super::webhook_slots::admissions(&m.pods);
    let (configs_met, configs) = super::webhook_slots::admissions(&m.configs);
    goals.check(
        "judge flood",
        "pod admissions from the flooding address p99 < 1 s, every one answered",
        pods.clone(),
        pods_met,
    );
    goals.check(
        "judge flood",
        "team-b's validations from the flooding address p99 < 1 s, every one answered",
        configs.clone(),
        configs_met,
    );
    Ok(vec![Row {
        benchmark: "R3: slow EnvoyConfig validations and pod admissions from one address".into(),
        case,
        samples: reviews,
        result: format!(
            "pod reviews (127.0.0.2, HTTP/2): {pods}; team-b's validations: {configs}; \
             team-a's flood: {}; throttled (metric): {}; webhook refusals: {refusals}",
            m.flood.summary(),
            throttled.map_or("-".into(), |t| t.to_string()),
        ),
    }])
}

/// The stand-in Envoy, `marin3r-slow-envoy` (src/bin/slow_envoy.rs): a config naming
/// [`SLOW_MARKER`] takes [`SLOW_JUDGE_SECONDS`]; every config is accepted. Built beside the
/// bench (`target/<profile>/`), or beside a test binary's folder (`target/<profile>/deps/`).
fn slow_envoy(_setup: &Setup) -> anyhow::Result<std::path::PathBuf> {
    let me = std::env::current_exe()?;
    me.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("marin3r-slow-envoy"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no marin3r-slow-envoy beside {}: cargo build -p marin3r-e2e --bin marin3r-slow-envoy",
                me.display()
            )
        })
}

/// The namespaces the reviews come from: the webhook weighs each review by the namespace it
/// names, so they need not exist.
const ATTACKER: &str = "team-a";
const BYSTANDER: &str = "team-b";

/// An EnvoyConfig AdmissionReview (CREATE) of one cluster named `cluster` in `namespace`.
fn envoy_config_review(uid: usize, namespace: &str, cluster: &str) -> Bytes {
    let value = json!({
        "name": cluster,
        "connect_timeout": "1s",
        "type": "STATIC",
        "load_assignment": {
            "cluster_name": cluster,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}]}],
        },
    });
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("{namespace}-{uid}"),
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": format!("system:serviceaccount:{namespace}:deployer")},
            "object": {
                "apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfig",
                "metadata": {"name": format!("config-{uid}"), "namespace": namespace},
                "spec": {"nodeID": "proxy", "resources": [{"type": "cluster", "value": value}]},
            },
        },
    });
    Bytes::from(review.to_string())
}

/// What the flood's validations got, counted as they are answered.
#[derive(Default)]
struct Flood {
    sent: AtomicUsize,
    allowed: AtomicUsize,
    throttled: AtomicUsize,
    denied: AtomicUsize,
    http_429: AtomicUsize,
    failed: AtomicUsize,
}

impl Flood {
    fn count(&self, answer: &anyhow::Result<(u16, Value)>) {
        let counter = match answer {
            Ok((200, out)) => match out["response"]["status"]["code"].as_u64() {
                None if out["response"]["allowed"] == true => &self.allowed,
                Some(429) => &self.throttled,
                _ => &self.denied,
            },
            Ok((429, _)) => &self.http_429,
            _ => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn summary(&self) -> String {
        let get = |n: &AtomicUsize| n.load(Ordering::Relaxed);
        format!(
            "{} sent: {} judged and allowed, {} refused with 429 (its namespace's turn), {} \
             denied otherwise, {} HTTP 429 (the address's request share), {} failed",
            get(&self.sent),
            get(&self.allowed),
            get(&self.throttled),
            get(&self.denied),
            get(&self.http_429),
            get(&self.failed),
        )
    }
}

struct Measured {
    pods: Vec<Result<Duration, String>>,
    configs: Vec<Result<Duration, String>>,
    flood: Arc<Flood>,
}

async fn measure(
    tls: TlsClient,
    addr: SocketAddr,
    in_flight: usize,
    reviews: usize,
) -> anyhow::Result<Measured> {
    let flood = Arc::new(Flood::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut connections = Vec::new();
    for _ in 0..FLOOD_CONNECTIONS {
        connections.push(h2(&tls, addr).await.context("a flood connection")?);
    }
    let mut tasks = Vec::new();
    for i in 0..in_flight {
        let send = connections[i % FLOOD_CONNECTIONS].clone();
        let (flood, stop) = (flood.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = i;
            while !stop.load(Ordering::Relaxed) {
                flood.sent.fetch_add(1, Ordering::Relaxed);
                let body = envoy_config_review(n, ATTACKER, SLOW_MARKER);
                let answer = post(&send, VALIDATE_PATH, body).await;
                flood.count(&answer);
                // A write refused (429) is retried after a second, as client-go backs off.
                if !matches!(&answer, Ok((200, out)) if out["response"]["allowed"] == true) {
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                n += in_flight;
            }
        }));
    }
    // Full strength: every validation of the first round sent and being judged or waiting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let api = h2(&tls, addr)
        .await
        .context("the timed reviews' connection")?;
    let pod = Bytes::from(crate::bench::admission::admission_review().to_string());
    let (mut pods, mut configs) = (Vec::new(), Vec::new());
    for i in 0..reviews {
        let started = Instant::now();
        let config = envoy_config_review(i, BYSTANDER, "team-b-cluster");
        let (pod, config) = tokio::join!(
            timed(post(&api, "/pod-v1-mutate", pod.clone())),
            timed(post(&api, VALIDATE_PATH, config)),
        );
        pods.push(pod);
        configs.push(config);
        tokio::time::sleep(REVIEW_EVERY.saturating_sub(started.elapsed())).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.abort();
    }
    Ok(Measured {
        pods,
        configs,
        flood,
    })
}

/// The time to an allowed answer, or why there was none.
async fn timed(
    answer: impl Future<Output = anyhow::Result<(u16, Value)>>,
) -> Result<Duration, String> {
    let started = Instant::now();
    match tokio::time::timeout(REVIEW_TIMEOUT, answer).await {
        Err(_) => Err(format!("no answer within {REVIEW_TIMEOUT:?}")),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Ok(Ok((200, out))) if out["response"]["allowed"] == true => Ok(started.elapsed()),
        Ok(Ok((status, out))) => Err(format!("{status}: {out}")),
    }
}

async fn h2(tls: &TlsClient, addr: SocketAddr) -> anyhow::Result<H2> {
    let stream = tls.connect(Some(API_SERVER), addr).await?;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// One POST on an HTTP/2 connection: the status and the body as JSON (null when it is not).
async fn post(send: &H2, path: &str, body: Bytes) -> anyhow::Result<(u16, Value)> {
    let request = hyper::Request::post(format!("https://{WEBHOOK_HOST}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let response = send.clone().send_request(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}
