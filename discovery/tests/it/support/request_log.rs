//! What a component asked of the API server: a loopback HTTP forwarder in front of the fault
//! proxy's endpoint that writes down each request line (`METHOD path?query`) and passes it on
//! unchanged, streaming the answer back (watches included). The real API server keeps no log
//! a test can read, and a child process's requests can only be seen on the wire.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type Body = UnsyncBoxBody<Bytes, hyper::Error>;

/// The requests seen, in arrival order; at most a million.
#[derive(Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<String>>>);

impl RequestLog {
    const LIMIT: usize = 1_000_000;

    pub fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn record(&self, line: String) {
        let mut log = self.0.lock().unwrap();
        assert!(
            log.len() < Self::LIMIT,
            "more than {} requests",
            Self::LIMIT
        );
        log.push(line);
    }
}

/// A forwarder to `upstream` (an `http://` URL) on a free loopback port, serving on the
/// current runtime until it shuts down; its `http://` URL and its log.
pub async fn forwarder(upstream: &str) -> (String, RequestLog) {
    let upstream: SocketAddr = upstream
        .strip_prefix("http://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("{upstream} is not http://<loopback address>"));
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let log = RequestLog::default();
    let recorder = log.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = recorder.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let log = log.clone();
                    async move { Ok::<_, Infallible>(forward(upstream, &log, request).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, log)
}

/// Writes the request down and sends it on over a connection of its own (a watch keeps
/// its connection for as long as it streams).
async fn forward(
    upstream: SocketAddr,
    log: &RequestLog,
    request: Request<Incoming>,
) -> Response<Body> {
    let uri = request.uri();
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    log.record(format!("{} {target}", request.method()));
    let answer = async {
        let stream = TcpStream::connect(upstream).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let (mut parts, body) = request.into_parts();
        parts.uri = target.parse()?;
        let response = sender
            .send_request(Request::from_parts(parts, body))
            .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response.map(BodyExt::boxed_unsync))
    };
    answer.await.unwrap_or_else(|e| {
        let mut response = Response::new(
            Full::new(Bytes::from(format!("forwarding failed: {e}")))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    })
}
