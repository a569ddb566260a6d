//! One discovery service, two tenants, one of them hostile. Tenant A's namespace admin holds
//! A's client certificate (it is a Secret of their namespace) and a pod on the pod network,
//! and tries what the reliability review found: xDS subscriptions that would make the
//! discovery pod hold gigabytes (N1), webhook connections held open with slow bodies (N2),
//! and draining tenant B's Envoy through its shutdown manager (N3). Meanwhile tenant B's
//! Envoy keeps serving its config, B's new pods keep being admitted and injected, and the
//! discovery pod's own accounting of what it holds stays within its budget.
//! Needs root (pod runner), python3 and the built `marin3r` binary.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use marin3r_e2e::product::{example_in, install, python3};
use marin3r_local_cluster::cluster::{create_restricted_namespace, pod_ready};
use marin3r_testkit::wait::until;
use marin3r_testkit::xds::client::{ClientTls, DeltaStream, connect};
use serde_json::json;

const A: &str = "tenant-a";
const B: &str = "tenant-b";
const BODY: &str = "hello from marin3r";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The discovery pod's default budget for one namespace's subscribed names.
const NAMESPACE_BUDGET: f64 = (128 << 20) as f64;

/// Tenant A's pod: 200 webhook connections, each a request whose body never ends, a byte a
/// second; then it asks tenant B's shutdown manager to drain and to stop B's Envoy, and
/// prints what it was answered.
const ATTACKER_PY: &str = r#"
import socket, ssl, sys, time, urllib.request, urllib.error
webhook, victim = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
held = []
for i in range(200):
    try:
        s = ctx.wrap_socket(socket.create_connection((webhook, 8443), timeout=5))
        s.sendall(b"POST /pod-v1-mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
        held.append(s)
    except Exception:
        pass
print("slow connections opened:", len(held), flush=True)
for path in ("/drain", "/shutdown"):
    try:
        code = urllib.request.urlopen("http://%s:8090%s" % (victim, path), timeout=5).status
    except urllib.error.HTTPError as e:
        code = e.code
    except Exception as e:
        code = repr(e)
    print("victim", path, code, flush=True)
while True:
    for s in list(held):
        try:
            s.sendall(b" ")
        except Exception:
            held.remove(s)
    time.sleep(1)
"#;

fn restricted_container(name: &str, command: serde_json::Value) -> serde_json::Value {
    json!({
        "name": name,
        "image": "probe-server",
        "command": command,
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]},
        },
    })
}

/// A pod of tenant B, injected: the EnvoyConfig's listener on 8080, with the drain.
fn tenant_b_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": B,
            "labels": {"marin3r.3scale.net/status": "enabled", "app": "b"},
            "annotations": {
                "marin3r.3scale.net/node-id": "demo-proxy",
                "marin3r.3scale.net/ports": "http:8080",
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
            },
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [restricted_container("app", json!(["sleep", "3600"]))],
        },
    }))
    .unwrap()
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

async fn serving(client: &Client, ns: &str, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    until(
        &format!("{ns}/{name} to serve its config"),
        Duration::from_secs(120),
        || async {
            let p = pods.get(name).await.ok()?;
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            let body = marin3r_testkit::envoy::get_body(&format!("http://{ip}:8080/"));
            (pod_ready(&p) && body.ok().as_deref() == Some(BODY)).then_some(p)
        },
    )
    .await
}

/// Tenant A's client certificate, as A's namespace admin can read it.
async fn tenant_a_tls(client: &Client) -> ClientTls {
    let secret = Api::<Secret>::namespaced(client.clone(), A)
        .get("envoy-sidecar-client-cert")
        .await
        .unwrap();
    let data = secret.data.unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    ClientTls {
        ca_pem: text("ca.crt"),
        identity: Some((text("tls.crt"), text("tls.key"))),
        server_name: "marin3r-instance.marin3r-system.svc".into(),
    }
}

/// A delta stream under tenant A's identity subscribing `count` CDS names of `len` bytes, a
/// few per request (each within the request size limit). Kept open by the caller.
async fn subscribe(
    xds: SocketAddr,
    tls: &ClientTls,
    from: usize,
    count: usize,
    len: usize,
) -> Option<DeltaStream> {
    let channel = connect(xds, tls).await.ok()?;
    let mut stream = DeltaStream::open(channel, "demo-proxy", None).await.ok()?;
    let names: Vec<String> = (from..from + count)
        .map(|i| format!("{i:09}-{}", "x".repeat(len - 10)))
        .collect();
    for chunk in names.chunks(200) {
        let req = DeltaDiscoveryRequest {
            type_url: CDS.into(),
            resource_names_subscribe: chunk.to_vec(),
            ..Default::default()
        };
        stream.send(req).await.ok()?;
    }
    Some(stream)
}

/// One value of the discovery pod's metrics, summed over its label sets matching `labels`.
fn metric(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_cannot_stop_another_tenants_proxies_or_pods() {
    let images = marin3r_e2e::product::images().with("probe-server", python3());
    let installed = install(images).await.unwrap();
    let (cluster, client) = (&installed.cluster, installed.client.clone());
    for ns in [A, B] {
        create_restricted_namespace(&client, ns).await.unwrap();
    }
    let ds = example_in("discoveryservice.yaml", "marin3r-system")
        .unwrap()
        .replace("    - demo\n", &format!("    - {A}\n    - {B}\n"));
    installed.apply(&ds).await.unwrap();
    installed
        .discovery_service_ready("marin3r-system", "instance")
        .await;
    for ns in [A, B] {
        let config = example_in("envoyconfig.yaml", ns).unwrap();
        installed.apply(&config).await.unwrap();
    }
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), B);
    pods_b
        .create(&PostParams::default(), &tenant_b_pod("b-1"))
        .await
        .unwrap();
    let victim = serving(&client, B, "b-1").await;
    let discovery = marin3r_local_cluster::cluster::ready_pods(
        &client,
        "marin3r-system",
        "app.kubernetes.io/component=discovery-service",
    )
    .await;
    let discovery_ip = pod_ip(discovery.unwrap().first().expect("a ready discovery pod"));
    let metrics_url = format!("http://{discovery_ip}:8383/metrics");
    let xds: SocketAddr = format!("{discovery_ip}:18000").parse().unwrap();

    // N2 and N3: tenant A's pod holds slow webhook connections and calls B's manager.
    let attacker: Pod = serde_json::from_value(json!({
        "metadata": {"name": "attacker", "namespace": A},
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [restricted_container(
                "attack",
                json!(["python3", "-c", ATTACKER_PY, discovery_ip, pod_ip(&victim)]),
            )],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), A)
        .create(&PostParams::default(), &attacker)
        .await
        .unwrap();
    let attack_log = || {
        cluster
            .log_path(A, "attacker", "attack")
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    until(
        "the attacker to call B's shutdown manager",
        Duration::from_secs(90),
        || async { attack_log().contains("victim /shutdown").then_some(()) },
    )
    .await;
    let log = attack_log();
    assert!(
        log.contains("victim /drain 401") && log.contains("victim /shutdown 401"),
        "{log}"
    );

    // N1: tenant A's subscriptions, over the name size and over the namespace's budget.
    let tls = tenant_a_tls(&client).await;
    let mut held = Vec::new();
    if let Some(s) = subscribe(xds, &tls, 0, 1, 5000).await {
        held.push(s);
    }
    // 36 streams of about 3.8 MiB each: 137 MiB, over the 128 MiB of one namespace.
    for i in 0..36 {
        if let Some(s) = subscribe(xds, &tls, (i + 1) * 1000, 950, 4000).await {
            held.push(s);
        }
    }

    // Meanwhile: B's pod keeps serving, and a new pod of B is admitted and injected.
    let asked = Instant::now();
    let created = pods_b
        .create(&PostParams::default(), &tenant_b_pod("b-2"))
        .await
        .unwrap();
    let admitted_in = asked.elapsed();
    assert!(
        admitted_in < Duration::from_secs(5),
        "admission took {admitted_in:?}"
    );
    let injected = created.spec.unwrap().init_containers.unwrap_or_default();
    assert!(
        injected.iter().any(|c| c.name == "envoy-sidecar"),
        "{injected:?}"
    );
    serving(&client, B, "b-2").await;
    let body = marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", pod_ip(&victim)));
    assert_eq!(body.ok().as_deref(), Some(BODY));

    // The discovery pod's own accounting: A's names refused past the bounds, and never more
    // held than the namespace's budget.
    let metrics = until(
        "the refusals to be counted",
        Duration::from_secs(60),
        || async {
            let m = marin3r_testkit::envoy::get_body(&metrics_url).ok()?;
            let name = metric(
                &m,
                "marin3r_xds_refused_streams_total",
                "limit=\"name_size\"",
            );
            let budget = metric(
                &m,
                "marin3r_xds_refused_streams_total",
                "limit=\"subscription_bytes_per_namespace\"",
            );
            (name >= 1.0 && budget >= 1.0).then_some(m)
        },
    )
    .await;
    let held_bytes = metric(&metrics, "marin3r_xds_subscription_bytes", "");
    assert!(
        held_bytes <= NAMESPACE_BUDGET + (1 << 20) as f64,
        "the discovery pod holds {held_bytes} bytes of names"
    );
    drop(held);
    let pods = Api::<Pod>::namespaced(client.clone(), B)
        .list(&ListParams::default().labels("app=b"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 2);
}
