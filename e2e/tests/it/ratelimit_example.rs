//! The original MARIN3R's rate-limit use case, in `docs/examples/ratelimit/`, on the real
//! cluster (`hack/cluster`): its sidecar annotations as it wrote them, `envoy-metrics:9901`
//! declared with the admin left on its default address, are admitted; the EnvoyConfig's rate
//! limit answers 429 past its budget; and its PodMonitor, translated into the scrape job the
//! prometheus-operator makes of it, has a real Prometheus find the pod through the API server
//! (Kubernetes service discovery, not targets the test hands it) and scrape Envoy's stats on
//! `envoy-metrics`, the rate-limit counter among them. The pod's address on that port serves
//! the stats alone: the admin stays on loopback.

use std::time::Duration;

use marin3r_e2e::monitoring::{self, Prometheus};
use marin3r_e2e::real::{Scenario, pod_ip};
use marin3r_testkit::envoy::request;
use marin3r_testkit::tools::repo_root;
use marin3r_testkit::wait::until;
use serde_json::{Value, json};

/// An example file in the scenario's namespace, its application image the one `hack/image`
/// writes (no registry here).
fn example(file: &str, ns: &str) -> String {
    let path = repo_root().join("docs/examples/ratelimit").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("namespace: demo"), "{}", path.display());
    text.replace("namespace: demo", &format!("namespace: {ns}"))
        .replace("image: python:3.13-alpine", "image: marin3r-test/python:3")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_originals_rate_limit_example_applies_and_is_scraped_on_envoy_metrics() {
    let scenario = Scenario::start("ratelimit", &["python"]).await.unwrap();
    let ns = scenario.ns.as_str();
    let ds = marin3r_e2e::product::example_in("discoveryservice-own-namespace.yaml", ns).unwrap();
    scenario.apply(&ds).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(180))
        .await
        .unwrap();
    scenario
        .apply(&example("envoyconfig.yaml", ns))
        .await
        .unwrap();
    scenario
        .apply(&example("deployment.yaml", ns))
        .await
        .unwrap();
    let pod = until(
        "the rate-limited pod Ready",
        Duration::from_secs(180),
        || async {
            scenario
                .ready_pods("app=ratelimited")
                .await
                .into_iter()
                .next()
        },
    )
    .await;
    let ip = pod_ip(&pod);
    let url = |port: u16, path: &str| format!("http://{}{path}", monitoring::address(&ip, port));

    // The EnvoyConfig reaches the sidecar: 5 requests a minute pass, then 429.
    until("the listener serving", Duration::from_secs(60), || async {
        request("GET", &url(38080, "/"))
            .ok()
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let mut limited = 0;
    for _ in 0..10 {
        let (status, body) = request("GET", &url(38080, "/")).unwrap();
        assert!(
            (status == 200 && body.contains("served within the limit")) || status == 429,
            "{status}: {body}"
        );
        limited += usize::from(status == 429);
    }
    assert!(
        limited >= 5,
        "{limited} of 10 requests past the budget limited"
    );

    // On the pod's address, the admin's port serves Envoy's stats and nothing else.
    let (status, body) = request("GET", &url(9901, "/stats/prometheus")).unwrap();
    assert_eq!(status, 200, "{body}");
    for (method, path) in [("GET", "/config_dump"), ("POST", "/quitquitquit")] {
        let (status, body) = request(method, &url(9901, path)).unwrap();
        assert_eq!(status, 404, "{method} {path} on the pod's address: {body}");
    }
    // The admin itself is on loopback, inside the pod.
    let info = scenario
        .envoy_admin(&pod.metadata.name.clone().unwrap(), "/server_info")
        .await
        .unwrap();
    assert!(info.contains("ratelimited"), "{info}");

    // The PodMonitor, as the prometheus-operator would scrape it.
    let monitor: Value = serde_saphyr::from_str(&example("podmonitor.yaml", ns)).unwrap();
    let jobs = monitoring::pod_monitor_jobs(&monitor, scenario.cluster.kubeconfig()).unwrap();
    let prometheus = Prometheus::start(
        &monitoring::config_of_jobs(&jobs, "2s"),
        &json!({"groups": []}),
    )
    .unwrap();
    let job = format!("{ns}/ratelimited");
    let name = pod.metadata.name.clone().unwrap();
    let up = format!(r#"up{{job="{job}",namespace="{ns}",pod="{name}",endpoint="envoy-metrics"}}"#);
    until(
        "the pod found and scraped on envoy-metrics",
        Duration::from_secs(90),
        || async {
            let up = prometheus.values(&up).ok()?;
            (up.len() == 1 && up[0].1 == 1.0).then_some(())
        },
    )
    .await;
    let limited_total = format!(
        r#"sum({{__name__=~"envoy_.*rate_limited", job="{job}", pod="{name}", envoy_local_http_ratelimit_prefix="ratelimited"}})"#
    );
    let seen = until(
        "Envoy's rate-limit counter in Prometheus",
        Duration::from_secs(60),
        || async {
            let values = prometheus.values(&limited_total).ok()?;
            values.first().map(|(_, v)| *v).filter(|v| *v >= 5.0)
        },
    )
    .await;
    assert!(
        seen >= limited as f64,
        "{seen} < {limited}:\n{}",
        prometheus.log()
    );
}

/// The translation the cluster test relies on, checked apart: every PodMonitor marin3r ships
/// (`manifests/monitoring/`) and the example's become scrape jobs that promtool accepts, with
/// the selection the PodMonitor states; what is not translated is refused by name.
#[test]
fn podmonitors_become_scrape_jobs_promtool_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    let mut monitors: Vec<Value> = monitoring::render()
        .unwrap()
        .into_iter()
        .filter(|o| o["kind"] == "PodMonitor")
        .collect();
    assert_eq!(monitors.len(), 4, "manifests/monitoring's PodMonitors");
    monitors.push(serde_saphyr::from_str(&example("podmonitor.yaml", "shop")).unwrap());
    let mut jobs = Vec::new();
    for monitor in &monitors {
        jobs.extend(monitoring::pod_monitor_jobs(monitor, &kubeconfig).unwrap());
    }
    std::fs::write(
        dir.path().join("prometheus.yml"),
        monitoring::config_of_jobs(&jobs, "10s"),
    )
    .unwrap();
    let (ok, out) =
        monitoring::run_promtool(dir.path(), &["check", "config", "prometheus.yml"]).unwrap();
    assert!(ok, "{out}");

    let example = jobs.last().unwrap();
    assert_eq!(example["job_name"], "podMonitor/shop/ratelimited/0");
    assert_eq!(example["metrics_path"], "/stats/prometheus");
    assert_eq!(example["scrape_interval"], "10s");
    assert_eq!(
        example["kubernetes_sd_configs"][0]["namespaces"]["names"],
        json!(["shop"])
    );
    let relabel = example["relabel_configs"].as_array().unwrap();
    assert!(relabel.contains(&json!({
        "source_labels": ["__meta_kubernetes_pod_label_app", "__meta_kubernetes_pod_labelpresent_app"],
        "regex": "(ratelimited);true", "action": "keep"})));
    assert!(relabel.contains(&json!({
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "envoy-metrics", "action": "keep"})));
    // `namespaceSelector: any` watches every namespace; `jobLabel` names the job.
    let operator = &jobs[0];
    assert!(
        operator["kubernetes_sd_configs"][0]
            .get("namespaces")
            .is_some()
            != (monitors[0]["spec"]["namespaceSelector"]["any"] == true)
    );
    assert!(
        operator["relabel_configs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["source_labels"]
                == json!(["__meta_kubernetes_pod_label_app_kubernetes_io_component"])
                && r["target_label"] == "job")
    );

    // A relabeling of the endpoint's, in Prometheus' spelling, after the operator's.
    let sidecars = jobs
        .iter()
        .find(|j| j["job_name"] == "podMonitor/marin3r-system/marin3r-envoy-sidecars/0")
        .unwrap();
    assert_eq!(
        sidecars["relabel_configs"].as_array().unwrap().last(),
        Some(&json!({"target_label": "job", "replacement": "envoy-sidecar"}))
    );

    let mut unsupported = monitors[4].clone();
    unsupported["spec"]["selector"]["matchExpressions"] =
        json!([{"key": "app", "operator": "Exists"}]);
    let err = monitoring::pod_monitor_jobs(&unsupported, &kubeconfig).unwrap_err();
    assert!(
        err.to_string()
            .contains("matchExpressions is not translated"),
        "{err}"
    );
}
