//! Native sidecars (init containers with `restartPolicy: Always`) on the pod runner, with real
//! processes: started (and startup-probed) before what follows them, restarted whatever the
//! pod's restart policy, counted for readiness, stopped after the app containers in reverse
//! order. The containers record what they see as timestamps in a shared emptyDir.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use marin3r_local_cluster::kubelet::{ImageMap, Node, NodeConfig, PodHandle, StaticObjects};
use serde_json::json;

const SERVER: &str = marin3r_local_cluster::kubelet::PROBE_SERVER_PY;
const LONG: Duration = Duration::from_secs(30);

pub(crate) fn node() -> Arc<Node> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for the pod runner tests");
    let python = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    Node::start(NodeConfig {
        images: ImageMap::new().with("probe-server", python),
        ..Default::default()
    })
    .unwrap()
}

/// A pod whose containers write to `out`, a host folder (containers see the host's files):
/// every `/w/` in its commands and hooks is a path in `out`, still there after the pod goes.
pub(crate) fn mk_pod(
    name: &str,
    policy: &str,
    init: serde_json::Value,
    apps: serde_json::Value,
    out: &Path,
) -> Pod {
    let with_image = |list: serde_json::Value| -> serde_json::Value {
        let mut list = list;
        for c in list.as_array_mut().unwrap() {
            c["image"] = json!("probe-server");
        }
        list
    };
    let pod = json!({
        "metadata": {"name": name, "namespace": "side", "uid": format!("uid-{name}")},
        "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 10,
            "initContainers": with_image(init), "containers": with_image(apps)}
    });
    let text = pod
        .to_string()
        .replace("/w/", &format!("{}/", out.display()));
    serde_json::from_str(&text).unwrap()
}

pub(crate) fn sh(name: &str, script: &str) -> serde_json::Value {
    json!({"name": name, "command": ["sh", "-c", script]})
}

/// A sidecar: an init container that restarts always.
fn sidecar(name: &str, script: &str) -> serde_json::Value {
    let mut c = sh(name, script);
    c["restartPolicy"] = json!("Always");
    c
}

/// A script that writes the time (ns) to `/w/<file>` on SIGTERM and exits with `code`.
fn until_term(file: &str, code: i32) -> String {
    format!("trap 'date +%s%N > /w/{file}; exit {code}' TERM; while :; do sleep 0.1; done")
}

pub(crate) async fn wait_status(
    pod: &PodHandle,
    what: &str,
    f: impl Fn(&PodStatus) -> bool,
) -> PodStatus {
    let mut rx = pod.watch_status();
    match tokio::time::timeout(LONG, rx.wait_for(|s| f(s))).await {
        Ok(Ok(s)) => s.clone(),
        _ => panic!(
            "{what}: not within {LONG:?}: {}\nlogs:\n{}",
            serde_json::to_string_pretty(&pod.status()).unwrap(),
            pod.logs()
        ),
    }
}

fn init_status<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
    s.init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no init status {name}: {s:?}"))
}

pub(crate) fn app_status<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status {name}: {s:?}"))
}

fn condition(s: &PodStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

pub(crate) fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

/// Whether a container has finished writing its line to `file`: `date > file` creates the
/// file before `date` writes, so an existing file may still be empty.
fn written(dir: &Path, file: &str) -> bool {
    std::fs::read_to_string(dir.join(file)).is_ok_and(|text| text.ends_with('\n'))
}

/// A nanosecond timestamp a container wrote (waiting for the line to be complete).
pub(crate) fn stamp(dir: &Path, file: &str) -> u128 {
    let deadline = std::time::Instant::now() + LONG;
    while !written(dir, file) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{file}: {e}: {text:?}"))
}

/// Waits for a container to write `file` (polled: no status change tells).
pub(crate) async fn wait_file(dir: &Path, file: &str) {
    let deadline = tokio::time::Instant::now() + LONG;
    while !written(dir, file) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {file} after {LONG:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn out_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("m3r-sidecars-")
        .tempdir()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_passes_its_startup_probe_before_the_app_starts_and_its_readiness_counts() {
    let node = node();
    // The sidecar is only up after a second; its startup probe says so. The app refuses to
    // run without it (restartPolicy Never: no second chance).
    let mut proxy = sidecar("proxy", "sleep 1; date +%s%N > /w/proxy-up; exec sleep 600");
    proxy["startupProbe"] = json!({"exec": {"command": ["test", "-f", "/w/proxy-up"]},
        "periodSeconds": 1, "failureThreshold": 30});
    proxy["readinessProbe"] = json!({"exec": {"command": ["test", "-f", "/w/proxy-ready"]},
        "periodSeconds": 1});
    let app = sh(
        "app",
        "test -f /w/proxy-up || exit 7; date +%s%N > /w/app-start; exec sleep 600",
    );
    let out = out_dir();
    let spec = mk_pod("order", "Never", json!([proxy]), json!([app]), out.path());
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    let s = wait_status(&pod, "the app running and ready", |s| {
        s.container_statuses
            .iter()
            .flatten()
            .any(|c| running(c) && c.ready)
    })
    .await;
    let dir = out.path();
    wait_file(dir, "app-start").await;
    assert!(stamp(dir, "proxy-up") < stamp(dir, "app-start"));
    let proxy = init_status(&s, "proxy");
    assert!(running(proxy) && proxy.started == Some(true), "{proxy:?}");
    assert_eq!(proxy.restart_count, 0);
    assert_eq!(app_status(&s, "app").restart_count, 0);
    assert!(condition(&s, "Initialized"));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    // The app is ready (no probe) but the sidecar is not: the pod is not Ready.
    assert!(app_status(&s, "app").ready);
    assert!(!init_status(&s, "proxy").ready && !condition(&s, "Ready"));
    std::fs::write(dir.join("proxy-ready"), "").unwrap();
    let s = wait_status(&pod, "Ready", |s| condition(s, "Ready")).await;
    assert!(init_status(&s, "proxy").ready);
    pod.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_like_pod_succeeds_and_its_sidecars_stop_after_the_app_in_reverse_order() {
    let node = node();
    // The first sidecar exits 1 on SIGTERM: a sidecar's exit code does not fail the pod.
    let init = json!([
        sidecar("first", &until_term("first-term", 1)),
        sh("setup", "date +%s%N > /w/setup"),
        sidecar("second", &until_term("second-term", 0)),
    ]);
    let app = sh("job", "sleep 1; date +%s%N > /w/job-done; exit 0");
    let out = out_dir();
    let spec = mk_pod("job", "Never", init, json!([app]), out.path());
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    let s = wait_status(&pod, "Succeeded", |s| {
        s.phase.as_deref() == Some("Succeeded")
    })
    .await;
    let dir = out.path();
    // The app first, then the sidecars last-declared first.
    let (done, second, first) = (
        stamp(dir, "job-done"),
        stamp(dir, "second-term"),
        stamp(dir, "first-term"),
    );
    assert!(done < second && second < first, "{done} {second} {first}");
    let terminated = |c: &ContainerStatus| {
        c.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    // Succeeded is written only once every container has stopped.
    assert_eq!(terminated(app_status(&s, "job")), Some(0));
    assert_eq!(terminated(init_status(&s, "setup")), Some(0));
    assert_eq!(terminated(init_status(&s, "second")), Some(0));
    assert_eq!(terminated(init_status(&s, "first")), Some(1));
    assert!(!condition(&s, "Ready"));
    pod.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_sidecar_is_restarted_during_init_and_beside_the_app() {
    let node = node();
    // The sidecar crashes after each start; the next init container waits for its second run,
    // and the app (restartPolicy Never) runs while it keeps crashing.
    let init = json!([
        sidecar("flaky", "echo run >> /w/runs; sleep 0.5; exit 3"),
        sh(
            "wait-second-run",
            "until [ \"$(wc -l < /w/runs)\" -ge 2 ]; do sleep 0.1; done"
        ),
    ]);
    let app = sh("app", "exec sleep 600");
    let out = out_dir();
    let spec = mk_pod("crashy", "Never", init, json!([app]), out.path());
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    let s = wait_status(&pod, "the sidecar's third restart with the app up", |s| {
        s.container_statuses.iter().flatten().any(running)
            && init_status(s, "flaky").restart_count >= 3
    })
    .await;
    let flaky = init_status(&s, "flaky");
    let last = flaky
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref());
    assert_eq!(last.map(|t| t.exit_code), Some(3), "{flaky:?}");
    assert_eq!(app_status(&s, "app").restart_count, 0);
    // Initialized stays True while the sidecar restarts.
    assert!(condition(&s, "Initialized"));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    pod.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_stops_its_app_first_while_the_sidecar_still_serves() {
    let node = node();
    // The sidecar serves HTTP until SIGTERM; its preStop hook records when it ran (kubelet
    // runs every preStop hook as soon as the pod stops, only SIGTERM waits for its turn).
    let mut web = sidecar(
        "web",
        "readlink /proc/self/ns/net > /w/web-ns; \
         trap 'date +%s%N > /w/web-term; exit 0' TERM; python3 -c \"$SERVER\" & wait $!",
    );
    web["env"] =
        json!([{"name": "POD_NAME", "value": "term"}, {"name": "SERVER", "value": SERVER}]);
    web["startupProbe"] = json!({"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1,
        "failureThreshold": 30});
    web["lifecycle"] =
        json!({"preStop": {"exec": {"command": ["sh", "-c", "date +%s%N > /w/web-prestop"]}}});
    // The app's preStop hook takes 2 s and asks the sidecar for a page at its end, over the
    // pod's loopback (the hook runs in the app's namespaces, even right after its start).
    let mut app = sh("app", &until_term("app-term", 0));
    app["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c",
        "date +%s%N > /w/app-prestop; readlink /proc/self/ns/net > /w/hook-ns; sleep 2; \
         curl -sSf http://127.0.0.1:8080/ > /w/served 2> /w/curl-error \
         && date +%s%N > /w/served-at"]}}});
    let out = out_dir();
    let spec = mk_pod("term", "Always", json!([web]), json!([app]), out.path());
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    wait_status(&pod, "Ready", |s| condition(s, "Ready")).await;
    let dir = out.path();
    let stopped = tokio::time::Instant::now();
    let stop = tokio::spawn(pod.stop(Duration::from_secs(10)));
    tokio::time::timeout(LONG, stop).await.unwrap().unwrap();
    let took = stopped.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    assert_eq!(
        read("hook-ns"),
        read("web-ns"),
        "the hook ran in the pod's network"
    );
    let log =
        |c: &str| std::fs::read_to_string(node.log_path("side", "term", c)).unwrap_or_default();
    assert_eq!(
        read("served"),
        "ok term ",
        "the sidecar answered during the app's preStop; curl: {}; web: {}; app: {}",
        read("curl-error"),
        log("web"),
        log("app"),
    );
    let (app_prestop, served_at, app_term, web_term) = (
        stamp(dir, "app-prestop"),
        stamp(dir, "served-at"),
        stamp(dir, "app-term"),
        stamp(dir, "web-term"),
    );
    assert!(app_prestop < served_at && served_at < app_term && app_term < web_term);
    // The sidecar's hook ran at once, before the app was even sent SIGTERM.
    assert!(stamp(dir, "web-prestop") < app_term);
}
