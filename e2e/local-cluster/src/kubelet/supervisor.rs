//! A pod's container supervisors: each starts its process, runs its probes, restarts it by
//! the restart policy and stops it (its preStop hook, then SIGTERM, then SIGKILL when the
//! grace period is over); init
//! containers run one after the other, to completion, before the others start.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tokio::sync::watch;

use super::pod::{PodShared, Which, lock};
use super::probe;
use super::runtime::{State, Terminated};
use crate::tasks::AbortOnDrop;

pub(super) fn signal_group(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

fn probes(pod: &Pod, index: usize) -> (Option<Container>, Option<Probe>, Option<Probe>) {
    let c = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.get(index))
        .cloned();
    let readiness = c.as_ref().and_then(|c| c.readiness_probe.clone());
    let liveness = c.as_ref().and_then(|c| c.liveness_probe.clone());
    (c, readiness, liveness)
}

/// Probes one container run: readiness flips `ready`; liveness failures kill the process.
async fn run_probes(shared: Arc<PodShared>, index: usize, pid: u32) {
    let pod = lock(&shared.pod).clone();
    let (Some(container), readiness, liveness) = probes(&pod, index) else {
        return;
    };
    let max = shared.node.config.max_probe_period;
    if readiness.is_none() {
        shared.set(Which::Main(index), |c| c.ready = true);
    }
    let readiness_task = readiness.map(|probe| {
        let (shared, container) = (shared.clone(), container.clone());
        AbortOnDrop(tokio::spawn(async move {
            let t = probe::timing(&probe, max);
            tokio::time::sleep(t.initial_delay).await;
            let (mut ok, mut failed) = (0, 0);
            loop {
                match probe::run(&probe, &container, &shared.ip, pid, t.timeout).await {
                    Ok(()) => {
                        ok += 1;
                        failed = 0;
                        if ok >= t.success_threshold {
                            shared.set(Which::Main(index), |c| c.ready = true);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(pod = %shared.name, container = %container.name, "readiness: {e}");
                        failed += 1;
                        ok = 0;
                        if failed >= t.failure_threshold {
                            shared.set(Which::Main(index), |c| c.ready = false);
                        }
                    }
                }
                tokio::time::sleep(t.period).await;
            }
        }))
    });
    if let Some(probe) = liveness {
        let t = probe::timing(&probe, max);
        tokio::time::sleep(t.initial_delay).await;
        let mut failed = 0;
        loop {
            match probe::run(&probe, &container, &shared.ip, pid, t.timeout).await {
                Ok(()) => failed = 0,
                Err(e) => {
                    failed += 1;
                    if failed >= t.failure_threshold {
                        tracing::info!(pod = %shared.name, container = %container.name, "liveness failed, killing: {e}");
                        signal_group(pid, rustix::process::Signal::KILL);
                        break;
                    }
                }
            }
            tokio::time::sleep(t.period).await;
        }
    }
    if let Some(mut task) = readiness_task {
        // Keep probing readiness until this run ends (the caller aborts us).
        let _ = (&mut task.0).await;
    }
}

/// Runs the init containers in order, each to success, then every other container until
/// the pod stops. An init container that fails under `restartPolicy: Never` ends the pod.
pub(super) async fn run_pod(
    shared: Arc<PodShared>,
    init: usize,
    main: usize,
    stop: watch::Receiver<Option<Duration>>,
) {
    for i in 0..init {
        if !supervise(shared.clone(), Which::Init(i), stop.clone()).await {
            return;
        }
    }
    let tasks: Vec<AbortOnDrop> = (0..main)
        .map(|i| {
            let run = supervise(shared.clone(), Which::Main(i), stop.clone());
            AbortOnDrop(tokio::spawn(async move {
                run.await;
            }))
        })
        .collect();
    for mut task in tasks {
        let _ = (&mut task.0).await;
    }
}

/// Runs one container, restarting it by the restart policy: a regular container until the
/// pod stops, an init container until it succeeds (`true`) or fails for good (`false`).
async fn supervise(
    shared: Arc<PodShared>,
    which: Which,
    mut stop: watch::Receiver<Option<Duration>>,
) -> bool {
    let mut backoff = Duration::from_secs(1);
    let max_backoff = shared.node.config.max_restart_backoff;
    loop {
        if stop.borrow().is_some() {
            return false;
        }
        let (mut cmd, image_path) = match shared.prepare(which) {
            Ok(ok) => ok,
            Err((reason, message)) => {
                shared.set(which, |c| {
                    c.state = State::Waiting { reason, message };
                    c.ready = false;
                });
                // Retry: the missing Secret or ConfigMap may appear.
                if wait_or_stop(&mut stop, Duration::from_secs(1)).await {
                    return false;
                }
                continue;
            }
        };
        let started_at = jiff::Timestamp::now();
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                shared.set(which, |c| {
                    c.state = State::Waiting {
                        reason: "RunContainerError".into(),
                        message: e.to_string(),
                    };
                });
                if wait_or_stop(&mut stop, backoff).await {
                    return false;
                }
                continue;
            }
        };
        let pid = child.id().unwrap_or_default();
        shared.set(which, |c| {
            c.state = State::Running {
                since: started_at,
                pid,
            };
            c.image_path = Some(image_path);
            c.ready = false;
        });
        // Init containers have no probes.
        let probes = match which {
            Which::Main(index) => Some(AbortOnDrop(tokio::spawn(run_probes(
                shared.clone(),
                index,
                pid,
            )))),
            Which::Init(_) => None,
        };
        let waited = tokio::select! {
            status = child.wait() => Some(status),
            _ = async { stop.wait_for(Option::is_some).await.is_ok() } => None,
        };
        let stopping = waited.is_none();
        let status = match waited {
            Some(status) => status,
            None => {
                let mut grace = stop.borrow().unwrap_or_default();
                if let Which::Main(index) = which {
                    grace = pre_stop(&shared, index, pid, grace).await;
                }
                signal_group(pid, rustix::process::Signal::TERM);
                match tokio::time::timeout(grace, child.wait()).await {
                    Ok(status) => status,
                    Err(_) => {
                        signal_group(pid, rustix::process::Signal::KILL);
                        child.wait().await
                    }
                }
            }
        };
        drop(probes);
        // Whatever the container started in its process group goes with it.
        signal_group(pid, rustix::process::Signal::KILL);
        let (exit_code, signal) = match &status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) => (code, None),
                (None, Some(sig)) => (128 + sig, Some(sig)),
                _ => (-1, None),
            },
            Err(_) => (-1, None),
        };
        let finished = Terminated {
            exit_code,
            signal,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            started_at,
            finished_at: jiff::Timestamp::now(),
        };
        let policy = lock(&shared.pod)
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into());
        let is_init = matches!(which, Which::Init(_));
        let restart = !stopping
            && match policy.as_str() {
                "Never" => false,
                _ if is_init => exit_code != 0,
                "OnFailure" => exit_code != 0,
                _ => true,
            };
        if !restart {
            shared.set(which, |c| {
                c.state = State::Terminated(finished);
                c.ready = false;
            });
            if stopping || is_init {
                return !stopping && exit_code == 0;
            }
            let _ = async { stop.wait_for(Option::is_some).await.is_ok() }.await;
            return true;
        }
        let ran_long = jiff::Timestamp::now().duration_since(started_at).as_secs() > 10;
        if ran_long {
            backoff = Duration::from_secs(1);
        }
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
        if wait_or_stop(&mut stop, backoff).await {
            return false;
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

/// Runs the container's preStop hook (httpGet, exec or sleep) as kubelet does before SIGTERM:
/// within the grace period, a failure only logged. Returns what is left of the grace period
/// for SIGTERM, at least 2 s (kubelet's extension when the hook used it all).
async fn pre_stop(shared: &Arc<PodShared>, index: usize, pid: u32, grace: Duration) -> Duration {
    let pod = lock(&shared.pod).clone();
    let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.get(index)) else {
        return grace;
    };
    let Some(hook) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
    else {
        return grace;
    };
    let started = tokio::time::Instant::now();
    let result = if let Some(sleep) = &hook.sleep {
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0).unsigned_abs()).min(grace))
            .await;
        Ok(())
    } else {
        // The hook's handler as a probe: the same httpGet, exec and tcpSocket code.
        let as_probe = Probe {
            http_get: hook.http_get.clone(),
            exec: hook.exec.clone(),
            tcp_socket: hook.tcp_socket.clone(),
            ..Default::default()
        };
        probe::run(
            &as_probe,
            container,
            &shared.ip,
            pid,
            grace.max(Duration::from_secs(1)),
        )
        .await
    };
    match result {
        Ok(()) => {
            tracing::info!(pod = %shared.name, container = %container.name, "preStop hook done")
        }
        Err(e) => {
            tracing::warn!(pod = %shared.name, container = %container.name, "FailedPreStopHook: {e}")
        }
    }
    grace
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(2))
}

/// Sleeps, returning early with `true` when the pod is being stopped.
async fn wait_or_stop(stop: &mut watch::Receiver<Option<Duration>>, d: Duration) -> bool {
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = async { stop.wait_for(Option::is_some).await.is_ok() } => true,
    };
    stopped || stop.borrow().is_some()
}
