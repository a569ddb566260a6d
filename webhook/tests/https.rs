//! The webhook over real HTTPS: a rustls client trusting only the CA that signed the server
//! certificate sends AdmissionReviews for a real-looking pod and applies the returned patch;
//! garbage gets 400; the certificate files are swapped the way kubelet does and new
//! connections see the new certificate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use marin3r_certs::{
    CertificateAuthority, CertificateInfo, CertificateRequest, IssuedCertificate, Usage,
    issue_self_signed,
};
use marin3r_webhook::WebhookServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

const HOST: &str = "marin3r.marin3r-system.svc";

struct Pki {
    ca: CertificateAuthority,
    ca_pem: String,
}

impl Pki {
    fn new() -> Self {
        let ca = issue_self_signed(&CertificateRequest::ca(
            "webhook-test-ca",
            Duration::from_secs(3600),
        ))
        .unwrap();
        Self {
            ca_pem: ca.cert_pem.clone(),
            ca: CertificateAuthority::from_issued(&ca).unwrap(),
        }
    }

    fn server_cert(&self) -> IssuedCertificate {
        self.ca
            .issue(
                &CertificateRequest::new("marin3r", Usage::Server, Duration::from_secs(3600))
                    .with_hosts([HOST]),
            )
            .unwrap()
    }
}

/// A mounted Secret laid out as kubelet does: `..<ts>/` holds the files, `..data` points at
/// it, and `tls.crt`/`tls.key` point through `..data`. Updates swap `..data` atomically.
struct SecretDir {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretDir {
    fn new(cert: &IssuedCertificate) -> Self {
        let mut s = Self {
            dir: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        s.write(&cert.cert_pem, &cert.key_pem);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{f}"), s.dir.path().join(f)).unwrap();
        }
        s
    }

    fn write(&mut self, cert_pem: &str, key_pem: &str) {
        self.generation += 1;
        let ts = format!(
            "..2026_11_22_00_00_{:02}.{}",
            self.generation,
            std::process::id()
        );
        let data = self.dir.path().join(&ts);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("tls.crt"), cert_pem).unwrap();
        std::fs::write(data.join("tls.key"), key_pem).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

/// A running server, stopped when dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    async fn start(config: WebhookServerConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            marin3r_webhook::serve(config, listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn config(dir: &SecretDir) -> WebhookServerConfig {
    WebhookServerConfig {
        reload_interval: Duration::from_millis(50),
        ..WebhookServerConfig::new(dir.cert(), dir.key())
    }
}

struct Client {
    send: SendRequest<Full<Bytes>>,
    peer_serial: String,
}

async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Client {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
        .unwrap();
    let peer = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    let peer_serial = CertificateInfo::from_der(&peer).unwrap().serial;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    Client { send, peer_serial }
}

impl Client {
    async fn request(&mut self, method: &str, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", HOST)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = self.send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        (status, body)
    }

    async fn review(&mut self, body: &Value) -> Value {
        let (status, out) = self
            .request("POST", "/pod-v1-mutate", body.to_string().into_bytes())
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
        serde_json::from_slice(&out).unwrap()
    }
}

/// A pod as the API server sends it for a Deployment's ReplicaSet: no name yet, owner,
/// service-account token volume, defaults filled in.
fn real_looking_pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "kuard-6f9c5b7d8-",
            "namespace": "shop",
            "labels": {
                "app": "kuard",
                "pod-template-hash": "6f9c5b7d8",
                "marin3r.3scale.net/status": "enabled",
            },
            "annotations": {
                "marin3r.3scale.net/node-id": "kuard",
                "marin3r.3scale.net/ports": "http:8081,https:8443",
                "marin3r.3scale.net/envoy-extra-args": "--log-level info",
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "kuard-6f9c5b7d8",
                "uid": "2b1c5f6e-1b1a-4c1e-9a53-0f1d1c7f3a11", "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "containers": [{
                "name": "kuard",
                "image": "gcr.io/kuar-demo/kuard-amd64:blue",
                "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{
                    "name": "kube-api-access-x7k2p",
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    "readOnly": true,
                }],
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "volumes": [{
                "name": "kube-api-access-x7k2p",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            }],
        },
        "status": {},
    })
}

fn admission_review(uid: &str, pod: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        }
    })
}

fn apply(pod: &Value, response: &Value) -> Value {
    assert_eq!(response["allowed"], true, "{response}");
    let mut out = pod.clone();
    if let Some(patch) = response.get("patch") {
        assert_eq!(response["patchType"], "JSONPatch");
        let patch: json_patch::Patch =
            serde_json::from_slice(&BASE64.decode(patch.as_str().unwrap()).unwrap()).unwrap();
        json_patch::patch(&mut out, &patch.0).unwrap();
    }
    out
}

fn expected_pod() -> Value {
    let mut pod = real_looking_pod();
    pod["metadata"]["annotations"]["marin3r.3scale.net/injected"] = json!("true");
    let probe = |delay: u32, period: u32, failures: u32| {
        json!({
            "httpGet": {"path": "/ready", "port": 9901, "scheme": "HTTP"},
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
        ],
        "readinessProbe": probe(0, 5, 3),
        "livenessProbe": probe(30, 10, 10),
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
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let mut client = connect(server.addr, &pki.ca_pem, versions).await;
        let pod = real_looking_pod();
        let out = client.review(&admission_review("uid-1", &pod)).await;
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], "uid-1");
        let mut injected = apply(&pod, &out["response"]);

        // The overlay arg is checked parsed (key order is not part of the contract).
        let overlay = &mut injected["spec"]["containers"][1]["args"][7];
        let parsed: Value = serde_json::from_str(overlay.as_str().unwrap()).unwrap();
        assert_eq!(
            parsed,
            json!({
                "node": {"metadata": {"pod_name": "$(POD_NAME)", "pod_namespace": "$(POD_NAMESPACE)"}},
                "admin": {"address": {"socket_address": {"address": "0.0.0.0", "port_value": 9901}}},
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
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    let mut client = connect(server.addr, &pki.ca_pem, rustls::DEFAULT_VERSIONS).await;
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
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.server_cert());
    let metrics = std::sync::Arc::new(marin3r_webhook::WebhookMetrics::default());
    let server = Server::start(WebhookServerConfig {
        max_body_bytes: 64 * 1024,
        metrics: metrics.clone(),
        ..config(&dir)
    })
    .await;
    let mut client = connect(server.addr, &pki.ca_pem, rustls::DEFAULT_VERSIONS).await;
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
    let (status, _) = client
        .request("POST", "/pod-v1-mutate", vec![b' '; 100 * 1024])
        .await;
    assert_eq!(status, 413);
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

async fn wait_for_serial(addr: SocketAddr, ca_pem: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let client = connect(addr, ca_pem, rustls::DEFAULT_VERSIONS).await;
        if client.peer_serial == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still serving {} instead of {want}",
            client.peer_serial
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn serial(cert: &IssuedCertificate) -> String {
    CertificateInfo::from_pem(&cert.cert_pem).unwrap().serial
}

#[tokio::test]
async fn a_swapped_certificate_is_served_to_new_connections() {
    let pki = Pki::new();
    let first = pki.server_cert();
    let mut dir = SecretDir::new(&first);
    let server = Server::start(config(&dir)).await;
    let mut old_conn = connect(server.addr, &pki.ca_pem, rustls::DEFAULT_VERSIONS).await;
    assert_eq!(old_conn.peer_serial, serial(&first));

    let second = pki.server_cert();
    assert_ne!(serial(&first), serial(&second));
    dir.write(&second.cert_pem, &second.key_pem);
    wait_for_serial(server.addr, &pki.ca_pem, &serial(&second)).await;

    // A mismatched pair (new certificate, another key) is not served; the last good one stays.
    let third = pki.server_cert();
    dir.write(&third.cert_pem, &first.key_pem);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = connect(server.addr, &pki.ca_pem, rustls::DEFAULT_VERSIONS).await;
    assert_eq!(client.peer_serial, serial(&second));
    // ...until the pair is completed.
    dir.write(&third.cert_pem, &third.key_pem);
    wait_for_serial(server.addr, &pki.ca_pem, &serial(&third)).await;

    // Connections opened before keep working.
    let out = old_conn
        .review(&admission_review("uid-5", &real_looking_pod()))
        .await;
    assert_eq!(out["response"]["allowed"], true);
    server.stop().await;
}

#[tokio::test]
async fn a_missing_or_bad_certificate_fails_at_start_with_the_path() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let missing = dir.path().join("tls.crt");
    let err = marin3r_webhook::serve(
        WebhookServerConfig::new(&missing, dir.path().join("tls.key")),
        listener,
        std::future::pending(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!("reading {}", missing.display())),
        "{err}"
    );

    let cert = pki.server_cert();
    let other = pki.server_cert();
    write(dir.path(), "tls.crt", &cert.cert_pem);
    write(dir.path(), "tls.key", &other.key_pem);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = marin3r_webhook::serve(
        WebhookServerConfig::new(dir.path().join("tls.crt"), dir.path().join("tls.key")),
        listener,
        std::future::pending(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("do not form a usable pair"), "{err}");
}

fn write(dir: &Path, name: &str, content: &str) {
    std::fs::write(dir.join(name), content).unwrap();
}

/// Go clients (the API server among them) negotiate HTTP/2 through ALPN.
#[tokio::test]
async fn http2_clients_are_served() {
    let pki = Pki::new();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(config(&dir)).await;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(pki.ca_pem.as_bytes()) {
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
    let pki = Pki::new();
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
