//! What the pod runner knows about each container (waiting, running, terminated, restarts,
//! readiness) and the pure translation of that into a Pod's `status`.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

#[derive(Clone, Debug, PartialEq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub started_at: jiff::Timestamp,
    pub finished_at: jiff::Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Waiting { reason: String, message: String },
    Running { since: jiff::Timestamp, pid: u32 },
    Terminated(Terminated),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ContainerRuntime {
    pub name: String,
    pub image: String,
    pub image_path: Option<String>,
    pub state: State,
    pub last: Option<Terminated>,
    pub restart_count: i32,
    pub ready: bool,
    /// Past its startup probe (at once without one): what `started` shows, and what lets
    /// the kubelet move on from a sidecar to the next init container.
    pub started: bool,
    /// The kubelet is done starting the current run (its postStart hook returned), or the
    /// start failed: what the next app container waits for. Not in the Pod's status.
    pub launched: bool,
}

impl ContainerRuntime {
    pub fn new(name: &str, image: &str) -> Self {
        Self {
            name: name.into(),
            image: image.into(),
            image_path: None,
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            last: None,
            restart_count: 0,
            ready: false,
            started: false,
            launched: false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        match self.state {
            State::Running { pid, .. } => Some(pid),
            _ => None,
        }
    }
}

fn time(t: jiff::Timestamp) -> Time {
    Time(t)
}

fn terminated(t: &Terminated) -> ContainerStateTerminated {
    ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        started_at: Some(time(t.started_at)),
        finished_at: Some(time(t.finished_at)),
        ..Default::default()
    }
}

fn container_status(c: &ContainerRuntime) -> ContainerStatus {
    let state = match &c.state {
        State::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: (!message.is_empty()).then(|| message.clone()),
            }),
            ..Default::default()
        },
        State::Running { since, .. } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(time(*since)),
            }),
            ..Default::default()
        },
        State::Terminated(t) => ContainerState {
            terminated: Some(terminated(t)),
            ..Default::default()
        },
    };
    let running = matches!(c.state, State::Running { .. });
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c
            .image_path
            .as_ref()
            .map(|p| format!("local://{p}"))
            .unwrap_or_default(),
        container_id: c.pid().map(|pid| format!("local://{pid}")),
        ready: c.ready && running,
        started: Some(running && c.started),
        restart_count: c.restart_count,
        state: Some(state),
        last_state: c.last.as_ref().map(|t| ContainerState {
            terminated: Some(terminated(t)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Everything the runner knows about a pod, besides the containers.
pub struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub started_at: jiff::Timestamp,
    pub init_containers: &'a [ContainerRuntime],
    pub containers: &'a [ContainerRuntime],
    /// Set when the pod could not be started at all (e.g. no network).
    pub failure: Option<&'a str>,
}

fn is_running(c: &ContainerRuntime) -> bool {
    matches!(c.state, State::Running { .. })
}

fn succeeded(c: &ContainerRuntime) -> bool {
    matches!(&c.state, State::Terminated(t) if t.exit_code == 0)
}

/// Initialized as kubelet sees it: every regular init container succeeded and every sidecar
/// has started. Once the app containers have left `PodInitializing` it stays so: a sidecar
/// restarting later does not take the pod back to initializing.
fn is_initialized(facts: &PodFacts<'_>, sidecars: &[bool]) -> bool {
    let done = facts.init_containers.iter().enumerate().all(|(i, c)| {
        if sidecars.get(i).copied().unwrap_or(false) {
            c.started && is_running(c)
        } else {
            succeeded(c)
        }
    });
    let past = !facts.init_containers.is_empty()
        && facts.containers.iter().any(
            |c| !matches!(&c.state, State::Waiting { reason, .. } if reason == "PodInitializing"),
        );
    done || past
}

/// kubelet's `getPhase` with sidecars (KEP-753): only the app containers decide Succeeded
/// or Failed (a sidecar's exit code never does), and a terminal phase is written only once
/// no container runs any more (kubelet delays it until the pod's containers are stopped).
fn phase(facts: &PodFacts<'_>, sidecars: &[bool], initialized: bool) -> &'static str {
    let restart_policy = facts
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let cs = facts.containers;
    let any_running = facts.init_containers.iter().chain(cs).any(is_running);
    let all_terminated =
        !cs.is_empty() && cs.iter().all(|c| matches!(c.state, State::Terminated(_)));
    let ever_ran =
        |c: &ContainerRuntime| !matches!(c.state, State::Waiting { .. }) || c.last.is_some();
    let init_failed = facts.init_containers.iter().enumerate().any(|(i, c)| {
        !sidecars.get(i).copied().unwrap_or(false)
            && matches!(&c.state, State::Terminated(t) if t.exit_code != 0)
    });
    if facts.failure.is_some() || (init_failed && !any_running) {
        "Failed"
    } else if !initialized {
        "Pending"
    } else if all_terminated && restart_policy != "Always" && !any_running {
        if cs.iter().all(succeeded) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if cs.iter().all(ever_ran) {
        "Running"
    } else {
        "Pending"
    }
}

/// The Pod status, keeping a condition's `lastTransitionTime` from `previous` while its
/// status is unchanged (so a rewrite with nothing new is a no-op). Sidecars count for
/// readiness: the pod is Ready when its app containers and its sidecars are.
pub fn pod_status(facts: &PodFacts<'_>, previous: Option<&PodStatus>) -> PodStatus {
    let sidecars = super::sidecars::flags(facts.pod);
    let cs = facts.containers;
    let ready_and_running = |c: &ContainerRuntime| c.ready && is_running(c);
    let all_ready = !cs.is_empty()
        && cs.iter().all(ready_and_running)
        && facts
            .init_containers
            .iter()
            .enumerate()
            .filter(|(i, _)| sidecars.get(*i).copied().unwrap_or(false))
            .all(|(_, c)| ready_and_running(c));
    let initialized = is_initialized(facts, &sidecars);
    let phase = phase(facts, &sidecars, initialized);
    let now = jiff::Timestamp::now();
    let condition = |type_: &str, ok: bool, reason: Option<&str>| {
        let status = if ok { "True" } else { "False" };
        let since = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| time(now));
        PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Some(since),
            reason: if ok { None } else { reason.map(Into::into) },
            ..Default::default()
        }
    };
    let not_ready = (!all_ready).then_some("ContainersNotReady");
    let scheduled = time(facts.started_at);
    PodStatus {
        phase: Some(phase.into()),
        message: facts.failure.map(Into::into),
        pod_ip: (!facts.pod_ip.is_empty()).then(|| facts.pod_ip.to_owned()),
        pod_ips: (!facts.pod_ip.is_empty()).then(|| {
            vec![PodIP {
                ip: facts.pod_ip.to_owned(),
            }]
        }),
        host_ip: Some(facts.host_ip.to_owned()),
        host_ips: Some(vec![HostIP {
            ip: facts.host_ip.to_owned(),
        }]),
        start_time: Some(scheduled.clone()),
        qos_class: Some("BestEffort".into()),
        conditions: Some(vec![
            condition("PodScheduled", true, None),
            condition("Initialized", initialized, Some("ContainersNotInitialized")),
            condition("ContainersReady", all_ready, not_ready),
            condition("Ready", all_ready, not_ready),
        ]),
        container_statuses: Some(cs.iter().map(container_status).collect()),
        init_container_statuses: (!facts.init_containers.is_empty())
            .then(|| facts.init_containers.iter().map(container_status).collect()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn facts<'a>(pod: &'a Pod, cs: &'a [ContainerRuntime]) -> PodFacts<'a> {
        PodFacts {
            pod,
            pod_ip: "10.200.0.2",
            host_ip: "10.200.0.1",
            started_at: jiff::Timestamp::now(),
            init_containers: &[],
            containers: cs,
            failure: None,
        }
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[test]
    fn a_pulled_image_error_keeps_the_pod_pending_with_the_reason() {
        let mut c = ContainerRuntime::new("app", "nginx");
        c.state = State::Waiting {
            reason: "ErrImagePull".into(),
            message: "no binary".into(),
        };
        let pod = Pod::default();
        let s = pod_status(&facts(&pod, &[c]), None);
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let w = s.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ErrImagePull"));
        assert_eq!(w.message.as_deref(), Some("no binary"));
    }

    #[test]
    fn ready_running_containers_make_the_pod_ready_and_transitions_are_kept() {
        let mut c = ContainerRuntime::new("app", "envoyproxy/envoy");
        c.state = State::Running {
            since: jiff::Timestamp::now(),
            pid: 1,
        };
        let pod = Pod::default();
        let s1 = pod_status(&facts(&pod, std::slice::from_ref(&c)), None);
        assert_eq!(s1.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s1, "Ready").status, "False");
        c.ready = true;
        let s2 = pod_status(&facts(&pod, std::slice::from_ref(&c)), Some(&s1));
        assert_eq!(cond(&s2, "Ready").status, "True");
        assert_eq!(cond(&s2, "ContainersReady").status, "True");
        assert!(s2.container_statuses.as_ref().unwrap()[0].ready);
        let s3 = pod_status(&facts(&pod, std::slice::from_ref(&c)), Some(&s2));
        assert_eq!(
            cond(&s3, "Ready").last_transition_time,
            cond(&s2, "Ready").last_transition_time
        );
    }

    #[test]
    fn finished_containers_end_the_pod_by_restart_policy() {
        let done = |code| {
            let mut c = ContainerRuntime::new("job", "x");
            let t = jiff::Timestamp::now();
            c.state = State::Terminated(Terminated {
                exit_code: code,
                signal: None,
                reason: "Completed".into(),
                started_at: t,
                finished_at: t,
            });
            c
        };
        let pod = Pod {
            spec: Some(PodSpec {
                restart_policy: Some("Never".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            pod_status(&facts(&pod, &[done(0)]), None).phase.as_deref(),
            Some("Succeeded")
        );
        assert_eq!(
            pod_status(&facts(&pod, &[done(1)]), None).phase.as_deref(),
            Some("Failed")
        );
    }
}
