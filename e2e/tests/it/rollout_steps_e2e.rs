//! Canary steps on the real cluster (`hack/cluster`), marin3r installed from `manifests/`:
//! four injected sidecars of one node, each answering a request loop of its own. A new
//! version with two steps (one proxy, then half) reaches one proxy, then two, then all, with
//! no failed request anywhere; `marin3r proxy-status` names the canary, and it is the proxy
//! that answers with the new body. A version the real Envoy rejects reaches the first step's
//! proxy only: it is rolled back by itself, the other three never get it, and every proxy
//! keeps answering with the good version. A version the real Envoy accepts but whose every
//! request is answered 503 reaches the first step's proxy only, and the health analysis of
//! its traffic rolls it back well within the step's bake: only that proxy's loop saw an
//! error. The same with two discovery replicas, the sidecars
//! spread over both: every replica serves each proxy its track, and the leader alone steps;
//! when the leader dies mid-step, the next one goes on from the step the status records, and
//! no canary goes back.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::CacheState;
use marin3r_api::rollout::RolloutPhase;
use marin3r_e2e::real;
use marin3r_e2e::rejected::NO_POD_ADDRESS;
use marin3r_testkit::wait::until;

/// Sidecars at first; with two replicas, more until each replica has one.
const PODS: usize = 4;
const MOST_PODS: usize = 8;

/// The EnvoyConfig `web`: a listener on `address`:8080 answering `body`, rolled out in two
/// steps of 8 s (one proxy, then half).
fn config(address: &str, body: &str) -> String {
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: web}}
spec:
  nodeID: web
  rollout:
    steps:
      - {{proxies: 1, bake: 8s}}
      - {{percent: 50, bake: 8s}}
  resources:
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: {address}, port_value: 8080}}}}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: http
                    virtual_hosts:
                      - name: web
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            direct_response: {{status: 200, body: {{inline_string: "{body}"}}}}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// How long the first step of the broken version bakes: it must be rolled back well within.
const BROKEN_BAKE: Duration = Duration::from_secs(90);

/// A version Envoy accepts that breaks every request: the listener routes to a cluster
/// (another listener of the same Envoy) that answers 503. Two steps, the first baking
/// [`BROKEN_BAKE`].
fn broken() -> String {
    let bake = BROKEN_BAKE.as_secs();
    let hcm = |name: &str, route: &str| {
        format!(
            r#"
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: {name}
                  route_config:
                    name: {name}
                    virtual_hosts:
                      - name: {name}
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            {route}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"#
        )
    };
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: web}}
spec:
  nodeID: web
  rollout:
    steps:
      - {{proxies: 1, bake: {bake}s}}
      - {{percent: 50, bake: 8s}}
  resources:
    - type: cluster
      value:
        name: backend
        connect_timeout: 1s
        load_assignment:
          cluster_name: backend
          endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 8081}}}}}}}}]}}]
    - type: listener
      value:
        name: backend
        address: {{socket_address: {{address: 127.0.0.1, port_value: 8081}}}}{backend}
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: 0.0.0.0, port_value: 8080}}}}{http}
"#,
        backend = hcm("backend", "direct_response: {status: 503}"),
        http = hcm("http", "route: {cluster: backend}"),
    )
}

/// What each pod answers now, by pod name (`None`: no answer).
async fn bodies(ips: &[(String, String)]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (pod, ip) in ips {
        let body = marin3r_e2e::demo::get(&format!("http://{ip}:8080/"))
            .await
            .ok()
            .flatten();
        out.push((pod.clone(), body));
    }
    out
}

/// The pods answering `body`.
fn answering(bodies: &[(String, Option<String>)], body: &str) -> BTreeSet<String> {
    bodies
        .iter()
        .filter(|(_, b)| b.as_deref() == Some(body))
        .map(|(p, _)| p.clone())
        .collect()
}

/// `marin3r proxy-status -n NS -o json`'s proxies.
async fn proxies(kubeconfig: &Path, ns: &str) -> Vec<serde_json::Value> {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let json = marin3r_e2e::cli::proxy_status(&marin3r, kubeconfig, &["-n", ns, "-o", "json"])
        .await
        .unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&json)
        .ok()
        .and_then(|v| v["proxies"].as_array().cloned())
        .unwrap_or_default()
}

/// The pods proxy-status shows on the canary track.
fn canaries(proxies: &[serde_json::Value]) -> BTreeSet<String> {
    proxies
        .iter()
        .filter(|p| p["track"] == "canary")
        .filter_map(|p| p["pod"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_reaches_the_canaries_step_by_step_and_a_rejected_one_goes_no_further() {
    rolls_out("steps", 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_discovery_replicas_serve_each_proxy_its_track() {
    rolls_out("steps2", 2).await;
}

/// The replicas the proxies of proxy-status are on.
fn replicas_of(proxies: &[serde_json::Value]) -> BTreeSet<String> {
    proxies
        .iter()
        .filter_map(|p| p["replica"].as_str().map(str::to_owned))
        .collect()
}

async fn rolls_out(prefix: &str, replicas: usize) {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start(prefix, &["python"]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.clone());
    let kubeconfig = scenario.cluster.kubeconfig().to_owned();
    let spec = format!("spec: {{replicas: {replicas}}}");
    scenario
        .apply(&real::DISCOVERY_SERVICE.replace("spec: {}", &spec))
        .await
        .unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(180))
        .await
        .unwrap();
    scenario.apply(&config("0.0.0.0", "one")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut ips: Vec<(String, String)> = Vec::new();
    while ips.len() < MOST_PODS {
        let name = format!("web-{}", ips.len());
        let pod = real::idle_injected_pod(&name, "web").unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let ip = until(
            &format!("{name} Ready"),
            Duration::from_secs(120),
            || async { marin3r_e2e::demo::ready_ip(&pods.get(&name).await.ok()?) },
        )
        .await;
        ips.push((name, ip));
        if ips.len() < PODS {
            continue;
        }
        let spread = until(
            "every sidecar connected",
            Duration::from_secs(60),
            || async {
                let all = proxies(&kubeconfig, &ns).await;
                (all.len() == ips.len()).then(|| replicas_of(&all).len())
            },
        )
        .await;
        if spread == replicas {
            break;
        }
    }
    let n = ips.len();
    let spread = replicas_of(&proxies(&kubeconfig, &ns).await);
    assert_eq!(spread.len(), replicas, "{n} sidecars on {spread:?}");
    until(
        "every pod answering one",
        Duration::from_secs(90),
        || async { (answering(&bodies(&ips).await, "one").len() == n).then_some(()) },
    )
    .await;
    step(&format!("{n} sidecars on {spread:?} serve version one"));

    // A request loop per proxy, for the whole rollout.
    let loops: Vec<real::Traffic> = ips
        .iter()
        .map(|(_, ip)| real::Traffic::start(&format!("http://{ip}:8080/")))
        .collect();
    scenario.apply(&config("0.0.0.0", "two")).await.unwrap();
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &ns);
    let rollout = || async { configs.get("web").await.ok()?.status?.rollout };
    let first = until(
        "step 1: one proxy answers two",
        Duration::from_secs(60),
        || async {
            let r = rollout().await?;
            let two = answering(&bodies(&ips).await, "two");
            (r.phase == RolloutPhase::Progressing
                && r.step == Some(1)
                && r.canary.as_deref() == Some(format!("1/{n}").as_str())
                && two.len() == 1)
                .then_some(two)
        },
    )
    .await;
    // The server says which proxy is the canary: the one answering two.
    let named = until(
        "proxy-status naming the canary",
        Duration::from_secs(20),
        || async {
            let c = canaries(&proxies(&kubeconfig, &ns).await);
            (c == first).then_some(c)
        },
    )
    .await;
    step(&format!("step 1: {named:?} on the canary track"));
    let second = until(
        "step 2: half the proxies answer two",
        Duration::from_secs(60),
        || async {
            let r = rollout().await?;
            let two = answering(&bodies(&ips).await, "two");
            (r.step == Some(2)
                && r.canary.as_deref() == Some(format!("{}/{n}", n.div_ceil(2)).as_str())
                && two.len() == n.div_ceil(2))
            .then_some(two)
        },
    )
    .await;
    assert!(
        second.is_superset(&first),
        "a canary of step 1 stays one in step 2: {first:?} {second:?}"
    );
    step(&format!("step 2: {second:?}"));
    until("published to all", Duration::from_secs(60), || async {
        let r = rollout().await?;
        (r.phase == RolloutPhase::Completed && answering(&bodies(&ips).await, "two").len() == n)
            .then_some(())
    })
    .await;
    for (l, (pod, _)) in loops.into_iter().zip(&ips) {
        let (answered, failed) = l.stop().await.unwrap();
        assert!(answered > 0, "{pod}: no request answered");
        assert!(
            failed.is_empty(),
            "{pod}: {} failed: {failed:?}",
            failed.len()
        );
    }
    step("completed, no request failed");

    // Rejected by the real Envoy (an address no pod has): only the first step's proxy gets
    // it, and it is rolled back by itself.
    let loops: Vec<real::Traffic> = ips
        .iter()
        .map(|(_, ip)| real::Traffic::start(&format!("http://{ip}:8080/")))
        .collect();
    scenario
        .apply(&config(NO_POD_ADDRESS, "three"))
        .await
        .unwrap();
    until("rolled back", Duration::from_secs(90), || async {
        let status = configs.get("web").await.ok()?.status?;
        let r = status.rollout?;
        (r.phase == RolloutPhase::RolledBack && status.cache_state? == CacheState::Rollback)
            .then_some(())
    })
    .await;
    let rejecting = until(
        "one proxy's NACK, on record",
        Duration::from_secs(30),
        || async {
            let all = proxies(&kubeconfig, &ns).await;
            let nacked: BTreeSet<String> = all
                .iter()
                .filter(|p| !p["types"]["listeners"]["last_nack"].is_null())
                .filter_map(|p| p["pod"].as_str().map(str::to_owned))
                .collect();
            (all.len() == n && canaries(&all).is_empty() && !nacked.is_empty()).then_some(nacked)
        },
    )
    .await;
    assert_eq!(
        rejecting.len(),
        1,
        "only the canary got the version: {rejecting:?}"
    );
    assert_eq!(answering(&bodies(&ips).await, "two").len(), n);
    for (l, (pod, _)) in loops.into_iter().zip(&ips) {
        let (_, failed) = l.stop().await.unwrap();
        assert!(
            failed.is_empty(),
            "{pod}: {} failed: {failed:?}",
            failed.len()
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let reasons: BTreeSet<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
        .filter_map(|e| e.reason)
        .collect();
    for reason in ["RolloutStep", "RolloutCompleted", "RolloutRolledBack"] {
        assert!(reasons.contains(reason), "no {reason} Event: {reasons:?}");
    }
    step(&format!("rejected by {rejecting:?} alone, rolled back"));
    // The leader exports the phase: what Marin3rRolloutRolledBack alerts on.
    let series = format!(
        "marin3r_envoyconfig_rollout_phase{{namespace=\"{ns}\",name=\"web\",phase=\"rolled_back\"}} 1"
    );
    until(
        "the leader's rollout metric",
        Duration::from_secs(30),
        || async {
            for pod in scenario
                .ready_pods("app.kubernetes.io/component=discovery-service")
                .await
            {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let got = marin3r_discovery::cli::port_forward::get(
                    client.clone(),
                    &ns,
                    &name,
                    8383,
                    "/metrics",
                )
                .await;
                if got.is_ok_and(|(_, body)| body.lines().any(|l| l == series)) {
                    return Some(());
                }
            }
            None
        },
    )
    .await;
    let broken = fails_its_analysis(&scenario, &ips).await;
    step(&format!(
        "a version answering 503 reached {broken} alone and was rolled back by its analysis"
    ));
    if replicas == 1 {
        paused_then_aborted(&scenario, &ips).await;
        step("paused, resumed and aborted");
    } else {
        let canary = leader_dies_mid_step(&scenario, &ips).await;
        step(&format!(
            "the leader died during step 1; {canary} stayed a canary, all got five"
        ));
    }
}

/// A version Envoy accepts but whose every request is answered 503: it reaches the first
/// step's proxy only, the health analysis of the canary's traffic fails well within the
/// step's bake, and it is rolled back by itself; only the canary's request loop saw an
/// error. Returns the canary.
async fn fails_its_analysis(scenario: &real::Scenario, ips: &[(String, String)]) -> String {
    let configs: Api<EnvoyConfig> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let loops: Vec<real::Traffic> = ips
        .iter()
        .map(|(_, ip)| real::Traffic::start(&format!("http://{ip}:8080/")))
        .collect();
    let applied = Instant::now();
    scenario.apply(&broken()).await.unwrap();
    let rolled_back = || async {
        let status = configs.get("web").await.ok()?.status?;
        let r = status.rollout?;
        (r.phase == RolloutPhase::RolledBack
            && status.cache_state? == CacheState::Rollback
            && r.analysis.as_deref()?.contains("5xx responses are"))
        .then_some(r)
    };
    let rollout = loop {
        if let Some(r) = rolled_back().await {
            break r;
        }
        if applied.elapsed() > BROKEN_BAKE {
            let status = configs.get("web").await.ok().and_then(|ec| ec.status);
            eprintln!(
                "rollout={:?}\nreports={:?}",
                status.as_ref().map(|s| &s.rollout),
                status.as_ref().map(|s| &s.sync_reports)
            );
            for pod in scenario
                .ready_pods("app.kubernetes.io/component=discovery-service")
                .await
            {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let logs = scenario.logs(&name, &["discovery-service"]).await;
                for line in logs
                    .lines()
                    .filter(|l| l.contains("stats") || l.contains("canary") || l.contains("taint"))
                {
                    eprintln!("{name}: {line}");
                }
            }
            panic!("not rolled back by the analysis within {BROKEN_BAKE:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let took = applied.elapsed();
    assert!(
        took < BROKEN_BAKE - Duration::from_secs(30),
        "rolled back after {took:?}, not well within the bake: {rollout:?}"
    );
    until(
        "every pod answering two again",
        Duration::from_secs(30),
        || async { (answering(&bodies(ips).await, "two").len() == ips.len()).then_some(()) },
    )
    .await;
    let mut failing = Vec::new();
    for (l, (pod, _)) in loops.into_iter().zip(ips) {
        let (answered, failed) = l.stop().await.unwrap();
        assert!(answered > 0, "{pod}: no request answered");
        if !failed.is_empty() {
            failing.push((pod.clone(), failed.len()));
        }
    }
    assert_eq!(
        failing.len(),
        1,
        "only the canary's loop saw errors: {failing:?}"
    );
    // The revision is tainted for its analysis, not by Envoy, and the status says so.
    let revisions: Api<marin3r_api::EnvoyConfigRevision> =
        Api::namespaced(scenario.client.clone(), &scenario.ns);
    let revision = revisions
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| r.spec.version == rollout.version)
        .expect("the broken version's revision");
    let taint = revision.taint_condition().expect("tainted");
    assert_eq!(taint.reason, "FailedAnalysis", "{taint:?}");
    assert!(
        rollout
            .message
            .contains("failed the health analysis in step 1 of 2"),
        "{rollout:?}"
    );
    let ec = configs.get("web").await.unwrap();
    let status = ec.status.unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "CacheOutOfSync")
        .unwrap();
    assert!(
        ready.message.contains("failed the health analysis"),
        "{ready:?}"
    );
    assert_eq!(status.last_nack_message, None, "not a NACK");
    failing.remove(0).0
}

/// The Lease holder: the leading discovery pod.
async fn leader(scenario: &real::Scenario) -> Option<String> {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        scenario.client.clone(),
        &scenario.ns,
    )
    .get_opt("marin3r-discovery-instance")
    .await
    .ok()??
    .spec?
    .holder_identity
}

/// The leading discovery pod dies (no grace) during step 1 of a good version: another takes
/// the Lease and goes on from the step the status records; the canary never goes back to
/// the old version, and no request fails. Returns the canary.
async fn leader_dies_mid_step(scenario: &real::Scenario, ips: &[(String, String)]) -> String {
    let configs: Api<EnvoyConfig> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let rollout = || async { configs.get("web").await.ok()?.status?.rollout };
    let loops: Vec<real::Traffic> = ips
        .iter()
        .map(|(_, ip)| real::Traffic::start(&format!("http://{ip}:8080/")))
        .collect();
    scenario.apply(&config("0.0.0.0", "five")).await.unwrap();
    let canary = until(
        "step 1 of version five",
        Duration::from_secs(60),
        || async {
            let r = rollout().await?;
            let five = answering(&bodies(ips).await, "five");
            (r.step == Some(1) && five.len() == 1).then(|| five.into_iter().next())?
        },
    )
    .await;
    let dead = until("a leader", Duration::from_secs(30), || leader(scenario)).await;
    Api::<Pod>::namespaced(scenario.client.clone(), &scenario.ns)
        .delete(
            &dead,
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    until(
        "published to all by the next leader",
        Duration::from_secs(180),
        || async {
            let now = bodies(ips).await;
            let on_canary = now.iter().find(|(pod, _)| *pod == canary);
            if let Some((_, Some(body))) = on_canary
                && body != "five"
            {
                let ec = configs.get("web").await.ok();
                let revs: Api<marin3r_api::EnvoyConfigRevision> =
                    Api::namespaced(scenario.client.clone(), &scenario.ns);
                let canaries: Vec<_> = revs
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| {
                        (
                            r.spec.version.clone(),
                            r.status.map(|s| (s.published, s.tainted, s.canary)),
                        )
                    })
                    .collect();
                eprintln!(
                    "rollout={:?}\nreports={:?}\nrevisions={canaries:?}\nleader={:?}",
                    ec.as_ref()
                        .and_then(|e| e.status.as_ref())
                        .map(|s| &s.rollout),
                    ec.as_ref()
                        .and_then(|e| e.status.as_ref())
                        .map(|s| &s.sync_reports),
                    leader(scenario).await
                );
                for pod in scenario
                    .ready_pods("app.kubernetes.io/component=discovery-service")
                    .await
                {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let logs = scenario.logs(&name, &["discovery-service"]).await;
                    for line in logs.lines().filter(|l| {
                        l.contains("canary") || l.contains("lead") || l.contains("loaded")
                    }) {
                        eprintln!("{name}: {line}");
                    }
                }
                panic!("the canary {canary} went back: {body}");
            }
            let r = rollout().await?;
            let holder = leader(scenario).await?;
            (holder != dead
                && r.phase == RolloutPhase::Completed
                && answering(&now, "five").len() == ips.len())
            .then_some(())
        },
    )
    .await;
    for (l, (pod, _)) in loops.into_iter().zip(ips) {
        let (_, failed) = l.stop().await.unwrap();
        assert!(
            failed.is_empty(),
            "{pod}: {} failed: {failed:?}",
            failed.len()
        );
    }
    canary
}

/// `marin3r rollout pause`, `resume` and `abort` on a good version: a paused step outlasts
/// its bake; resumed, the next step comes; aborted, every proxy answers the published
/// version again.
async fn paused_then_aborted(scenario: &real::Scenario, ips: &[(String, String)]) {
    let (ns, kubeconfig) = (&scenario.ns, scenario.cluster.kubeconfig());
    let configs: Api<EnvoyConfig> = Api::namespaced(scenario.client.clone(), ns);
    let rollout = || async { configs.get("web").await.ok()?.status?.rollout };
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let run = |command: &'static str| {
        let marin3r = marin3r.clone();
        async move {
            let out = tokio::process::Command::new(marin3r)
                .args(["rollout", command, "-n", ns, "web"])
                .env("KUBECONFIG", kubeconfig)
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "rollout {command}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    };
    scenario.apply(&config("0.0.0.0", "four")).await.unwrap();
    until(
        "step 1 of version four",
        Duration::from_secs(60),
        || async {
            let r = rollout().await?;
            (r.step == Some(1) && answering(&bodies(ips).await, "four").len() == 1).then_some(())
        },
    )
    .await;
    run("pause").await;
    until("paused", Duration::from_secs(30), || async {
        (rollout().await?.phase == RolloutPhase::Paused).then_some(())
    })
    .await;
    // Longer than the bake: still step 1.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let r = rollout().await.unwrap();
    assert_eq!((r.phase, r.step), (RolloutPhase::Paused, Some(1)), "{r:?}");
    assert_eq!(answering(&bodies(ips).await, "four").len(), 1);
    run("resume").await;
    until(
        "step 2 of version four",
        Duration::from_secs(30),
        || async {
            let r = rollout().await?;
            (r.phase == RolloutPhase::Progressing && r.step == Some(2)).then_some(())
        },
    )
    .await;
    run("abort").await;
    until(
        "aborted, every proxy back on two",
        Duration::from_secs(60),
        || async {
            let r = rollout().await?;
            (r.phase == RolloutPhase::Aborted
                && answering(&bodies(ips).await, "two").len() == ips.len())
            .then_some(())
        },
    )
    .await;
}
