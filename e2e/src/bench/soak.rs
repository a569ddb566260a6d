//! The soak (`hack/bench --only soak`): the whole product on the real cluster of
//! `hack/cluster` (operator, discovery pod with the webhook, real Envoy sidecars), installed
//! from `manifests/`, under churn and faults for a while, then a check that nothing was lost.
//! It holds the cluster alone: its API faults reach every pod.
//!
//! While it runs:
//! - **pod churn**: annotated pods are created in an enabled namespace and deleted after a
//!   while; every creation must be admitted with the sidecar injected and become Ready. A
//!   creation the API refuses because the webhook cannot be reached (the discovery pod was
//!   just killed; `failurePolicy: Fail`) is retried as a ReplicaSet controller would, and
//!   counted;
//! - **EnvoyConfig updates** every second, each a new good config (the listener answers
//!   `soak revision <n>`), and now and then one every proxy rejects (its listener on an
//!   address no pod has, which Envoy's validate mode, the webhook's judge, admits): the
//!   revision must be rolled back while every Envoy keeps serving the last good one;
//! - **API faults** for the product's own clients (the service accounts of `marin3r-system`:
//!   the operator and the discovery pod): 500 on any request, 409 on writes, 410 Gone inside
//!   watch streams. The pods' connections to the `kubernetes` Service are sent (one nat rule)
//!   to the fault proxy (`marin3r-api-faults`) on the node, which serves them with the API
//!   server's own certificate, passes each request on with the pod's token, and fails the
//!   product's service accounts' requests only;
//! - **discovery pod kills** while Envoys are connected: its process (SIGKILL from the node;
//!   the kubelet restarts it in place), then the whole pod with no grace period (the Deployment brings a new one at
//!   a new IP), in turn, each followed by two 500s for the new process's first requests; the
//!   Envoys reconnect.
//!
//! Every Ready sidecar is probed through its listener (from the host, at the pod's IP) ten
//! times a second: that is how convergence is timed, and any answer that is not a good
//! revision, or older than one the same Envoy already served, is config loss. At the end every
//! running Envoy must serve the newest good revision. Any failure is returned by name.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::CacheState;
use serde_json::json;
use tokio::sync::watch;

use super::{Row, Stats, human};
use crate::demo::{self, wait_for};
use marin3r_api_faults::{FaultProxy, FaultScope, Faults};
use marin3r_testkit::cluster::Cluster;
use marin3r_testkit::kubectl::Kubectl;

const OPS: &str = "marin3r-system";
const NODE_ID: &str = "soak-proxy";
const SIDECAR: &str = "envoy-sidecar";
const LISTENER_PORT: u16 = 8080;
/// Faults are injected into the requests of these users only: the operator and the discovery
/// pod (the kubelet, the Deployment controller and this driver are the test's machinery).
const PRODUCT_USERS: &str = "system:serviceaccount:marin3r-system:";
const BENCHMARK: &str = "soak (whole product on the real cluster)";

/// How the soak runs.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// How long the churn, updates and faults go on (the checks come after).
    pub duration: Duration,
    /// One EnvoyConfig update per this interval.
    pub update_every: Duration,
    /// Every this-many-th update is one Envoy rejects.
    pub bad_every: u64,
    /// A new pod per this interval...
    pub pod_every: Duration,
    /// ...deleted this long after it became Ready.
    pub pod_lifetime: Duration,
    /// How many times the discovery pod's process is killed (evenly spread).
    pub discovery_kills: usize,
    /// One fault per this interval, 500, 409 and 410 in turn.
    pub fault_every: Duration,
    /// Where the product's and the sidecars' logs are written when the soak fails.
    pub log_dir: Option<PathBuf>,
}

impl SoakConfig {
    /// The soak: 5 minutes, an update a second.
    pub fn new(duration: Duration) -> Self {
        Self {
            duration,
            update_every: Duration::from_secs(1),
            bad_every: 20,
            pod_every: Duration::from_secs(3),
            pod_lifetime: Duration::from_secs(15),
            discovery_kills: 2,
            fault_every: Duration::from_millis(1500),
            log_dir: None,
        }
    }
}

/// What a soak measured, and what it found lost.
#[derive(Debug)]
pub struct SoakOutcome {
    pub rows: Vec<Row>,
    pub counts: SoakCounts,
    /// Empty when nothing was lost; otherwise each names what.
    pub failures: Vec<String>,
}

/// The main counts of [`SoakOutcome::rows`], for tests.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoakCounts {
    pub pods_admitted: u64,
    pub pods_injected: u64,
    pub good_updates: u64,
    pub rollbacks: usize,
    pub faults_served: u64,
    pub discovery_kills: u64,
    pub convergence_samples: usize,
    pub envoys_at_end: usize,
}

/// Runs the soak on this machine's `hack/cluster` (started when it does not run; needs root,
/// Envoy and a built `marin3r`), holding it alone.
pub fn soak(config: &SoakConfig) -> anyhow::Result<SoakOutcome> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(config))
}

/// The body a good revision's listener answers with.
fn body(n: u64) -> String {
    format!("soak revision {n}")
}

/// The revision a body names (`None` for anything else).
fn revision_of(body: &str) -> Option<u64> {
    body.strip_prefix("soak revision ")?.parse().ok()
}

/// The listener of update `n`: answers `soak revision <n>`; when `bad`, it listens on an
/// address no pod has, which passes validation, Envoy's judge included, but every proxy
/// rejects ([`crate::rejected`]).
fn listener(n: u64, bad: bool) -> anyhow::Result<String> {
    let address = if bad {
        crate::rejected::NO_POD_ADDRESS
    } else {
        "0.0.0.0"
    };
    let listener = json!({
        "name": "http",
        "address": {"socket_address": {"address": address, "port_value": LISTENER_PORT}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http",
                "route_config": {"name": "local", "virtual_hosts": [{
                    "name": "soak", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "direct_response": {
                        "status": 200, "body": {"inline_string": body(n)}}}]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            }}]}],
    });
    Ok(serde_json::to_string(&listener)?)
}

fn envoy_config(ns: &str, n: u64) -> anyhow::Result<EnvoyConfig> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": NODE_ID, "namespace": ns},
        "spec": {"nodeID": NODE_ID, "envoyResources": {
            "listeners": [{"name": "http", "value": listener(n, false)?}]}},
    }))?)
}

fn churn_pod() -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "generateName": "soak-",
            "labels": {"app": "soak", "marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": NODE_ID,
                "marin3r.3scale.net/ports": format!("http:{LISTENER_PORT}"),
            },
        },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [crate::real::python_container(crate::real::IDLE_PY)],
        },
    }))?)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One Ready sidecar being probed.
#[derive(Debug)]
struct Probed {
    ip: String,
    /// The newest revision it served.
    served: Option<u64>,
    /// Updates from this one on are timed for it (the ones applied after it became Ready).
    first_timed: u64,
    /// Probes that got no answer (connection refused before Envoy has its listener, a
    /// timeout).
    misses: u64,
    last_miss: Option<String>,
}

/// One EnvoyConfig update that Envoy should take.
#[derive(Debug)]
struct Update {
    n: u64,
    applied: Instant,
    /// The pods Ready when it was applied, and when each first served it (or a newer one).
    pending: Vec<String>,
    reached: HashMap<String, Instant>,
}

#[derive(Debug, Default)]
struct Counters {
    create_attempts: u64,
    refused: BTreeMap<String, u64>,
    admitted: u64,
    injected: u64,
    ready: u64,
    deleted: u64,
    good_updates: u64,
    bad_updates: u64,
    update_errors: u64,
    rollbacks: Vec<Duration>,
    faults_queued: BTreeMap<u16, u64>,
    discovery_kills: u64,
    discovery_back: Vec<Duration>,
    probes: u64,
    misses: u64,
    max_envoys: usize,
    pod_ready: Vec<Duration>,
}

/// What the workers share.
#[derive(Debug, Default)]
struct Shared {
    /// The run's namespace (the pods, the EnvoyConfig) and DiscoveryService.
    ns: String,
    ds: String,
    probed: Mutex<HashMap<String, Probed>>,
    updates: Mutex<Vec<Update>>,
    /// The newest good revision applied (the one every Envoy must end on).
    newest_good: Mutex<u64>,
    counters: Mutex<Counters>,
    per_envoy: Mutex<Vec<Duration>>,
    failures: Mutex<Vec<String>>,
}

impl Shared {
    fn fail(&self, what: String) {
        tracing::error!("soak: {what}");
        lock(&self.failures).push(what);
    }

    fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut lock(&self.counters));
    }
}

async fn run(config: &SoakConfig) -> anyhow::Result<SoakOutcome> {
    let cluster = tokio::task::spawn_blocking(Cluster::start_or_attach).await??;
    let pki = cluster.pki_dir().context(
        "the soak's API faults reach the pods through hack/cluster's node, with its API \
         server's certificate: it runs on this machine's hack/cluster only",
    )?;
    let test = marin3r_testkit::cluster::current_test();
    let _held = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || cluster.exclusive_for(test)
    })
    .await??;
    tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || marin3r_testkit::image::load_images(&cluster, &["marin3r", "envoy", "python"])
    })
    .await??;
    let kubectl = cluster.kubectl()?;
    let proxy = FaultProxy::start(cluster.config().await?).await?;
    let node_ip = kubectl
        .ok(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ])
        .await?;
    let read = |file: &str| {
        std::fs::read_to_string(pki.join(file)).with_context(|| format!("reading {file}"))
    };
    let endpoint = proxy
        .pod_endpoint(
            format!("{}:0", node_ip.trim()).parse()?,
            &read("apiserver.crt")?,
            &read("apiserver.key")?,
        )
        .await?;
    let service = kubectl
        .ok(&[
            "get",
            "service",
            "kubernetes",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}",
        ])
        .await?;
    let _redirect = Redirect::insert(service.trim(), endpoint)?;
    crate::real::install(&cluster).await?;
    // The operator's connections were opened before the redirect: a new operator pod opens
    // its own through the proxy.
    kubectl
        .ok(&[
            "rollout",
            "restart",
            "-n",
            OPS,
            "deployment/marin3r-operator",
        ])
        .await?;
    kubectl
        .ok(&[
            "rollout",
            "status",
            "-n",
            OPS,
            "deployment/marin3r-operator",
            "--timeout=120s",
        ])
        .await?;
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let run = format!("soak-{}-{millis}", std::process::id());
    let client = cluster.client().await?;
    let result = drive(config, &client, &kubectl, &proxy.faults(), &run).await;
    let failed = result.as_ref().map_or(true, |o| !o.failures.is_empty());
    if failed {
        // Into the folder asked for, else a temporary one whose tails are printed (CI keeps
        // only the output).
        let scratch = tempfile::tempdir();
        let dir = match (&config.log_dir, &scratch) {
            (Some(dir), _) => Some(dir.clone()),
            (None, Ok(tmp)) => Some(tmp.path().to_path_buf()),
            (None, Err(_)) => None,
        };
        if let Some(dir) = dir {
            keep_logs(&kubectl, &dir, &run).await;
            if config.log_dir.is_some() {
                eprintln!("soak: the product's logs are in {}", dir.display());
            } else {
                print_tails(&dir);
            }
        }
    }
    // The DiscoveryService first, while the operator runs, for its finalizer.
    let _ = kubectl
        .ok(&[
            "delete",
            "discoveryservice",
            "-n",
            OPS,
            &run,
            "--timeout=60s",
        ])
        .await;
    let _ = kubectl
        .ok(&["delete", "namespace", &run, "--wait=false"])
        .await;
    result
}

/// The logs of the operator, the run's discovery pods and its sidecars, into `dir`.
async fn keep_logs(kubectl: &Kubectl, dir: &std::path::Path, run: &str) {
    let _ = std::fs::create_dir_all(dir);
    let instance = format!("app.kubernetes.io/instance={run}");
    for (file, ns, selector) in [
        ("operator.log", OPS, "app.kubernetes.io/component=operator"),
        ("discovery.log", OPS, instance.as_str()),
        ("pods.log", run, "app=soak"),
    ] {
        let args = [
            "logs",
            "-n",
            ns,
            "-l",
            selector,
            "--all-containers",
            "--prefix",
            "--tail=-1",
            "--max-log-requests=50",
        ];
        let text = match kubectl.run(&args).await {
            Ok(out) => format!("{}{}", out.stdout, out.stderr),
            Err(e) => format!("kubectl logs failed: {e:#}"),
        };
        let _ = std::fs::write(dir.join(file), text);
    }
}

/// The last lines of each log [`keep_logs`] wrote, on stderr.
fn print_tails(dir: &std::path::Path) {
    for file in ["operator.log", "discovery.log", "pods.log"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        eprintln!("soak: the last lines of {file}:\n{}", tail.join("\n"));
    }
}

/// One nat rule sending the pods' connections to the `kubernetes` Service to the fault proxy
/// instead of the API server (in PREROUTING, which the node's own connections never pass);
/// deleted on drop. Its comment names hack/cluster, whose `down`
/// removes it too if this process dies first.
struct Redirect {
    rule: Vec<String>,
}

impl Redirect {
    fn insert(service: &str, to: std::net::SocketAddr) -> anyhow::Result<Self> {
        let (ip, port) = service
            .rsplit_once(':')
            .with_context(|| format!("the kubernetes Service's address {service:?}"))?;
        let rule: Vec<String> = [
            "-d",
            ip,
            "-p",
            "tcp",
            "--dport",
            port,
            "-m",
            "comment",
            "--comment",
            "marin3r-cluster soak API faults",
            "-j",
            "DNAT",
            "--to-destination",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .chain([to.to_string()])
        .collect();
        let out = std::process::Command::new("iptables")
            .args(["-w", "-t", "nat", "-I", "PREROUTING", "1"])
            .args(&rule)
            .output()
            .context("running iptables")?;
        if !out.status.success() {
            bail!(
                "iptables could not send the pods' API connections to the fault proxy: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Self { rule })
    }
}

impl Drop for Redirect {
    fn drop(&mut self) {
        let _ = std::process::Command::new("iptables")
            .args(["-w", "-t", "nat", "-D", "PREROUTING"])
            .args(&self.rule)
            .output();
    }
}

async fn drive(
    config: &SoakConfig,
    client: &kube::Client,
    kubectl: &Kubectl,
    faults: &Arc<Faults>,
    run: &str,
) -> anyhow::Result<SoakOutcome> {
    let t = Duration::from_secs(120);
    let setup_started = Instant::now();
    demo::ensure_namespace(client, run).await?;
    let ds = format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
         metadata: {{name: {run}, namespace: {OPS}}}\nspec: {{enabledNamespaces: [{run}]}}\n"
    );
    kubectl.ok_with(&["apply", "-f", "-"], &ds).await?;
    wait_for("the soak's namespace enabled", t, || {
        demo::namespace_enabled(client, run)
    })
    .await?;
    wait_for("the discovery pod Ready", t, || async {
        Ok(ready_discovery_pod(client, run).await?.map(|_| ()))
    })
    .await?;
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), run);
    let first = envoy_config(run, 0)?;
    // A pod Ready is not yet an address behind its Service: until the EndpointSlice
    // controller has listed it, the API server answers the webhook's call with a 500.
    let deadline = Instant::now() + t;
    while let Err(e) = configs.create(&PostParams::default(), &first).await {
        let unreachable =
            matches!(&e, kube::Error::Api(s) if s.message.contains("no endpoints available"));
        if !unreachable || Instant::now() > deadline {
            return Err(anyhow::Error::from(e).context("creating the EnvoyConfig"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for("the first revision InSync", t, || async {
        demo::in_sync_version(&configs.get(NODE_ID).await?)
    })
    .await?;
    let setup = setup_started.elapsed();
    tracing::info!("soak: set up in {}", human(setup));

    let shared = Arc::new(Shared {
        ns: run.to_owned(),
        ds: run.to_owned(),
        ..Shared::default()
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let soak = async {
        tokio::time::sleep(config.duration).await;
        let _ = stop_tx.send(true);
    };
    let ((), updates, (), (), kills, pods) = tokio::join!(
        soak,
        updater(config, &configs, &shared, stop_rx.clone()),
        prober(&shared, stop_rx.clone()),
        faulter(config, faults, &shared, stop_rx.clone()),
        killer(config, client, faults, &shared, stop_rx.clone()),
        churner(config, client, &shared, stop_rx.clone()),
    );
    let soaked = started.elapsed();
    for (what, r) in [
        ("updates", updates),
        ("discovery kills", kills),
        ("pods", pods),
    ] {
        if let Err(e) = r {
            shared.fail(format!("{what}: {e:#}"));
        }
    }

    // Every Envoy still running must end on the newest good revision.
    let newest = *lock(&shared.newest_good);
    let last_update = lock(&shared.updates).last().map(|u| u.applied);
    let (final_stop_tx, final_stop_rx) = watch::channel(false);
    let converge = async {
        let r = wait_for(
            "every running Envoy on the newest good revision",
            Duration::from_secs(60),
            || async {
                let probed = lock(&shared.probed);
                let behind: Vec<String> = probed
                    .iter()
                    .filter(|(_, p)| p.served != Some(newest))
                    .map(|(name, p)| format!("{name} serves {:?}", p.served))
                    .collect();
                if behind.is_empty() {
                    Ok(Some(probed.len()))
                } else {
                    bail!("{}", behind.join(", "))
                }
            },
        )
        .await;
        let _ = final_stop_tx.send(true);
        r
    };
    let (converged, ()) = tokio::join!(converge, prober(&shared, final_stop_rx));
    let final_convergence = last_update.map(|t| t.elapsed());
    let envoys_at_end = match converged {
        Ok(n) => n,
        Err(e) => {
            shared.fail(format!("config lost: {e:#}"));
            0
        }
    };
    if envoys_at_end == 0 && lock(&shared.failures).is_empty() {
        shared.fail("no Envoy was running at the end to check".into());
    }
    match configs.get(NODE_ID).await {
        Ok(ec) => {
            let status = ec.status.unwrap_or_default();
            if status.cache_state != Some(CacheState::InSync)
                || status.published_version != status.desired_version
            {
                shared.fail(format!(
                    "EnvoyConfig not InSync on the newest spec at the end: cacheState {:?}, \
                     published {:?}, desired {:?}",
                    status.cache_state, status.published_version, status.desired_version
                ));
            }
        }
        Err(e) => shared.fail(format!("reading the EnvoyConfig at the end: {e}")),
    }

    let served = faults.served();
    let counters = lock(&shared.counters);
    let updates = lock(&shared.updates);
    let mut all_envoys = Vec::new();
    for u in updates.iter() {
        let alive: Vec<&Instant> = u.pending.iter().filter_map(|p| u.reached.get(p)).collect();
        if let Some(last) = alive.iter().max() {
            all_envoys.push(last.duration_since(u.applied));
        }
    }
    let per_envoy = lock(&shared.per_envoy).clone();
    let failures = lock(&shared.failures).clone();
    let stats = |s: &[Duration]| {
        Stats::of(s).map_or_else(
            || "no samples".to_owned(),
            |s| {
                format!(
                    "p50 {}, p99 {}, max {}",
                    human(s.p50),
                    human(s.p99),
                    human(s.max)
                )
            },
        )
    };
    let refused: Vec<String> = counters
        .refused
        .iter()
        .map(|(why, n)| format!("{n} {why}"))
        .collect();
    let kinds = |m: &BTreeMap<u16, u64>| {
        [
            (500, "500 on any request"),
            (409, "409 on writes"),
            (410, "410 Gone in watches"),
        ]
        .iter()
        .map(|(code, what)| format!("{} {what}", m.get(code).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ")
    };
    let row = |case: &str, samples: usize, result: String| Row {
        benchmark: BENCHMARK.into(),
        case: case.into(),
        samples,
        result,
    };
    let rows = vec![
        row(
            "run",
            1,
            format!(
                "setup {}, soak {}; up to {} Envoys probed at once, {} probes ({} unanswered: \
                 Envoy starting, or slow)",
                human(setup),
                human(soaked),
                counters.max_envoys,
                counters.probes,
                counters.misses
            ),
        ),
        row(
            "pod creations (webhook, failurePolicy Fail)",
            counters.create_attempts as usize,
            format!(
                "{} requests, {} admitted, {} injected, {} Ready (time to Ready {}), {} deleted; \
                 refused and retried: {}",
                counters.create_attempts,
                counters.admitted,
                counters.injected,
                counters.ready,
                stats(&counters.pod_ready),
                counters.deleted,
                if refused.is_empty() {
                    "none".to_owned()
                } else {
                    refused.join(", ")
                }
            ),
        ),
        row(
            "EnvoyConfig updates",
            (counters.good_updates + counters.bad_updates) as usize,
            format!(
                "{} good, {} rejected by Envoy ({} rolled back, rollback {}), {} update \
                 requests failed and retried; newest good revision {newest}",
                counters.good_updates,
                counters.bad_updates,
                counters.rollbacks.len(),
                stats(&counters.rollbacks),
                counters.update_errors
            ),
        ),
        row(
            "API faults for the product's service accounts",
            served.values().sum::<u64>() as usize,
            format!(
                "served: {}; queued: {}",
                kinds(&served),
                kinds(&counters.faults_queued)
            ),
        ),
        row(
            "discovery pod killed (process, then whole pod, in turn)",
            counters.discovery_kills as usize,
            format!("back Ready after {}", stats(&counters.discovery_back)),
        ),
        row(
            "convergence, one Envoy (update applied -> its listener serves it)",
            per_envoy.len(),
            stats(&per_envoy),
        ),
        row(
            "convergence, all Envoys Ready at the update",
            all_envoys.len(),
            stats(&all_envoys),
        ),
        row(
            "at the end: last update -> every running Envoy on it",
            envoys_at_end,
            final_convergence.map_or_else(
                || "no update".to_owned(),
                |d| format!("{} for {envoys_at_end} Envoys, revision {newest}", human(d)),
            ),
        ),
        row(
            "errors",
            failures.len(),
            if failures.is_empty() {
                "none".to_owned()
            } else {
                failures.join("; ")
            },
        ),
    ];
    let counts = SoakCounts {
        pods_admitted: counters.admitted,
        pods_injected: counters.injected,
        good_updates: counters.good_updates,
        rollbacks: counters.rollbacks.len(),
        faults_served: served.values().sum(),
        discovery_kills: counters.discovery_kills,
        convergence_samples: per_envoy.len(),
        envoys_at_end,
    };
    Ok(SoakOutcome {
        rows,
        counts,
        failures,
    })
}

/// Applies a new good revision every `update_every`, and a bad one every `bad_every`-th
/// time (then waits for its rollback before going on).
async fn updater(
    config: &SoakConfig,
    configs: &Api<EnvoyConfig>,
    shared: &Shared,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut n = 0u64;
    let mut tick = tokio::time::interval(config.update_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_bad = false;
    loop {
        tick.tick().await;
        // The soak ends on a good revision (a rejected one last would leave nothing to check
        // the rollback against).
        if *stop.borrow() && !last_bad {
            return Ok(());
        }
        n += 1;
        let bad = config.bad_every > 0 && n.is_multiple_of(config.bad_every) && !*stop.borrow();
        let patch = Patch::Merge(json!({"spec": {"envoyResources": {
            "listeners": [{"name": "http", "value": listener(n, bad)?}]}}}));
        let ready: Vec<String> = lock(&shared.probed).keys().cloned().collect();
        let applied = Instant::now();
        if let Err(e) = configs
            .patch(NODE_ID, &PatchParams::default(), &patch)
            .await
        {
            tracing::warn!("soak: update {n}: {e}");
            shared.count(|c| c.update_errors += 1);
            continue;
        }
        last_bad = bad;
        if !bad {
            lock(&shared.updates).push(Update {
                n,
                applied,
                pending: ready,
                reached: HashMap::new(),
            });
            *lock(&shared.newest_good) = n;
            shared.count(|c| c.good_updates += 1);
            continue;
        }
        shared.count(|c| c.bad_updates += 1);
        let good = *lock(&shared.newest_good);
        let rolled_back = wait_for(
            "the rejected revision rolled back",
            Duration::from_secs(60),
            || async {
                let status = configs.get(NODE_ID).await?.status.unwrap_or_default();
                Ok((status.cache_state == Some(CacheState::Rollback)
                    && status.published_version != status.desired_version)
                    .then_some(()))
            },
        )
        .await;
        match rolled_back {
            Ok(()) => shared.count(|c| c.rollbacks.push(applied.elapsed())),
            Err(e) => shared.fail(format!(
                "update {n} (rejected by Envoy, after good revision {good}): {e:#}"
            )),
        }
    }
}

/// GETs the listener of every Ready sidecar ten times a second until `stop`.
async fn prober(shared: &Shared, mut stop: watch::Receiver<bool>) {
    // A new connection per probe: a kept-alive one stays on the listener it was accepted by,
    // which Envoy drains for a while after an update, so it would show the old body.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(1)))
        .http_status_as_error(false)
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .build()
        .into();
    loop {
        let targets: Vec<(String, String)> = lock(&shared.probed)
            .iter()
            .map(|(name, p)| (name.clone(), p.ip.clone()))
            .collect();
        let probes = targets.into_iter().map(|(name, ip)| {
            let agent = agent.clone();
            async move {
                let url = format!("http://{ip}:{LISTENER_PORT}/");
                let answer = tokio::task::spawn_blocking(move || {
                    let call = agent.get(&url).header("connection", "close").call();
                    match call {
                        Ok(mut response) => match response.body_mut().read_to_string() {
                            Ok(body) => Answer::Body(response.status().as_u16(), body),
                            Err(e) => Answer::Nothing(e.to_string()),
                        },
                        Err(ureq::Error::Io(e))
                            if e.kind() == std::io::ErrorKind::ConnectionRefused =>
                        {
                            Answer::Refused
                        }
                        Err(e) => Answer::Nothing(e.to_string()),
                    }
                })
                .await
                .unwrap_or_else(|e| Answer::Nothing(e.to_string()));
                (name, answer, Instant::now())
            }
        });
        let answers = futures::future::join_all(probes).await;
        record(shared, answers);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// What one probe of a sidecar's listener got.
#[derive(Debug, Clone)]
enum Answer {
    Body(u16, String),
    /// Nothing listens on the port: before the first revision, Envoy is still starting;
    /// after it, the listener (or Envoy) is gone.
    Refused,
    /// A timeout or a broken connection (a busy machine), with the error.
    Nothing(String),
}

fn record(shared: &Shared, answers: Vec<(String, Answer, Instant)>) {
    let mut probed = lock(&shared.probed);
    let mut updates = lock(&shared.updates);
    let mut per_envoy = lock(&shared.per_envoy);
    let mut lost = Vec::new();
    shared.count(|c| {
        c.probes += answers.len() as u64;
        c.misses += answers
            .iter()
            .filter(|(_, a, _)| !matches!(a, Answer::Body(..)))
            .count() as u64;
        c.max_envoys = c.max_envoys.max(probed.len());
    });
    for (name, answer, at) in answers {
        // Deleted meanwhile.
        let Some(p) = probed.get_mut(&name) else {
            continue;
        };
        let (status, body) = match answer {
            Answer::Body(status, body) => (status, body),
            Answer::Refused if p.served.is_some() => {
                lost.push(format!(
                    "{name} stopped listening on {LISTENER_PORT} (connection refused) after \
                     serving revision {}",
                    p.served.unwrap_or_default()
                ));
                continue;
            }
            Answer::Refused => {
                p.misses += 1;
                p.last_miss = Some("connection refused".into());
                continue;
            }
            Answer::Nothing(why) => {
                p.misses += 1;
                p.last_miss = Some(why);
                continue;
            }
        };
        let Some(n) = revision_of(&body).filter(|_| status == 200) else {
            lost.push(format!(
                "{name} answered {status} {:?}, not a good revision",
                body.trim()
            ));
            continue;
        };
        match p.served {
            Some(old) if n < old => {
                lost.push(format!("{name} went back from revision {old} to {n}"));
            }
            Some(old) if n == old => {}
            old => {
                let from = old.map_or(p.first_timed, |o| (o + 1).max(p.first_timed));
                for u in updates.iter_mut().filter(|u| u.n >= from && u.n <= n) {
                    if u.pending.contains(&name) {
                        u.reached.entry(name.clone()).or_insert(at);
                    }
                    per_envoy.push(at.duration_since(u.applied));
                }
                p.served = Some(n);
            }
        }
    }
    drop((probed, updates, per_envoy));
    for what in lost {
        shared.fail(format!("config lost: {what}"));
    }
}

/// Queues one fault for the product's clients every `fault_every`: 500, 409 and 410 (with
/// every watch ended) in turn, only when the last one was served, so they do not pile up.
async fn faulter(
    config: &SoakConfig,
    faults: &Faults,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) {
    let kinds = [
        (500, FaultScope::Any),
        (409, FaultScope::Write),
        (410, FaultScope::Watch),
    ];
    let mut next = 0;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(config.fault_every) => {}
        }
        if faults.pending() > 0 {
            continue;
        }
        let (code, scope) = kinds[next % kinds.len()];
        next += 1;
        faults.fail_next_for(1, code, scope, PRODUCT_USERS);
        if scope == FaultScope::Watch {
            // Watches are long: end them all (as an API server restart would) so that the
            // product's next watch request, at once, is the one answered 410 Gone.
            faults.drop_watches();
        }
        shared.count(|c| *c.faults_queued.entry(code).or_default() += 1);
    }
}

/// A Ready pod of the DiscoveryService `ds`.
async fn ready_discovery_pod(client: &kube::Client, ds: &str) -> anyhow::Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPS);
    let selector =
        format!("app.kubernetes.io/component=discovery-service,app.kubernetes.io/instance={ds}");
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(list
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none() && demo::ready_ip(p).is_some()))
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| c.restart_count)
        .sum()
}

/// SIGKILLs the processes of `pod`'s container `name` from the node, as the kernel's OOM
/// killer would: every process whose cgroup names the container's ID.
fn kill_container(pod: &Pod, name: &str) -> anyhow::Result<()> {
    let id = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.rsplit_once("://").map(|(_, id)| id.to_owned()))
        .with_context(|| format!("container {name} has no ID yet"))?;
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cgroup) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        if cgroup.contains(&id) {
            let status = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status()?;
            killed += usize::from(status.success());
        }
    }
    if killed == 0 {
        bail!("no process of container {name} ({id}) found on this node");
    }
    Ok(())
}

/// Kills the discovery pod `discovery_kills` times, evenly spread over the soak, its process
/// and the whole pod in turn, and waits each time for a discovery pod to be Ready again.
async fn killer(
    config: &SoakConfig,
    client: &kube::Client,
    faults: &Faults,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let every = config.duration / u32::try_from(config.discovery_kills + 1).unwrap_or(u32::MAX);
    for kill in 0..config.discovery_kills {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            () = tokio::time::sleep(every) => {}
        }
        let pod = ready_discovery_pod(client, &shared.ds)
            .await?
            .context("no Ready discovery pod to kill")?;
        let name = pod.name_any();
        let container = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone())
            .context("the discovery pod has no container")?;
        let before = restarts(&pod);
        let pods: Api<Pod> = Api::namespaced(client.clone(), OPS);
        if kill % 2 == 0 {
            // The process dies; the kubelet restarts it in the same pod (same IP).
            kill_container(&pod, &container)?;
            tracing::info!("soak: killed {OPS}/{name} {container}");
        } else {
            // The pod is gone at once (`kubectl delete --grace-period=0 --force`); the
            // Deployment brings a new one, at a new IP.
            pods.delete(&name, &DeleteParams::default().grace_period(0))
                .await
                .with_context(|| format!("deleting {OPS}/{name}"))?;
            tracing::info!("soak: deleted {OPS}/{name} with no grace period");
        }
        let killed = Instant::now();
        shared.count(|c| c.discovery_kills += 1);
        // The new process starts against a flaky API: its first requests fail.
        faults.fail_next_for(2, 500, FaultScope::Any, PRODUCT_USERS);
        shared.count(|c| *c.faults_queued.entry(500).or_default() += 2);
        wait_for(
            "the killed discovery pod restarted and Ready",
            Duration::from_secs(120),
            || async {
                let back = ready_discovery_pod(client, &shared.ds).await?;
                Ok(match back {
                    Some(p) if p.name_any() != name || restarts(&p) > before => Some(()),
                    _ => None,
                })
            },
        )
        .await?;
        shared.count(|c| c.discovery_back.push(killed.elapsed()));
    }
    Ok(())
}

/// Starts a pod every `pod_every`, each living `pod_lifetime` once Ready; at `stop` the pods
/// still starting are waited for and the living ones kept (the final check probes them).
async fn churner(
    config: &SoakConfig,
    client: &kube::Client,
    shared: &Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut lives = tokio::task::JoinSet::new();
    loop {
        let life = pod_life(
            client.clone(),
            shared.clone(),
            config.pod_lifetime,
            stop.clone(),
        );
        lives.spawn(life);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(config.pod_every) => {}
        }
    }
    while let Some(done) = lives.join_next().await {
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => shared.fail(format!("pod: {e:#}")),
            Err(e) => shared.fail(format!("pod task: {e}")),
        }
    }
    Ok(())
}

/// One pod: created (retried while the webhook cannot be reached), checked for the sidecar,
/// waited for until Ready, probed, deleted after `lifetime` (unless the soak ends first).
async fn pod_life(
    client: kube::Client,
    shared: Arc<Shared>,
    lifetime: Duration,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client, &shared.ns);
    let pod = churn_pod()?;
    let asked = Instant::now();
    let created = loop {
        shared.count(|c| c.create_attempts += 1);
        match pods.create(&PostParams::default(), &pod).await {
            Ok(created) => break created,
            Err(kube::Error::Api(e)) if asked.elapsed() < Duration::from_secs(120) => {
                let why = if e.message.contains("failed calling webhook") {
                    "webhook unreachable".to_owned()
                } else {
                    format!("{} {}", e.code, e.reason)
                };
                tracing::info!("soak: pod creation refused ({why}): {}", e.message);
                shared.count(|c| *c.refused.entry(why).or_default() += 1);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!(
                "a pod was never admitted (for {}): {e}",
                human(asked.elapsed())
            ),
        }
    };
    let name = created.name_any();
    shared.count(|c| c.admitted += 1);
    let containers = created
        .spec
        .as_ref()
        .map(|s| {
            let mut all = s.containers.clone();
            all.extend(s.init_containers.iter().flatten().cloned());
            all
        })
        .unwrap_or_default();
    if !containers.iter().any(|c| c.name == SIDECAR) {
        bail!("pod {name} was admitted without the {SIDECAR} container");
    }
    shared.count(|c| c.injected += 1);
    let ip = wait_for(
        &format!("pod {name} Ready"),
        Duration::from_secs(120),
        || async { Ok(demo::ready_ip(&pods.get(&name).await?)) },
    )
    .await?;
    let ready_after = asked.elapsed();
    {
        let mut probed = lock(&shared.probed);
        let first_timed = *lock(&shared.newest_good) + 1;
        probed.insert(
            name.clone(),
            Probed {
                ip,
                served: None,
                first_timed,
                misses: 0,
                last_miss: None,
            },
        );
    }
    shared.count(|c| {
        c.ready += 1;
        c.pod_ready.push(ready_after);
    });
    tokio::select! {
        // The soak ended: the pod stays for the final check.
        _ = stop.wait_for(|s| *s) => return Ok(()),
        () = tokio::time::sleep(lifetime) => {}
    }
    let probe = lock(&shared.probed).remove(&name);
    if let Some(p) = probe
        && p.served.is_none()
    {
        bail!(
            "pod {name} was Ready for {} and its sidecar never served a revision ({} probes \
             unanswered, the last: {})",
            human(lifetime),
            p.misses,
            p.last_miss.unwrap_or_default()
        );
    }
    pods.delete(&name, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting pod {name}"))?;
    shared.count(|c| c.deleted += 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_that_goes_back_or_shows_another_body_is_config_loss() {
        let shared = Shared::default();
        let t0 = Instant::now();
        lock(&shared.probed).insert(
            "a".into(),
            Probed {
                ip: "10.0.0.1".into(),
                served: None,
                first_timed: 2,
                misses: 0,
                last_miss: None,
            },
        );
        for n in [2, 3] {
            lock(&shared.updates).push(Update {
                n,
                applied: t0,
                pending: vec!["a".into()],
                reached: HashMap::new(),
            });
        }
        let answer = |n: u64| Answer::Body(200, body(n));
        let later = t0 + Duration::from_millis(300);
        // Revision 3 at once: both timed updates reached.
        record(&shared, vec![("a".into(), answer(3), later)]);
        assert_eq!(*lock(&shared.per_envoy), [Duration::from_millis(300); 2]);
        assert!(
            lock(&shared.updates)
                .iter()
                .all(|u| u.reached.contains_key("a"))
        );
        // A timeout is a miss, not a loss; the same revision is nothing new.
        record(
            &shared,
            vec![
                ("a".into(), Answer::Nothing("timeout".into()), later),
                ("a".into(), answer(3), later),
            ],
        );
        assert!(lock(&shared.failures).is_empty());
        assert_eq!(lock(&shared.probed)["a"].misses, 1);
        // Back to 2, a 404 and another body are each config loss, by name.
        record(
            &shared,
            vec![
                ("a".into(), answer(2), later),
                ("a".into(), Answer::Body(404, String::new()), later),
                (
                    "a".into(),
                    Answer::Body(200, "this body never reaches a client".into()),
                    later,
                ),
                ("a".into(), Answer::Refused, later),
                ("gone".into(), answer(1), later),
            ],
        );
        let failures = lock(&shared.failures).clone();
        assert_eq!(failures.len(), 4, "{failures:?}");
        assert!(
            failures[0].contains("a went back from revision 3 to 2"),
            "{failures:?}"
        );
        assert!(failures[1].contains("a answered 404"), "{failures:?}");
        assert!(failures[2].contains("never reaches"), "{failures:?}");
        assert!(failures[3].contains("a stopped listening"), "{failures:?}");
    }

    #[test]
    fn bodies_name_their_revision() {
        assert_eq!(revision_of(&body(42)), Some(42));
        assert_eq!(revision_of("this body never reaches a client"), None);
        assert_eq!(revision_of("soak revision x"), None);
    }

    #[test]
    fn good_and_bad_listeners_pass_validation() {
        // Both reach Envoy (the bad one is refused by the proxy, not by marin3r validate nor
        // by Envoy's validate mode, which the webhook runs).
        let judge =
            marin3r_envoyconfig::judge::EnvoyJudge::new(marin3r_testkit::tools::envoy().unwrap())
                .with_launcher(marin3r_testkit::image::marin3r_bin().unwrap());
        for bad in [false, true] {
            let mut ec = envoy_config("soak", 7).unwrap();
            ec.spec.envoy_resources.listeners[0].value = listener(7, bad).unwrap();
            let spec = &ec.spec;
            let converted = marin3r_envoyconfig::convert::envoy_resources(
                &spec.envoy_resources,
                spec.serialization,
            );
            assert_eq!(converted.unwrap().len(), 1);
            assert_eq!(judge.judge(spec), Ok(()), "bad: {bad}");
        }
    }
}
