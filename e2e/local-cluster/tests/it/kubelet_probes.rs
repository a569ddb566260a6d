//! Probes against real servers: HTTP and HTTPS (certificate not verified, as the kubelet
//! does) against the local API server, tcpSocket, and exec inside a process's namespaces.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use marin3r_local_cluster::kubelet::probe;

fn probe_of(json: serde_json::Value) -> Probe {
    serde_json::from_value(json).unwrap()
}

#[tokio::test]
async fn http_https_tcp_and_exec_probes_pass_and_fail_for_the_right_reasons() {
    let server = ApiServer::start(ApiServerConfig {
        plain_http: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let https_port = server.https_addr().port();
    let http_port: u16 = server
        .http_url()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let container = Container::default();
    let pid = std::process::id();
    let timeout = Duration::from_secs(2);
    let run = |p: Probe| {
        let container = container.clone();
        async move { probe::run(&p, &container, "127.0.0.1", pid, timeout).await }
    };

    let https = |path: &str| {
        probe_of(
            serde_json::json!({"httpGet": {"scheme": "HTTPS", "port": https_port, "path": path}}),
        )
    };
    run(https("/version")).await.unwrap();
    // Probes carry no token: the API server answers system:anonymous 403, as a real one does.
    let err = run(https("/api/v1/namespaces/nope")).await.unwrap_err();
    assert!(err.contains("403"), "{err}");
    let http = probe_of(serde_json::json!({"httpGet": {"port": http_port, "path": "/version"}}));
    run(http).await.unwrap();
    // HTTP against the HTTPS port is answered with a TLS alert or garbage: a failure.
    let wrong = probe_of(serde_json::json!({"httpGet": {"port": https_port, "path": "/version"}}));
    assert!(run(wrong).await.is_err());

    run(probe_of(
        serde_json::json!({"tcpSocket": {"port": https_port}}),
    ))
    .await
    .unwrap();
    drop(server);
    let err = run(probe_of(
        serde_json::json!({"tcpSocket": {"port": https_port}}),
    ))
    .await
    .unwrap_err();
    assert!(err.contains(&https_port.to_string()), "{err}");

    run(probe_of(serde_json::json!({"exec": {"command": ["true"]}})))
        .await
        .unwrap();
    let err = run(probe_of(
        serde_json::json!({"exec": {"command": ["sh", "-c", "echo not yet; exit 3"]}}),
    ))
    .await
    .unwrap_err();
    assert!(err.contains("not yet"), "{err}");
    let err = run(probe_of(serde_json::json!({"grpc": {"port": 1}})))
        .await
        .unwrap_err();
    assert!(err.contains("httpGet, tcpSocket, exec"), "{err}");
}
