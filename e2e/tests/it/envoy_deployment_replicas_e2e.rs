//! An EnvoyDeployment's replicas and disruption budget on the real cluster (`hack/cluster`),
//! driven with kubectl as a user drives them, from manifests of our own in the original
//! MARIN3R's API (`kubectl apply -f`, client-side), in a namespace of the scenario's own:
//! dynamic replicas become an autoscaling/v2 HorizontalPodAutoscaler of the Deployment with
//! the original's name, which the real HPA controller acts on (it raises a Deployment below
//! `minReplicas`; without a metrics server it reports `ScalingActive=False` and leaves a count
//! within its bounds, so `kubectl scale` sticks across the operator's reconciles and spec
//! changes); static replicas remove the autoscaler and set the count, and turning dynamic
//! again keeps the count (the server-side-apply handover: its manager owns `spec.replicas` in
//! the real managedFields); the PodDisruptionBudget follows `spec.podDisruptionBudget`, the
//! disruption controller counts it and the eviction API honours it; the autoscaler, budget and
//! bootstrap, deleted or edited by hand, are back within seconds; the gateway's own
//! `marin3r.3scale.net/prometheus-annotations` decides its pods' `prometheus.io/*` annotations.

use std::time::{Duration, Instant};

use marin3r_e2e::real::Scenario;
use marin3r_operator::envoy_deployment::build::REPLICAS_HANDOVER_MANAGER;
use marin3r_testkit::wait::until;
use serde_json::Value;

const OWNED: &str = "marin3r-envoydeployment-checkout";
const DEPLOYMENT: &str = "deployment/marin3r-envoydeployment-checkout";
const HPA: &str = "hpa/marin3r-envoydeployment-checkout";
const PDB: &str = "pdb/marin3r-envoydeployment-checkout";
const GATEWAY_NAME: &str = "envoydeployment/checkout";
const GATEWAY_PODS: &str =
    "app.kubernetes.io/component=envoy-deployment,app.kubernetes.io/instance=checkout";

/// The discovery service and the gateway's config: a listener on 7070 that answers
/// `checkout` itself.
const SETUP: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata:
  name: instance
  namespace: NAMESPACE
spec: {}
---
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata:
  name: checkout
  namespace: NAMESPACE
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
/// admin access log, dynamic replicas with two metrics and a behavior, and a budget; its
/// readiness probe quicker than the original's defaults (15 s before the first), so pods are
/// Ready in seconds.
const GATEWAY: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: EnvoyDeployment
metadata:
  name: checkout
  namespace: NAMESPACE
spec:
  discoveryServiceRef: instance
  envoyConfigRef: checkout
  ports:
    - name: web
      port: 7070
  extraArgs: ["--concurrency", "2"]
  adminAccessLogPath: /dev/stderr
  readinessProbe:
    initialDelaySeconds: 0
    periodSeconds: 2
    timeoutSeconds: 1
    successThreshold: 1
    failureThreshold: 3
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

async fn kubectl(s: &Scenario, args: &[&str]) -> String {
    s.kubectl.ok(args).await.unwrap()
}

/// `kubectl get <what> -n shop -o json`, or `None` when it is not found.
async fn get(s: &Scenario, what: &str) -> Option<Value> {
    let out = s
        .kubectl
        .run(&["get", what, "-n", &s.ns, "-o", "json"])
        .await
        .unwrap();
    if !out.success {
        assert!(out.stderr.contains("NotFound"), "{out:?}");
        return None;
    }
    Some(serde_json::from_str(&out.stdout).unwrap())
}

/// `kubectl patch envoydeployment checkout` with a patch of `kind` (merge or json).
async fn patch(s: &Scenario, kind: &str, patch: &str) {
    let args = [
        "patch",
        "envoydeployment",
        "checkout",
        "-n",
        &s.ns,
        &format!("--type={kind}"),
        "-p",
        patch,
    ];
    kubectl(s, &args).await;
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
async fn reconciled(s: &Scenario) -> Value {
    until(
        "the EnvoyDeployment's current generation to be reconciled",
        Duration::from_secs(120),
        || async {
            let ed = get(s, GATEWAY_NAME).await?;
            (ed["status"]["observedGeneration"] == ed["metadata"]["generation"]).then_some(ed)
        },
    )
    .await
}

/// Waits for the Deployment to ask for `replicas` and have that many ready pods.
async fn runs(s: &Scenario, replicas: i64) -> Value {
    until(
        &format!("{replicas} ready gateway pods"),
        Duration::from_secs(120),
        || async {
            let d = get(s, DEPLOYMENT).await?;
            let ready = d["status"]["readyReplicas"].as_i64().unwrap_or(0);
            let all = d["status"]["replicas"].as_i64().unwrap_or(0);
            (d["spec"]["replicas"] == replicas && ready == replicas && all == replicas).then_some(d)
        },
    )
    .await
}

async fn appears(s: &Scenario, what: &str, name: &str) -> Value {
    until(what, Duration::from_secs(60), || get(s, name)).await
}

async fn gone(s: &Scenario, what: &str) {
    until(
        &format!("{what} to go"),
        Duration::from_secs(60),
        || async { get(s, what).await.is_none().then_some(()) },
    )
    .await;
}

/// How soon a deleted or edited child must be back: far under the Ready gateway's 300 s
/// resync, so only a watch of that kind can have woken the operator.
const RESTORED_WITHIN: Duration = Duration::from_secs(20);

/// Waits until `check` holds for `name`, within [`RESTORED_WITHIN`].
async fn restored(s: &Scenario, name: &str, check: impl Fn(&Value) -> bool) {
    let started = std::time::Instant::now();
    until(
        &format!("{name} to be restored"),
        RESTORED_WITHIN,
        || async { get(s, name).await.filter(|v| check(v)).map(|_| ()) },
    )
    .await;
    println!("{name} restored in {:?}", started.elapsed());
}

/// The autoscaler, the budget and the bootstrap of a Ready gateway, deleted or edited by
/// hand, are put back by the operator within seconds: it watches them as it watches the
/// Deployment.
async fn children_come_back(s: &Scenario) {
    until(
        "the gateway to be Ready",
        Duration::from_secs(120),
        || async {
            let ed = get(s, GATEWAY_NAME).await?;
            let conditions = ed["status"]["conditions"].as_array()?.clone();
            conditions
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        },
    )
    .await;
    for child in [HPA, PDB] {
        kubectl(s, &["delete", child, "-n", &s.ns]).await;
        restored(s, child, |_| true).await;
    }
    let config_map = format!("configmap/{OWNED}");
    let before = get(s, &config_map).await.unwrap();
    let data = before["data"].as_object().unwrap();
    let key = data.keys().next().unwrap().clone();
    let edit = serde_json::json!({"data": {&key: "edited by hand"}}).to_string();
    kubectl(
        s,
        &[
            "patch",
            &config_map,
            "-n",
            &s.ns,
            "--type=merge",
            "-p",
            &edit,
        ],
    )
    .await;
    restored(s, &config_map, |cm| cm["data"][&key] == data[&key]).await;
}

/// The managers owning the Deployment's `spec.replicas` (`manager/operation[/subresource]`),
/// from its managedFields.
async fn replicas_owners(s: &Scenario) -> Vec<String> {
    let out = s
        .kubectl
        .ok(&[
            "get",
            DEPLOYMENT,
            "-n",
            &s.ns,
            "-o",
            "json",
            "--show-managed-fields",
        ])
        .await
        .unwrap();
    let d: Value = serde_json::from_str(&out).unwrap();
    d["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["fieldsV1"]["f:spec"]["f:replicas"].is_object())
        .map(|e| {
            let sub = e["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            format!(
                "{}/{}{sub}",
                e["manager"].as_str().unwrap_or("?"),
                e["operation"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// The HPA's condition `kind`: (status, reason).
fn hpa_condition(hpa: &Value, kind: &str) -> Option<(String, String)> {
    let c = hpa["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?;
    Some((
        c["status"].as_str()?.to_owned(),
        c["reason"].as_str()?.to_owned(),
    ))
}

/// Samples the Deployment's `spec.replicas` for `how_long`: every value seen.
async fn replicas_over(s: &Scenario, how_long: Duration) -> Vec<Value> {
    let until = Instant::now() + how_long;
    let mut seen = Vec::new();
    while Instant::now() < until {
        if let Some(d) = get(s, DEPLOYMENT).await {
            let r = d["spec"]["replicas"].clone();
            if seen.last() != Some(&r) {
                seen.push(r);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    seen
}

/// The eviction API honours the budget: with `disruptions_allowed` pods evictable, one more
/// eviction right after is refused (429) while the evicted pods are replaced. (Posted with
/// kubectl: kube's client retries a 429 until it passes.)
async fn evictions_honour_the_budget(s: &Scenario, disruptions_allowed: usize) {
    let ready = s.ready_pods(GATEWAY_PODS).await;
    assert!(ready.len() > disruptions_allowed, "{}", ready.len());
    let mut outcomes = Vec::new();
    for pod in ready.iter().take(disruptions_allowed + 1) {
        let name = kube::ResourceExt::name_any(pod);
        let eviction = serde_json::json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": s.ns},
        });
        let path = format!("/api/v1/namespaces/{}/pods/{name}/eviction", s.ns);
        let out = s
            .kubectl
            .run_with(
                &["create", "--raw", &path, "-f", "-"],
                &eviction.to_string(),
            )
            .await
            .unwrap();
        outcomes.push(if out.success {
            "evicted".to_owned()
        } else {
            out.stderr.trim().to_owned()
        });
    }
    println!("evictions with {disruptions_allowed} disruption(s) allowed: {outcomes:?}");
    assert!(
        outcomes[..disruptions_allowed]
            .iter()
            .all(|o| o == "evicted"),
        "{outcomes:?}"
    );
    let refused = &outcomes[disruptions_allowed];
    assert!(
        refused.contains("TooManyRequests") && refused.contains("disruption budget"),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_replicas_are_the_autoscalers_static_ones_the_operators_and_budgets_follow() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = Scenario::start("gateway-replicas", &[]).await.unwrap();
    let s = &scenario;
    let ns = s.ns.clone();
    step("namespace created");
    s.apply(&SETUP.replace("NAMESPACE", &ns)).await.unwrap();
    s.discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");
    let gateway = GATEWAY.replace("NAMESPACE", &ns);
    s.apply(&gateway).await.unwrap();

    // Every field applied is kept as written: nothing pruned.
    let applied = s
        .kubectl
        .ok_with(
            &["create", "--dry-run=client", "-o", "json", "-f", "-"],
            &gateway,
        )
        .await
        .unwrap();
    let applied: Value = serde_json::from_str(&applied).unwrap();
    let ed = reconciled(s).await;
    assert_within(&applied["spec"], &ed["spec"], "spec");

    // The autoscaler: the original's name and labels, the Deployment as its target, the
    // spec's bounds, metrics and behavior.
    let hpa = appears(s, "the autoscaler", HPA).await;
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
    // The operator applies the Deployment last, once the gateway's client certificate is
    // issued: a reconcile that found it not yet issued reports the generation observed with
    // the autoscaler and budget applied and no Deployment. So each is waited for.
    let pdb = appears(s, "the disruption budget", PDB).await;
    assert_eq!(pdb["spec"]["minAvailable"], "50%");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "envoy-deployment"
    );
    let d = appears(s, "the Deployment", DEPLOYMENT).await;
    let envoy = &d["spec"]["template"]["spec"]["containers"][0];
    assert_within(
        &applied["spec"]["resources"],
        &envoy["resources"],
        "resources",
    );

    // The real HPA controller holds the count at its minimum; with no metrics server it can
    // read no metric, says so, and scales no further.
    runs(s, 2).await;
    step("the autoscaler's minimum running");
    println!("spec.replicas owned by {:?}", replicas_owners(s).await);
    let hpa = until(
        "the HPA controller to report it cannot read metrics",
        Duration::from_secs(90),
        || async {
            let hpa = get(s, HPA).await?;
            let active = hpa_condition(&hpa, "ScalingActive")?;
            (active.0 == "False").then_some(hpa)
        },
    )
    .await;
    let active = hpa_condition(&hpa, "ScalingActive").unwrap();
    println!("the HPA's ScalingActive: {active:?}");
    assert!(active.1.starts_with("FailedGet"), "{active:?}");
    assert_eq!(hpa_condition(&hpa, "AbleToScale").unwrap().0, "True");
    assert_eq!(hpa["status"]["currentReplicas"], 2, "{hpa}");
    step("HPA ScalingActive=False without metrics");

    // The disruption controller counts the budget, and the eviction API honours it.
    let pdb = until(
        "the disruption controller to count the budget",
        Duration::from_secs(60),
        || async {
            let pdb = get(s, PDB).await?;
            (pdb["status"]["currentHealthy"] == 2
                && pdb["status"]["observedGeneration"] == pdb["metadata"]["generation"])
                .then_some(pdb)
        },
    )
    .await;
    assert_eq!(pdb["status"]["desiredHealthy"], 1, "{pdb}");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 1, "{pdb}");
    evictions_honour_the_budget(s, 1).await;
    runs(s, 2).await;
    step("budget honoured by the eviction API");

    children_come_back(s).await;
    step("children restored");

    // Below the autoscaler's minimum, the HPA controller raises the count again.
    kubectl(s, &["scale", DEPLOYMENT, "-n", &ns, "--replicas=1"]).await;
    runs(s, 2).await;
    // The operator's apply leaves the count out while the autoscaler has it: it owns none of it.
    let owners = replicas_owners(s).await;
    println!("raised back to 2; spec.replicas owned by {owners:?}");
    assert!(
        !owners.iter().any(|o| o.starts_with("marin3r-operator/")),
        "{owners:?}"
    );
    step("HPA raised the count to its minimum");

    // A count within its bounds, set by hand: with no metric the autoscaler leaves it, and it
    // sticks through the operator's reconciles (the scale wakes it: it owns the Deployment)
    // and through a spec change.
    kubectl(s, &["scale", DEPLOYMENT, "-n", &ns, "--replicas=3"]).await;
    runs(s, 3).await;
    until(
        "the status to show the scaled Deployment",
        Duration::from_secs(60),
        || async {
            let ed = get(s, GATEWAY_NAME).await?;
            (ed["status"]["deploymentStatus"]["readyReplicas"] == 3).then_some(())
        },
    )
    .await;
    patch(
        s,
        "merge",
        r#"{"spec":{"extraArgs":["--concurrency","1"]}}"#,
    )
    .await;
    reconciled(s).await;
    let d = runs(s, 3).await;
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.ends_with(r#""--concurrency","1"]"#), "{args}");
    step("scaled count kept through a rollout");

    // No budget asked for: none; a different one: that one.
    patch(
        s,
        "json",
        r#"[{"op":"remove","path":"/spec/podDisruptionBudget"}]"#,
    )
    .await;
    gone(s, PDB).await;
    patch(
        s,
        "merge",
        r#"{"spec":{"podDisruptionBudget":{"maxUnavailable":1}}}"#,
    )
    .await;
    let pdb = appears(s, "the new budget", PDB).await;
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(pdb["spec"].get("minAvailable").is_none(), "{pdb}");

    // Static replicas: the autoscaler goes and the operator sets the count.
    patch(
        s,
        "merge",
        r#"{"spec":{"replicas":{"dynamic":null,"static":2}}}"#,
    )
    .await;
    gone(s, HPA).await;
    runs(s, 2).await;
    let owners = replicas_owners(s).await;
    println!("static: spec.replicas owned by {owners:?}");
    assert_eq!(owners, ["marin3r-operator/Apply"]);
    step("static replicas set by the operator");

    // Dynamic again, with a minimum of 1: the autoscaler is back and the count stays at 2
    // (were the field left unowned, the API server would reset it to 1, a count the
    // autoscaler, within its bounds and with no metric, would keep). The handover manager
    // owns it until the autoscaler changes it.
    patch(
        s,
        "merge",
        r#"{"spec":{"replicas":{"static":null,"dynamic":{"minReplicas":1,"maxReplicas":4}}}}"#,
    )
    .await;
    reconciled(s).await;
    appears(s, "the autoscaler again", HPA).await;
    let d = runs(s, 2).await;
    assert_eq!(d["status"]["replicas"], 2, "{d}");
    let owners = replicas_owners(s).await;
    println!("dynamic again: spec.replicas owned by {owners:?}");
    assert!(
        owners.contains(&format!("{REPLICAS_HANDOVER_MANAGER}/Apply")),
        "{owners:?}"
    );
    // Through the HPA controller's next syncs (every 15 s) the count stays.
    let seen = replicas_over(s, Duration::from_secs(20)).await;
    assert_eq!(seen, [serde_json::json!(2)], "spec.replicas went {seen:?}");
    step("the count kept through the handover");
    prometheus_annotations_follow_the_gateway(s).await;
    step("prometheus annotations followed");
}

/// `kubectl annotate envoydeployment checkout -n shop <annotation>`.
async fn annotate(s: &Scenario, annotation: &str) {
    let args = [
        "annotate",
        GATEWAY_NAME,
        "-n",
        &s.ns,
        "--overwrite",
        annotation,
    ];
    kubectl(s, &args).await;
}

/// Waits for the pod template's `prometheus.io/scrape` to be `want` (`None`: absent).
async fn template_scrape(s: &Scenario, want: Option<&str>) {
    until(
        &format!("the pod template's prometheus.io/scrape to be {want:?}"),
        Duration::from_secs(60),
        || async {
            let d = get(s, DEPLOYMENT).await?;
            let got = &d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"];
            (got.as_str() == want).then_some(())
        },
    )
    .await;
}

/// The gateway's own `marin3r.3scale.net/prometheus-annotations` turns its pods'
/// `prometheus.io/*` annotations off and on again; a value that is not a boolean is a
/// condition naming the annotation.
async fn prometheus_annotations_follow_the_gateway(s: &Scenario) {
    const KEY: &str = "marin3r.3scale.net/prometheus-annotations";
    template_scrape(s, Some("true")).await;
    annotate(s, &format!("{KEY}=false")).await;
    template_scrape(s, None).await;
    annotate(s, &format!("{KEY}=maybe")).await;
    let message = until(
        "the bad annotation to be reported",
        Duration::from_secs(60),
        || async {
            let ed = get(s, GATEWAY_NAME).await?;
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
    annotate(s, &format!("{KEY}-")).await;
    template_scrape(s, Some("true")).await;
}
