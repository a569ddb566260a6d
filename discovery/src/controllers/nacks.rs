//! Taints the revisions Envoy rejects, with any number of discovery replicas. Policy: a
//! revision is tainted when a share of its node's connected proxies (by default all of them,
//! `--taint-threshold-percent`) has rejected the version it carried, so one outlier proxy (an
//! older Envoy during an upgrade, a broken or hostile pod) cannot roll back the whole node. A
//! taint is permanent for that revision (delete the revision, or change the spec, to try
//! again). The `EnvoyConfig` controller sees the taint and rolls back.
//!
//! The proxies of one node may be spread over several replicas, so the decision goes through
//! the API: every replica writes its own count into the revision's `status.nackReports` (one
//! entry per replica: a NACK it saw, or its answer to another replica's report), and the
//! leader alone sums the reports of the live replicas (pod present, report fresh) against the
//! threshold and writes the taint, once, guarded by the revision's resourceVersion.
//!
//! Fairness: each namespace has its own bounded queue and worker, so a flood of NACKs or a
//! slow API write in one namespace never delays or drops another namespace's reports.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use marin3r_controller::{Note, patch_status, set_condition, status_patch};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::{Context, Error};
use marin3r_api::EnvoyConfigRevision;
use marin3r_api::envoy_config_revision::{NackReport, REVISION_TAINTED, RevisionReason};
use marin3r_xds::resource::ResourceType;
use marin3r_xds::{NackEvent, Track};

/// How many NACK events wait per namespace; more are dropped (and counted), which only
/// affects that namespace.
const PER_NAMESPACE_QUEUE: usize = 64;

/// How long a replica's report counts: an older one describes proxies that may have
/// reconnected elsewhere since.
pub const REPORT_LIFETIME: Duration = Duration::from_secs(300);

/// How long the leader waits, after the first report of a rejection, for every live replica
/// to answer with its own count before it decides with the reports it has.
pub const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The controller's name in metrics and logs.
const CONTROLLER: &str = "taint";

/// Where the sibling discovery pods are: a report of a replica whose pod is gone is ignored,
/// and the leader waits for the answer of every live one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPods {
    pub namespace: String,
    /// The label selector of the discovery pods.
    pub selector: String,
}

/// The percentage of a node's connected proxies that must reject a version to taint it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaintThreshold(u8);

impl TaintThreshold {
    /// `percent` from 1 to 100.
    pub fn percent(percent: u8) -> Result<Self, String> {
        if (1..=100).contains(&percent) {
            Ok(Self(percent))
        } else {
            Err(format!(
                "the taint threshold is a percentage from 1 to 100, not {percent}"
            ))
        }
    }

    /// Whether `rejecting` of `connected` proxies reach the threshold. A NACK from a proxy
    /// that is gone by the time it is counted (connected 0) still counts as one of one.
    pub fn reached(self, rejecting: usize, connected: usize) -> bool {
        let connected = connected.max(rejecting).max(1);
        rejecting.saturating_mul(100) >= usize::from(self.0).saturating_mul(connected)
    }
}

impl Default for TaintThreshold {
    /// Every connected proxy of the node, as the original MARIN3R.
    fn default() -> Self {
        Self(100)
    }
}

/// Every replica: writes its count of each NACK it sees into the rejected revision's
/// `status.nackReports`.
pub(crate) async fn report_nacks(
    ctx: Arc<Context>,
    nacks: mpsc::Receiver<NackEvent>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let handler = {
        let ctx = Arc::clone(&ctx);
        move |nack: NackEvent| {
            let ctx = Arc::clone(&ctx);
            async move { report_with_retries(&ctx, &nack).await }
        }
    };
    let dropped = ctx.metrics.nacks_dropped.clone();
    dispatch(
        nacks,
        |_| true,
        handler,
        move || {
            dropped.inc();
        },
        shutdown,
    )
    .await;
}

/// Routes every NACK that `admit` accepts to its namespace's queue, whose worker runs
/// `handle` on one event at a time; `on_drop` is called for an event whose namespace queue
/// is full. Returns when `shutdown` resolves or the NACK channel closes.
pub(crate) async fn dispatch<H, Fut>(
    mut nacks: mpsc::Receiver<NackEvent>,
    mut admit: impl FnMut(&NackEvent) -> bool,
    handle: H,
    on_drop: impl Fn(),
    shutdown: impl Future<Output = ()> + Send,
) where
    H: Fn(NackEvent) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::pin!(shutdown);
    let mut queues: HashMap<String, mpsc::Sender<NackEvent>> = HashMap::new();
    let mut workers = JoinSet::new();
    loop {
        let nack = tokio::select! {
            () = &mut shutdown => break,
            nack = nacks.recv() => match nack {
                Some(nack) => nack,
                None => break,
            },
        };
        if !admit(&nack) {
            continue;
        }
        let queue = queues.entry(nack.namespace.clone()).or_insert_with(|| {
            let (tx, mut rx) = mpsc::channel::<NackEvent>(PER_NAMESPACE_QUEUE);
            let handle = handle.clone();
            workers.spawn(async move {
                while let Some(nack) = rx.recv().await {
                    handle(nack).await;
                }
            });
            tx
        });
        if let Err(mpsc::error::TrySendError::Full(nack)) = queue.try_send(nack) {
            on_drop();
            warn!(namespace = %nack.namespace, "NACK event dropped: this namespace's queue is full");
        }
    }
    workers.abort_all();
}

/// A failed write (a conflict with another replica's report included) is retried on a
/// fresh read a few times; the NACK is not sent again by Envoy.
async fn report_with_retries(ctx: &Context, nack: &NackEvent) {
    for attempt in 0..5u64 {
        match report(ctx, nack).await {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, attempt, "could not report the NACK on the rejected revision");
                tokio::time::sleep(Duration::from_millis(200 * (attempt + 1))).await;
            }
        }
    }
}

async fn report(ctx: &Context, nack: &NackEvent) -> Result<(), Error> {
    let Some(load) = ctx.publisher.revision_of(nack) else {
        debug!(namespace = %nack.namespace, node = %nack.node_id, version = %nack.version, "NACK of a version no revision served; ignored");
        return Ok(());
    };
    // A canary version is counted among the proxies it was served to.
    let key = marin3r_xds::NodeKey::new(nack.namespace.clone(), nack.node_id.clone());
    let track = match ctx.publisher.canary(&key) {
        Some(canary) if canary.uid == load.uid => Track::Canary,
        _ => Track::Stable,
    };
    let now = ctx.config.proxies.tally(
        &nack.namespace,
        &nack.node_id,
        track,
        nack.resource_type,
        &nack.version,
    );
    let (rejecting, connected) = counted(now, (nack.rejecting, nack.connected));
    let entry = NackReport {
        replica: ctx.config.replica.clone(),
        connected_proxies: count(connected),
        rejecting_proxies: count(rejecting),
        resource_type: nack.resource_type.spec_field().to_owned(),
        version: nack.version.clone(),
        message: nack.message.clone(),
        proxy_pod: nack.pod_name.clone(),
        reported_at: super::now(),
    };
    write_report(ctx, &nack.namespace, &load.revision, &load.version, entry).await
}

/// The (rejecting, connected) proxies a report carries: this replica's count when it is
/// written (`now`), not the one taken when the NACK came. NACKs of several proxies arrive
/// at once, and their events can reach the queue out of order (the proxy that made it 3 of 3
/// before the one that made it 2 of 3), or a write be retried after a later one: a report
/// written with its event's count would leave the last word to an older count, and the
/// revision untainted for good. When no proxy rejecting it is connected any more, the event's
/// count stands (a proxy gone since still rejected it).
fn counted(now: (usize, usize), event: (usize, usize)) -> (usize, usize) {
    if now.0 == 0 { event } else { now }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Puts `entry` in place of this replica's report on the revision, read fresh; the write
/// carries the resourceVersion read, so two replicas reporting at once never lose each
/// other's entry (the later one gets a conflict and retries).
async fn write_report(
    ctx: &Context,
    namespace: &str,
    name: &str,
    revision_version: &str,
    entry: NackReport,
) -> Result<(), Error> {
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(revision) = api.get_opt(name).await? else {
        return Ok(());
    };
    if revision.is_tainted() || revision.spec.version != revision_version {
        return Ok(());
    }
    let mut reports = revision
        .status
        .as_ref()
        .map(|s| s.nack_reports.clone())
        .unwrap_or_default();
    reports.retain(|r| r.replica != entry.replica);
    info!(revision = %name, %namespace, replica = %entry.replica,
          rejecting = entry.rejecting_proxies, connected = entry.connected_proxies,
          "reporting this replica's count of the proxies that rejected the revision");
    reports.push(entry);
    reports.sort_by(|a, b| a.replica.cmp(&b.replica));
    let mut patch = serde_json::json!({ "status": { "nackReports": reports } });
    if let Some(rv) = &revision.metadata.resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch_status(&api, name, patch, super::FIELD_MANAGER).await?;
    Ok(())
}

/// Every replica, from the revision loader: when another replica reported a rejection of
/// this published revision and this one has no fresh report on it, this replica adds its own
/// count of the node's proxies (how many of its proxies rejected that version, out of how
/// many are connected to it), so the leader sums the whole node.
pub(crate) async fn answer(r: &EnvoyConfigRevision, ctx: &Context) -> Result<(), Error> {
    let Some(status) = &r.status else {
        return Ok(());
    };
    if r.is_tainted() {
        return Ok(());
    }
    let now = Timestamp::now();
    let fresh = |report: &NackReport| age(&report.reported_at, now) <= REPORT_LIFETIME;
    let me = &ctx.config.replica;
    if status
        .nack_reports
        .iter()
        .any(|report| &report.replica == me && fresh(report))
    {
        return Ok(());
    }
    let Some(newest) = status
        .nack_reports
        .iter()
        .filter(|report| report.rejecting_proxies > 0 && fresh(report))
        .max_by_key(|report| report.reported_at.0)
    else {
        return Ok(());
    };
    let Some(kind) = ResourceType::from_spec_field(&newest.resource_type) else {
        return Ok(());
    };
    let namespace = r.namespace().unwrap_or_default();
    let track = match r.canary() {
        Some(_) => Track::Canary,
        None => Track::Stable,
    };
    let (rejecting, connected) =
        ctx.config
            .proxies
            .tally(&namespace, &r.spec.node_id, track, kind, &newest.version);
    let entry = NackReport {
        replica: me.clone(),
        connected_proxies: count(connected),
        rejecting_proxies: count(rejecting),
        resource_type: newest.resource_type.clone(),
        version: newest.version.clone(),
        message: String::new(),
        proxy_pod: None,
        reported_at: super::now(),
    };
    write_report(ctx, &namespace, &r.name_any(), &r.spec.version, entry).await
}

/// How long ago `at` was (zero when in the future: clocks of replicas differ).
fn age(at: &Time, now: Timestamp) -> Duration {
    let millis = now.as_millisecond().saturating_sub(at.0.as_millisecond());
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// What the leader does with a revision's reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No live report of a rejection.
    Nothing,
    /// A live replica has not answered yet: decide again after this long.
    Wait(Duration),
    /// The live reports sum below the threshold: the revision stays published.
    Below { rejecting: u64, connected: u64 },
    /// Taint, with this message.
    Taint { message: String },
}

/// The pure decision: the reports of live replicas (`live`: the names of the discovery pods
/// that exist, `None` when unknown) that are fresh at `now` are summed; while a live replica
/// has not answered and the first rejection is younger than [`ANSWER_WAIT`], wait.
pub fn decide(
    reports: &[NackReport],
    live: Option<&BTreeSet<String>>,
    now: Timestamp,
    threshold: TaintThreshold,
) -> Decision {
    let counted: Vec<&NackReport> = reports
        .iter()
        .filter(|r| age(&r.reported_at, now) <= REPORT_LIFETIME)
        .filter(|r| live.is_none_or(|live| live.contains(&r.replica)))
        .collect();
    let Some(first) = counted
        .iter()
        .filter(|r| r.rejecting_proxies > 0)
        .map(|r| age(&r.reported_at, now))
        .max()
    else {
        return Decision::Nothing;
    };
    if let Some(live) = live {
        let answered: BTreeSet<&String> = counted.iter().map(|r| &r.replica).collect();
        let missing = live.iter().any(|name| !answered.contains(name));
        if missing && first < ANSWER_WAIT {
            return Decision::Wait(ANSWER_WAIT - first);
        }
    }
    let rejecting: u64 = counted.iter().map(|r| u64::from(r.rejecting_proxies)).sum();
    let connected: u64 = counted.iter().map(|r| u64::from(r.connected_proxies)).sum();
    let as_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    if !threshold.reached(as_usize(rejecting), as_usize(connected)) {
        return Decision::Below {
            rejecting,
            connected,
        };
    }
    // The message of the newest rejecting report that has one.
    let Some(example) = counted
        .iter()
        .filter(|r| r.rejecting_proxies > 0)
        .max_by_key(|r| (!r.message.is_empty(), r.reported_at.0))
    else {
        return Decision::Nothing;
    };
    let pod = example.proxy_pod.as_deref().unwrap_or("unknown pod");
    let replicas = counted.len();
    let connected = connected.max(rejecting);
    Decision::Taint {
        message: format!(
            "Envoy ({pod}; {rejecting} of {connected} connected proxies of the node, over \
             {replicas} discovery replica(s)) rejected the {} of version {}: {}",
            example.resource_type, example.version, example.message
        ),
    }
}

/// The leader: decides on every revision that has reports.
pub(crate) async fn run_decider(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let revisions = &ctx.index.revisions;
    let controller =
        kube::runtime::Controller::for_shared_stream(revisions.changes(), revisions.store());
    let controller = ctx.watch_namespaces(controller);
    let (metrics, deadline) = (ctx.metrics.reconciles.clone(), ctx.reconcile_timeout());
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
}

async fn reconcile(r: Arc<EnvoyConfigRevision>, ctx: Arc<Context>) -> Result<Action, Error> {
    let reports = r
        .status
        .as_ref()
        .map(|s| s.nack_reports.as_slice())
        .unwrap_or_default();
    if reports.is_empty() || r.is_tainted() || r.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    // The revision watch is cluster-wide (unless one namespace is watched): a revision of a
    // namespace served by another discovery service is that one's leader's to decide. Its
    // reports are by replicas that are not this one's, so `live` would not know them: without
    // a list of pods (a single replica) the first report alone would taint it, before that
    // service's other replicas have answered.
    if !ctx.writes_for(&r.namespace().unwrap_or_default()).await {
        return Ok(Action::await_change());
    }
    let live = live_replicas(&ctx).await?;
    match decide(
        reports,
        live.as_ref(),
        Timestamp::now(),
        ctx.config.taint_threshold,
    ) {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::Wait(after) => Ok(Action::requeue(after)),
        Decision::Below {
            rejecting,
            connected,
        } => {
            ctx.metrics.nacks_below_threshold.inc();
            info!(revision = %r.name_any(), namespace = ?r.namespace(), rejecting, connected,
                  "NACKs below the taint threshold; the revision stays published");
            Ok(Action::await_change())
        }
        Decision::Taint { message } => {
            taint(&ctx, &r, RevisionReason::RejectedByEnvoy, &message).await?;
            Ok(Action::await_change())
        }
    }
}

/// The names of the discovery pods that exist and are not terminating, when known.
pub(super) async fn live_replicas(ctx: &Context) -> Result<Option<BTreeSet<String>>, Error> {
    let Some(pods) = &ctx.config.replica_pods else {
        return Ok(None);
    };
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pods.namespace);
    let list = api
        .list(&ListParams::default().labels(&pods.selector))
        .await?;
    Ok(Some(
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| p.name_any())
            .collect(),
    ))
}

/// Writes the taint on the revision as the leader read it: a stale read is refused with a
/// conflict (and decided again on the fresh one), so the taint is written once.
pub(super) async fn taint(
    ctx: &Context,
    revision: &EnvoyConfigRevision,
    reason: RevisionReason,
    message: &str,
) -> Result<(), Error> {
    let namespace = revision.namespace().unwrap_or_default();
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut status = revision.status.clone().unwrap_or_default();
    status.tainted = Some(true);
    set_condition(
        &mut status.conditions,
        REVISION_TAINTED,
        true,
        reason,
        message,
        revision.metadata.generation,
        &super::now(),
    );
    let patch = status_patch(&status, &[], revision.metadata.resource_version.as_deref())?;
    patch_status(&api, &revision.name_any(), patch, super::FIELD_MANAGER).await?;
    info!(revision = %revision.name_any(), %namespace, %message, "tainted");
    ctx.metrics.taints.inc();
    let note = Note::warning(RevisionReason::RevisionTainted, message.to_owned());
    ctx.events.publish(revision, &note).await;
    Ok(())
}

#[cfg(test)]
#[path = "nacks_tests.rs"]
mod tests;
