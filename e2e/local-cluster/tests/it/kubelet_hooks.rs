//! postStart hooks on the pod runner, as kubelet runs them: a pod's app containers start in
//! order, each only once the previous one's postStart hook returned (how a container holds
//! the ones after it, as marin3r's `hold-application-until-proxy-starts` does), and a
//! failed hook kills its container, which restarts by the pod's policy.

use std::sync::Arc;
use std::time::Duration;

use marin3r_local_cluster::kubelet::{PodHandle, StaticObjects};
use serde_json::json;

use super::kubelet_sidecars::{
    app_status, mk_pod, node, out_dir, running, sh, stamp, wait_file, wait_status,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_containers_start_in_order_each_after_the_previous_ones_post_start_hook() {
    let node = node();
    let mut first = sh("first", "exec sleep 600");
    first["lifecycle"] = json!({"postStart": {"exec": {"command":
        ["sh", "-c", "sleep 1; date +%s%N > /w/hooked"]}}});
    // Refuses to run before the first one's hook is done (restartPolicy Never: one chance).
    let second = sh(
        "second",
        "test -f /w/hooked || exit 7; date +%s%N > /w/second-start; exec sleep 600",
    );
    let out = out_dir();
    let spec = mk_pod(
        "ordered",
        "Never",
        json!([]),
        json!([first, second]),
        out.path(),
    );
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    let s = wait_status(&pod, "both containers running", |s| {
        s.container_statuses
            .iter()
            .flatten()
            .filter(|c| running(c))
            .count()
            == 2
    })
    .await;
    let dir = out.path();
    wait_file(dir, "second-start").await;
    assert!(stamp(dir, "hooked") < stamp(dir, "second-start"));
    assert_eq!(app_status(&s, "second").restart_count, 0);
    pod.stop(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_post_start_hook_kills_its_container_and_the_next_one_starts_anyway() {
    let node = node();
    let mut hooked = sh("hooked", "exec sleep 600");
    hooked["lifecycle"] = json!({"postStart": {"exec": {"command": ["sh", "-c", "exit 3"]}}});
    let after = sh("after", "date +%s%N > /w/after-start; exec sleep 600");
    let out = out_dir();
    let spec = mk_pod(
        "failing",
        "Always",
        json!([]),
        json!([hooked, after]),
        out.path(),
    );
    let pod = PodHandle::start(&node, &spec, Arc::new(StaticObjects::default())).unwrap();
    let s = wait_status(&pod, "the hooked container restarted", |s| {
        s.container_statuses
            .iter()
            .flatten()
            .any(|c| c.name == "hooked" && c.restart_count >= 1)
    })
    .await;
    let last = app_status(&s, "hooked")
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .expect("the killed run");
    assert_eq!(last.exit_code, 137, "{last:?}");
    wait_file(out.path(), "after-start").await;
    pod.stop(Duration::from_secs(5)).await;
}
