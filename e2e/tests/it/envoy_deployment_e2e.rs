//! An EnvoyDeployment (the original MARIN3R's gateway) on the real cluster (`hack/cluster`),
//! installed from `manifests/` and created with the EnvoyDeployment guide's own commands
//! (`docs/envoydeployment.md`), in a namespace of the scenario's own: a client pod sends a
//! continuous loop of requests through a Service (kube-proxy's ClusterIP) to the gateway's
//! Envoy pods and on to a backend pod, and gets the backend's answer; an EnvoyConfig update
//! reaches the gateways and a rejected one is rolled back; a rolling update of the gateway (a
//! spec change) with the shutdown manager drops no request of the loop, counted, while the
//! real Deployment controller replaces the pods and the EndpointSlice controller and
//! kube-proxy move the Service to the new ones. A bad spec is a Ready=False condition naming
//! the field and leaves the running Deployment alone; one the CRD refuses never reaches the
//! controller. The guide's commands run word for word but for two things this cluster needs:
//! its namespace `gateway` is the scenario's, and its examples' `python:3.13-alpine` (no
//! registry here) is `hack/image`'s python image.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_deployment::EnvoyDeployment;
use marin3r_e2e::product::ready_condition;
use marin3r_e2e::real::{self, Scenario};
use marin3r_e2e::rejected::nacked_by_proxies;
use marin3r_testkit::commands;
use marin3r_testkit::kubectl::Output;
use marin3r_testkit::wait::until;

use crate::gateway_traffic::{ClientLog, MODES, Mode, client_pod, now_ms, pods};

const GATEWAY_PODS: &str =
    "app.kubernetes.io/component=envoy-deployment,app.kubernetes.io/instance=front-door";
/// The guide's folder of examples and its namespace.
const GUIDE_EXAMPLES: &str = "docs/examples/gateway/";
const GUIDE_NS: &str = "gateway";

/// The backend's answer once the gateway rewrites the path (the updated EnvoyConfig).
const V2: &str = "greeter /v2/hello";
/// How long the client keeps being counted after the last old pod is gone.
const AFTER_ROLLOUT_MS: u64 = 5_000;

/// The guide's example `file` as it runs in the scenario's namespace `ns`.
fn guide_example(file: &str, ns: &str) -> String {
    marin3r_e2e::real::guide_example(GUIDE_EXAMPLES, GUIDE_NS, file, ns).unwrap()
}

/// Runs one of the guide's commands (`commands::GATEWAY_*`) in the scenario's namespace:
/// an `apply` of an example applies [`guide_example`], any other has its `-n gateway` turned
/// into the scenario's namespace. Returns stdout.
async fn guide(s: &Scenario, command: &str) -> String {
    if let Some(file) = command.strip_prefix(&format!("kubectl apply -f {GUIDE_EXAMPLES}")) {
        s.apply(&guide_example(file, &s.ns)).await.unwrap();
        return String::new();
    }
    let here = command.replace(&format!(" -n {GUIDE_NS}"), &format!(" -n {}", s.ns));
    assert_ne!(here, command, "`{command}` runs in no namespace");
    let repo = marin3r_testkit::tools::repo_root();
    let marin3r = marin3r_testkit::image::marin3r_bin().unwrap();
    commands::run(&here, &repo, &s.kubectl, s.cluster.kubeconfig(), &marin3r)
        .await
        .unwrap()
}

/// `kubectl patch envoydeployment front-door --type=merge -p <patch>`.
async fn patch(s: &Scenario, patch: &str) -> Output {
    let args = [
        "patch",
        "envoydeployment",
        "front-door",
        "-n",
        &s.ns,
        "--type=merge",
        "-p",
        patch,
    ];
    s.kubectl.run(&args).await.unwrap()
}

fn ready(ed: &EnvoyDeployment) -> Option<(String, String, String)> {
    ready_condition(&ed.status.as_ref()?.conditions)
}

/// Waits for the client's new-connection loop to see `body` as its latest answer.
async fn client_sees(s: &Scenario, what: &str, body: &str) {
    until(what, Duration::from_secs(60), || async {
        let log = ClientLog::read(s).await;
        (log.last(Mode::Fresh)?.body == body).then_some(())
    })
    .await;
}

/// Waits for the guide's client to print `line` as its latest (`kubectl logs --tail=1`).
async fn guide_client_sees(s: &Scenario, line: &str) {
    let what = format!("the guide's client to print {line:?}");
    until(&what, Duration::from_secs(60), || async {
        let command = commands::GATEWAY_CLIENT_LOGS
            .replace(&format!(" -n {GUIDE_NS}"), &format!(" -n {}", s.ns));
        let out = s
            .kubectl
            .run(&command.split_whitespace().skip(1).collect::<Vec<_>>())
            .await;
        (out.ok()?.stdout.trim_end() == line).then_some(())
    })
    .await;
}

/// When the test saw the rollout's steps (Unix ms, the client's clock).
#[derive(Debug)]
struct Rollout {
    /// Just before the spec change.
    patched: u64,
    /// Every new pod Ready.
    new_ready: u64,
    /// The first old pod terminating (its deletionTimestamp set).
    terminating: u64,
    /// Every old pod gone from the API (its processes ended).
    gone: u64,
}

/// Changes the gateway's spec and follows its pods until every old one is gone.
async fn roll(s: &Scenario, old: &BTreeSet<String>) -> Rollout {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.ns);
    let patched = now_ms();
    let out = patch(s, r#"{"spec":{"extraArgs":["--log-level","info"]}}"#).await;
    assert!(out.success, "{out:?}");
    let (mut new_ready, mut terminating) = (None, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rollout did not end within 180 s: {new_ready:?} {terminating:?}"
        );
        let Ok(list) = pods.list(&ListParams::default().labels(GATEWAY_PODS)).await else {
            continue;
        };
        let now = now_ms();
        let (olds, news): (Vec<&Pod>, Vec<&Pod>) =
            list.iter().partition(|p| old.contains(&p.name_any()));
        let serving = news
            .iter()
            .filter(|p| real::pod_ready(p) && p.metadata.deletion_timestamp.is_none())
            .count();
        if serving == old.len() {
            new_ready.get_or_insert(now);
        }
        if olds.iter().any(|p| p.metadata.deletion_timestamp.is_some()) {
            terminating.get_or_insert(now);
        }
        if olds.is_empty() {
            let (Some(new_ready), Some(terminating)) = (new_ready, terminating) else {
                panic!("the old pods went without being seen terminating or replaced");
            };
            return Rollout {
                patched,
                new_ready,
                terminating,
                gone: now,
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The client's counts around a rollout: none failed; both loops were answered all along,
/// from the new pods once the old ones were gone; the kept-alive connection was closed by a
/// draining old pod (`Connection: close`) while the new pods already served, not cut.
fn check_rollout(log: &ClientLog, old: &BTreeSet<String>, r: &Rollout) {
    let failures = log.failures();
    let end = r.gone + AFTER_ROLLOUT_MS;
    for mode in MODES {
        let during = log.answers(mode, r.patched, r.gone);
        let after = log.answers(mode, r.gone, end);
        println!(
            "{mode:?}: {} answers during the rollout ({} ms, from {:?}), {} in the {AFTER_ROLLOUT_MS} ms after \
             (from {:?}), {} failures in all",
            during.len(),
            r.gone - r.patched,
            pods(&during),
            after.len(),
            pods(&after),
            failures.len(),
        );
        // A request every 50 ms: at least 2 answers a second is a loop that never stalled.
        assert!(
            during.len() as u64 >= (r.gone - r.patched) / 500,
            "{mode:?}: {} answers in {} ms",
            during.len(),
            r.gone - r.patched
        );
        assert!(
            after.len() as u64 >= AFTER_ROLLOUT_MS / 500,
            "{mode:?}: {after:?}"
        );
        assert!(after.iter().all(|(_, a)| a.body == V2), "{after:?}");
        assert!(pods(&after).is_disjoint(old), "{after:?}");
    }
    assert!(failures.is_empty(), "requests dropped: {failures:?}");
    // The old pods drained: the kept-alive connection was on them and they closed it. The
    // pods are replaced one at a time, so a connection closed by the first old pod to drain
    // may open on another old pod that is not draining yet; after the last close by an old
    // pod, it is on a new one.
    let kept = log.answers(Mode::KeepAlive, r.patched, r.gone);
    let closed_by_old = kept
        .iter()
        .rev()
        .find(|(_, a)| a.closed && old.contains(&a.pod))
        .unwrap_or_else(|| panic!("no old pod closed the kept-alive connection: {kept:?}"));
    let next = log
        .answers(Mode::KeepAlive, closed_by_old.0 + 1, end)
        .into_iter()
        .next();
    assert!(
        next.is_some_and(|(_, a)| !old.contains(&a.pod)),
        "after {closed_by_old:?}: {next:?}"
    );
    // ...while the new pods served new connections.
    let overlap = log
        .answers(Mode::Fresh, r.terminating, r.gone)
        .into_iter()
        .filter(|(_, a)| !old.contains(&a.pod))
        .count();
    println!(
        "rollout {r:?}: the old pods drained for {} ms, {overlap} new connections served by \
         new pods meanwhile; the kept-alive connection closed by {} at {}",
        r.gone - r.terminating,
        closed_by_old.1.pod,
        closed_by_old.0,
    );
    assert!(r.new_ready <= r.gone && overlap >= 5, "{overlap}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_serves_through_a_service_follows_its_config_and_rolls_without_dropping_requests()
{
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    // The guide's backend and client run python, as does the test's own client.
    let scenario = Scenario::start("gateway", &["python"]).await.unwrap();
    let s = &scenario;
    let client = s.client.clone();
    step("namespace created");

    // The guide's commands, in its order, on a cluster with only `manifests/` installed.
    for command in [
        commands::GATEWAY_APPLY_NAMESPACE,
        commands::GATEWAY_APPLY_BACKEND,
        commands::GATEWAY_APPLY_DISCOVERY_SERVICE,
    ] {
        guide(s, command).await;
    }
    // The guide's wait gives up after 120 s; `commands::run` after 30 s: wait here first.
    s.discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    let waited = guide(s, commands::GATEWAY_WAIT_DISCOVERY_SERVICE).await;
    assert!(waited.contains("condition met"), "{waited}");
    step("DiscoveryService Ready");
    for command in [
        commands::GATEWAY_APPLY_ENVOY_CONFIG,
        commands::GATEWAY_APPLY_ENVOY_DEPLOYMENT,
        commands::GATEWAY_APPLY_SERVICE,
    ] {
        guide(s, command).await;
    }
    let eds: Api<EnvoyDeployment> = Api::namespaced(client.clone(), &s.ns);
    until(
        "the EnvoyDeployment to be Ready",
        Duration::from_secs(120),
        || async {
            let ed = eds.get("front-door").await.ok()?;
            (ready(&ed)?.0 == "True").then_some(())
        },
    )
    .await;
    step("EnvoyDeployment Ready");
    let table = guide(s, commands::GATEWAY_GET).await;
    assert!(
        table.contains("READY") && table.contains("marin3r-envoydeployment-front-door"),
        "{table}"
    );
    let children = guide(s, commands::GATEWAY_GET_CHILDREN).await;
    for child in [
        "marin3r-envoydeployment-front-door",
        "envoy-client-cert-front-door",
    ] {
        assert!(children.contains(child), "{children}");
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &s.ns);
    let d = deployments
        .get("marin3r-envoydeployment-front-door")
        .await
        .unwrap();
    assert_eq!(d.spec.replicas, Some(2));
    assert_eq!(
        d.labels()["app.kubernetes.io/component"],
        "envoy-deployment"
    );
    // Each gateway Envoy is scraped like a sidecar: annotated, its stats on the readiness
    // port, reached at the pod's IP.
    let gateway_pods = s.ready_pods(GATEWAY_PODS).await;
    assert_eq!(gateway_pods.len(), 2);
    for pod in &gateway_pods {
        let annotations = pod.annotations();
        assert_eq!(annotations["prometheus.io/port"], "9902", "{annotations:?}");
        assert_eq!(annotations["prometheus.io/path"], "/stats/prometheus");
        let url = format!("http://{}:9902/stats/prometheus", real::pod_ip(pod));
        let (code, body) =
            tokio::task::spawn_blocking(move || marin3r_testkit::envoy::request("GET", &url))
                .await
                .unwrap()
                .unwrap();
        let live = body.lines().find(|l| l.starts_with("envoy_server_live"));
        assert!(
            code == 200 && live.is_some_and(|l| l.ends_with(" 1")),
            "{code} {live:?}"
        );
    }

    // The guide's client shows the backend's answer through the gateway's Service.
    guide(s, commands::GATEWAY_APPLY_CLIENT).await;
    guide_client_sees(s, "200 greeter /hello").await;
    step("the guide's client answered through the gateway");
    // What a gateway pod's Envoy holds, against what its node is served: found with no
    // node-id annotation (gateway pods have none), from the Envoy's own /server_info.
    let held = guide(s, commands::GATEWAY_PROXY_CONFIG).await;
    println!("$ {}\n{held}", commands::GATEWAY_PROXY_CONFIG);
    assert!(
        held.lines()
            .any(|l| l.starts_with("listeners") && l.contains(" dynamic "))
            && held.contains("In sync: the proxy holds"),
        "{held}"
    );

    // The test's own client pod loops through the Service, counting every answer.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &s.ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(client_pod(&s.ns)).unwrap(),
    )
    .await
    .unwrap();
    client_sees(
        s,
        "the backend's answer through the gateway",
        "greeter /hello",
    )
    .await;
    step("the test's client answered");

    // An EnvoyConfig update reaches the gateways; it also names the answering gateway pod.
    let ecs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &s.ns);
    let v1 = guide_example("envoyconfig.yaml", &s.ns);
    let v2 = v1
        .replace(
            "route: {cluster: greeter}",
            "route: {cluster: greeter, prefix_rewrite: /v2/}",
        )
        .replace(
            "                    name: front-door-routes\n",
            "                    name: front-door-routes\n                    response_headers_to_add:\n                      - header: {key: x-gateway-pod, value: \"%HOSTNAME%\"}\n",
        );
    assert_eq!(v2.lines().count(), v1.lines().count() + 2);
    s.apply(&v2).await.unwrap();
    client_sees(s, "the updated config's answer", V2).await;
    step("config update served");

    // One the gateways reject (their listener on an address they lack, which the webhook's
    // Envoy judge admits) is rolled back; the gateways keep serving v2.
    let rejected = nacked_by_proxies(&v2).unwrap();
    s.apply(&rejected).await.unwrap();
    until(
        "the rejected config to be rolled back",
        Duration::from_secs(90),
        || async {
            let ec = ecs.get("front-door").await.ok()?;
            (ec.status?.cache_state == Some(CacheState::Rollback)).then_some(())
        },
    )
    .await;
    // Both loops are answered by a named gateway pod with v2 (the kept-alive one once the
    // listener update has drained its connection to the old listener).
    until(
        "both loops to be answered with v2",
        Duration::from_secs(60),
        || async {
            let log = ClientLog::read(s).await;
            MODES
                .iter()
                .all(|m| log.last(*m).is_some_and(|a| a.body == V2 && a.pod != "-"))
                .then_some(())
        },
    )
    .await;
    step("rejected config rolled back");

    // A rolling update (a spec change) while the client loops: no request is dropped.
    let old_pods: BTreeSet<String> = pods
        .list(&ListParams::default().labels(GATEWAY_PODS))
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(old_pods.len(), 2, "{old_pods:?}");
    let rollout = roll(s, &old_pods).await;
    step("rolled");
    until(
        "the client to be counted after the rollout",
        Duration::from_secs(60),
        || async {
            let log = ClientLog::read(s).await;
            let end = rollout.gone + AFTER_ROLLOUT_MS;
            MODES
                .iter()
                .all(|m| log.latest(*m).is_some_and(|at| at >= end))
                .then_some(())
        },
    )
    .await;
    check_rollout(&ClientLog::read(s).await, &old_pods, &rollout);
    until(
        "the EnvoyDeployment to be Ready after the rollout",
        Duration::from_secs(60),
        || async {
            let ed = eds.get("front-door").await.ok()?;
            let current = ed.status.as_ref()?.observed_generation == ed.metadata.generation;
            (current && ready(&ed)?.0 == "True").then_some(())
        },
    )
    .await;
    let d = deployments
        .get("marin3r-envoydeployment-front-door")
        .await
        .unwrap();
    let args = d.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.ends_with(&["--log-level".to_owned(), "info".to_owned()]),
        "{args:?}"
    );

    // A bad spec is a condition naming the field; the Deployment stays as it was.
    let generation = d.metadata.generation;
    let out = patch(s, r#"{"spec":{"ports":[{"name":"HTTP","port":8080}]}}"#).await;
    assert!(out.success, "{out:?}");
    let (_, reason, message) = until(
        "the bad spec to be reported",
        Duration::from_secs(60),
        || async {
            let ed = eds.get("front-door").await.ok()?;
            ready(&ed).filter(|r| r.0 == "False")
        },
    )
    .await;
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("spec.ports[0].name"), "{message}");
    let d = deployments
        .get("marin3r-envoydeployment-front-door")
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, generation);
    // ...and one the CRD refuses never reaches the controller.
    let both = r#"{"spec":{"replicas":{"static":1,"dynamic":{"maxReplicas":3}}}}"#;
    let out = patch(s, both).await;
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr.contains("spec.replicas")
            && out
                .stderr
                .contains("set exactly one of static (a fixed number) or dynamic"),
        "{out:?}"
    );
    let failures = ClientLog::read(s).await.failures();
    assert!(failures.is_empty(), "{failures:?}");
    step("bad specs reported");
}
