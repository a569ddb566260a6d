//! The discovery service's controllers: `EnvoyConfig` (revisions and which one is published),
//! `EnvoyConfigRevision` (loads the published one, with its Secrets, into the xDS cache) and
//! the NACK consumer that taints rejected revisions. All run in `marin3r discovery-service`.

pub mod convergence;
pub mod envoy_config;
mod index;
pub mod loader;
pub mod metrics;
pub mod nacks;
mod proxy_metrics;
pub mod publisher;
pub mod traffic;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, ResourceExt};
use marin3r_controller::Events;
use tokio::sync::mpsc;

use index::Index;
use marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL;
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};
use marin3r_controller::leader::{self, LeaseConfig};
use marin3r_xds::{Cache, NackEvent, StatusRegistry};
pub use metrics::ControllerMetrics;
pub use publisher::Publisher;

const FIELD_MANAGER: &str = "marin3r-discovery-service";

pub use marin3r_controller::Error;

/// What the controllers serve.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// Where the controllers count their work; register it with the process's registry.
    pub metrics: ControllerMetrics,
    /// Serve only `EnvoyConfig`s in namespaces labelled
    /// `marin3r.3scale.net/discovery-service=<name>`; `None`: every namespace.
    pub discovery_service: Option<String>,
    /// Serve only this namespace, reading nothing outside it (not even Namespaces): the
    /// discovery pod of a `DiscoveryService` that serves its own namespace. Wins over
    /// `discovery_service`.
    pub watch_namespace: Option<String>,
    /// Let revisions reference Secrets in other namespaces (off: a cross-namespace reference
    /// is an error in status, so a namespace cannot have another's certificates served).
    pub allow_cross_namespace_secrets: bool,
    /// The share of a node's connected proxies that must have rejected a version before
    /// its revision is tainted.
    pub taint_threshold: nacks::TaintThreshold,
    /// This replica's name (its pod's), the key of its NACK reports.
    pub replica: String,
    /// The proxies connected to this replica's xDS server, counted when answering another
    /// replica's NACK report.
    pub proxies: StatusRegistry,
    /// Where the sibling discovery pods are (`None`: the reports alone say which replicas
    /// there are).
    pub replica_pods: Option<nacks::ReplicaPods>,
    /// Leader election: only the holder of this Lease runs the `EnvoyConfig` controller and
    /// the taint decision; `None`: this process always does (one replica only).
    pub leader_lease: Option<LeaseConfig>,
    /// How long one reconcile may take before it is abandoned and retried (`None`:
    /// [`marin3r_controller::DEFAULT_RECONCILE_TIMEOUT`]).
    pub reconcile_timeout: Option<std::time::Duration>,
    /// Envoy, the last judge of a new version before it gets its revision (`None`: our own
    /// checks only).
    pub judge: Option<marin3r_envoyconfig::judge::EnvoyJudge>,
}

/// The one watch of each kind the controllers read (see [`index`]).
#[derive(Default)]
pub(crate) struct Indexes {
    pub revisions: Index<EnvoyConfigRevision>,
    pub configs: Index<EnvoyConfig>,
    /// Every Namespace, for their labels: only with `discovery_service` (and no
    /// `watch_namespace`), when the label decides which namespaces are served.
    pub namespaces: Option<Index<Namespace>>,
}

impl Indexes {
    fn new(config: &Config) -> Self {
        let by_label = config.discovery_service.is_some() && config.watch_namespace.is_none();
        Self {
            namespaces: by_label.then(Index::default),
            ..Default::default()
        }
    }

    /// Runs every watch until aborted; deleted revisions stop being served (`deleted`).
    fn run(ctx: &Arc<Context>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = vec![
            tokio::spawn({
                let ctx = Arc::clone(ctx);
                async move {
                    let api = ctx.api::<EnvoyConfigRevision>();
                    let mut deletions = loader::Deletions::default();
                    let on_event = |event: &_| deletions.on_event(&ctx.publisher, event);
                    ctx.index
                        .revisions
                        .run(api, "EnvoyConfigRevision", on_event)
                        .await;
                }
            }),
            tokio::spawn({
                let ctx = Arc::clone(ctx);
                async move {
                    let api = ctx.api::<EnvoyConfig>();
                    ctx.index.configs.run(api, "EnvoyConfig", |_| {}).await;
                }
            }),
        ];
        if ctx.index.namespaces.is_some() {
            tasks.push(tokio::spawn({
                let ctx = Arc::clone(ctx);
                async move {
                    let api = Api::<Namespace>::all(ctx.client.clone());
                    if let Some(index) = &ctx.index.namespaces {
                        index.run(api, "Namespace", |_| {}).await;
                    }
                }
            }));
        }
        tasks
    }
}

/// Shared by every controller.
pub(crate) struct Context {
    pub client: Client,
    pub index: Indexes,
    pub events: Events,
    pub config: Config,
    pub publisher: Publisher,
    pub metrics: ControllerMetrics,
    /// Uids of the revisions the revision controller has tried to load since start (what
    /// readiness waits for).
    pub attempted: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Envoy's last verdict on each EnvoyConfig.
    pub verdicts: envoy_config::verdicts::Verdicts,
    /// What this replica read of its proxies' traffic during rollout steps.
    pub traffic: traffic::Book,
}

impl Context {
    /// How long one reconcile of any of these controllers may take.
    pub fn reconcile_timeout(&self) -> std::time::Duration {
        self.config
            .reconcile_timeout
            .unwrap_or(marin3r_controller::DEFAULT_RECONCILE_TIMEOUT)
    }

    pub fn mark_attempted(&self, uid: &str) {
        if let Ok(mut set) = self.attempted.lock() {
            set.insert(uid.to_owned());
        }
    }

    /// The API of `K` in the namespace watched, or in every namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.config.watch_namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    /// Whether this discovery service serves `namespace`, as the Namespace watch has it: a
    /// label added later takes effect at once (see [`Context::watch_namespaces`]). `None`
    /// when it cannot be known: the watch ended before it listed (shutting down).
    async fn serving(&self, namespace: &str) -> Option<bool> {
        // Only a Namespace watch can be unlisted: without one the answer never waits.
        let reads_labels =
            self.config.watch_namespace.is_none() && self.config.discovery_service.is_some();
        if reads_labels
            && let Some(index) = &self.index.namespaces
            && !listed(&index.store()).await
        {
            return None;
        }
        Some(self.serves_now(namespace))
    }

    /// Whether this discovery service serves `namespace`, as its Namespace watch has it now
    /// (no namespace before the watch has listed): for readers that cannot wait, such as a
    /// metrics scrape.
    pub fn serves_now(&self, namespace: &str) -> bool {
        if let Some(watched) = &self.config.watch_namespace {
            return watched == namespace;
        }
        let (Some(name), Some(index)) = (&self.config.discovery_service, &self.index.namespaces)
        else {
            return true;
        };
        index
            .store()
            .get(&ObjectRef::new(namespace))
            .is_some_and(|ns| ns.labels().get(DISCOVERY_SERVICE_LABEL) == Some(name))
    }

    /// Whether to keep serving `namespace`'s revisions: when it cannot be known, yes, so
    /// nothing loaded is unloaded on the way out.
    pub async fn serves(&self, namespace: &str) -> Result<bool, Error> {
        Ok(self.serving(namespace).await.unwrap_or(true))
    }

    /// Whether to write on `namespace`'s objects (revisions, taints, sync reports): when it
    /// cannot be known, no, so a replica on its way out never writes on the objects of a
    /// namespace another discovery service serves.
    pub async fn writes_for(&self, namespace: &str) -> bool {
        self.serving(namespace).await.unwrap_or(false)
    }

    /// With `--discovery-service-name`, labelling a namespace (or removing the label) takes
    /// effect at once: a namespace change reconciles every object of that namespace again.
    pub(crate) fn watch_namespaces<K: marin3r_controller::Watched>(
        &self,
        controller: kube::runtime::Controller<K>,
    ) -> kube::runtime::Controller<K> {
        let Some(namespaces) = &self.index.namespaces else {
            return controller;
        };
        let store = controller.store();
        controller.watches_shared_stream(namespaces.changes(), move |ns: Arc<Namespace>| {
            let name = ns.name_any();
            store
                .state()
                .into_iter()
                .filter(|o| o.meta().namespace.as_deref() == Some(name.as_str()))
                .map(|o| ObjectRef::from_obj(&*o))
                .collect::<Vec<_>>()
        })
    }
}

/// Readiness of the controllers: true once every watch has listed its objects and every
/// revision published at start has been loaded (or has failed to load, with a status).
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    pub envoy_configs: Arc<AtomicBool>,
    pub revisions: Arc<AtomicBool>,
}

impl Readiness {
    pub fn ready(&self) -> bool {
        self.envoy_configs.load(Ordering::SeqCst) && self.revisions.load(Ordering::SeqCst)
    }
}

/// Waits until `store` has listed its objects; false when its watch is gone. kube's readiness
/// future wakes only its last poller, so several reconciles awaiting it at once would all but
/// one sleep forever: each polls it again every 100 ms instead.
pub(crate) async fn listed<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        let wait = store.wait_until_ready();
        match tokio::time::timeout(std::time::Duration::from_millis(100), wait).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

/// The turn of a periodic task over the EnvoyConfigs: waits `period`, then until their store
/// has listed (which never comes during an API outage, so `stop` ends the wait too). The
/// store; None when the task is to end (`stop` came, or the watch is gone).
pub(crate) async fn next_turn(
    ctx: &Context,
    stop: &mut (impl Future<Output = ()> + Unpin),
    period: std::time::Duration,
) -> Option<kube::runtime::reflector::Store<EnvoyConfig>> {
    tokio::select! {
        () = &mut *stop => return None,
        () = tokio::time::sleep(period) => {}
    }
    let store = ctx.index.configs.store();
    let listed = tokio::select! {
        () = &mut *stop => return None,
        listed = listed(&store) => listed,
    };
    listed.then_some(store)
}

/// Sets `flag` once `store` has listed its objects.
pub(crate) async fn mark_ready<K>(store: kube::runtime::reflector::Store<K>, flag: Arc<AtomicBool>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    if listed(&store).await {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Runs every controller and the NACK consumer until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    cache: Cache,
    nacks: mpsc::Receiver<NackEvent>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    run_stepping_down(
        client,
        config,
        cache,
        nacks,
        readiness,
        std::future::pending(),
        shutdown,
    )
    .await;
}

/// [`run`], but with leader election the leader's term ends, and the Lease is released, as
/// soon as `step_down` resolves: a draining pod keeps serving what is published while its
/// replacement takes over at once instead of waiting out the drain (and leads again if no
/// other replica takes the Lease).
pub async fn run_stepping_down(
    client: Client,
    config: Config,
    cache: Cache,
    nacks: mpsc::Receiver<NackEvent>,
    readiness: Readiness,
    step_down: impl Future<Output = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context {
        events: Events::new(client.clone(), FIELD_MANAGER),
        index: Indexes::new(&config),
        client,
        metrics: config.metrics.clone(),
        config,
        publisher: Publisher::new(cache),
        attempted: Default::default(),
        verdicts: Default::default(),
        traffic: Default::default(),
    });
    let watches = Indexes::run(&ctx);
    let stop = tokio_util::sync::CancellationToken::new();
    let ecr = tokio::spawn(loader::run(
        Arc::clone(&ctx),
        readiness.revisions.clone(),
        stop.clone().cancelled_owned(),
    ));
    let nack = tokio::spawn(nacks::report_nacks(
        Arc::clone(&ctx),
        nacks,
        stop.clone().cancelled_owned(),
    ));
    let sync_reports = tokio::spawn(convergence::report(
        Arc::clone(&ctx),
        stop.clone().cancelled_owned(),
    ));
    let traffic = tokio::spawn(traffic::run(
        Arc::clone(&ctx),
        stop.clone().cancelled_owned(),
    ));
    let yielding = tokio_util::sync::CancellationToken::new();
    let leading = {
        let ctx = Arc::clone(&ctx);
        let (stop, yielding) = (stop.clone(), yielding.clone());
        tokio::spawn(async move {
            let Some(lease) = ctx.config.leader_lease.clone() else {
                // The only replica: it leads until it stops, draining included.
                lead(ctx, readiness.envoy_configs.clone(), stop).await;
                return;
            };
            // A follower serves what the leader publishes: it has no EnvoyConfig controller
            // of its own to wait for.
            readiness.envoy_configs.store(true, Ordering::SeqCst);
            elect(ctx, lease, stop, yielding).await;
        })
    };
    let stepping_down = {
        let yielding = yielding.clone();
        tokio::spawn(async move {
            step_down.await;
            yielding.cancel();
        })
    };
    shutdown.await;
    stepping_down.abort();
    stop.cancel();
    // The watches end first: whatever still waits for a first list (during an API outage it
    // never comes) is told the watch is gone instead of waiting for good.
    for watch in &watches {
        watch.abort();
    }
    let tasks = [ecr, nack, sync_reports, traffic, leading];
    let aborts: Vec<_> = tasks
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    let joined = futures::future::join_all(tasks);
    if tokio::time::timeout(STOP_GRACE, joined).await.is_err() {
        tracing::warn!(grace = ?STOP_GRACE, "controllers still running after the stop; aborting them");
        aborts.iter().for_each(tokio::task::AbortHandle::abort);
    }
}

/// How long the controllers may take to stop once told to, before they are aborted: a
/// reconcile in flight finishes its API call (each has its own deadline), nothing waits for
/// more.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The leader's part: the `EnvoyConfig` controller (revisions, publication, rollback), the
/// taint decision and the sum of the proxy counts, until `stop`.
async fn lead(
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
) {
    let ec = envoy_config::run(Arc::clone(&ctx), ready, stop.clone().cancelled_owned());
    let taints = nacks::run_decider(Arc::clone(&ctx), stop.clone().cancelled_owned());
    let counts = convergence::sum(ctx, stop.cancelled_owned());
    tokio::join!(ec, taints, counts);
}

/// Campaigns for the Lease, leads while holding it, and campaigns again after losing it
/// (the leader's work stops before anyone else may take over), until `stop`. When `yielding`
/// fires (the pod is draining), the current term ends and the Lease is released at once, so a
/// sibling replica takes over without waiting for the drain; if none has taken it after a
/// few retry periods (this is the only replica), this one campaigns and leads again.
async fn elect(
    ctx: Arc<Context>,
    lease: LeaseConfig,
    stop: tokio_util::sync::CancellationToken,
    yielding: tokio_util::sync::CancellationToken,
) {
    let mut yielded = false;
    while !stop.is_cancelled() {
        let term = stop.child_token();
        if !yielded {
            let (term, yielding) = (term.clone(), yielding.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = yielding.cancelled() => term.cancel(),
                    () = term.cancelled() => {}
                }
            });
        }
        // Stops gracefully at `term`; dropped by `run_as_leader` when the term is lost.
        let work = lead(
            Arc::clone(&ctx),
            Arc::new(AtomicBool::new(false)),
            term.clone(),
        );
        let result = leader::run_as_leader(ctx.client.clone(), lease.clone(), term, work).await;
        if !yielded && yielding.is_cancelled() {
            yielded = true;
            tracing::info!("draining: Lease released for another replica to take");
            tokio::select! {
                () = tokio::time::sleep(lease.retry_period * 3) => {}
                () = stop.cancelled() => {}
            }
            continue;
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "no longer the leader; serving as a follower and campaigning again");
            tokio::select! {
                () = tokio::time::sleep(lease.retry_period) => {}
                () = stop.cancelled() => {}
            }
        }
    }
}

pub(crate) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}
