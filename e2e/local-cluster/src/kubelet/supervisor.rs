//! A pod's container supervisors: each starts its process, runs its probes, restarts it by
//! the restart policy (sidecars always) and stops it (its preStop hook, a sidecar's turn,
//! then SIGTERM, then SIGKILL when the grace period is over). The order in which they run is
//! `lifecycle`'s.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pod::{PodShared, Which, lock};
use super::runtime::{State, Terminated};
use super::{health, hooks, sidecars};
use crate::tasks::AbortOnDrop;

pub(super) fn signal_group(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// How a container start went.
enum Launch {
    Running(Box<tokio::process::Child>, jiff::Timestamp),
    /// Could not start; waited (a config error, a failed spawn) and may try again.
    Retry,
    Stopped,
}

/// Prepares and spawns one run of the container, publishing its Running state (or why it
/// waits). A container with a startup probe is not `started` until the probe passes.
async fn launch(
    shared: &Arc<PodShared>,
    which: Which,
    stop: &mut watch::Receiver<Option<Duration>>,
    backoff: Duration,
) -> Launch {
    let (mut cmd, image_path) = match shared.prepare(which) {
        Ok(ok) => ok,
        Err((reason, message)) => {
            shared.set(which, |c| {
                c.state = State::Waiting { reason, message };
                c.ready = false;
            });
            // Retry: the missing Secret or ConfigMap may appear.
            return match wait_or_stop(stop, Duration::from_secs(1)).await {
                true => Launch::Stopped,
                false => Launch::Retry,
            };
        }
    };
    let started_at = jiff::Timestamp::now();
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            shared.set(which, |c| {
                c.state = State::Waiting {
                    reason: "RunContainerError".into(),
                    message: e.to_string(),
                };
            });
            return match wait_or_stop(stop, backoff).await {
                true => Launch::Stopped,
                false => Launch::Retry,
            };
        }
    };
    let pid = child.id().unwrap_or_default();
    entered_namespaces(pid).await;
    let pod = lock(&shared.pod).clone();
    let container = health::container_of(&pod, which);
    let has_startup_probe = container
        .as_ref()
        .is_some_and(|c| c.startup_probe.is_some());
    let has_post_start = container.as_ref().is_some_and(hooks::has_post_start);
    shared.set(which, |c| {
        c.state = State::Running {
            since: started_at,
            pid,
        };
        c.image_path = Some(image_path);
        c.ready = false;
        // Not started before its postStart hook returned.
        c.started = !has_startup_probe && !has_post_start;
        c.launched = false;
    });
    Launch::Running(Box::new(child), started_at)
}

/// Waits (5 s at most) until a spawned container is in its own namespaces, as a runtime's
/// container is once it runs: until then its pid is still the host-side `nsenter`, and an
/// exec hook or probe entering "its" namespaces would run on the host. Returns at once if
/// the process is gone.
async fn entered_namespaces(pid: u32) {
    let host = std::fs::read_link("/proc/self/ns/mnt").ok();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            Ok(ns) if Some(&ns) != host.as_ref() => return,
            Err(_) => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Whether the container `which` is a sidecar (an init container with `restartPolicy:
/// Always`).
fn is_sidecar(shared: &PodShared, which: Which) -> bool {
    let pod = lock(&shared.pod).clone();
    matches!(which, Which::Init(_))
        && health::container_of(&pod, which).is_some_and(|c| sidecars::is_sidecar(&c))
}

/// Whether a run that ended with `exit_code` is started again: a sidecar always (whatever
/// the pod's restart policy), a regular init container until it succeeds (unless `Never`),
/// an app container by the pod's restart policy.
fn should_restart(shared: &PodShared, which: Which, exit_code: i32) -> bool {
    if is_sidecar(shared, which) {
        return true;
    }
    let policy = lock(&shared.pod)
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    match (policy.as_str(), which) {
        ("Never", _) => false,
        (_, Which::Init(_)) | ("OnFailure", _) => exit_code != 0,
        _ => true,
    }
}

fn terminated(
    status: &std::io::Result<std::process::ExitStatus>,
    started_at: jiff::Timestamp,
) -> Terminated {
    let (exit_code, signal) = match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            _ => (-1, None),
        },
        Err(_) => (-1, None),
    };
    Terminated {
        exit_code,
        signal,
        reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
        started_at,
        finished_at: jiff::Timestamp::now(),
    }
}

/// Runs one container, restarting it by its restart policy (with a capped back-off) until it
/// is done for good or the pod stops it. `true` when its last run ended on its own with exit
/// code 0: a regular init container's success.
pub(super) async fn supervise(
    shared: Arc<PodShared>,
    which: Which,
    mut stop: watch::Receiver<Option<Duration>>,
) -> bool {
    let mut backoff = Duration::from_secs(1);
    let max_backoff = shared.node.config.max_restart_backoff;
    // Regular init containers have no probes; app containers and sidecars do.
    let probed = matches!(which, Which::Main(_)) || is_sidecar(&shared, which);
    loop {
        if stop.borrow().is_some() {
            return false;
        }
        let (mut child, started_at) = match launch(&shared, which, &mut stop, backoff).await {
            Launch::Running(child, at) => (child, at),
            Launch::Retry => {
                shared.set(which, |c| c.launched = true);
                shared.status_tx.send_modify(|_| {});
                continue;
            }
            Launch::Stopped => return false,
        };
        let pid = child.id().unwrap_or_default();
        if !after_start(&shared, which, pid, &mut child, &mut stop).await {
            // kubelet kills a container whose postStart hook failed.
            signal_group(pid, rustix::process::Signal::KILL);
        }
        let probes =
            probed.then(|| AbortOnDrop(tokio::spawn(health::run(shared.clone(), which, pid))));
        let waited = tokio::select! {
            status = child.wait() => Some(status),
            _ = async { stop.wait_for(Option::is_some).await.is_ok() } => None,
        };
        let stopping = waited.is_none();
        let status = match waited {
            Some(status) => status,
            None => {
                let grace = stop.borrow().unwrap_or_default();
                stop_container(&shared, which, pid, &mut child, grace).await
            }
        };
        drop(probes);
        // Whatever the container started in its process group goes with it.
        signal_group(pid, rustix::process::Signal::KILL);
        let finished = terminated(&status, started_at);
        if stopping || !should_restart(&shared, which, finished.exit_code) {
            let ok = !stopping && finished.exit_code == 0;
            shared.set(which, |c| {
                c.state = State::Terminated(finished);
                c.ready = false;
            });
            return ok;
        }
        if jiff::Timestamp::now().duration_since(started_at).as_secs() > 10 {
            backoff = Duration::from_secs(1);
        }
        back_off(&shared, which, finished, backoff);
        if wait_or_stop(&mut stop, backoff).await {
            if is_sidecar(&shared, which) {
                // A sidecar stopped while it waited to restart ends as its last run did.
                shared.set(which, |c| {
                    if let Some(last) = c.last.clone() {
                        c.state = State::Terminated(last);
                    }
                });
            }
            return false;
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

/// The postStart hook of a run that just started, then the run counts as launched (the next
/// container may start) and, without a startup probe, as started. `false` when the hook
/// failed. A stop or the process's end cuts the hook short.
async fn after_start(
    shared: &Arc<PodShared>,
    which: Which,
    pid: u32,
    child: &mut tokio::process::Child,
    stop: &mut watch::Receiver<Option<Duration>>,
) -> bool {
    let hook = hooks::post_start(shared, which, pid);
    let ok = tokio::select! {
        result = hook => result.is_ok(),
        _ = stop.wait_for(Option::is_some) => true,
        // The process is gone: its exit is read by the caller.
        _ = child_exited(child) => true,
    };
    let pod = lock(&shared.pod).clone();
    let no_startup_probe =
        health::container_of(&pod, which).is_some_and(|c| c.startup_probe.is_none());
    shared.set(which, |c| {
        c.launched = true;
        if ok && no_startup_probe {
            c.started = true;
        }
    });
    // `launched` is not in the Pod's status: wake the waiters even if nothing shows.
    shared.status_tx.send_modify(|_| {});
    ok
}

/// Resolves once the child has exited, without reaping it (its status stays for `wait`).
async fn child_exited(child: &mut tokio::process::Child) {
    loop {
        match child.try_wait() {
            Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return,
        }
    }
}

/// Publishes a crashed run and the restart's back-off (`CrashLoopBackOff`).
fn back_off(shared: &PodShared, which: Which, finished: Terminated, backoff: Duration) {
    let name = shared.name.clone();
    shared.set(which, |c| {
        c.state = State::Waiting {
            reason: "CrashLoopBackOff".into(),
            message: format!(
                "back-off {}s restarting failed container={} pod={name}",
                backoff.as_secs(),
                c.name
            ),
        };
        c.last = Some(finished);
        c.ready = false;
        c.restart_count += 1;
    });
}

/// Stops a running container as kubelet's `killContainer` does: its preStop hook within the
/// grace period; for a sidecar, then waiting for its turn (every app container and every
/// later sidecar exited) for what is left of the grace period; then SIGTERM, and SIGKILL
/// once the rest of the grace period is over (at least 2 s, kubelet's minimum).
///
/// As in kubelet, every container's preStop hook starts as soon as the pod stops, sidecars'
/// included: only SIGTERM waits for the sidecar's turn. The grace period is one budget for
/// the whole pod, so the last sidecar gets SIGTERM at the latest when it is over (plus the
/// 2 s minimum), and the pod is gone within its `terminationGracePeriodSeconds` (+ 2 s).
async fn stop_container(
    shared: &Arc<PodShared>,
    which: Which,
    pid: u32,
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    const MIN_GRACE: Duration = Duration::from_secs(2);
    let deadline = tokio::time::Instant::now() + grace;
    hooks::pre_stop(shared, which, pid, grace).await;
    if let Which::Init(index) = which
        && is_sidecar(shared, which)
    {
        let _ = tokio::time::timeout_at(deadline, wait_for_turn(shared, index)).await;
    }
    let left = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .max(MIN_GRACE);
    signal_group(pid, rustix::process::Signal::TERM);
    match tokio::time::timeout(left, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            signal_group(pid, rustix::process::Signal::KILL);
            child.wait().await
        }
    }
}

/// Waits until the sidecar at `index` may be sent SIGTERM (`sidecars::turn_to_stop`),
/// re-checking at every status change of the pod.
async fn wait_for_turn(shared: &PodShared, index: usize) {
    let mut rx = shared.status_tx.subscribe();
    let _ = rx
        .wait_for(|_| {
            let pod = lock(&shared.pod).clone();
            let init = lock(&shared.init).clone();
            let containers = lock(&shared.containers).clone();
            sidecars::turn_to_stop(&pod, &init, &containers, index)
        })
        .await;
}

/// Sleeps, returning early with `true` when the pod is being stopped.
async fn wait_or_stop(stop: &mut watch::Receiver<Option<Duration>>, d: Duration) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = async { stop.wait_for(Option::is_some).await.is_ok() } => true,
    };
    stopped || stop.borrow().is_some()
}
