//! A DiscoveryService with two replicas on the local cluster, real Envoy sidecars spread
//! over both (each sidecar's Service name resolves to one discovery pod, as kube-proxy
//! spreads connections): a config both halves of the fleet reject is reported by both
//! replicas, tainted once by the leader and rolled back everywhere; then the leader's pod
//! dies at once, its sidecar reconnects to a live replica, another replica takes the Lease,
//! and a new config reaches every sidecar. Needs root (pod runner) and the built `marin3r`
//! binary (`cargo build -p marin3r-discovery`).

use marin3r_testkit::wait::until;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use marin3r_discovery::api::EnvoyConfig;
use marin3r_discovery::api::EnvoyConfigRevision;
use marin3r_discovery::api::discovery_service::DiscoveryService;
use marin3r_discovery::api::envoy_config::CacheState;
use marin3r_e2e::cli::{proxy_status, version};
use marin3r_e2e::rejected::nacked_by_proxies;
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_local_cluster::kubelet::hosts::endpoint;
use marin3r_testkit::kubectl::Kubectl;
use serde_json::json;

const OPS: &str = "marin3r-system";
const DS: &str = "instance";
const BODY: &str = "hello from marin3r";
const DISCOVERY: &str = "app.kubernetes.io/component=discovery-service";
const LEASE: &str = "marin3r-discovery-instance";

fn repo() -> PathBuf {
    marin3r_testkit::tools::repo_root()
}

fn get(url: &str) -> String {
    marin3r_testkit::envoy::get_body(url).unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

async fn ready_pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    marin3r_local_cluster::cluster::ready_pods(client, ns, selector)
        .await
        .unwrap()
}

fn example_in(file: &str, ns: &str) -> String {
    let text = std::fs::read_to_string(repo().join("manifests/examples").join(file)).unwrap();
    text.replace("namespace: demo", &format!("namespace: {ns}"))
}

/// The discovery pod, among `replicas`, whose xDS server has the sidecar of `pod` connected
/// (its `/sync-status`, read inside the pod, names the proxy's pod).
fn serving_replica(cluster: &LocalCluster, replicas: &[Pod], pod: &Pod) -> Option<String> {
    let needle = format!("\"pod\":\"{}\"", pod.name_any());
    replicas
        .iter()
        .find(|r| {
            cluster
                .get_in_pod(OPS, &r.name_any(), "http://127.0.0.1:8385/sync-status")
                .is_ok_and(|status| status.contains(&needle))
        })
        .map(|r| r.name_any())
}

async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), OPS)
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_discovery_replicas_share_the_fleet_and_survive_one() {
    let images = marin3r_e2e::product::images();
    let marin3r = images
        .resolve(marin3r_discovery::IMAGE)
        .expect("build the marin3r binary first: cargo build -p marin3r-discovery")
        .path;
    let cluster = LocalCluster::start(LocalClusterConfig {
        images,
        log_dir: std::env::var_os("MARIN3R_E2E_LOG_DIR").map(PathBuf::from),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.api().write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();

    // Install, and a DiscoveryService with two replicas.
    let manifests = repo().join("manifests");
    kubectl
        .ok(&["apply", "--server-side", "-k", manifests.to_str().unwrap()])
        .await
        .unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {
        "name": "demo",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
    }}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let ds_yaml = std::fs::read_to_string(manifests.join("examples/discoveryservice.yaml"))
        .unwrap()
        .replace("spec:\n", "spec:\n  replicas: 2\n");
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &ds_yaml)
        .await
        .unwrap();
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), OPS);
    until(
        "the DiscoveryService to be Ready",
        Duration::from_secs(180),
        || async {
            let ds = dss.get(DS).await.ok()?;
            let ready = ds
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "True").then_some(())
        },
    )
    .await;
    let discovery = until(
        "two ready discovery pods",
        Duration::from_secs(120),
        || async {
            let pods = ready_pods(&client, OPS, DISCOVERY).await;
            (pods.len() == 2).then_some(pods)
        },
    )
    .await;
    let leader = until(
        "a discovery pod to hold the Lease",
        Duration::from_secs(60),
        || async {
            let holder = holder(&client).await?;
            discovery
                .iter()
                .any(|p| p.name_any() == holder)
                .then_some(holder)
        },
    )
    .await;

    // One sidecar per discovery pod: the pods are named so that the Service's virtual IP
    // sends their connections to different discovery pods.
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("envoyconfig.yaml", "demo"),
        )
        .await
        .unwrap();
    let service = Api::<Service>::namespaced(client.clone(), OPS)
        .get("marin3r-instance")
        .await
        .unwrap();
    let mut names = Vec::new();
    for target in &discovery {
        let name = (0..200)
            .map(|i| format!("demo-{i}"))
            .find(|n| {
                endpoint(&service, &discovery, n).map(|p| p.name_any()) == Some(target.name_any())
            })
            .unwrap();
        names.push(name);
    }
    // The pod of manifests/examples/deployment.yaml, under a chosen name.
    for name in &names {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "demo",
                "labels": {"app": "demo", "marin3r.3scale.net/status": "enabled"},
                "annotations": {
                    "marin3r.3scale.net/node-id": "demo-proxy",
                    "marin3r.3scale.net/ports": "http:8080",
                },
            },
            "spec": {
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "app",
                    "image": "envoyproxy/envoy:v1.40.0",
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": 101,
                        "allowPrivilegeEscalation": false,
                        "readOnlyRootFilesystem": true,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "args": [
                        "--disable-hot-restart",
                        "--config-yaml",
                        "admin: {address: {socket_address: {address: 127.0.0.1, port_value: 9910}}}",
                    ],
                }],
            },
        });
        kubectl
            .ok_with(&["apply", "-f", "-"], &pod.to_string())
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    let mut sidecars = Vec::new();
    for name in &names {
        let pod = until(
            &format!("{name} to serve the config"),
            Duration::from_secs(120),
            || async {
                let p = pods.get(name).await.ok()?;
                (marin3r_local_cluster::cluster::pod_ready(&p)
                    && get(&format!("http://{}:8080/", pod_ip(&p))) == BODY)
                    .then_some(p)
            },
        )
        .await;
        sidecars.push(pod);
    }
    for (pod, target) in sidecars.iter().zip(&discovery) {
        let replica = until(
            "the sidecar's xDS connection",
            Duration::from_secs(30),
            || async { serving_replica(&cluster, &discovery, pod) },
        )
        .await;
        assert_eq!(
            replica,
            target.name_any(),
            "{} is on the other replica",
            pod.name_any()
        );
    }
    // `marin3r proxy-status` asks every replica and says which one each sidecar is on.
    let table = proxy_status(&marin3r, &kubeconfig, &["-n", "demo"])
        .await
        .unwrap();
    assert!(
        table.lines().next().unwrap_or_default().contains("REPLICA"),
        "{table}"
    );
    for (pod, target) in sidecars.iter().zip(&discovery) {
        assert!(
            table.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.contains(&pod.name_any().as_str())
                    && cells.contains(&target.name_any().as_str())
            }),
            "{} is not listed on {}: {table}",
            pod.name_any(),
            target.name_any()
        );
    }
    // The same as JSON, for scripts: each proxy with the replica it is on.
    let json = proxy_status(&marin3r, &kubeconfig, &["-o", "json", "-n", "demo"])
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
        .zip(&discovery)
        .map(|(p, d)| (p.name_any(), d.name_any()))
        .collect();
    want.sort();
    assert_eq!(on, want, "{doc}");

    // `marin3r version` reaches the same pods: the operator's and the discovery pods'
    // image, and every sidecar's Envoy release (the Envoy these sidecars run).
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
    let ds = &doc["server"]["discoveryServices"][0];
    assert_eq!(
        (&ds["namespace"], &ds["name"]),
        (&json!(OPS), &json!(DS)),
        "{doc}"
    );
    assert_eq!(ds["images"], json!([marin3r_discovery::IMAGE]), "{doc}");
    assert_eq!(ds["pods"], 2, "{doc}");
    let envoy = std::process::Command::new("envoy")
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
    assert_eq!(proxies.as_u64(), Some(sidecars.len() as u64), "{doc}");
    let text = version(&marin3r, &kubeconfig, &[]).await.unwrap();
    assert!(
        text.contains(&format!(
            "DiscoveryService {OPS}/{DS}: {} (2 pods); proxies: Envoy {release} ({})",
            marin3r_discovery::IMAGE,
            sidecars.len()
        )),
        "{text}"
    );

    // A config every sidecar rejects: each replica reports its own sidecar, the leader
    // taints once, and both roll back.
    let bad = nacked_by_proxies(&example_in("envoyconfig.yaml", "demo")).unwrap();
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &bad)
        .await
        .unwrap();
    let ecs: Api<EnvoyConfig> = Api::namespaced(client.clone(), "demo");
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
    assert!(
        message.contains("2 of 2 connected proxies of the node, over 2 discovery replica(s)"),
        "{message}"
    );
    let tainted: Vec<EnvoyConfigRevision> =
        Api::<EnvoyConfigRevision>::namespaced(client.clone(), "demo")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| r.is_tainted())
            .collect();
    assert_eq!(tainted.len(), 1);
    let mut reporters: Vec<String> = tainted[0]
        .status
        .as_ref()
        .unwrap()
        .nack_reports
        .iter()
        .map(|r| r.replica.clone())
        .collect();
    reporters.sort();
    let mut expected: Vec<String> = discovery.iter().map(|p| p.name_any()).collect();
    expected.sort();
    assert_eq!(reporters, expected);
    for pod in &sidecars {
        assert_eq!(get(&format!("http://{}:8080/", pod_ip(pod))), BODY);
    }

    // The leader's pod dies at once (no grace: it cannot release the Lease): its sidecar
    // reconnects to a live replica, another replica takes the Lease once it expires, and
    // publishes the next config to both. (Killing only the container would not do: the
    // restarted process has the same pod name, and resumes its own Lease as client-go does.)
    let dead = discovery
        .iter()
        .find(|p| p.name_any() == leader)
        .unwrap()
        .clone();
    Api::<Pod>::namespaced(client.clone(), OPS)
        .delete(
            &dead.name_any(),
            &kube::api::DeleteParams {
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
            let holder = holder(&client).await?;
            let live = ready_pods(&client, OPS, DISCOVERY).await;
            (holder != dead.name_any() && live.iter().any(|p| p.name_any() == holder))
                .then_some(holder)
        },
    )
    .await;
    assert_ne!(new_leader, dead.name_any());
    for pod in &sidecars {
        // Any live replica will do, the Deployment's replacement for the dead one included.
        until(
            "every sidecar on a live replica",
            Duration::from_secs(90),
            || async {
                let live: Vec<Pod> = ready_pods(&client, OPS, DISCOVERY)
                    .await
                    .into_iter()
                    .filter(|p| p.name_any() != dead.name_any())
                    .collect();
                serving_replica(&cluster, &live, pod).map(|_| ())
            },
        )
        .await;
        assert_eq!(get(&format!("http://{}:8080/", pod_ip(pod))), BODY);
    }
    let next = example_in("envoyconfig.yaml", "demo").replace(BODY, "after the failover");
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &next)
        .await
        .unwrap();
    for pod in &sidecars {
        until(
            "the next config on every sidecar",
            Duration::from_secs(60),
            || async {
                (get(&format!("http://{}:8080/", pod_ip(pod))) == "after the failover")
                    .then_some(())
            },
        )
        .await;
    }
    cluster.shutdown(Duration::from_secs(5)).await;
}
