//! Mutual TLS for the xDS port: the rustls server configuration read from files, and the
//! accept loop that completes each handshake in its own task, takes the proxy's namespace
//! from its client certificate's SPIFFE URI and hands the connection to tonic with that
//! identity attached.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use marin3r_certs::reload::{Build, ReadError, Reloading};
use marin3r_certs::{CertificateInfo, SubjectAltName, TRUST_DOMAIN, spiffe_parts};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::limits::{ConnectionSlot, NamespaceConnections};
use super::metrics::{Metrics, RefusalReason};

/// The server certificate, its key and the CA that signs client certificates, as files (a
/// Kubernetes TLS Secret mounted as a volume: `tls.crt`, `tls.key`, `ca.crt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TlsFiles {
    fn paths(&self) -> [PathBuf; 3] {
        [self.cert.clone(), self.key.clone(), self.ca.clone()]
    }

    /// The files of a TLS Secret mounted at `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            ca: dir.join("ca.crt"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            message: format!("not a PEM certificate bundle: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            message: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Builds the server side of mutual TLS: TLS 1.2 or 1.3, ring, HTTP/2 by ALPN, and a client
/// certificate signed by the CA required on every connection.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    Ok(ReloadingConfig::load(files.paths(), build(files))?.current())
}

/// The server configuration built from the content of the three files.
fn build(files: &TlsFiles) -> Build<ServerConfig, TlsError, 3> {
    let files = files.clone();
    Box::new(move |[cert, key, ca]| config_from_pem(&files, cert, key, ca))
}

fn config_from_pem(
    files: &TlsFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs(&files.cert, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        message: format!("no usable private key: {e}"),
    })?;
    let mut roots = RootCertStore::empty();
    for ca in certs(&files.ca, ca_pem)? {
        roots.add(ca).map_err(|e| TlsError::Pem {
            path: files.ca.clone(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("server certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The server configuration, re-read from its three files while the server runs.
type ReloadingConfig = Reloading<ServerConfig, TlsError, 3>;

/// Where the server's TLS configuration comes from.
#[derive(Debug, Clone)]
pub enum TlsSource {
    /// A fixed configuration.
    Static(Arc<ServerConfig>),
    /// Files, re-read every `interval`: a renewed server certificate or CA (a Secret update
    /// swapped into the mounted folder) is used for new connections without a restart.
    Files { files: TlsFiles, interval: Duration },
}

impl From<Arc<ServerConfig>> for TlsSource {
    fn from(config: Arc<ServerConfig>) -> Self {
        Self::Static(config)
    }
}

impl From<TlsFiles> for TlsSource {
    fn from(files: TlsFiles) -> Self {
        Self::Files {
            files,
            interval: Duration::from_secs(10),
        }
    }
}

/// The configuration new connections are accepted with.
#[derive(Debug, Clone)]
pub enum ServerTls {
    Static(Arc<ServerConfig>),
    Reloading(Arc<ReloadingConfig>),
}

impl ServerTls {
    fn current(&self) -> Arc<ServerConfig> {
        match self {
            Self::Static(config) => config.clone(),
            Self::Reloading(files) => files.current(),
        }
    }
}

impl TlsSource {
    /// The current configuration, kept up to date by a task (for files) until `stop`.
    pub(crate) fn watch(self, stop: CancellationToken) -> Result<ServerTls, TlsError> {
        let (files, interval) = match self {
            Self::Static(config) => return Ok(ServerTls::Static(config)),
            Self::Files { files, interval } => (files, interval),
        };
        let reloading = Arc::new(ReloadingConfig::load(files.paths(), build(&files))?);
        tokio::spawn(
            reloading
                .clone()
                .watch(interval, async move { stop.cancelled().await }),
        );
        Ok(ServerTls::Reloading(reloading))
    }
}

/// Who is on the other end of a connection, as proven by its client certificate.
#[derive(Debug, Clone)]
pub struct PeerIdentity {
    pub namespace: Arc<str>,
    pub remote_addr: SocketAddr,
    /// The ADS streams open on this connection.
    pub(crate) streams: crate::limits::ConnectionStreams,
}

/// The namespace a verified client certificate speaks for: its SPIFFE URI SAN in our trust
/// domain ([`TRUST_DOMAIN`]). A certificate naming two namespaces, or none, speaks for none.
pub fn namespace_of(cert_der: &[u8]) -> Option<String> {
    let info = CertificateInfo::from_der(cert_der).ok()?;
    let mut namespaces = info.sans.iter().filter_map(|san| match san {
        SubjectAltName::Uri(uri) => spiffe_parts(uri),
        _ => None,
    });
    let (domain, namespace) = namespaces.next()?;
    let alone = namespaces.all(|other| other == (domain, namespace));
    (domain == TRUST_DOMAIN && alone).then(|| namespace.to_owned())
}

/// An accepted, authenticated connection.
pub struct TlsConn {
    io: TlsStream<TcpStream>,
    peer: PeerIdentity,
    /// Its place in its namespace's connections, given back when it closes.
    _slot: Option<ConnectionSlot>,
}

/// How many authenticated connections each namespace may have open at once.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionLimit {
    pub open: Arc<NamespaceConnections>,
    pub max_per_namespace: usize,
}

impl ConnectionLimit {
    /// Gives `conn` a place in its namespace's count, or counts and logs its refusal (the
    /// caller drops it, which closes it).
    fn admit(&self, mut conn: TlsConn, metrics: &Metrics) -> Option<TlsConn> {
        let Some(slot) = self.open.open(&conn.peer.namespace, self.max_per_namespace) else {
            metrics.refused(RefusalReason::ConnectionsPerNamespace);
            warn!(
                namespace = %conn.peer.namespace,
                remote_addr = %conn.peer.remote_addr,
                max = self.max_per_namespace,
                "xDS connection refused: its namespace has too many connections open \
                 (--xds-max-connections-per-namespace)"
            );
            return None;
        };
        conn._slot = Some(slot);
        Some(conn)
    }
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerIdentity;

    fn connect_info(&self) -> PeerIdentity {
        self.peer.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until `stop` is cancelled, handshaking each in its own task (a slow
/// client never holds up the others) and sending the authenticated ones its namespace has
/// room for to `out`.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    (config, limit): (ServerTls, ConnectionLimit),
    metrics: Metrics,
    out: mpsc::Sender<Result<TlsConn, io::Error>>,
    stop: CancellationToken,
) {
    loop {
        let (tcp, remote_addr) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Running out of file descriptors and the like: back off, keep serving.
                    warn!(error = %e, "xDS accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(config.current());
        let metrics = metrics.clone();
        let (out, limit) = (out.clone(), limit.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
            let conn = tokio::select! {
                () = stop.cancelled() => return,
                r = handshake => r,
            };
            match authenticate(conn, remote_addr) {
                Ok(conn) => {
                    if let Some(conn) = limit.admit(conn, &metrics) {
                        let _ = out.send(Ok(conn)).await;
                    }
                }
                Err(reason) => metrics.refused(reason),
            }
        });
    }
}

fn authenticate(
    conn: Result<io::Result<TlsStream<TcpStream>>, tokio::time::error::Elapsed>,
    remote_addr: SocketAddr,
) -> Result<TlsConn, RefusalReason> {
    let io = match conn {
        Err(_) => {
            warn!(%remote_addr, "xDS connection refused: TLS handshake timed out");
            return Err(RefusalReason::Handshake);
        }
        Ok(Err(e)) => {
            let reason = match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                Some(rustls::Error::NoCertificatesPresented) => RefusalReason::NoClientCertificate,
                Some(rustls::Error::InvalidCertificate(_)) => {
                    RefusalReason::UntrustedClientCertificate
                }
                _ => RefusalReason::Handshake,
            };
            warn!(%remote_addr, error = %e, ?reason, "xDS connection refused: TLS handshake failed");
            return Err(reason);
        }
        Ok(Ok(io)) => io,
    };
    let leaf = io
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first());
    let Some(namespace) = leaf.and_then(|c| namespace_of(c)) else {
        warn!(
            %remote_addr,
            trust_domain = TRUST_DOMAIN,
            "xDS connection refused: the client certificate has no URI SAN \
             spiffe://<trust domain>/ns/<namespace> in our trust domain naming the proxy's \
             namespace (exactly one)"
        );
        return Err(RefusalReason::NoNamespaceIdentity);
    };
    debug!(%remote_addr, %namespace, "xDS connection authenticated");
    Ok(TlsConn {
        io,
        peer: PeerIdentity {
            namespace: namespace.into(),
            remote_addr,
            streams: Default::default(),
        },
        _slot: None,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use marin3r_certs::{
        CertificateAuthority, CertificateRequest, Usage, issue_self_signed, spiffe_id,
    };

    use super::*;

    #[test]
    fn namespace_comes_from_the_spiffe_uri_only() {
        let ca =
            issue_self_signed(&CertificateRequest::ca("ca", Duration::from_secs(3600))).unwrap();
        let ca = CertificateAuthority::from_issued(&ca).unwrap();
        let der = |hosts: Vec<String>| {
            let c = ca
                .issue(
                    &CertificateRequest::new("envoy", Usage::Client, Duration::from_secs(60))
                        .with_hosts(hosts),
                )
                .unwrap();
            CertificateInfo::from_pem(&c.cert_pem).unwrap().der
        };
        let good = der(vec![
            "envoy.example".into(),
            spiffe_id("cluster.local", "team-a"),
        ]);
        assert_eq!(namespace_of(&good).as_deref(), Some("team-a"));
        assert_eq!(namespace_of(&der(vec!["team-a".into()])), None);
        assert_eq!(
            namespace_of(&der(vec!["spiffe://cluster.local/sa/team-a".into()])),
            None
        );
        assert_eq!(namespace_of(b"not a certificate"), None);
        // another trust domain, or two namespaces, is no identity.
        assert_eq!(
            namespace_of(&der(vec![spiffe_id("evil.example", "team-a")])),
            None
        );
        assert_eq!(
            namespace_of(&der(vec![
                spiffe_id("cluster.local", "team-a"),
                spiffe_id("cluster.local", "team-b"),
            ])),
            None
        );
    }

    /// During a CA rotation `ca.crt` holds the previous and the next CA: a client
    /// certificate of either completes the handshake, one of any other CA does not.
    #[tokio::test]
    async fn a_ca_bundle_admits_clients_of_every_ca_in_it() {
        let ca = |name: &str| {
            let issued =
                issue_self_signed(&CertificateRequest::ca(name, Duration::from_secs(3600)))
                    .unwrap();
            (
                issued.cert_pem.clone(),
                CertificateAuthority::from_issued(&issued).unwrap(),
            )
        };
        let ((old_pem, old), (next_pem, next), (_, other)) = (ca("old"), ca("next"), ca("other"));
        let server = old
            .issue(
                &CertificateRequest::new("xds", Usage::Server, Duration::from_secs(60))
                    .with_hosts(["localhost"]),
            )
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles::in_dir(dir.path());
        std::fs::write(&files.cert, &server.cert_pem).unwrap();
        std::fs::write(&files.key, &server.key_pem).unwrap();
        std::fs::write(&files.ca, format!("{next_pem}{old_pem}")).unwrap();
        let acceptor = TlsAcceptor::from(server_config(&files).unwrap());
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(old_pem.as_bytes()).unwrap())
            .unwrap();
        let roots = Arc::new(roots);
        for (signer, trusted) in [(&old, true), (&next, true), (&other, false)] {
            let client = signer
                .issue(
                    &CertificateRequest::new("envoy", Usage::Client, Duration::from_secs(60))
                        .with_hosts([spiffe_id("cluster.local", "a")]),
                )
                .unwrap();
            let chain = vec![CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).unwrap();
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain, key)
            .unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let dial = tokio::spawn(async move {
                let tcp = TcpStream::connect(addr).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                connector.connect(name, tcp).await.map(drop)
            });
            let (tcp, _) = listener.accept().await.unwrap();
            let accepted = acceptor.accept(tcp).await;
            assert_eq!(accepted.is_ok(), trusted, "{:?}", accepted.err());
            let _ = dial.await.unwrap();
        }
    }

    #[test]
    fn bad_files_are_named_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles::in_dir(dir.path());
        let err = server_config(&files).unwrap_err().to_string();
        assert!(err.contains("tls.crt"), "{err}");
        std::fs::write(&files.cert, "garbage").unwrap();
        let err = server_config(&files).unwrap_err().to_string();
        assert!(err.contains("reading") && err.contains("tls.key"), "{err}");
        std::fs::write(&files.key, "garbage").unwrap();
        std::fs::write(&files.ca, "garbage").unwrap();
        let err = server_config(&files).unwrap_err().to_string();
        assert!(
            err.contains("tls.crt") && err.contains("no CERTIFICATE"),
            "{err}"
        );
    }
}
