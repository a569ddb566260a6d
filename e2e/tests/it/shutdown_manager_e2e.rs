//! A pod with `marin3r.3scale.net/shutdown-manager.enabled`, injected by the real API
//! server's call to our webhook on the real cluster (`hack/cluster`, marin3r installed from
//! `manifests/`), in both layouts: native (the default on this 1.36 cluster: Envoy and the
//! shutdown manager are init containers that always restart) and classic
//! (`native-sidecar: "false"`). When the pod is deleted, the real kubelet runs the preStop
//! hooks (in the classic layout every container's at once; in the native one the application's
//! first, the sidecars' only after the applications have exited). While a downstream
//! connection is open the drain holds: Envoy keeps proxying it and the application named in
//! `extra-lifecycle-hooks` keeps running (its SIGTERM waits for its hook). Once the connection
//! closes Envoy exits, the shutdown manager after it, and the pod goes. The shutdown manager
//! refuses anyone without the pod's token.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use marin3r_e2e::real;
use marin3r_testkit::wait::until;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The application: echoes every connection on the pod's loopback, port 9000, and closes it
/// when the client does (Envoy's TCP proxy forwards the half-close and waits for it). It
/// exits on SIGTERM: as its container's PID 1 it would otherwise ignore it, and the kubelet
/// would stop the native sidecars only after killing it at the end of the grace period.
const ECHO_PY: &str = r#"
import os, signal, socket, threading
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
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
async fn echo(stream: &mut TcpStream, word: &[u8]) -> std::io::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), async {
        stream.write_all(word).await?;
        let mut buf = vec![0u8; word.len()];
        stream.read_exact(&mut buf).await?;
        assert_eq!(buf, word);
        Ok(())
    })
    .await?
}

async fn refused(addr: SocketAddr) -> bool {
    !matches!(
        tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// The pod `name`, annotated for the shutdown manager (drain time 90 s, the application's
/// preStop waiting for the drain), natively or classically injected.
fn pod(name: &str, native: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "web",
                "marin3r.3scale.net/native-sidecar": native.to_string(),
                "marin3r.3scale.net/ads-configmap": "drain-bootstrap",
                "marin3r.3scale.net/ports": "traffic:8080",
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
                "marin3r.3scale.net/shutdown-manager.drain-time": "90",
                "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app",
            },
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [real::python_container(ECHO_PY)],
        },
    }))
    .unwrap()
}

/// The status of the shutdown manager's `path` for a caller without the pod's token.
async fn status_without_token(manager: SocketAddr, path: &str) -> u16 {
    let url = format!("http://{manager}{path}");
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        agent.get(&url).call().map(|r| r.status().as_u16())
    })
    .await
    .unwrap()
    .unwrap()
}

/// One pod through the whole drain: Ready, a connection open through Envoy, the pod deleted,
/// the drain holding while the connection is open, Envoy and the manager gone soon after it
/// closes, and the pod object removed by the kubelet's confirmation.
async fn drains(scenario: &real::Scenario, name: &str, native: bool) {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {name}: {what}", start.elapsed().as_secs_f64());
    let pods: Api<Pod> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    let created = pods
        .create(&PostParams::default(), &pod(name, native))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    let mut sidecars: Vec<String> = if native {
        spec.init_containers.unwrap_or_default()
    } else {
        spec.containers
    }
    .into_iter()
    .map(|c| c.name)
    .filter(|c| c != "app")
    .collect();
    sidecars.sort();
    assert_eq!(sidecars, ["envoy-shtdn-mgr", "envoy-sidecar"], "{native}");
    assert!(spec.termination_grace_period_seconds.unwrap_or(30) > 90);
    let ip = until(
        "the drained pod to be ready",
        Duration::from_secs(90),
        || async { marin3r_e2e::demo::ready_ip(&pods.get(name).await.ok()?) },
    )
    .await;
    step("Ready");
    let traffic: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let manager: SocketAddr = format!("{ip}:8090").parse().unwrap();
    // The pod is Ready once Envoy is: the application (no probe) may not listen yet, and
    // Envoy then closes the connection it could not proxy.
    let mut conn = until("an echo through Envoy", Duration::from_secs(30), || async {
        let mut conn = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(traffic))
            .await
            .ok()?
            .ok()?;
        echo(&mut conn, b"before").await.ok().map(|()| conn)
    })
    .await;
    // Anyone else on the pod network (here the host) is refused: no drain, no stop. Only the
    // pod's own preStop hooks carry its token.
    for path in ["/drain", "/shutdown"] {
        assert_eq!(
            status_without_token(manager, path).await,
            401,
            "{path} without the pod's token"
        );
    }
    echo(&mut conn, b"still").await.unwrap();

    let containers = ["envoy-sidecar", "envoy-shtdn-mgr", "app"];
    let deleted = Instant::now();
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    // The manager counts after its 5 s delay; seconds past it, the drain still holds: Envoy
    // proxies the open connection to the app, which the kubelet has not stopped.
    tokio::time::sleep(Duration::from_secs(9)).await;
    if let Err(e) = echo(&mut conn, b"during").await {
        panic!(
            "no echo {:?} after the deletion: {e}
{}",
            deleted.elapsed(),
            scenario.logs(name, &containers).await
        );
    }
    assert!(
        !refused(manager).await,
        "the shutdown manager stopped during the drain"
    );
    step("the drain holds the open connection");

    let closed = Instant::now();
    drop(conn);
    // Envoy's exit is watched on its readiness port: a connection to the traffic port would
    // be traffic, which the drain rightly waits for.
    let readiness: SocketAddr = format!("{ip}:9902").parse().unwrap();
    for (what, addr) in [
        ("Envoy to exit", readiness),
        ("the shutdown manager to stop", manager),
    ] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !refused(addr).await {
            if Instant::now() > deadline {
                panic!(
                    "waiting for {what}:
{}",
                    scenario.logs(name, &containers).await
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Well inside the 90 s drain time: the closed connection ended the drain.
    assert!(
        closed.elapsed() < Duration::from_secs(45),
        "{:?}",
        closed.elapsed()
    );
    step("Envoy and the manager gone after the connection closed");
    until("the pod to be gone", Duration::from_secs(60), || async {
        pods.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    step("pod gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_pod_drains_its_envoy_through_the_prestop_hooks() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("drain", &["python"]).await.unwrap();
    step("namespace created");
    scenario.apply(real::DISCOVERY_SERVICE).await.unwrap();
    scenario
        .apply(
            &serde_json::to_string(&json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "drain-bootstrap"},
                "data": {"config.json": BOOTSTRAP},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");
    tokio::join!(
        drains(&scenario, "native", true),
        drains(&scenario, "classic", false),
    );
    step("both layouts drained");
}
