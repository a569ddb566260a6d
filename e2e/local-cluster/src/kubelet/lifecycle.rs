//! The order in which a pod's containers run, as kubelet runs them with native sidecars:
//! init containers one after the other (a regular one to success; a sidecar only until it
//! has started, then it keeps running beside the rest), then the app containers. When the
//! app containers are all done (`restartPolicy` Never or OnFailure) or the pod is deleted,
//! everything stops: app containers first, then the sidecars in reverse order.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pod::{PodShared, Which, lock};
use super::sidecars;
use super::supervisor::supervise;
use crate::tasks::AbortOnDrop;

/// Runs the pod's containers until they are all stopped for good: by the pod's end (its app
/// containers done, or an init container failed under `restartPolicy: Never`) or by `stop`
/// (a deletion, with its grace period).
pub(super) async fn run_pod(
    shared: Arc<PodShared>,
    init: usize,
    main: usize,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    // What the containers' supervisors watch: the deletion's stop, or the pod's own end.
    let (stopper, containers_stop) = watch::channel(None);
    let run = run_containers(shared, init, main, containers_stop, &stopper);
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => return,
        deleted = stop.wait_for(Option::is_some) => {
            if let Ok(grace) = deleted {
                let grace = *grace;
                stop_once(&stopper, grace);
            }
        }
    }
    run.await;
}

/// Asks every container to stop with `grace`, unless a stop is already under way.
fn stop_once(stopper: &watch::Sender<Option<Duration>>, grace: Option<Duration>) {
    stopper.send_if_modified(|current| {
        let first = current.is_none();
        if first {
            *current = grace;
        }
        first
    });
}

async fn run_containers(
    shared: Arc<PodShared>,
    init: usize,
    main: usize,
    stop: watch::Receiver<Option<Duration>>,
    stopper: &watch::Sender<Option<Duration>>,
) {
    let mut sidecar_tasks = Vec::new();
    if run_init(&shared, init, &stop, &mut sidecar_tasks).await {
        // In order, each once the previous one is launched (its postStart hook returned):
        // how kubelet starts a pod's containers, and what holds an app behind a hook.
        let mut apps = Vec::new();
        for i in 0..main {
            let run = supervise(shared.clone(), Which::Main(i), stop.clone());
            apps.push(AbortOnDrop(tokio::spawn(async move {
                run.await;
            })));
            if !wait_launched(&shared, i, stop.clone()).await {
                break;
            }
        }
        for mut task in apps {
            let _ = (&mut task.0).await;
        }
    }
    // The app containers are done for good (or never ran): the sidecars go too, with the
    // pod's grace period, each at its turn.
    stop_once(stopper, Some(pod_grace(&shared)));
    for mut task in sidecar_tasks {
        let _ = (&mut task.0).await;
    }
}

/// Runs the init containers in order: a regular one to success, a sidecar until it has
/// started (its supervisor then goes on in `sidecar_tasks`). `false` when the pod cannot
/// go on: an init container failed for good, or the pod is stopping.
async fn run_init(
    shared: &Arc<PodShared>,
    init: usize,
    stop: &watch::Receiver<Option<Duration>>,
    sidecar_tasks: &mut Vec<AbortOnDrop>,
) -> bool {
    let flags = sidecars::flags(&lock(&shared.pod));
    for i in 0..init {
        if flags.get(i).copied().unwrap_or(false) {
            let run = supervise(shared.clone(), Which::Init(i), stop.clone());
            sidecar_tasks.push(AbortOnDrop(tokio::spawn(async move {
                run.await;
            })));
            if !wait_started(shared, i, stop.clone()).await {
                return false;
            }
        } else if !supervise(shared.clone(), Which::Init(i), stop.clone()).await {
            return false;
        }
    }
    true
}

/// Waits until the app container at `index` is launched, or its start failed (`false` if
/// the pod stops first).
async fn wait_launched(
    shared: &PodShared,
    index: usize,
    mut stop: watch::Receiver<Option<Duration>>,
) -> bool {
    let mut status = shared.status_tx.subscribe();
    let launched = status.wait_for(|_| {
        lock(&shared.containers)
            .get(index)
            .is_none_or(|c| c.launched || matches!(c.state, super::runtime::State::Terminated(_)))
    });
    tokio::select! {
        done = launched => done.is_ok(),
        _ = stop.wait_for(Option::is_some) => false,
    }
}

/// Waits until the sidecar at `index` has started (`false` if the pod stops first).
async fn wait_started(
    shared: &PodShared,
    index: usize,
    mut stop: watch::Receiver<Option<Duration>>,
) -> bool {
    let mut status = shared.status_tx.subscribe();
    let started = status.wait_for(|_| {
        lock(&shared.init)
            .get(index)
            .is_some_and(sidecars::has_started)
    });
    tokio::select! {
        done = started => done.is_ok(),
        _ = stop.wait_for(Option::is_some) => false,
    }
}

/// The pod's `terminationGracePeriodSeconds` (30 s by default), which bounds stopping the
/// sidecars once the app containers are done.
fn pod_grace(shared: &PodShared) -> Duration {
    let secs = lock(&shared.pod)
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(secs.max(0).unsigned_abs())
}
