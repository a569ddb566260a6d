//! An EnvoyDeployment's replicas and disruption budget on the local cluster, driven with
//! kubectl as a user drives them, from manifests of our own in the original MARIN3R's API
//! (`kubectl apply -f`, client-side): dynamic replicas become an
//! autoscaling/v2 HorizontalPodAutoscaler of the Deployment with the original's name, and
//! the operator leaves the replica count to it (`kubectl scale`, as an autoscaler would,
//! sticks across reconciles and spec changes); static replicas remove the autoscaler and set
//! the count, and turning dynamic again keeps the count; the PodDisruptionBudget follows
//! `spec.podDisruptionBudget`; the autoscaler, budget and bootstrap, deleted or edited by hand,
//! are back within seconds; the gateway's own `marin3r.3scale.net/prometheus-annotations`
//! decides its pods' `prometheus.io/*` annotations. Needs root (pod runner) and the built `marin3r` binary.

use std::time::Duration;

use marin3r_e2e::product::{Installed, install};
use marin3r_local_cluster::cluster::create_restricted_namespace;
use marin3r_testkit::wait::until;
use serde_json::Value;

const NS: &str = "shop";
const OWNED: &str = "marin3r-envoydeployment-checkout";
const DEPLOYMENT: &str = "deployment/marin3r-envoydeployment-checkout";
const HPA: &str = "hpa/marin3r-envoydeployment-checkout";
const PDB: &str = "pdb/marin3r-envoydeployment-checkout";
const GATEWAY_NAME: &str = "envoydeployment/checkout";

/// The discovery service and the gateway's config: a listener on 7070 that answers
/// `checkout` itself.
const SETUP: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata:
  name: instance
  namespace: shop
spec: {}
---
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata:
  name: checkout
  namespace: shop
spec:
  nodeID: checkout-gw
  resources:
    - type: listener
      value:
        name: web
        address:
          socket_address: {address: 0.0.0.0, port_value: 7070}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: checkout_web
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
                  route_config:
                    name: checkout-direct
                    virtual_hosts:
                      - name: checkout-hosts
                        domains: ["*"]
                        routes:
                          - match: {path: /healthz}
                            direct_response: {status: 204}
"#;

/// An autoscaled gateway using every field of that shape: resources, extra arguments, an
/// admin access log, dynamic replicas with two metrics and a behavior, and a budget.
const GATEWAY: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: EnvoyDeployment
metadata:
  name: checkout
  namespace: shop
spec:
  discoveryServiceRef: instance
  envoyConfigRef: checkout
  ports:
    - name: web
      port: 7070
  extraArgs: ["--concurrency", "2"]
  adminAccessLogPath: /dev/stderr
  resources:
    requests: {cpu: 75m, memory: 40Mi}
    limits: {cpu: "1", memory: 200Mi}
  replicas:
    dynamic:
      minReplicas: 2
      maxReplicas: 5
      metrics:
        - type: Resource
          resource:
            name: memory
            target: {type: AverageValue, averageValue: 150Mi}
        - type: Resource
          resource:
            name: cpu
            target: {type: Utilization, averageUtilization: 70}
      behavior:
        scaleUp:
          stabilizationWindowSeconds: 30
          policies:
            - {type: Pods, value: 1, periodSeconds: 20}
        scaleDown:
          stabilizationWindowSeconds: 180
          selectPolicy: Min
          policies:
            - {type: Pods, value: 1, periodSeconds: 90}
            - {type: Percent, value: 25, periodSeconds: 90}
  podDisruptionBudget:
    minAvailable: "50%"
"#;

async fn kubectl(installed: &Installed, args: &[&str]) -> String {
    installed.kubectl.ok(args).await.unwrap()
}

/// `kubectl get <what> -n shop -o json`, or `None` when it is not found.
async fn get(installed: &Installed, what: &str) -> Option<Value> {
    let out = installed
        .kubectl
        .run(&["get", what, "-n", NS, "-o", "json"])
        .await
        .unwrap();
    if !out.success {
        assert!(out.stderr.contains("NotFound"), "{out:?}");
        return None;
    }
    Some(serde_json::from_str(&out.stdout).unwrap())
}

/// `kubectl patch envoydeployment checkout` with a patch of `kind` (merge or json).
async fn patch(installed: &Installed, kind: &str, patch: &str) {
    let args = [
        "patch",
        "envoydeployment",
        "checkout",
        "-n",
        NS,
        &format!("--type={kind}"),
        "-p",
        patch,
    ];
    kubectl(installed, &args).await;
}

/// Every field of `want` is in `got` with the same value (`got` may have defaults on top).
fn assert_within(want: &Value, got: &Value, path: &str) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                let at = format!("{path}.{k}");
                let found = g
                    .get(k)
                    .unwrap_or_else(|| panic!("{at} was dropped: {got}"));
                assert_within(v, found, &at);
            }
        }
        (Value::Array(w), Value::Array(g)) => {
            assert_eq!(w.len(), g.len(), "{path}: {got}");
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                assert_within(w, g, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(want, got, "{path}"),
    }
}

/// Waits for the gateway's reconcile of its current generation to be reported.
async fn reconciled(installed: &Installed) -> Value {
    until(
        "the EnvoyDeployment's current generation to be reconciled",
        Duration::from_secs(120),
        || async {
            let ed = get(installed, GATEWAY_NAME).await?;
            (ed["status"]["observedGeneration"] == ed["metadata"]["generation"]).then_some(ed)
        },
    )
    .await
}

/// Waits for the Deployment to ask for `replicas` and have that many ready pods.
async fn runs(installed: &Installed, replicas: i64) -> Value {
    until(
        &format!("{replicas} ready gateway pods"),
        Duration::from_secs(120),
        || async {
            let d = get(installed, DEPLOYMENT).await?;
            let ready = d["status"]["readyReplicas"].as_i64().unwrap_or(0);
            let all = d["status"]["replicas"].as_i64().unwrap_or(0);
            (d["spec"]["replicas"] == replicas && ready == replicas && all == replicas).then_some(d)
        },
    )
    .await
}

async fn appears(installed: &Installed, what: &str, name: &str) -> Value {
    until(what, Duration::from_secs(60), || get(installed, name)).await
}

async fn gone(installed: &Installed, what: &str) {
    until(
        &format!("{what} to go"),
        Duration::from_secs(60),
        || async { get(installed, what).await.is_none().then_some(()) },
    )
    .await;
}

/// How soon a deleted or edited child must be back: far under the Ready gateway's 300 s
/// resync, so only a watch of that kind can have woken the operator.
const RESTORED_WITHIN: Duration = Duration::from_secs(20);

/// Waits until `check` holds for `name`, within [`RESTORED_WITHIN`].
async fn restored(installed: &Installed, name: &str, check: impl Fn(&Value) -> bool) {
    let started = std::time::Instant::now();
    until(
        &format!("{name} to be restored"),
        RESTORED_WITHIN,
        || async { get(installed, name).await.filter(|v| check(v)).map(|_| ()) },
    )
    .await;
    println!("{name} restored in {:?}", started.elapsed());
}

/// The autoscaler, the budget and the bootstrap of a Ready gateway, deleted or edited by
/// hand, are put back by the operator within seconds: it watches them as it watches the
/// Deployment.
async fn children_come_back(installed: &Installed) {
    until(
        "the gateway to be Ready",
        Duration::from_secs(120),
        || async {
            let ed = get(installed, GATEWAY_NAME).await?;
            let conditions = ed["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        },
    )
    .await;
    for child in [HPA, PDB] {
        kubectl(installed, &["delete", child, "-n", NS]).await;
        restored(installed, child, |_| true).await;
    }
    let config_map = format!("configmap/{OWNED}");
    let before = get(installed, &config_map).await.unwrap();
    let data = before["data"].as_object().unwrap();
    let key = data.keys().next().unwrap().clone();
    let edit = serde_json::json!({"data": {&key: "edited by hand"}}).to_string();
    kubectl(
        installed,
        &["patch", &config_map, "-n", NS, "--type=merge", "-p", &edit],
    )
    .await;
    restored(installed, &config_map, |cm| cm["data"][&key] == data[&key]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_replicas_are_the_autoscalers_static_ones_the_operators_and_budgets_follow() {
    let installed = install(marin3r_e2e::product::images()).await.unwrap();
    create_restricted_namespace(&installed.client, NS)
        .await
        .unwrap();
    installed
        .kubectl
        .ok_with(&["apply", "-f", "-"], SETUP)
        .await
        .unwrap();
    installed.discovery_service_ready(NS, "instance").await;
    installed
        .kubectl
        .ok_with(&["apply", "-f", "-"], GATEWAY)
        .await
        .unwrap();

    // Every field applied is kept as written: nothing pruned.
    let applied = installed
        .kubectl
        .ok_with(
            &["create", "--dry-run=client", "-o", "json", "-f", "-"],
            GATEWAY,
        )
        .await
        .unwrap();
    let applied: Value = serde_json::from_str(&applied).unwrap();
    let ed = reconciled(&installed).await;
    assert_within(&applied["spec"], &ed["spec"], "spec");

    // The autoscaler: the original's name and labels, the Deployment as its target, the
    // spec's bounds, metrics and behavior.
    let hpa = appears(&installed, "the autoscaler", HPA).await;
    let dynamic = &applied["spec"]["replicas"]["dynamic"];
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": OWNED})
    );
    assert_eq!(hpa["spec"]["minReplicas"], 2);
    assert_eq!(hpa["spec"]["maxReplicas"], 5);
    assert_within(&dynamic["metrics"], &hpa["spec"]["metrics"], "metrics");
    assert_within(&dynamic["behavior"], &hpa["spec"]["behavior"], "behavior");
    assert_eq!(
        hpa["metadata"]["labels"]["app.kubernetes.io/instance"],
        "checkout"
    );
    assert_eq!(
        hpa["metadata"]["ownerReferences"][0]["kind"],
        "EnvoyDeployment"
    );
    let pdb = get(&installed, PDB).await.unwrap();
    assert_eq!(pdb["spec"]["minAvailable"], "50%");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "envoy-deployment"
    );
    let d = get(&installed, DEPLOYMENT).await.unwrap();
    let envoy = &d["spec"]["template"]["spec"]["containers"][0];
    assert_within(
        &applied["spec"]["resources"],
        &envoy["resources"],
        "resources",
    );

    children_come_back(&installed).await;

    // The autoscaler's job, done by hand: the count sticks through the operator's reconciles
    // (the scale wakes it: it owns the Deployment) and through a spec change.
    kubectl(&installed, &["scale", DEPLOYMENT, "-n", NS, "--replicas=3"]).await;
    runs(&installed, 3).await;
    until(
        "the status to show the scaled Deployment",
        Duration::from_secs(60),
        || async {
            let ed = get(&installed, GATEWAY_NAME).await?;
            (ed["status"]["deploymentStatus"]["readyReplicas"] == 3).then_some(())
        },
    )
    .await;
    patch(
        &installed,
        "merge",
        r#"{"spec":{"extraArgs":["--concurrency","1"]}}"#,
    )
    .await;
    reconciled(&installed).await;
    let d = runs(&installed, 3).await;
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.ends_with(r#""--concurrency","1"]"#), "{args}");

    // No budget asked for: none; a different one: that one.
    patch(
        &installed,
        "json",
        r#"[{"op":"remove","path":"/spec/podDisruptionBudget"}]"#,
    )
    .await;
    gone(&installed, PDB).await;
    patch(
        &installed,
        "merge",
        r#"{"spec":{"podDisruptionBudget":{"maxUnavailable":1}}}"#,
    )
    .await;
    let pdb = appears(&installed, "the new budget", PDB).await;
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"].get("minAvailable").is_none(), "{pdb}");

    // Static replicas: the autoscaler goes and the operator sets the count.
    patch(
        &installed,
        "merge",
        r#"{"spec":{"replicas":{"dynamic":null,"static":2}}}"#,
    )
    .await;
    gone(&installed, HPA).await;
    runs(&installed, 2).await;

    // Dynamic again: the autoscaler is back and the count stays where it was (never reset
    // to one while the autoscaler has not acted yet).
    patch(
        &installed,
        "merge",
        r#"{"spec":{"replicas":{"static":null,"dynamic":{"minReplicas":2,"maxReplicas":4}}}}"#,
    )
    .await;
    reconciled(&installed).await;
    appears(&installed, "the autoscaler again", HPA).await;
    let d = runs(&installed, 2).await;
    assert_eq!(d["status"]["replicas"], 2, "{d}");
    prometheus_annotations_follow_the_gateway(&installed).await;
    installed.cluster.shutdown(Duration::from_secs(5)).await;
}

/// `kubectl annotate envoydeployment checkout -n shop <annotation>`.
async fn annotate(installed: &Installed, annotation: &str) {
    let args = [
        "annotate",
        GATEWAY_NAME,
        "-n",
        NS,
        "--overwrite",
        annotation,
    ];
    kubectl(installed, &args).await;
}

/// Waits for the pod template's `prometheus.io/scrape` to be `want` (`None`: absent).
async fn template_scrape(installed: &Installed, want: Option<&str>) {
    until(
        &format!("the pod template's prometheus.io/scrape to be {want:?}"),
        Duration::from_secs(60),
        || async {
            let d = get(installed, DEPLOYMENT).await?;
            let got = &d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"];
            (got.as_str() == want).then_some(())
        },
    )
    .await;
}

/// The gateway's own `marin3r.3scale.net/prometheus-annotations` turns its pods'
/// `prometheus.io/*` annotations off and on again; a value that is not a boolean is a
/// condition naming the annotation.
async fn prometheus_annotations_follow_the_gateway(installed: &Installed) {
    const KEY: &str = "marin3r.3scale.net/prometheus-annotations";
    template_scrape(installed, Some("true")).await;
    annotate(installed, &format!("{KEY}=false")).await;
    template_scrape(installed, None).await;
    annotate(installed, &format!("{KEY}=maybe")).await;
    let message = until(
        "the bad annotation to be reported",
        Duration::from_secs(60),
        || async {
            let ed = get(installed, GATEWAY_NAME).await?;
            let conditions = ed["status"]["conditions"].as_array()?.clone();
            let ready = conditions.into_iter().find(|c| c["type"] == "Ready")?;
            (ready["status"] == "False" && ready["reason"] == "InvalidSpec")
                .then(|| ready["message"].as_str().unwrap_or_default().to_owned())
        },
    )
    .await;
    assert!(
        message.contains(&format!("metadata.annotations[{KEY}]: \"maybe\"")),
        "{message}"
    );
    annotate(installed, &format!("{KEY}-")).await;
    template_scrape(installed, Some("true")).await;
}
