//! Admission throughput and latency: the webhook server in-process on loopback, clients over
//! HTTPS keep-alive sending a realistic ~5 KB AdmissionReview (a pod with three containers)
//! at several concurrencies; the server's CPU time per admission is read from its own
//! threads' `/proc/self/task/<tid>/schedstat`, so client work is not counted.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use marin3r_certs::{CertificateAuthority, CertificateRequest, Usage, issue_self_signed};
use marin3r_webhook::WebhookServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;

use super::{Row, Stats, human};

const HOST: &str = "marin3r.marin3r-system.svc";

/// Requests per concurrency level at scale 1.
const REQUESTS: usize = 4000;
pub const CONCURRENCY: [usize; 3] = [1, 16, 64];

pub fn admission(scale: f64) -> anyhow::Result<Vec<Row>> {
    let requests = ((REQUESTS as f64 * scale).round() as usize).max(64);
    let body = Bytes::from(admission_review().to_string());

    let dir = tempfile::Builder::new()
        .prefix("marin3r-bench-admission-")
        .tempdir()?;
    let ca = issue_self_signed(&CertificateRequest::ca(
        "bench-ca",
        Duration::from_secs(3600),
    ))?;
    let server_cert = CertificateAuthority::from_issued(&ca)?.issue(
        &CertificateRequest::new("marin3r", Usage::Server, Duration::from_secs(3600))
            .with_hosts([HOST]),
    )?;
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_path, &server_cert.cert_pem)?;
    std::fs::write(&key_path, &server_cert.key_pem)?;

    // The server gets its own runtime so its threads, and only they, can be measured.
    let server_tids = Arc::new(Mutex::new(Vec::<u32>::new()));
    let tids = server_tids.clone();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("webhook-bench-server")
        .on_thread_start(move || {
            if let Some(tid) = current_tid() {
                tids.lock().unwrap_or_else(|p| p.into_inner()).push(tid);
            }
        })
        .enable_all()
        .build()?;
    let listener = server_rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Every client of the benchmark comes from one address, as the API server's calls do: its
    // share of connections and requests must hold the highest concurrency with room to spare
    // (connections of the previous level may still be closing).
    let share = CONCURRENCY.iter().max().copied().unwrap_or(1) * 4;
    let server = server_rt.spawn(marin3r_webhook::serve(
        WebhookServerConfig {
            max_connections_per_address: share,
            max_requests_per_address: share,
            ..WebhookServerConfig::new(&cert_path, &key_path)
        },
        listener,
        async {
            let _ = stopped.await;
        },
    ));

    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        let run = client_rt.block_on(run_level(
            addr,
            &ca.cert_pem,
            body.clone(),
            concurrency,
            requests,
            &server_tids,
        ))?;
        let Some(stats) = Stats::of(&run.latencies) else {
            continue;
        };
        let n = run.latencies.len();
        rows.push(Row {
            benchmark: "admission over HTTPS keep-alive".into(),
            case: format!("{} B review, concurrency {concurrency}", body.len()),
            samples: n,
            result: format!(
                "{:.0} req/s, p50 {}, p99 {}, max {}; server CPU {} per admission",
                n as f64 / run.wall.as_secs_f64(),
                human(stats.p50),
                human(stats.p99),
                human(stats.max),
                human(run.server_cpu / n as u32),
            ),
        });
    }
    rows.push(decision_only(&body, requests)?);
    let _ = stop.send(());
    server_rt
        .block_on(server)
        .context("webhook server task")?
        .context("webhook server")?;
    Ok(rows)
}

/// The pure part alone (decode, parse annotations, build the patch, encode), to tell it from
/// the TLS and HTTP cost.
fn decision_only(body: &[u8], samples: usize) -> anyhow::Result<Row> {
    let config = marin3r_webhook::InjectionConfig::default();
    let mut timings = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        let (response, _) = marin3r_webhook::review(body, &config)?;
        std::hint::black_box(serde_json::to_vec(&response)?);
        timings.push(start.elapsed());
    }
    let stats = Stats::of(&timings).context("no samples")?;
    Ok(Row {
        benchmark: "admission decision alone (no TLS, no HTTP)".into(),
        case: format!("{} B review", body.len()),
        samples,
        result: format!(
            "p50 {}, p99 {}, min {}",
            human(stats.p50),
            human(stats.p99),
            human(stats.min)
        ),
    })
}

struct LevelRun {
    latencies: Vec<Duration>,
    wall: Duration,
    server_cpu: Duration,
}

async fn run_level(
    addr: SocketAddr,
    ca_pem: &str,
    body: Bytes,
    concurrency: usize,
    requests: usize,
    server_tids: &Mutex<Vec<u32>>,
) -> anyhow::Result<LevelRun> {
    let mut senders = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let mut sender = connect(addr, ca_pem).await?;
        // Warm-up: the handshake and the first request are not what is measured.
        send(&mut sender, body.clone()).await?;
        senders.push(sender);
    }
    let per_task = requests.div_ceil(concurrency);
    let cpu_before = thread_cpu(server_tids)?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(concurrency);
    for mut sender in senders {
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let t = Instant::now();
                send(&mut sender, body.clone()).await?;
                latencies.push(t.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(per_task * concurrency);
    for task in tasks {
        latencies.extend(task.await??);
    }
    let wall = start.elapsed();
    let server_cpu = thread_cpu(server_tids)?.saturating_sub(cpu_before);
    Ok(LevelRun {
        latencies,
        wall,
        server_cpu,
    })
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr, ca_pem: &str) -> anyhow::Result<Sender> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from(HOST)?, tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

async fn send(sender: &mut Sender, body: Bytes) -> anyhow::Result<()> {
    sender.ready().await?;
    let request = hyper::Request::post("/pod-v1-mutate")
        .header("host", HOST)
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    const PATCH: &[u8] = b"\"patch\":\"";
    if status != 200 || !bytes.windows(PATCH.len()).any(|w| w == PATCH) {
        bail!(
            "unexpected admission response {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    Ok(())
}

/// This thread's id, from the `/proc/thread-self` link (`<pid>/task/<tid>`).
fn current_tid() -> Option<u32> {
    std::fs::read_link("/proc/thread-self")
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// CPU time the given threads have run, from schedstat (nanoseconds).
fn thread_cpu(tids: &Mutex<Vec<u32>>) -> anyhow::Result<Duration> {
    let tids = tids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if tids.is_empty() {
        bail!("no server threads recorded");
    }
    let mut total = 0u64;
    for tid in tids {
        let path = format!("/proc/self/task/{tid}/schedstat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let ns: u64 = stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("parsing {path}: {stat:?}"))?;
        total += ns;
    }
    Ok(Duration::from_nanos(total))
}

/// An AdmissionReview as the API server sends it for a Deployment's pod with an app, a log
/// shipper and a metrics exporter: about 5 KB.
pub fn admission_review() -> Value {
    let env: Vec<Value> = (0..8)
        .map(|i| json!({"name": format!("SETTING_{i}"), "value": format!("value-number-{i}")}))
        .collect();
    let mount = |name: &str, path: &str| json!({"name": name, "mountPath": path, "readOnly": true});
    let container = |name: &str, image: &str, port: u16| {
        json!({
            "name": name,
            "image": image,
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "env": env,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "volumeMounts": [
                mount("kube-api-access-x7k2p", "/var/run/secrets/kubernetes.io/serviceaccount"),
                mount("config", "/etc/app"),
            ],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        })
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "7d2c7d4e-59e4-4a4f-a0a5-3d64cf2a4d0c",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": "storefront-6f9c5b7d8-",
                    "namespace": "shop",
                    "labels": {
                        "app.kubernetes.io/name": "storefront",
                        "app.kubernetes.io/part-of": "shop",
                        "pod-template-hash": "6f9c5b7d8",
                        "marin3r.3scale.net/status": "enabled",
                    },
                    "annotations": {
                        "marin3r.3scale.net/node-id": "storefront",
                        "marin3r.3scale.net/ports": "http:8080,https:8443,metrics:9000",
                        "marin3r.3scale.net/resources.requests.cpu": "50m",
                        "marin3r.3scale.net/resources.limits.memory": "128Mi",
                        "marin3r.3scale.net/envoy-extra-args": "--log-level info --drain-time-s 10",
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "9102",
                    },
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "storefront-6f9c5b7d8",
                        "uid": "2b1c5f6e-1b1a-4c1e-9a53-0f1d1c7f3a11", "controller": true, "blockOwnerDeletion": true,
                    }],
                },
                "spec": {
                    "containers": [
                        container("storefront", "registry.example.com/shop/storefront:2.14.3", 8081),
                        container("log-shipper", "registry.example.com/infra/fluent-bit:3.1.9", 2020),
                        container("exporter", "registry.example.com/infra/statsd-exporter:0.27.1", 9102),
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "storefront-config", "defaultMode": 420}},
                        {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                        ]}},
                    ],
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst",
                    "serviceAccountName": "storefront",
                    "securityContext": {"runAsNonRoot": true, "fsGroup": 2000},
                    "schedulerName": "default-scheduler",
                    "tolerations": [
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                    ],
                    "priority": 0,
                    "enableServiceLinks": true,
                    "preemptionPolicy": "PreemptLowerPriority",
                },
                "status": {},
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_review_is_realistic_in_size_and_is_injected() {
        let review = admission_review();
        let len = review.to_string().len();
        assert!((4_000..=7_000).contains(&len), "{len} bytes");
        let (out, outcome) = marin3r_webhook::review(
            review.to_string().as_bytes(),
            &marin3r_webhook::InjectionConfig::default(),
        )
        .unwrap();
        assert_eq!(outcome, marin3r_webhook::review::Outcome::Patched, "{out}");
    }

    #[test]
    fn a_small_run_measures_every_level() {
        let rows = admission(0.001).unwrap();
        assert_eq!(rows.len(), CONCURRENCY.len() + 1);
        for (i, row) in rows.iter().enumerate() {
            let unit = if i < CONCURRENCY.len() {
                "req/s"
            } else {
                "p50"
            };
            assert!(row.result.contains(unit), "{row:?}");
            assert!(row.samples >= 64, "{row:?}");
        }
    }
}
