//! The probes of one container run, as kubelet's prober runs them for app containers and
//! sidecars: the startup probe first (the container counts as `started` once it passes, and
//! is killed when it fails `failureThreshold` times in a row), then readiness (flips
//! `ready`) and liveness (kills the run) from then on.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};

use super::pod::{PodShared, Which, lock};
use super::probe;
use super::supervisor::signal_group;
use crate::tasks::AbortOnDrop;

/// The container `which` of the pod's spec.
pub(super) fn container_of(pod: &Pod, which: Which) -> Option<Container> {
    let spec = pod.spec.as_ref()?;
    match which {
        Which::Init(i) => spec.init_containers.as_ref()?.get(i).cloned(),
        Which::Main(i) => spec.containers.get(i).cloned(),
    }
}

/// Probes one container run until it ends (the caller aborts us).
pub(super) async fn run(shared: Arc<PodShared>, which: Which, pid: u32) {
    let pod = lock(&shared.pod).clone();
    let Some(container) = container_of(&pod, which) else {
        return;
    };
    if let Some(probe) = &container.startup_probe
        && !startup(&shared, &container, probe, pid).await
    {
        tracing::info!(pod = %shared.name, container = %container.name, "startup probe failed, killing");
        signal_group(pid, rustix::process::Signal::KILL);
        return;
    }
    // Without a readiness probe a started container is ready at once.
    let no_readiness = container.readiness_probe.is_none();
    shared.set(which, |c| {
        c.started = true;
        c.ready = no_readiness;
    });
    let readiness_task = container.readiness_probe.clone().map(|probe| {
        let (shared, container) = (shared.clone(), container.clone());
        AbortOnDrop(tokio::spawn(async move {
            readiness(&shared, which, &container, &probe, pid).await;
        }))
    });
    if let Some(probe) = &container.liveness_probe {
        liveness(&shared, &container, probe, pid).await;
    }
    if let Some(mut task) = readiness_task {
        // Keep probing readiness until this run ends.
        let _ = (&mut task.0).await;
    }
}

/// Runs the startup probe until it passes (`true`) or fails `failureThreshold` times in a
/// row (`false`). Its `successThreshold` is always 1 (the API server refuses others).
async fn startup(shared: &PodShared, container: &Container, probe: &Probe, pid: u32) -> bool {
    let t = probe::timing(probe, shared.node.config.max_probe_period);
    tokio::time::sleep(t.initial_delay).await;
    let mut failed = 0;
    loop {
        match probe::run(probe, container, &shared.ip, pid, t.timeout).await {
            Ok(()) => return true,
            Err(e) => {
                tracing::debug!(pod = %shared.name, container = %container.name, "startup: {e}");
                failed += 1;
                if failed >= t.failure_threshold {
                    return false;
                }
            }
        }
        tokio::time::sleep(t.period).await;
    }
}

/// Readiness for as long as the run lasts: `successThreshold` passes in a row make the
/// container ready, `failureThreshold` failures in a row unready.
async fn readiness(
    shared: &PodShared,
    which: Which,
    container: &Container,
    probe: &Probe,
    pid: u32,
) {
    let t = probe::timing(probe, shared.node.config.max_probe_period);
    tokio::time::sleep(t.initial_delay).await;
    let (mut ok, mut failed) = (0, 0);
    loop {
        match probe::run(probe, container, &shared.ip, pid, t.timeout).await {
            Ok(()) => {
                ok += 1;
                failed = 0;
                if ok >= t.success_threshold {
                    shared.set(which, |c| c.ready = true);
                }
            }
            Err(e) => {
                tracing::debug!(pod = %shared.name, container = %container.name, "readiness: {e}");
                failed += 1;
                ok = 0;
                if failed >= t.failure_threshold {
                    shared.set(which, |c| c.ready = false);
                }
            }
        }
        tokio::time::sleep(t.period).await;
    }
}

/// Liveness: `failureThreshold` failures in a row kill the process (it is then restarted by
/// its restart policy).
async fn liveness(shared: &PodShared, container: &Container, probe: &Probe, pid: u32) {
    let t = probe::timing(probe, shared.node.config.max_probe_period);
    tokio::time::sleep(t.initial_delay).await;
    let mut failed = 0;
    loop {
        match probe::run(probe, container, &shared.ip, pid, t.timeout).await {
            Ok(()) => failed = 0,
            Err(e) => {
                failed += 1;
                if failed >= t.failure_threshold {
                    tracing::info!(pod = %shared.name, container = %container.name, "liveness failed, killing: {e}");
                    signal_group(pid, rustix::process::Signal::KILL);
                    return;
                }
            }
        }
        tokio::time::sleep(t.period).await;
    }
}
