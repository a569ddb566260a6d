//! Taints the revisions Envoy rejects. Policy: a revision is tainted when a share of its
//! node's connected proxies (by default all of them, `--taint-threshold-percent`) has rejected
//! the version it carried, so one outlier proxy (an older Envoy during an upgrade, a broken
//! or hostile pod) cannot roll back the whole node. A taint is permanent for that revision
//! (delete the revision, or change the spec, to try again). The `EnvoyConfig` controller sees
//! the taint and rolls back.
//!
//! Fairness: each namespace has its own bounded queue and worker, so a flood of NACKs or a
//! slow API write in one namespace never delays or drops another namespace's taints.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use kube::{Api, ResourceExt};
use marin3r_controller::{Note, patch_status, set_condition, status_patch};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use super::{Context, Error};
use crate::api::EnvoyConfigRevision;
use crate::api::envoy_config_revision::{REVISION_TAINTED, RevisionReason};
use crate::xds::NackEvent;

/// How many NACK events wait per namespace; more are dropped (and counted), which only
/// affects that namespace.
const PER_NAMESPACE_QUEUE: usize = 64;

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

pub(crate) async fn run(
    ctx: Arc<Context>,
    nacks: mpsc::Receiver<NackEvent>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let threshold = ctx.config.taint_threshold;
    let handler = {
        let ctx = Arc::clone(&ctx);
        move |nack: NackEvent| {
            let ctx = Arc::clone(&ctx);
            async move { taint_with_retries(&ctx, &nack).await }
        }
    };
    let below = ctx.metrics.nacks_below_threshold.clone();
    let dropped = ctx.metrics.nacks_dropped.clone();
    dispatch(
        nacks,
        move |nack| {
            let reached = threshold.reached(nack.rejecting, nack.connected);
            if !reached {
                below.inc();
                info!(namespace = %nack.namespace, node = %nack.node_id, version = %nack.version,
                      rejecting = nack.rejecting, connected = nack.connected,
                      "NACK below the taint threshold; the revision stays published");
            }
            reached
        },
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

/// A failed write is retried a few times; the NACK is not sent again by Envoy.
async fn taint_with_retries(ctx: &Context, nack: &NackEvent) {
    for attempt in 0..5u64 {
        match taint(ctx, nack).await {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, attempt, "could not taint the rejected revision");
                tokio::time::sleep(std::time::Duration::from_millis(200 * (attempt + 1))).await;
            }
        }
    }
}

async fn taint(ctx: &Context, nack: &NackEvent) -> Result<(), Error> {
    let Some(load) = ctx.publisher.revision_of(nack) else {
        debug!(namespace = %nack.namespace, node = %nack.node_id, version = %nack.version, "NACK of a version no revision served; ignored");
        return Ok(());
    };
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &nack.namespace);
    let Some(revision) = api.get_opt(&load.revision).await? else {
        return Ok(());
    };
    if revision.is_tainted() || revision.spec.version != load.version {
        return Ok(());
    }
    let pod = nack.pod_name.as_deref().unwrap_or("unknown pod");
    let message = format!(
        "Envoy ({pod}; {} of {} connected proxies of the node) rejected the {} of version {}: {}",
        nack.rejecting, nack.connected, nack.resource_type, nack.version, nack.message
    );
    let mut status = revision.status.clone().unwrap_or_default();
    status.tainted = Some(true);
    set_condition(
        &mut status.conditions,
        REVISION_TAINTED,
        true,
        RevisionReason::RejectedByEnvoy,
        &message,
        revision.metadata.generation,
        &super::now(),
    );
    let patch = status_patch(&status, &[], revision.metadata.resource_version.as_deref())?;
    patch_status(&api, &revision.name_any(), patch, super::FIELD_MANAGER).await?;
    info!(revision = %revision.name_any(), namespace = %nack.namespace, %message, "tainted");
    ctx.metrics.taints.inc();
    let note = Note::warning(RevisionReason::RevisionTainted, message);
    ctx.events.publish(&revision, &note).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::resource::ResourceType;

    fn mk_nack(namespace: &str, rejecting: usize, connected: usize) -> NackEvent {
        NackEvent {
            namespace: namespace.into(),
            node_id: "node".into(),
            pod_name: None,
            resource_type: ResourceType::Listener,
            type_url: ResourceType::Listener.type_url().into(),
            version: "v2".into(),
            message: "bad".into(),
            rejecting,
            connected,
        }
    }

    #[test]
    fn thresholds() {
        let all = TaintThreshold::default();
        assert!(all.reached(1, 1));
        assert!(!all.reached(1, 2));
        assert!(all.reached(2, 2));
        assert!(all.reached(1, 0), "a proxy gone since still counts");
        let half = TaintThreshold::percent(50).unwrap();
        assert!(half.reached(1, 2));
        assert!(!half.reached(1, 3));
        assert!(half.reached(usize::MAX, usize::MAX));
        assert!(TaintThreshold::percent(0).is_err());
        assert!(TaintThreshold::percent(101).unwrap_err().contains("101"));
    }

    #[tokio::test]
    async fn a_stuck_namespace_does_not_delay_or_drop_another() {
        let (tx, rx) = mpsc::channel(1024);
        let handled = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handle = {
            let handled = handled.clone();
            move |nack: NackEvent| {
                let handled = handled.clone();
                async move {
                    if nack.namespace == "stuck" {
                        // An API write that never returns.
                        std::future::pending::<()>().await;
                    }
                    handled.lock().unwrap().push(nack.namespace);
                }
            }
        };
        let on_drop = {
            let dropped = dropped.clone();
            move || {
                dropped.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(dispatch(
            rx,
            |n: &NackEvent| TaintThreshold::default().reached(n.rejecting, n.connected),
            handle,
            on_drop,
            stop.clone().cancelled_owned(),
        ));
        // A flood from one namespace, more than its queue holds...
        for _ in 0..500 {
            tx.send(mk_nack("stuck", 1, 1)).await.unwrap();
        }
        // ...one NACK below the threshold elsewhere, and one that taints.
        tx.send(mk_nack("calm", 1, 2)).await.unwrap();
        tx.send(mk_nack("calm", 2, 2)).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while handled.lock().unwrap().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "calm was never handled"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *handled.lock().unwrap(),
            ["calm"],
            "only the one over the threshold"
        );
        // The stuck namespace's overflow was dropped, and only its own.
        assert_eq!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            500 - PER_NAMESPACE_QUEUE - 1
        );
        stop.cancel();
        task.await.unwrap();
    }
}
