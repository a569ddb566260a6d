//! The webhook over real HTTPS: a rustls client trusting only the CA that signed the server
//! certificate sends AdmissionReviews for a real-looking pod and applies the returned patch
//! (HTTP/1.1 and HTTP/2, TLS 1.2 and 1.3); bad annotations are denied with 200; garbage gets
//! 400, oversized bodies 413; a silent client is dropped.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use marin3r_webhook::WebhookServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use support::*;

fn expected_pod() -> Value {
    let mut pod = real_looking_pod();
    pod["metadata"]["annotations"]["marin3r.3scale.net/injected"] = json!("true");
    // Envoy's stats, on the readiness port, for annotation-driven Prometheus.
    pod["metadata"]["annotations"]["prometheus.io/scrape"] = json!("true");
    pod["metadata"]["annotations"]["prometheus.io/port"] = json!("9902");
    pod["metadata"]["annotations"]["prometheus.io/path"] = json!("/stats/prometheus");
    let probe = |delay: u32, period: u32, failures: u32| {
        json!({
            "httpGet": {"path": "/ready", "port": 9902, "scheme": "HTTP"},
            "initialDelaySeconds": delay, "periodSeconds": period, "failureThreshold": failures,
            "successThreshold": 1, "timeoutSeconds": 1,
        })
    };
    pod["spec"]["containers"].as_array_mut().unwrap().push(json!({
        "name": "envoy-sidecar",
        "image": "envoyproxy/envoy:v1.40.0",
        "command": ["envoy"],
        "args": [
            "-c", "/etc/envoy/bootstrap/config.json",
            "--service-node", "kuard", "--service-cluster", "kuard",
            "--config-yaml", "<overlay>",
            "--log-level", "info",
        ],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        ],
        "ports": [
            {"name": "http", "containerPort": 8081, "protocol": "TCP"},
            {"name": "https", "containerPort": 8443, "protocol": "TCP"},
            {"name": "envoy-stats", "containerPort": 9902, "protocol": "TCP"},
        ],
        "readinessProbe": probe(0, 5, 3),
        "livenessProbe": probe(30, 10, 10),
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 101, "runAsGroup": 101,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "envoy-sidecar-bootstrap", "mountPath": "/etc/envoy/bootstrap", "readOnly": true},
            {"name": "envoy-sidecar-tls", "mountPath": "/etc/envoy/tls/client", "readOnly": true},
        ],
    }));
    let volumes = pod["spec"]["volumes"].as_array_mut().unwrap();
    volumes.push(json!({"name": "envoy-sidecar-bootstrap", "configMap": {"name": "envoy-sidecar-bootstrap"}}));
    volumes.push(
        json!({"name": "envoy-sidecar-tls", "secret": {"secretName": "envoy-sidecar-client-cert"}}),
    );
    pod
}

#[tokio::test]
async fn a_real_looking_pod_round_trips_over_https() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let mut client = connect(server.addr, pki.ca_pem(), versions).await;
        let pod = real_looking_pod();
        let out = client.review(&admission_review("uid-1", &pod)).await;
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], "uid-1");
        let mut injected = apply(&pod, &out["response"]);

        // The overlay arg is checked parsed (key order is not part of the contract).
        let overlay = &mut injected["spec"]["containers"][1]["args"][7];
        let mut parsed: Value = serde_json::from_str(overlay.as_str().unwrap()).unwrap();
        let statics = parsed
            .as_object_mut()
            .unwrap()
            .remove("static_resources")
            .unwrap();
        assert_eq!(
            statics["listeners"][0]["address"]["socket_address"]["port_value"],
            9902
        );
        assert_eq!(
            parsed,
            json!({
                "node": {"metadata": {
                    "pod_name": "$(POD_NAME)",
                    "pod_namespace": "$(POD_NAMESPACE)",
                    "stats_port": 9902,
                }},
                "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}}},
            })
        );
        *overlay = json!("<overlay>");
        assert_eq!(injected, expected_pod());

        // Idempotent: the injected pod comes back allowed and untouched, on the same
        // keep-alive connection.
        let again = client
            .review(&admission_review("uid-2", &apply(&pod, &out["response"])))
            .await;
        assert_eq!(again["response"]["uid"], "uid-2");
        assert_eq!(again["response"]["allowed"], true);
        assert!(again["response"].get("patch").is_none(), "{again}");
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_annotations_are_denied_with_200() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    let mut pod = real_looking_pod();
    pod["metadata"]["annotations"]["marin3r.3scale.net/ports"] = json!("http:99999");
    let out = client.review(&admission_review("uid-3", &pod)).await;
    assert_eq!(out["response"]["uid"], "uid-3");
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(
        out["response"]["status"]["message"],
        r#"marin3r.3scale.net/ports: "http:99999": port must be between 1 and 65535"#
    );
    server.stop().await;
}

#[tokio::test]
async fn garbage_gets_400_oversized_gets_413_and_healthz_answers() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let metrics = std::sync::Arc::new(marin3r_webhook::WebhookMetrics::default());
    let server = Server::start(WebhookServerConfig {
        max_body_bytes: 64 * 1024,
        metrics: metrics.clone(),
        ..config(&dir)
    })
    .await;
    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    let (status, body) = client
        .request("POST", "/pod-v1-mutate", b"{\"hello\":".to_vec())
        .await;
    assert_eq!(status, 400);
    assert!(
        String::from_utf8_lossy(&body).starts_with("the body is not JSON: "),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (status, body) = client
        .request(
            "POST",
            "/pod-v1-mutate",
            br#"{"kind":"Pod","apiVersion":"v1"}"#.to_vec(),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        String::from_utf8_lossy(&body),
        "expected apiVersion \"admission.k8s.io/v1\" and kind \"AdmissionReview\", got \"v1\" and \"Pod\"\n"
    );
    let (status, body) = client
        .request("POST", "/pod-v1-mutate", vec![b' '; 100 * 1024])
        .await;
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (413, "the body is larger than 65536 bytes\n")
    );
    let (status, body) = client.request("GET", "/healthz", Vec::new()).await;
    assert_eq!((status, body.as_slice()), (200, &b"ok"[..]));
    let (status, _) = client.request("GET", "/pod-v1-mutate", Vec::new()).await;
    assert_eq!(status, 405);
    let (status, _) = client.request("POST", "/mutate", Vec::new()).await;
    assert_eq!(status, 404);
    // The connection survived all of that.
    let out = client
        .review(&admission_review("uid-4", &real_looking_pod()))
        .await;
    assert_eq!(out["response"]["allowed"], true);
    server.stop().await;
}

/// Go clients (the API server among them) negotiate HTTP/2 through ALPN.
#[tokio::test]
async fn http2_clients_are_served() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for uid in ["h2-1", "h2-2"] {
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!("https://{HOST}/pod-v1-mutate"))
            .body(Full::new(Bytes::from(
                admission_review(uid, &real_looking_pod()).to_string(),
            )))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let out: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(out["response"]["uid"], uid);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
    }
    server.stop().await;
}

/// A client that connects and never says hello is dropped, not kept forever.
#[tokio::test]
async fn a_silent_client_is_disconnected_after_the_handshake_timeout() {
    use tokio::io::AsyncReadExt;
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..config(&dir)
    })
    .await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("the server kept a silent connection open");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(150));
    server.stop().await;
}

/// The EnvoyConfig validation path over HTTPS: the injected validator decides, bad bodies get
/// 400 and oversized ones 413 as on the injection path, and without a validator the path is
/// not served.
#[tokio::test]
async fn envoyconfigs_are_judged_by_the_injected_validator() {
    const PATH: &str = marin3r_webhook::server::VALIDATE_ENVOY_CONFIG_PATH;
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let metrics = std::sync::Arc::new(marin3r_webhook::WebhookMetrics::default());
    let validator = marin3r_webhook::EnvoyConfigValidator::new(|ns, object| {
        match object.pointer("/spec/nodeID").and_then(Value::as_str) {
            Some("ok") => Vec::new(),
            other => vec![format!("spec.nodeID: {other:?} is not served in {ns}")],
        }
    });
    let server = Server::start(WebhookServerConfig {
        max_body_bytes: 64 * 1024,
        metrics: metrics.clone(),
        envoy_config_validator: Some(validator),
        ..config(&dir)
    })
    .await;
    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    let review = |node: &str| {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "operation": "CREATE", "namespace": "shop",
                "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
                "object": {"metadata": {"name": "ec"}, "spec": {"nodeID": node}},
            }
        })
        .to_string()
        .into_bytes()
    };
    let (status, body) = client.request("POST", PATH, review("ok")).await;
    let out: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((status, &out["response"]["allowed"]), (200, &json!(true)));
    let (status, body) = client.request("POST", PATH, review("nope")).await;
    let out: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 200);
    assert_eq!(out["response"]["allowed"], false);
    assert_eq!(
        out["response"]["status"]["message"],
        "spec.nodeID: Some(\"nope\") is not served in shop"
    );
    let (status, body) = client.request("POST", PATH, b"{\"hello\":".to_vec()).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _) = client.request("POST", PATH, vec![b' '; 100 * 1024]).await;
    assert_eq!(status, 413);
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for outcome in ["allowed", "denied", "bad_request"] {
        let line = format!(
            "marin3r_webhook_admissions_total{{webhook=\"envoyconfig-validation\",outcome=\"{outcome}\"}} 1"
        );
        assert!(text.contains(&line), "{line} in\n{text}");
    }
    server.stop().await;

    // Without a validator, the path is not served.
    let server = Server::start(config(&dir)).await;
    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    let (status, _) = client.request("POST", PATH, review("ok")).await;
    assert_eq!(status, 404);
    server.stop().await;
}
