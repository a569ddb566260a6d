//! A real Prometheus (3.16, built by `hack/install-cluster-tools`) scrapes the real cluster
//! (`hack/cluster`) as `manifests/monitoring/` tells one to: the operator and the discovery pod
//! on their `metrics` ports, and the injected Envoy on its `envoy-stats` port and
//! `prometheus.io/*` annotations, found through the API as the PodMonitors and
//! annotation-driven configurations find them. The targets are static (the pod IPs the test
//! reads from the API, which the host reaches), labelled `job`, `namespace` and `pod` as the
//! prometheus-operator labels a PodMonitor's targets. PromQL over its HTTP API then sees
//! Envoy's own stats and the control plane's `marin3r_*`; every dashboard panel's query runs;
//! the shipped rules (with `for:` shortened to `0s`, the only change) fire
//! `Marin3rEnvoyConfigNacked` when the real Envoy NACKs a bad config from the real discovery
//! service. Last, `spec.sidecar.prometheusAnnotations: false` reaches a new pod. The
//! discovery service is the scenario's, in its namespace; the operator is the one every
//! scenario shares, whose metrics cover every scenario's certificates and reconciles, so the
//! test holds the cluster alone: "nothing fires on a healthy cluster" is about this one, and
//! a certificate of another scenario not yet issued would fire with `for: 0s`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use marin3r_api::discovery_service::DiscoveryService;
use marin3r_e2e::monitoring::{self, Job, Prometheus, address, grafana_to_promql};
use marin3r_e2e::real::{self, Scenario, pod_ready};
use marin3r_e2e::rejected::nacked_by_proxies;
use marin3r_testkit::wait::until;
use serde_json::{Value, json};

const OPS: &str = "marin3r-system";
const BODY: &str = real::EXAMPLE_BODY;
/// What the fixed config answers.
const FIXED_BODY: &str = "fixed by marin3r";
/// How often the test's Prometheus scrapes and evaluates, and the window its rates take
/// (Grafana's `$__rate_interval` is at least four scrape intervals).
const INTERVAL: &str = "2s";
const RATE_WINDOW: &str = "30s";

use real::pod_ip;

/// The container port named `name`, in any container of the pod (a native sidecar's is an
/// init container's).
fn named_port(pod: &Pod, name: &str) -> Option<i32> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// A static target for `pod`, labelled as a PodMonitor's targets are.
fn target<'a>(pod: &Pod, port: impl std::fmt::Display) -> (String, Vec<(&'a str, String)>) {
    (
        address(&pod_ip(pod), port),
        vec![
            ("namespace", pod.namespace().unwrap_or_default()),
            ("pod", pod.name_any()),
        ],
    )
}

/// The pods of `ns` that `selector` picks, Ready and not being deleted.
async fn ready_pods(client: &kube::Client, ns: &str, selector: &str) -> Option<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .ok()?;
    Some(
        list.items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
            .collect(),
    )
}

async fn one_ready(client: &kube::Client, ns: &str, selector: &str) -> Pod {
    until(
        &format!("a ready pod {selector} in {ns}"),
        Duration::from_secs(120),
        || async { ready_pods(client, ns, selector).await?.pop() },
    )
    .await
}

/// The injected demo pod (not `not`), ready and answering `body`.
async fn serving_pod(client: &kube::Client, ns: &str, not: Option<&str>, body: &str) -> Pod {
    until(
        "an injected demo pod serving",
        Duration::from_secs(120),
        || async {
            let pods = ready_pods(client, ns, "app=demo").await?;
            let pod = pods
                .into_iter()
                .find(|p| Some(p.name_any().as_str()) != not)?;
            let got = marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", pod_ip(&pod)));
            (got.ok()?.as_str() == body).then_some(pod)
        },
    )
    .await
}

/// Polls an instant query until it has a sample (rates need two scrapes).
async fn samples(prometheus: &Prometheus, expr: &str) -> Vec<(Value, f64)> {
    samples_where(prometheus, expr, |_| true).await
}

/// Polls an instant query until its first sample's value passes `wanted` (the next scrape
/// may not have happened yet).
async fn samples_where(
    prometheus: &Prometheus,
    expr: &str,
    wanted: impl Fn(f64) -> bool,
) -> Vec<(Value, f64)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = match prometheus.values(expr) {
            Ok(found) => found,
            // A query Prometheus refuses is the dashboard's bug: no retry.
            Err(e) => panic!("{expr}: {e:#}"),
        };
        if found.first().is_some_and(|(_, v)| wanted(*v)) {
            return found;
        }
        if tokio::time::Instant::now() > deadline {
            let names = prometheus.api("label/__name__/values", &[]);
            panic!("{expr}: {found:?} after 60 s; the metric names Prometheus has: {names:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_fleet_and_fires_on_a_real_nack() {
    let started = std::time::Instant::now();
    let scenario = Scenario::start_alone("monitoring", &[]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.as_str());
    let config = |body: &str| real::example_config(ns, body).unwrap();
    scenario.serve_examples(BODY).await.unwrap();
    let sidecar = serving_pod(&client, ns, None, BODY).await;

    // The webhook named the stats port and annotated the pod for it.
    let stats_port = named_port(&sidecar, "envoy-stats").expect("an envoy-stats port");
    assert_eq!(stats_port, 9902);
    let annotations = sidecar.annotations();
    let annotation = |name: &str| annotations.get(name).cloned().unwrap_or_default();
    assert_eq!(annotation("prometheus.io/scrape"), "true");
    assert_eq!(annotation("prometheus.io/port"), stats_port.to_string());
    let stats_path = annotation("prometheus.io/path");
    assert_eq!(stats_path, "/stats/prometheus");

    let operator = one_ready(&client, OPS, "app.kubernetes.io/component=operator").await;
    let discovery = one_ready(&client, ns, "app.kubernetes.io/component=discovery-service").await;
    let metrics_port = |pod: &Pod| named_port(pod, "metrics").expect("a metrics port");
    let objects = monitoring::render().unwrap();
    let honor = |monitor: &str| {
        let monitor = monitoring::object(&objects, "PodMonitor", monitor).unwrap();
        monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] == true
    };
    let jobs = [
        Job {
            name: "operator",
            path: "/metrics",
            honor_labels: honor("marin3r-operator"),
            targets: vec![target(&operator, metrics_port(&operator))],
        },
        Job {
            name: "discovery-service",
            path: "/metrics",
            honor_labels: honor("marin3r-discovery-service"),
            targets: vec![target(&discovery, metrics_port(&discovery))],
        },
        // What an annotation-driven configuration scrapes: the annotations' port and path.
        Job {
            name: "envoy-sidecar",
            path: &stats_path,
            honor_labels: honor("marin3r-envoy-sidecars"),
            targets: vec![target(&sidecar, annotation("prometheus.io/port"))],
        },
    ];
    let rules = monitoring::without_for(&monitoring::rules(&objects).unwrap());
    let prometheus = Prometheus::start(&monitoring::config(&jobs, INTERVAL), &rules).unwrap();

    until("the three targets up", Duration::from_secs(60), || async {
        let up = prometheus.values("up").ok()?;
        (up.len() == 3 && up.iter().all(|(_, v)| *v == 1.0)).then_some(())
    })
    .await;

    // Envoy's own stats, from the sidecar.
    let pod = sidecar.name_any();
    let live = format!(r#"envoy_server_live{{job="envoy-sidecar",pod="{pod}"}}"#);
    samples_where(&prometheus, &live, |v| v == 1.0).await;
    let requests = r#"sum(envoy_cluster_upstream_rq_total{job="envoy-sidecar"})"#;
    samples_where(&prometheus, requests, |v| v > 0.0).await;
    samples_where(&prometheus, "envoy_control_plane_connected_state", |v| {
        v == 1.0
    })
    .await;
    // The control plane's, from the operator and the discovery pod.
    let synced = format!(
        r#"marin3r_envoyconfig_proxies{{job="discovery-service",namespace="{ns}",name="demo-proxy",state="synced"}}"#
    );
    for (expr, at_least) in [
        (
            r#"marin3r_build_info{job="operator",component="operator"}"#,
            1.0,
        ),
        (
            r#"marin3r_build_info{job="discovery-service",component="discovery_service"}"#,
            1.0,
        ),
        (
            r#"sum(marin3r_xds_connected_proxies{job="discovery-service"})"#,
            1.0,
        ),
        (
            r#"sum(marin3r_controller_reconciles_total{job="operator",result="ok"})"#,
            1.0,
        ),
        (
            r#"min(marin3r_certificate_expiration_timestamp_seconds{job="operator"}) - time()"#,
            3600.0,
        ),
        // The leader's count of the demo config's proxies, labelled with the config's
        // namespace (honored over the discovery pod's).
        (synced.as_str(), 1.0),
    ] {
        samples_where(&prometheus, expr, |v| v >= at_least).await;
    }

    // Nothing fires on this healthy fleet. The operator reports on every namespace's
    // certificates, and another scenario's namespace may still be going away (its client
    // certificate not ready while its Secret is deleted first): alerts about a namespace
    // other than this scenario's and the operator's are not this fleet's.
    let ours = |a: &Value| {
        a["labels"]["namespace"]
            .as_str()
            .is_none_or(|n| n == ns || n == OPS)
    };
    let firing = |alerts: Vec<Value>| -> Vec<Value> {
        alerts
            .into_iter()
            .filter(|a| a["state"] == "firing" && ours(a))
            .collect()
    };
    // (Marin3rOperatorDown holds until the first scrape, which `for: 10m` hides outside.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = firing(prometheus.alerts().unwrap());
        if now.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A config the real Envoy refuses (its listener on an address the pod lacks; the webhook's
    // Envoy judge binds nothing and admits it), served by the real discovery service: the
    // NACK alert fires, naming the discovery pod.
    let bad = nacked_by_proxies(&config(BODY)).unwrap();
    scenario.apply(&bad).await.unwrap();
    let alert = until(
        "Marin3rEnvoyConfigNacked to fire",
        Duration::from_secs(90),
        || async {
            firing(prometheus.alerts().ok()?)
                .into_iter()
                .find(|a| a["labels"]["alertname"] == "Marin3rEnvoyConfigNacked")
        },
    )
    .await;
    let labels = &alert["labels"];
    assert_eq!(labels["namespace"], ns, "{alert}");
    assert_eq!(labels["pod"], discovery.name_any().as_str(), "{alert}");
    assert_eq!(labels["resource_type"], "listeners", "{alert}");
    assert_eq!(labels["severity"], "warning", "{alert}");
    // Envoy counted the rejection too, and kept serving.
    let rejected = format!(r#"envoy_listener_manager_lds_update_rejected{{pod="{pod}"}}"#);
    samples_where(&prometheus, &rejected, |v| v >= 1.0).await;
    let body = marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", pod_ip(&sidecar)));
    assert_eq!(body.unwrap(), BODY);

    // The fix reaches the proxy, which ACKs it.
    scenario.apply(&config(FIXED_BODY)).await.unwrap();
    serving_pod(&client, ns, None, FIXED_BODY).await;

    // Every dashboard panel's query runs, and has data on this cluster (the convergence
    // histogram since the fix: a config Envoy ACKed while connected).
    let queries = monitoring::dashboard_queries(&objects).unwrap();
    for (title, expr) in &queries {
        let expr = grafana_to_promql(expr, RATE_WINDOW);
        let found = samples(&prometheus, &expr).await;
        assert!(!found.is_empty(), "panel {title:?}: {expr}");
    }
    drop(prometheus);

    cluster_default_turns_the_annotations_off(&client, ns, &sidecar).await;
    println!("done in {:?}", started.elapsed());
}

/// `spec.sidecar.prometheusAnnotations: false` rolls the discovery pod with the flag, and the
/// next injected pod has no `prometheus.io/*` (its `envoy-stats` port stays).
async fn cluster_default_turns_the_annotations_off(
    client: &kube::Client,
    ns: &str,
    old_sidecar: &Pod,
) {
    let discovery_pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = ListParams::default().labels("app.kubernetes.io/component=discovery-service");
    let before: Vec<String> = discovery_pods
        .list(&selector)
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    Api::<DiscoveryService>::namespaced(client.clone(), ns)
        .patch(
            "instance",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sidecar": {"prometheusAnnotations": false}}})),
        )
        .await
        .unwrap();
    until(
        "the discovery pod to roll with --sidecar-prometheus-annotations=false",
        Duration::from_secs(120),
        || async {
            let pods = discovery_pods.list(&selector).await.ok()?.items;
            let rolled = !pods.is_empty()
                && pods
                    .iter()
                    .all(|p| !before.contains(&p.name_any()) && pod_ready(p));
            let flag = pods.iter().all(|p| {
                p.spec.as_ref().is_some_and(|s| {
                    s.containers[0]
                        .args
                        .iter()
                        .flatten()
                        .any(|a| a == "--sidecar-prometheus-annotations=false")
                })
            });
            (rolled && flag).then_some(())
        },
    )
    .await;
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(&old_sidecar.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let replacement = serving_pod(client, ns, Some(&old_sidecar.name_any()), FIXED_BODY).await;
    let annotations = replacement.annotations();
    assert!(
        !annotations.keys().any(|k| k.starts_with("prometheus.io/")),
        "{annotations:?}"
    );
    assert_eq!(named_port(&replacement, "envoy-stats"), Some(9902));
}
