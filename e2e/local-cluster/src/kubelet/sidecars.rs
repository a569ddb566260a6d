//! Native sidecars (KEP-753, Kubernetes 1.29+): init containers with `restartPolicy: Always`.
//! The rules the kubelet applies to them, as pure functions of the Pod and of what runs:
//! which init containers are sidecars, when one counts as started, and when its turn to stop
//! has come (after every app container, and after the sidecars declared later).

use k8s_openapi::api::core::v1::{Container, Pod};

use super::runtime::{ContainerRuntime, State};

/// Whether an init container is a sidecar: `restartPolicy: Always`, the only value the API
/// server lets an init container have.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// Per init container of the pod, in order: whether it is a sidecar.
pub(super) fn flags(pod: &Pod) -> Vec<bool> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .map(is_sidecar)
        .collect()
}

/// Whether a sidecar has started, so the kubelet may start the next init container: its
/// process runs and its startup probe (if any) has passed.
pub(super) fn has_started(sidecar: &ContainerRuntime) -> bool {
    sidecar.started && matches!(sidecar.state, State::Running { .. })
}

/// Whether the sidecar at `index` of the init containers may be sent SIGTERM: no app
/// container runs any more, nor any sidecar declared after it. This is kubelet's
/// `terminationOrdering`: sidecars stop after the app containers, in reverse order.
pub(super) fn turn_to_stop(
    pod: &Pod,
    init: &[ContainerRuntime],
    containers: &[ContainerRuntime],
    index: usize,
) -> bool {
    let running = |c: &ContainerRuntime| matches!(c.state, State::Running { .. });
    let sidecars = flags(pod);
    let later_sidecar_running = init
        .iter()
        .enumerate()
        .skip(index + 1)
        .any(|(i, c)| sidecars.get(i).copied().unwrap_or(false) && running(c));
    !containers.iter().any(running) && !later_sidecar_running
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_pod(init: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"initContainers": init, "containers": [{"name": "app"}]}}))
        .unwrap()
    }

    fn mk_running(name: &str) -> ContainerRuntime {
        let mut c = ContainerRuntime::new(name, "x");
        c.state = State::Running {
            since: jiff::Timestamp::now(),
            pid: 1,
        };
        c
    }

    fn mk_stopped(name: &str) -> ContainerRuntime {
        let mut c = ContainerRuntime::new(name, "x");
        let t = jiff::Timestamp::now();
        c.state = State::Terminated(super::super::runtime::Terminated {
            exit_code: 143,
            signal: Some(15),
            reason: "Error".into(),
            started_at: t,
            finished_at: t,
        });
        c
    }

    #[test]
    fn only_restart_policy_always_makes_a_sidecar() {
        let pod = mk_pod(json!([
            {"name": "setup"},
            {"name": "proxy", "restartPolicy": "Always"},
        ]));
        assert_eq!(flags(&pod), [false, true]);
    }

    #[test]
    fn a_sidecar_has_started_once_running_and_past_its_startup_probe() {
        let mut c = mk_running("proxy");
        assert!(!has_started(&c));
        c.started = true;
        assert!(has_started(&c));
        assert!(!has_started(&mk_stopped("proxy")));
    }

    #[test]
    fn sidecars_stop_after_the_app_containers_in_reverse_order() {
        let pod = mk_pod(json!([
            {"name": "first", "restartPolicy": "Always"},
            {"name": "setup"},
            {"name": "second", "restartPolicy": "Always"},
        ]));
        let init = [
            mk_running("first"),
            mk_stopped("setup"),
            mk_running("second"),
        ];
        // The app still runs: no sidecar's turn yet.
        assert!(!turn_to_stop(&pod, &init, &[mk_running("app")], 2));
        let app_done = [mk_stopped("app")];
        // The last sidecar goes first; the first waits for it.
        assert!(turn_to_stop(&pod, &init, &app_done, 2));
        assert!(!turn_to_stop(&pod, &init, &app_done, 0));
        let init = [
            mk_running("first"),
            mk_stopped("setup"),
            mk_stopped("second"),
        ];
        assert!(turn_to_stop(&pod, &init, &app_done, 0));
    }
}
