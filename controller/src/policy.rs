//! What a controller does when a reconcile fails, and the logging of its results.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use crate::ReconcileMetrics;

/// What a reconcile fails with; its cause is its `source` ([`crate::chain`] shows both).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API")]
    Kube(#[from] kube::Error),
    #[error("encoding an object")]
    Encode(#[from] serde_json::Error),
    #[error("finalizer")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Conflict for Error {
    fn is_conflict(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::Kube(e) => is_conflict(e),
            Self::Finalizer(e) => match &**e {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.is_conflict(),
                F::AddFinalizer(e) | F::RemoveFinalizer(e) => is_conflict(e),
                F::UnnamedObject | F::InvalidFinalizer => false,
            },
            Self::Encode(_) => false,
        }
    }
}

/// A write lost a race with another writer: retry soon with a fresh read.
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(e) if e.code == 409)
}

/// How long one reconcile may take before it is abandoned and retried: far more than any
/// reconcile needs, but finite, so one request that never answers cannot stop its object
/// from ever being reconciled again (kube never runs two reconciles of one object at once).
pub const DEFAULT_RECONCILE_TIMEOUT: Duration = Duration::from_secs(120);

/// A reconcile's failure as [`run`] sees it: the controller's own error, or the deadline.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<E> {
    #[error(transparent)]
    Failed(E),
    #[error(
        "the reconcile did not finish within {0:?} (an API request that never answered?); abandoned, and retried with fresh requests"
    )]
    TimedOut(Duration),
}

impl<E: Conflict> Conflict for ReconcileError<E> {
    fn is_conflict(&self) -> bool {
        match self {
            Self::Failed(e) => e.is_conflict(),
            Self::TimedOut(_) => false,
        }
    }
}

/// Runs `reconcile` for at most `deadline`: past it the reconcile is dropped (its request
/// with it, which closes that request's connection).
pub async fn within<T, E>(
    deadline: Duration,
    reconcile: impl Future<Output = Result<T, E>>,
) -> Result<T, ReconcileError<E>> {
    match tokio::time::timeout(deadline, reconcile).await {
        Ok(result) => result.map_err(ReconcileError::Failed),
        Err(_) => Err(ReconcileError::TimedOut(deadline)),
    }
}

/// Errors that can say whether they are a lost write race.
pub trait Conflict {
    fn is_conflict(&self) -> bool;
}

/// How long a failed reconcile waits: a conflict is retried at once, anything else later.
pub fn retry_after(err: &impl Conflict) -> Duration {
    if err.is_conflict() {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(5)
    }
}

/// The error policy of every controller: log (a conflict quietly) and requeue.
pub fn error_policy<K, E>(kind: &str, obj: &K, err: &E) -> Action
where
    K: Resource,
    E: std::error::Error + Conflict + 'static,
{
    let error = crate::chain(err);
    if err.is_conflict() {
        debug!(kind, name = %obj.name_any(), %error, "write conflict; retrying");
    } else {
        warn!(kind, name = %obj.name_any(), namespace = ?obj.namespace(), %error, "reconcile failed; retrying");
    }
    Action::requeue(retry_after(err))
}

/// Runs `controller` until `shutdown` resolves: each reconcile has `deadline` (see
/// [`within`]) and is measured into `metrics`, every failure (a missed deadline included)
/// goes through [`error_policy`], every result is logged.
pub async fn run<K, Ctx, E, Fut>(
    controller: Controller<K>,
    name: &'static str,
    deadline: Duration,
    metrics: ReconcileMetrics,
    reconcile: impl Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + 'static,
    ctx: Arc<Ctx>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    E: std::error::Error + Conflict + Send + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let store = controller.store();
    let shutdown = shutdown.shared();
    let results = controller.graceful_shutdown_on(shutdown.clone()).run(
        move |obj, ctx| {
            let metrics = metrics.clone();
            let reconcile = within(deadline, reconcile(obj, ctx));
            async move { metrics.measure(name, reconcile).await }
        },
        move |obj, err, _| error_policy(name, &*obj, err),
        ctx,
    );
    tokio::select! {
        () = drain(results, name) => {}
        () = never_listed(shutdown, store) => {
            debug!(kind = name, "stopped before its first list: nothing to wait for");
        }
    }
}

/// Resolves when `shutdown` comes before `store` has listed its objects (the API server
/// unreachable since the start). kube's runner holds every reconcile until then, and waits
/// for it even to end, so the controller would outlive its shutdown; with nothing listed no
/// reconcile has started, and there is nothing to wait for. Never resolves otherwise: the
/// graceful shutdown lets the reconciles under way finish.
async fn never_listed<K>(shutdown: impl Future<Output = ()>, store: Store<K>)
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    shutdown.await;
    // Polled once, after the shutdown only: the readiness future keeps one waker, the
    // runner's, which must not be taken while the controller runs.
    if store.wait_until_ready().now_or_never().is_none() {
        return;
    }
    std::future::pending::<()>().await;
}

/// Runs a controller's result stream to its end, logging each result.
pub async fn drain<K, E, S>(results: S, kind: &'static str)
where
    K: Resource<DynamicType = ()>,
    E: std::error::Error + 'static,
    S: Stream<Item = Result<(ObjectRef<K>, Action), E>>,
{
    results
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(kind, object = %obj, "reconciled"),
                Err(err) => debug!(kind, error = %crate::chain(&err), "reconcile failed"),
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::oneshot;

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    impl Conflict for Never {
        fn is_conflict(&self) -> bool {
            false
        }
    }

    fn mk_config_map() -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("cm".into());
        cm.metadata.namespace = Some("ns".into());
        cm
    }

    /// A reconcile stuck on a request that never answers ends at its deadline
    /// as an error the policy retries later (not as a conflict, retried at once).
    #[tokio::test]
    async fn a_stuck_reconcile_fails_at_its_deadline_and_is_retried() {
        let stuck = std::future::pending::<Result<(), Never>>();
        let deadline = Duration::from_millis(50);
        let err = within(deadline, stuck).await.unwrap_err();
        assert!(matches!(err, ReconcileError::TimedOut(d) if d == deadline));
        assert!(
            err.to_string().contains("did not finish within 50ms"),
            "{err}"
        );
        let action = error_policy("test", &mk_config_map(), &err);
        assert_eq!(action, Action::requeue(Duration::from_secs(5)));
        // A reconcile that finishes in time keeps its own result.
        assert!(
            within(Duration::from_secs(1), async { Ok::<_, Never>(()) })
                .await
                .is_ok()
        );
    }

    /// The API server unreachable from the start, the store never lists.
    #[tokio::test]
    async fn a_controller_that_never_listed_stops_at_its_shutdown() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let controller = Controller::for_stream(futures::stream::pending(), store);
        let running = run(
            controller,
            "test",
            DEFAULT_RECONCILE_TIMEOUT,
            ReconcileMetrics::default(),
            |_, _: Arc<()>| async { Ok::<_, Never>(Action::await_change()) },
            Arc::new(()),
            tokio::time::sleep(Duration::from_millis(50)),
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(5), running)
                .await
                .is_ok(),
            "the controller outlived its shutdown"
        );
    }

    struct Progress {
        started: std::sync::Mutex<Option<oneshot::Sender<()>>>,
        finished: AtomicBool,
    }

    /// Stopping early is for a store that never listed: a listed one still lets the
    /// reconcile under way finish.
    #[tokio::test]
    async fn a_reconcile_under_way_at_shutdown_finishes() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(mk_config_map()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let trigger =
            futures::stream::iter([Ok(mk_config_map())]).chain(futures::stream::pending());
        let controller = Controller::for_stream(trigger, store);
        let (started, shutdown) = oneshot::channel();
        let progress = Arc::new(Progress {
            started: std::sync::Mutex::new(Some(started)),
            finished: AtomicBool::new(false),
        });
        let reconcile = |_, progress: Arc<Progress>| async move {
            let started = progress.started.lock().ok().and_then(|mut s| s.take());
            if let Some(started) = started {
                let _ = started.send(());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            progress.finished.store(true, Ordering::SeqCst);
            Ok::<_, Never>(Action::await_change())
        };
        let running = run(
            controller,
            "test",
            DEFAULT_RECONCILE_TIMEOUT,
            ReconcileMetrics::default(),
            reconcile,
            Arc::clone(&progress),
            shutdown.map(|_| ()),
        );
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .unwrap();
        assert!(progress.finished.load(Ordering::SeqCst));
    }
}
