//! A pod with `marin3r.3scale.net/shutdown-manager.enabled`, injected as the webhook injects
//! it, on the local cluster: when the pod is deleted, the pod runner runs every preStop hook
//! at once as kubelet does. While a downstream connection is open the drain holds: Envoy keeps
//! proxying it and the application named in `extra-lifecycle-hooks` keeps running (its SIGTERM
//! waits for its hook). Once the connection closes Envoy exits and the pod goes. Needs root
//! and python3.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig, pod_ready};
use marin3r_testkit::wait::until;
use marin3r_webhook::{InjectionConfig, inject_json};
use serde_json::json;

/// The application: echoes every connection on the pod's loopback, port 9000, and closes it
/// when the client does (Envoy's TCP proxy forwards the half-close and waits for it).
const ECHO_PY: &str = r#"
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9000))
s.listen()
def echo(c):
    while True:
        d = c.recv(1024)
        if not d:
            c.close()
            return
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"#;

/// A bootstrap without xDS (the drain is the subject): port 8080 proxies TCP to the app.
const BOOTSTRAP: &str = r#"{"static_resources": {
  "listeners": [{"name": "traffic", "stat_prefix": "traffic",
    "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8080}},
    "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy",
      "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": "traffic", "cluster": "app"}}]}]}],
  "clusters": [{"name": "app", "type": "STATIC", "connect_timeout": "1s",
    "load_assignment": {"cluster_name": "app", "endpoints": [{"lb_endpoints": [{"endpoint":
      {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9000}}}}]}]}}]}}"#;

/// A connection through Envoy to the app, proven by an echo.
fn echo(stream: &mut TcpStream, word: &[u8]) -> std::io::Result<()> {
    stream.write_all(word)?;
    let mut buf = vec![0u8; word.len()];
    stream.read_exact(&mut buf)?;
    assert_eq!(buf, word);
    Ok(())
}

fn refused(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_drains_its_envoy_through_the_prestop_hooks() {
    let cluster = LocalCluster::start(LocalClusterConfig {
        images: marin3r_e2e::product::images()
            .with("probe-server", marin3r_e2e::product::python3()),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let ns = "drain";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "drain-bootstrap"},
                "data": {"config.json": BOOTSTRAP},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // The client certificate volume must exist; this bootstrap does not read it.
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "envoy-sidecar-client-cert"},
                "stringData": {"unused": "x"},
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": ns,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "web",
                "marin3r.3scale.net/ads-configmap": "drain-bootstrap",
                "marin3r.3scale.net/ports": "traffic:8080",
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
                "marin3r.3scale.net/shutdown-manager.drain-time": "90",
                "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app",
            },
        },
        "spec": {"containers": [{
            "name": "app", "image": "probe-server", "command": ["python3", "-c", ECHO_PY],
        }]},
    });
    // What the webhook does at admission (its own tests cover the AdmissionReview path).
    let (_, warnings) = inject_json(&mut pod, &InjectionConfig::default()).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let ip = until(
        "the drained pod to be ready",
        Duration::from_secs(90),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("web").await.ok()?;
                pod_ready(&p).then(|| p.status?.pod_ip)?
            }
        },
    )
    .await;
    let traffic: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let manager: SocketAddr = format!("{ip}:8090").parse().unwrap();
    let mut conn = TcpStream::connect_timeout(&traffic, Duration::from_secs(5)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    echo(&mut conn, b"before").unwrap();
    // Anyone else on the pod network (here the host) is refused: no drain, no stop. Only the
    // pod's own preStop hooks carry its token.
    for path in ["/drain", "/shutdown"] {
        let url = format!("http://{manager}{path}");
        let status = tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .into();
            agent.get(&url).call().map(|r| r.status().as_u16())
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(status, 401, "{path} without the pod's token");
    }
    echo(&mut conn, b"still").unwrap();

    let logs: Vec<_> = ["envoy-sidecar", "envoy-shtdn-mgr", "app"]
        .iter()
        .filter_map(|c| cluster.log_path(ns, "web", c))
        .collect();
    let tails = move || {
        logs.iter()
            .map(|path| {
                let log = std::fs::read_to_string(path).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "== {}\n{}",
                    path.display(),
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    pods.delete("web", &DeleteParams::default()).await.unwrap();
    // The manager counts after its 5 s delay; seconds past it, the drain still holds: Envoy
    // proxies the open connection to the app, which has not been stopped.
    tokio::time::sleep(Duration::from_secs(9)).await;
    echo(&mut conn, b"during").unwrap();
    assert!(
        !refused(manager),
        "the shutdown manager stopped during the drain"
    );

    let closed = Instant::now();
    drop(conn);
    // Envoy's exit is watched on its readiness port: a connection to the traffic port would
    // be traffic, which the drain rightly waits for.
    let readiness: SocketAddr = format!("{ip}:9902").parse().unwrap();
    for (what, addr) in [
        ("the shutdown manager to stop", manager),
        ("Envoy to exit", readiness),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !refused(addr) {
            assert!(
                Instant::now() < deadline,
                "waiting for {what}:\n{}",
                tails()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Well inside the 90 s drain time: the closed connection ended the drain.
    assert!(
        closed.elapsed() < Duration::from_secs(45),
        "{:?}",
        closed.elapsed()
    );
    cluster.shutdown(Duration::from_secs(5)).await;
}
