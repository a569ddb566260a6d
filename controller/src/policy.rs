//! What a controller does when a reconcile fails, and the logging of its results.

use std::fmt::{Debug, Display};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use crate::ReconcileMetrics;

/// What a reconcile fails with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding an object: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("finalizer: {0}")]
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
    E: Conflict + Display,
{
    if err.is_conflict() {
        debug!(kind, name = %obj.name_any(), error = %err, "write conflict; retrying");
    } else {
        warn!(kind, name = %obj.name_any(), namespace = ?obj.namespace(), error = %err, "reconcile failed; retrying");
    }
    Action::requeue(retry_after(err))
}

/// Runs `controller` until `shutdown` resolves: each reconcile is measured into `metrics`,
/// every failure goes through [`error_policy`], every result is logged.
pub async fn run<K, Ctx, E, Fut>(
    controller: Controller<K>,
    name: &'static str,
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
    let results = controller.graceful_shutdown_on(shutdown).run(
        move |obj, ctx| {
            let metrics = metrics.clone();
            let reconcile = reconcile(obj, ctx);
            async move { metrics.measure(name, reconcile).await }
        },
        move |obj, err, _| error_policy(name, &*obj, err),
        ctx,
    );
    drain(results, name).await;
}

/// Runs a controller's result stream to its end, logging each result.
pub async fn drain<K, E, S>(results: S, kind: &'static str)
where
    K: Resource<DynamicType = ()>,
    E: Display,
    S: Stream<Item = Result<(ObjectRef<K>, Action), E>>,
{
    results
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(kind, object = %obj, "reconciled"),
                Err(err) => debug!(kind, error = %err, "reconcile failed"),
            }
        })
        .await;
}
