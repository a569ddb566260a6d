//! Clients of the admission webhook's HTTPS server, well-behaved and not: TLS from a chosen
//! loopback address (so one process can be several clients by address), and HTTP/2
//! connections holding requests whose bodies never end. The webhook's own
//! tests and the `abuse` benchmark share them.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::Context as _;
use bytes::Bytes;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A TCP connection to `addr` from the loopback address `from` (any of 127.0.0.0/8), or from
/// the kernel's choice.
pub async fn tcp_from(from: Option<IpAddr>, addr: SocketAddr) -> io::Result<TcpStream> {
    let Some(from) = from else {
        return TcpStream::connect(addr).await;
    };
    let socket = match from {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// What a client trusts and the name it expects, built once and used for many connections.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl TlsClient {
    /// Trusts only `ca_pem`, expects `host`, offers `alpn` (none: no ALPN) and rustls's safe
    /// default protocol versions.
    pub fn new(ca_pem: &str, host: &str, alpn: &[&[u8]]) -> anyhow::Result<Self> {
        Self::with_versions(ca_pem, host, alpn, rustls::DEFAULT_VERSIONS)
    }

    /// [`Self::new`] offering only `versions`.
    pub fn with_versions(
        ca_pem: &str,
        host: &str,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.context("reading the CA certificate")?)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: ServerName::try_from(host.to_owned())?,
        })
    }

    /// A TLS connection to `addr` from `from`; an error when the server closes it before the
    /// handshake ends.
    pub async fn connect(
        &self,
        from: Option<IpAddr>,
        addr: SocketAddr,
    ) -> io::Result<TlsStream<TcpStream>> {
        let tcp = tcp_from(from, addr).await?;
        tcp.set_nodelay(true)?;
        self.connector.connect(self.server_name.clone(), tcp).await
    }
}

/// A request body that sends its first bytes and then nothing, ever: it holds its request
/// open until the server gives up on it.
pub struct Trickle(Option<Bytes>);

impl Trickle {
    pub fn new(first: &'static [u8]) -> Self {
        Self(Some(Bytes::from_static(first)))
    }
}

impl hyper::body::Body for Trickle {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(first) => Poll::Ready(Some(Ok(Frame::data(first)))),
            None => Poll::Pending,
        }
    }
}

/// One HTTP/2 connection's request sender, for bodies that never end.
pub type SlowH2 = hyper::client::conn::http2::SendRequest<Trickle>;

/// An HTTP/2 connection to `addr` from `from` (the client must offer `h2`); its connection
/// task runs on the current runtime until the server closes it.
pub async fn h2_from(
    tls: &TlsClient,
    from: Option<IpAddr>,
    addr: SocketAddr,
) -> anyhow::Result<SlowH2> {
    let stream = tls.connect(from, addr).await?;
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(send)
}

/// Starts an AdmissionReview POST to `https://{host}/pod-v1-mutate` that announces 100,000
/// bytes and sends 14; the task yields the response status, if one comes.
pub fn slow_review(send: &mut SlowH2, host: &str) -> tokio::task::JoinHandle<Option<u16>> {
    let request = hyper::Request::builder()
        .method("POST")
        .uri(format!("https://{host}/pod-v1-mutate"))
        .header("content-type", "application/json")
        .header("content-length", "100000")
        .body(Trickle::new(b"{\"apiVersion\":"));
    let response = request.map(|r| send.send_request(r));
    tokio::spawn(async move {
        match response {
            Ok(response) => response.await.ok().map(|r| r.status().as_u16()),
            Err(_) => None,
        }
    })
}
