//! Fixtures for the HTTPS tests: a PKI from marin3r-certs, a Secret directory laid out and
//! updated as kubelet does it, a server stopped on drop, a rustls client, a real-looking pod.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use marin3r_certs::{CertificateInfo, IssuedCertificate};
pub use marin3r_testkit::pki::Pki;
use marin3r_testkit::webhook::TlsClient;
use marin3r_webhook::WebhookServerConfig;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

pub const HOST: &str = "marin3r.marin3r-system.svc";

/// The test PKI, its server certificates for [`HOST`].
pub fn pki() -> Pki {
    Pki::for_hosts([HOST])
}

/// A mounted Secret with `tls.crt` and `tls.key`, written and updated by the local kubelet's
/// atomic writer (`..<ts>/` holds the files, `..data` points at it and is swapped by rename).
pub struct SecretDir {
    dir: tempfile::TempDir,
}

impl SecretDir {
    pub fn new(cert: &IssuedCertificate) -> Self {
        let mut s = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        s.write(&cert.cert_pem, &cert.key_pem);
        s
    }

    pub fn write(&mut self, cert_pem: &str, key_pem: &str) {
        marin3r_testkit::secret_volume::write(
            self.dir.path(),
            &[("tls.crt", cert_pem), ("tls.key", key_pem)],
        )
        .unwrap();
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

/// A running server, stopped when dropped.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub async fn start(config: WebhookServerConfig) -> Self {
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

    pub async fn stop(mut self) {
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

pub fn config(dir: &SecretDir) -> WebhookServerConfig {
    WebhookServerConfig {
        reload_interval: Duration::from_millis(50),
        ..WebhookServerConfig::new(dir.cert(), dir.key())
    }
}

pub struct Client {
    pub send: SendRequest<Full<Bytes>>,
    pub peer_serial: String,
}

pub async fn connect(
    addr: SocketAddr,
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Client {
    connect_from(None, addr, ca_pem, versions).await
}

/// [`connect`] from the loopback address `from` (any of 127.0.0.0/8), so a test can be
/// several clients by address.
pub async fn connect_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    ca_pem: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Client {
    let stream = TlsClient::with_versions(ca_pem, HOST, &[], versions)
        .unwrap()
        .connect(from, addr)
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
    pub async fn request(&mut self, method: &str, path: &str, body: Vec<u8>) -> (u16, Vec<u8>) {
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

    pub async fn review(&mut self, body: &Value) -> Value {
        let (status, out) = self
            .request("POST", "/pod-v1-mutate", body.to_string().into_bytes())
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
        serde_json::from_slice(&out).unwrap()
    }
}

/// A pod as the API server sends it for a Deployment's ReplicaSet: no name yet, owner,
/// service-account token volume, defaults filled in.
pub fn real_looking_pod() -> Value {
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

pub fn admission_review(uid: &str, pod: &Value) -> Value {
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

pub fn apply(pod: &Value, response: &Value) -> Value {
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

/// A TLS stream to the server trusting only `ca_pem`, offering `alpn`: for clients that
/// misbehave below HTTP.
pub async fn tls_stream(
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    try_tls_stream(None, addr, ca_pem, alpn).await.unwrap()
}

/// [`tls_stream`] from the loopback address `from`; an error when the server closes the
/// connection before the handshake ends.
pub async fn try_tls_stream(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    ca_pem: &str,
    alpn: &[&[u8]],
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    TlsClient::new(ca_pem, HOST, alpn)
        .unwrap()
        .connect(from, addr)
        .await
}

/// An HTTP/2 connection as the API server opens them (it speaks HTTP/2 to webhooks), from the
/// loopback address `from`.
pub type H2 = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

pub async fn h2_client(from: std::net::IpAddr, addr: SocketAddr, ca_pem: &str) -> H2 {
    let stream = TlsClient::new(ca_pem, HOST, &[b"h2"])
        .unwrap()
        .connect(Some(from), addr)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// POSTs `body` to `path` on an HTTP/2 connection: the status and the body read as JSON
/// (`Value::Null` when it is not JSON); an error when the connection failed.
pub async fn h2_post(send: &H2, path: &str, body: &Value) -> Result<(u16, Value), hyper::Error> {
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("https://{HOST}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = send.clone().send_request(req).await?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// An EnvoyConfig AdmissionReview (CREATE in `namespace`) with `uid`.
pub fn envoy_config_review(uid: &str, namespace: &str) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "operation": "CREATE", "namespace": namespace,
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "userInfo": {"username": format!("system:serviceaccount:{namespace}:deployer")},
            "object": {"metadata": {"name": "ec", "namespace": namespace}, "spec": {"nodeID": "proxy"}},
        }
    })
}
