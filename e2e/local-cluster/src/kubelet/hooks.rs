//! A container's lifecycle hooks, as kubelet runs them: postStart right after the process
//! starts (the next container of the pod starts only once it returned; a failure kills the
//! run, `FailedPostStartHook`), preStop before SIGTERM within the grace period (a failure
//! only logged). Handlers are httpGet, exec (in the container's namespaces, the image's own
//! binary resolved as the image would have it), tcpSocket and sleep.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};

use super::env;
use super::health;
use super::pod::{PodShared, Which, lock};
use super::probe;

/// The longest a postStart hook may run here before it counts as failed (kubelet itself sets
/// none; a test that hangs should not).
const MAX_POST_START: Duration = Duration::from_secs(600);

/// Whether the container has a postStart hook.
pub(super) fn has_post_start(container: &Container) -> bool {
    container
        .lifecycle
        .as_ref()
        .is_some_and(|l| l.post_start.is_some())
}

/// Runs the postStart hook of the container's run `pid`, if it has one.
pub(super) async fn post_start(
    shared: &Arc<PodShared>,
    which: Which,
    pid: u32,
) -> Result<(), String> {
    let pod = lock(&shared.pod).clone();
    let Some(container) = health::container_of(&pod, which) else {
        return Ok(());
    };
    let Some(hook) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref())
    else {
        return Ok(());
    };
    let result = run_handler(shared, &container, hook, pid, MAX_POST_START).await;
    match &result {
        Ok(()) => {
            tracing::info!(pod = %shared.name, container = %container.name, "postStart hook done")
        }
        Err(e) => {
            tracing::warn!(pod = %shared.name, container = %container.name, "FailedPostStartHook: {e}")
        }
    }
    result
}

/// Runs the container's preStop hook within `grace`; a failure is only logged.
pub(super) async fn pre_stop(shared: &Arc<PodShared>, which: Which, pid: u32, grace: Duration) {
    let pod = lock(&shared.pod).clone();
    let Some(container) = health::container_of(&pod, which) else {
        return;
    };
    let Some(hook) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
    else {
        return;
    };
    let timeout = grace.max(Duration::from_secs(1));
    match run_handler(shared, &container, hook, pid, timeout).await {
        Ok(()) => {
            tracing::info!(pod = %shared.name, container = %container.name, "preStop hook done")
        }
        Err(e) => {
            tracing::warn!(pod = %shared.name, container = %container.name, "FailedPreStopHook: {e}")
        }
    }
}

/// One handler: a sleep, or the same httpGet, exec and tcpSocket code as the probes.
async fn run_handler(
    shared: &PodShared,
    container: &Container,
    hook: &LifecycleHandler,
    pid: u32,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(sleep) = &hook.sleep {
        let wanted = Duration::from_secs(sleep.seconds.max(0).unsigned_abs());
        tokio::time::sleep(wanted.min(timeout)).await;
        return Ok(());
    }
    let mut exec = hook.exec.clone();
    if let Some(action) = exec.as_mut() {
        let image = container.image.as_deref().unwrap_or_default();
        let image = shared.node.config.images.resolve(image)?;
        let command = action.command.clone().unwrap_or_default();
        action.command = Some(env::exec_command(&command, &image));
    }
    let as_probe = Probe {
        http_get: hook.http_get.clone(),
        exec,
        tcp_socket: hook.tcp_socket.clone(),
        ..Default::default()
    };
    probe::run(&as_probe, container, &shared.ip, pid, timeout).await
}
