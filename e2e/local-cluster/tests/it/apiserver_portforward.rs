//! `pods/portforward` as kube-rs speaks it (WebSocket, `v4.channel.k8s.io`): bytes go both
//! ways to the pod's port through the connector the pod runner installs (here one that dials
//! a local listener, so no root is needed; the operator e2e does it inside real pod network
//! namespaces), a port nothing listens on is reported on the error channel, and bad requests
//! get a Status naming what is wrong.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig, PodPorts};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connects every pod port to a local port, recording what was asked.
struct LocalPorts {
    target: u16,
    asked: Mutex<Vec<(String, String, u16)>>,
}

impl PodPorts for LocalPorts {
    fn connect(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> std::io::Result<std::net::TcpStream> {
        self.asked
            .lock()
            .unwrap()
            .push((namespace.into(), pod.into(), port));
        let target = if port == 1 { 1 } else { self.target };
        std::net::TcpStream::connect(("127.0.0.1", target))
    }
}

async fn pod(client: &kube::Client, name: &str, phase: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_go_both_ways_and_failures_are_named() {
    let api = ApiServer::start(ApiServerConfig {
        plain_http: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let client = api.kube_client().await.unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ns"}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    pod(&client, "running", "Running").await;
    pod(&client, "pending", "Pending").await;

    // An echo server that upper-cases, standing for the pod's port.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let upper = buf[..n].to_ascii_uppercase();
                    if conn.write_all(&upper).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let ports = Arc::new(LocalPorts {
        target,
        asked: Mutex::default(),
    });
    api.set_pod_ports(ports.clone());

    let pods: Api<Pod> = Api::namespaced(client.clone(), "ns");
    let mut forwarder = pods.portforward("running", &[8384]).await.unwrap();
    let mut stream = forwarder.take_stream(8384).unwrap();
    for word in ["hello", "port-forward"] {
        stream.write_all(word.as_bytes()).await.unwrap();
        let mut got = vec![0u8; word.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, word.to_ascii_uppercase().as_bytes());
    }
    drop(stream);
    forwarder.abort();
    assert_eq!(
        ports.asked.lock().unwrap().as_slice(),
        [("ns".to_owned(), "running".to_owned(), 8384)]
    );

    // Nothing listens on the port: the error channel says so.
    let mut forwarder = pods.portforward("running", &[1]).await.unwrap();
    let error = forwarder.take_error(1).unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), error)
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(
        message.contains("error forwarding port 1 to pod running"),
        "{message:?}"
    );

    // RBAC: a ServiceAccount needs `create` on `pods/portforward`.
    let token = api.service_account_token("ns", "default");
    let kubeconfig = api
        .kubeconfig()
        .replace("token: local-cluster", &format!("token: {token}"));
    let unprivileged = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let denied = Api::<Pod>::namespaced(unprivileged, "ns")
        .portforward("running", &[8384])
        .await
        .err()
        .unwrap();
    assert!(denied.to_string().contains("403"), "{denied}");

    // Bad requests: a Status naming the problem.
    let missing = pods.portforward("missing", &[80]).await.err().unwrap();
    assert!(missing.to_string().contains("404"), "{missing}");
    let pending = pods.portforward("pending", &[80]).await.err().unwrap();
    assert!(pending.to_string().contains("400"), "{pending}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let base = api.http_url().unwrap();
    for (query, websocket, expected) in [
        ("", true, "at least one port"),
        ("?ports=0", true, "must be between 1 and 65535"),
        ("?ports=99999", true, "must be between 1 and 65535"),
        ("?ports=80", false, "needs a WebSocket upgrade"),
    ] {
        let mut request = agent.get(&format!(
            "{base}/api/v1/namespaces/ns/pods/running/portforward{query}"
        ));
        if websocket {
            request = request
                .header("Upgrade", "websocket")
                .header("Connection", "Upgrade")
                .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
                .header("Sec-WebSocket-Version", "13")
                .header("Sec-WebSocket-Protocol", "v4.channel.k8s.io");
        }
        let mut response = request.call().unwrap();
        let status = response.status().as_u16();
        let body = response.body_mut().read_to_string().unwrap();
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains(expected), "{query}: {body}");
    }
}
