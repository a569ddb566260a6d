//! A DiscoveryService with two replicas on the real cluster (`hack/cluster`), in the
//! scenario's namespace, real Envoy sidecars spread over both (kube-proxy picks a discovery
//! pod behind the Service for each sidecar's connection, so pods are added until each replica
//! has one): a config every sidecar rejects is reported by both replicas, tainted once by the
//! leader and rolled back everywhere; then the leader's pod dies at once, its sidecars
//! reconnect to a live replica, another replica takes the Lease, the Deployment replaces the
//! dead pod, and a new config reaches every sidecar.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use marin3r_api::EnvoyConfig;
use marin3r_api::EnvoyConfigRevision;
use marin3r_api::envoy_config::CacheState;
use marin3r_e2e::cli::{proxy_status, version};
use marin3r_e2e::real::{self, IDLE_PY, Scenario};
use marin3r_e2e::rejected::nacked_by_proxies;
use marin3r_testkit::wait::until;
use serde_json::json;

const DS: &str = "instance";
const BODY: &str = real::EXAMPLE_BODY;
const DISCOVERY: &str = "app.kubernetes.io/component=discovery-service";
const LEASE: &str = "marin3r-discovery-instance";
/// The most sidecars made before each replica has one (1 in 2^11 runs has them all on one).
const MOST_SIDECARS: usize = 12;

fn get(url: &str) -> String {
    marin3r_testkit::envoy::get_body(url).unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

/// An idle pod of the demo workload, injected with the example's node id and port.
fn demo_pod(name: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "demo", "marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "demo-proxy",
                "marin3r.3scale.net/ports": "http:8080",
            },
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "terminationGracePeriodSeconds": 5,
            "containers": [real::python_container(IDLE_PY)],
        },
    })
    .to_string()
}

/// The discovery pod, among `replicas`, whose xDS server has the sidecar of `pod` connected
/// (its `/sync-status` on the pod's loopback admin port, through a port-forward, names the
/// proxy's pod).
async fn serving_replica(scenario: &Scenario, replicas: &[Pod], pod: &str) -> Option<String> {
    let needle = format!("\"pod\":\"{pod}\"");
    for r in replicas {
        let status = marin3r_discovery::cli::port_forward::get(
            scenario.client.clone(),
            &scenario.ns,
            &r.name_any(),
            8385,
            "/sync-status",
        )
        .await;
        if status.is_ok_and(|(_, body)| body.contains(&needle)) {
            return Some(r.name_any());
        }
    }
    None
}

async fn holder(scenario: &Scenario) -> Option<String> {
    Api::<Lease>::namespaced(scenario.client.clone(), &scenario.ns)
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread")]
async fn two_discovery_replicas_share_the_fleet_and_survive_one() {
    let started = std::time::Instant::now();
    let scenario = Scenario::start("replicas", &["python"]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.as_str());
    let kubeconfig = scenario.cluster.kubeconfig().to_path_buf();
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");

    // A DiscoveryService with two replicas.
    scenario
        .apply(&real::DISCOVERY_SERVICE.replace("spec: {}", "spec: {replicas: 2}"))
        .await
        .unwrap();
    scenario
        .discovery_service_ready(DS, Duration::from_secs(180))
        .await
        .unwrap();
    let discovery = until(
        "two ready discovery pods",
        Duration::from_secs(120),
        || async {
            let pods = scenario.ready_pods(DISCOVERY).await;
            (pods.len() == 2).then_some(pods)
        },
    )
    .await;
    let leader = until(
        "a discovery pod to hold the Lease",
        Duration::from_secs(60),
        || async {
            let holder = holder(&scenario).await?;
            discovery
                .iter()
                .any(|p| p.name_any() == holder)
                .then_some(holder)
        },
    )
    .await;

    // Sidecars, each connected through the Service to the replica kube-proxy picked, until
    // each replica has one.
    scenario
        .apply(&real::example_config(ns, BODY).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // (pod, its IP, the replica it is on)
    let mut sidecars: Vec<(String, String, String)> = Vec::new();
    for i in 0..MOST_SIDECARS {
        let name = format!("demo-{i}");
        scenario.apply(&demo_pod(&name)).await.unwrap();
        let pod = until(
            &format!("{name} to serve the config"),
            Duration::from_secs(120),
            || async {
                let p = pods.get(&name).await.ok()?;
                (real::pod_ready(&p) && get(&format!("http://{}:8080/", real::pod_ip(&p))) == BODY)
                    .then_some(p)
            },
        )
        .await;
        let replica = until(
            "the sidecar's xDS connection",
            Duration::from_secs(30),
            || serving_replica(&scenario, &discovery, &name),
        )
        .await;
        sidecars.push((name, real::pod_ip(&pod), replica));
        if discovery
            .iter()
            .all(|d| sidecars.iter().any(|(_, _, r)| *r == d.name_any()))
        {
            break;
        }
    }
    assert!(
        discovery
            .iter()
            .all(|d| sidecars.iter().any(|(_, _, r)| *r == d.name_any())),
        "{MOST_SIDECARS} sidecars and one replica has none: {sidecars:?}"
    );
    let n = sidecars.len();
    println!(
        "{n} sidecars over both replicas after {:?}",
        started.elapsed()
    );

    // `marin3r proxy-status` asks every replica and says which one each sidecar is on.
    let table = proxy_status(&marin3r, &kubeconfig, &["-n", ns])
        .await
        .unwrap();
    assert!(
        table.lines().next().unwrap_or_default().contains("REPLICA"),
        "{table}"
    );
    for (pod, _, replica) in &sidecars {
        assert!(
            table.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.contains(&pod.as_str()) && cells.contains(&replica.as_str())
            }),
            "{pod} is not listed on {replica}: {table}"
        );
    }
    // The same as JSON, for scripts: each proxy with the replica it is on.
    let json = proxy_status(&marin3r, &kubeconfig, &["-o", "json", "-n", ns])
        .await
        .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut on: Vec<(String, String)> = doc["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
            (s("pod"), s("replica"))
        })
        .collect();
    on.sort();
    let mut want: Vec<(String, String)> = sidecars
        .iter()
        .map(|(p, _, r)| (p.clone(), r.clone()))
        .collect();
    want.sort();
    assert_eq!(on, want, "{doc}");

    // `marin3r version` reaches the same pods: the operator's and the discovery pods'
    // image, and every sidecar's Envoy release (the Envoy of the image they run).
    let doc: serde_json::Value = serde_json::from_str(
        &version(&marin3r, &kubeconfig, &["-o", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(doc["client"]["version"], env!("CARGO_PKG_VERSION"), "{doc}");
    assert_eq!(
        doc["server"]["operators"][0]["image"],
        marin3r_discovery::IMAGE,
        "{doc}"
    );
    let ds = doc["server"]["discoveryServices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["namespace"] == ns && d["name"] == DS)
        .unwrap_or_else(|| panic!("no DiscoveryService {ns}/{DS} in {doc}"));
    assert_eq!(ds["images"], json!([marin3r_discovery::IMAGE]), "{doc}");
    assert_eq!(ds["pods"], 2, "{doc}");
    let envoy = std::process::Command::new(marin3r_testkit::tools::envoy().unwrap())
        .arg("--version")
        .output()
        .unwrap();
    let envoy = String::from_utf8_lossy(&envoy.stdout);
    let versions = ds["envoyVersions"].as_object().unwrap();
    assert_eq!(versions.len(), 1, "{doc}");
    let (release, proxies) = versions.iter().next().unwrap();
    assert!(
        envoy.contains(&format!("/{release}/")),
        "{release} vs {envoy}"
    );
    assert_eq!(proxies.as_u64(), Some(n as u64), "{doc}");
    let text = version(&marin3r, &kubeconfig, &[]).await.unwrap();
    assert!(
        text.contains(&format!(
            "DiscoveryService {ns}/{DS}: {} (2 pods); proxies: Envoy {release} ({n})",
            marin3r_discovery::IMAGE,
        )),
        "{text}"
    );

    // A config every sidecar rejects: each replica reports its own sidecars, the leader
    // taints once, and all roll back.
    let bad = nacked_by_proxies(&real::example_config(ns, BODY).unwrap()).unwrap();
    scenario.apply(&bad).await.unwrap();
    let ecs: Api<EnvoyConfig> = Api::namespaced(client.clone(), ns);
    let ec = until(
        "the bad config to be rolled back",
        Duration::from_secs(60),
        || async {
            let ec = ecs.get("demo-proxy").await.ok()?;
            (ec.status.as_ref()?.cache_state == Some(CacheState::Rollback)).then_some(ec)
        },
    )
    .await;
    let message = ec.status.unwrap().last_nack_message.unwrap_or_default();
    if !message.contains(&format!(
        "{n} of {n} connected proxies of the node, over 2 discovery replica(s)"
    )) {
        let mut logs = String::new();
        for d in &discovery {
            logs.push_str(&scenario.logs(&d.name_any(), &["marin3r"]).await);
        }
        let revisions = scenario
            .kubectl
            .run(&["get", "envoyconfigrevisions", "-n", ns, "-o", "yaml"])
            .await
            .unwrap();
        panic!("{message}\n{}\n{logs}", revisions.stdout);
    }
    let tainted: Vec<EnvoyConfigRevision> =
        Api::<EnvoyConfigRevision>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| r.is_tainted())
            .collect();
    assert_eq!(tainted.len(), 1);
    let reports = &tainted[0].status.as_ref().unwrap().nack_reports;
    let mut reporters: Vec<String> = reports.iter().map(|r| r.replica.clone()).collect();
    reporters.sort();
    let mut expected: Vec<String> = discovery.iter().map(|p| p.name_any()).collect();
    expected.sort();
    assert_eq!(reporters, expected);
    for r in reports {
        let own = sidecars
            .iter()
            .filter(|(_, _, on)| *on == r.replica)
            .count();
        assert_eq!(
            (r.connected_proxies, r.rejecting_proxies),
            (own as u32, own as u32),
            "{r:?}"
        );
    }
    for (_, ip, _) in &sidecars {
        assert_eq!(get(&format!("http://{ip}:8080/")), BODY);
    }

    // The leader's pod dies at once (no grace: it cannot release the Lease): its sidecars
    // reconnect to a live replica, another replica takes the Lease once it expires, and
    // publishes the next config to all. (Killing only the container would not do: the
    // restarted process has the same pod name, and resumes its own Lease as client-go does.)
    let dead = leader.clone();
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(
            &dead,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let new_leader = until(
        "another discovery pod to take the Lease",
        Duration::from_secs(90),
        || async {
            let holder = holder(&scenario).await?;
            let live = scenario.ready_pods(DISCOVERY).await;
            (holder != dead && live.iter().any(|p| p.name_any() == holder)).then_some(holder)
        },
    )
    .await;
    assert_ne!(new_leader, dead);
    // The Deployment replaces the dead pod.
    until(
        "two ready discovery pods again",
        Duration::from_secs(120),
        || async {
            let live = scenario.ready_pods(DISCOVERY).await;
            (live.len() == 2 && live.iter().all(|p| p.name_any() != dead)).then_some(())
        },
    )
    .await;
    for (pod, ip, _) in &sidecars {
        // Any live replica will do, the Deployment's replacement for the dead one included.
        until(
            "every sidecar on a live replica",
            Duration::from_secs(90),
            || async {
                let live: Vec<Pod> = scenario
                    .ready_pods(DISCOVERY)
                    .await
                    .into_iter()
                    .filter(|p| p.name_any() != dead)
                    .collect();
                serving_replica(&scenario, &live, pod).await.map(|_| ())
            },
        )
        .await;
        assert_eq!(get(&format!("http://{ip}:8080/")), BODY);
    }
    let next = real::example_config(ns, "after the failover").unwrap();
    scenario.apply(&next).await.unwrap();
    for (_, ip, _) in &sidecars {
        until(
            "the next config on every sidecar",
            Duration::from_secs(60),
            || async { (get(&format!("http://{ip}:8080/")) == "after the failover").then_some(()) },
        )
        .await;
    }
    println!("done in {:?}", started.elapsed());
}
