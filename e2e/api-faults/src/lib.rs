//! A fault-injecting proxy in front of a real Kubernetes API server.
//!
//! The components a test runs (controllers in the test process, `marin3r` child processes)
//! talk to the API server through an [`Endpoint`] of a [`FaultProxy`]; the test's own client
//! talks to the API server directly. The test switches [`Faults`] on and off while they run:
//! errors for the next requests (409, 500, a 410 inside a watch), every open watch ended,
//! requests delayed, held until released or never answered, paths refused. Everything else is
//! passed to the real API server as it came, with the admin credentials of the upstream
//! configuration, or with the client's own bearer token when it sent one (so the real RBAC
//! applies to it).
//!
//! Each endpoint is a loopback port with a name, the `user` the per-client rules
//! ([`Faults::fail_next_for`], [`Faults::hold_for`]) match: the proxy cannot authenticate
//! anyone itself. A pod endpoint ([`FaultProxy::pod_endpoint`]) serves a cluster's pods
//! instead, over TLS with a certificate their service account's `ca.crt` trusts, and names
//! each request's user after the service account its token was issued to.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's; the
// scenarios, benchmarks and test helpers may run past it.
#![allow(clippy::too_many_lines)]

mod faults;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use faults::FaultedRequest;
pub use faults::{FaultScope, Faults};

/// The largest request body passed on (the API server's own limit is 3 MiB per object).
const MAX_REQUEST_BYTES: usize = 8 << 20;
/// Most upstream clients kept for distinct bearer tokens.
const MAX_TOKEN_CLIENTS: usize = 64;

type Error = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = UnsyncBoxBody<Bytes, Error>;

/// The proxy: its rules, its upstream clients, and the endpoints it listens on. Dropping it
/// closes every endpoint and every connection through it.
pub struct FaultProxy {
    inner: Arc<Inner>,
    listeners: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    faults: Arc<Faults>,
    upstream: kube::Config,
    /// The client for requests without a bearer token: the upstream configuration's own.
    admin: kube::Client,
    /// Clients for the bearer tokens clients sent, by token.
    by_token: Mutex<BTreeMap<String, kube::Client>>,
}

/// One named way into the proxy: a loopback port whose requests count as `user`'s, and the
/// log of what its clients asked.
#[derive(Debug, Clone)]
pub struct Endpoint {
    url: String,
    user: String,
    log: RequestLog,
}

/// The request lines (`METHOD path?query`) an endpoint received, in arrival order (faulted
/// ones included): the API server keeps no log a test can read, and a child process's
/// requests can only be seen on the wire. At most [`MAX_LOGGED`] are kept.
#[derive(Debug, Clone, Default)]
struct RequestLog(Arc<Mutex<Vec<String>>>);

/// Most request lines an endpoint keeps.
pub const MAX_LOGGED: usize = 1_000_000;

impl RequestLog {
    fn record(&self, method: &Method, uri: &http::Uri) {
        let target = uri
            .path_and_query()
            .map_or_else(|| uri.path(), http::uri::PathAndQuery::as_str);
        let mut log = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if log.len() < MAX_LOGGED {
            log.push(format!("{method} {target}"));
        }
    }
}

impl FaultProxy {
    /// A proxy to the API server `upstream` names, with no endpoint yet and no fault on.
    pub async fn start(mut upstream: kube::Config) -> anyhow::Result<Self> {
        // The client decides what to retry; a watch may stay quiet for minutes.
        upstream.default_retry = false;
        upstream.read_timeout = None;
        let admin = kube::Client::try_from(upstream.clone())
            .context("building the proxy's client of the API server")?;
        Ok(Self {
            inner: Arc::new(Inner {
                faults: Arc::new(Faults::default()),
                upstream,
                admin,
                by_token: Mutex::new(BTreeMap::new()),
            }),
            listeners: Mutex::new(Vec::new()),
        })
    }

    /// The rules every endpoint of this proxy applies.
    pub fn faults(&self) -> Arc<Faults> {
        self.inner.faults.clone()
    }

    /// A new endpoint on a free loopback port, whose requests count as `user`'s.
    pub async fn endpoint(&self, user: &str) -> anyhow::Result<Endpoint> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the proxy's endpoint")?;
        let addr = listener.local_addr()?;
        let log = RequestLog::default();
        let task = tokio::spawn(serve(
            listener,
            self.inner.clone(),
            user.to_owned(),
            log.clone(),
        ));
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(task);
        Ok(Endpoint {
            url: format!("http://{addr}"),
            user: user.to_owned(),
            log,
        })
    }
}

impl FaultProxy {
    /// An endpoint for a cluster's pods on `bind` (an address they reach, e.g. the node's),
    /// serving HTTPS with `cert_pem`/`key_pem` (a certificate for the names they call the API
    /// server by, signed by the CA of their service account's `ca.crt`: the API server's own
    /// serving certificate will do). A request's user is the subject of its bearer token
    /// (`system:serviceaccount:<namespace>:<name>`; `unknown` without one), read, not
    /// verified: the API server verifies it. Returns the address it listens on.
    pub async fn pod_endpoint(
        &self,
        bind: SocketAddr,
        cert_pem: &str,
        key_pem: &str,
    ) -> anyhow::Result<SocketAddr> {
        let certs = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("reading the pod endpoint's certificate")?;
        let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
            .context("reading the pod endpoint's key")?
            .context("no key in the pod endpoint's key PEM")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .context("the pod endpoint's certificate and key")?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding the pod endpoint on {bind}"))?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(serve_pods(listener, acceptor, self.inner.clone()));
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(task);
        Ok(addr)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        for task in self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

impl Endpoint {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on, for a test that connects by hand.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.url.strip_prefix("http://")?.parse().ok()
    }

    /// The request lines (`METHOD path?query`) this endpoint received so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.log
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The name the rules match this endpoint's requests with.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// A client configuration for this endpoint, with no credentials of its own: the proxy
    /// sends its requests with the upstream's admin credentials.
    pub fn config(&self) -> kube::Config {
        let url = self
            .url
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1"));
        kube::Config::new(url)
    }

    /// A client of this endpoint ([`Endpoint::config`]).
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        kube::Client::try_from(self.config()).context("building a client of the fault proxy")
    }

    /// A kubeconfig (YAML) for a child process naming this endpoint; with `token`, its
    /// requests carry it and the API server authenticates them as that token's owner.
    pub fn kubeconfig(&self, token: Option<&str>) -> String {
        let user = match token {
            Some(token) => serde_json::json!({ "token": token }),
            None => serde_json::json!({}),
        };
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "faults", "cluster": {"server": self.url}}],
            "users": [{"name": self.user, "user": user}],
            "contexts": [{"name": "faults", "context": {"cluster": "faults", "user": self.user}}],
            "current-context": "faults",
        });
        // JSON is YAML.
        config.to_string()
    }
}

/// Accepts connections on one endpoint until the proxy drops (which aborts this task, and
/// with it the connections' tasks).
async fn serve(listener: TcpListener, inner: Arc<Inner>, user: String, log: RequestLog) {
    let mut connections = JoinSet::new();
    loop {
        let Some(stream) = accept(&listener).await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        connections.spawn(serve_connection(
            TokioIo::new(stream),
            inner.clone(),
            Some(user.clone()),
            Some(log.clone()),
        ));
    }
}

/// [`serve`] for a pod endpoint: TLS, and each request's user read from its token.
async fn serve_pods(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, inner: Arc<Inner>) {
    let mut connections = JoinSet::new();
    loop {
        let Some(stream) = accept(&listener).await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        let (acceptor, inner) = (acceptor.clone(), inner.clone());
        connections.spawn(async move {
            let handshake =
                tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(stream));
            match handshake.await {
                Ok(Ok(tls)) => serve_connection(TokioIo::new(tls), inner, None, None).await,
                Ok(Err(err)) => tracing::debug!(%err, "a pod's TLS handshake failed"),
                Err(_) => tracing::debug!("a pod's TLS handshake timed out"),
            }
        });
    }
}

async fn accept(listener: &TcpListener) -> Option<tokio::net::TcpStream> {
    match listener.accept().await {
        Ok((stream, _)) => Some(stream),
        Err(err) => {
            tracing::warn!(%err, "the fault proxy could not accept a connection");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            None
        }
    }
}

/// Serves one client connection; `user` is the endpoint's, or `None` to read each request's
/// from its token; each request is written into `log`, when there is one.
async fn serve_connection<IO>(
    io: IO,
    inner: Arc<Inner>,
    user: Option<String>,
    log: Option<RequestLog>,
) where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        if let Some(log) = &log {
            log.record(req.method(), req.uri());
        }
        let inner = inner.clone();
        let user = user
            .clone()
            .unwrap_or_else(|| token_subject(bearer_token(req.headers())));
        async move { Ok::<_, Infallible>(handle(&inner, &user, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

/// The `sub` claim of a JWT bearer token (a service account's:
/// `system:serviceaccount:<namespace>:<name>`), or `unknown`.
fn token_subject(token: Option<&str>) -> String {
    use base64::Engine as _;
    let subject = || {
        let payload = token?.split('.').nth(1)?;
        let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .ok()?;
        let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
        claims.get("sub")?.as_str().map(str::to_owned)
    };
    subject().unwrap_or_else(|| "unknown".to_owned())
}

/// What the rules need to know of a request.
#[derive(Debug, PartialEq, Eq)]
struct Kind {
    /// The resource's plural name; `None` for discovery and anything that is no resource.
    resource: Option<String>,
    is_watch: bool,
    is_write: bool,
}

fn classify(method: &Method, path: &str, query: Option<&str>) -> Kind {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => &[],
    };
    // The legacy `/watch/` form: /api/v1/watch/namespaces/a/pods.
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let resource = match rest {
        ["namespaces", _, resource, ..] => Some(*resource),
        [resource, ..] => Some(*resource),
        [] => None,
    };
    let is_watch = legacy_watch
        || query.is_some_and(|q| {
            q.split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
        });
    let is_write = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    Kind {
        resource: resource.map(str::to_owned),
        is_watch,
        is_write,
    }
}

async fn handle(inner: &Inner, user: &str, req: Request<Incoming>) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let kind = classify(req.method(), &path, req.uri().query());
    let faults = &inner.faults;
    faults.wait_if_held(&path, user).await;
    if let Some(delay) = kind
        .resource
        .as_deref()
        .and_then(|r| faults.request_delay(r))
    {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = faults.denied(&path) {
        return status_response(code);
    }
    if kind.resource.is_some()
        && let Some(code) = faults.take(&FaultedRequest {
            is_watch: kind.is_watch,
            is_write: kind.is_write,
            user,
        })
    {
        return if kind.is_watch && code == 410 {
            expired_watch()
        } else {
            status_response(code)
        };
    }
    match forward(inner, req, kind.is_watch).await {
        Ok(response) => response,
        Err(err) => {
            tracing::warn!(%path, err = format!("{err:#}"), "the fault proxy could not pass a request on");
            text_response(StatusCode::BAD_GATEWAY, format!("fault proxy: {err:#}"))
        }
    }
}

/// Passes the request to the API server and streams its answer back; a watch's answer ends
/// early when [`Faults::drop_watches`] is called.
async fn forward(
    inner: &Inner,
    req: Request<Incoming>,
    is_watch: bool,
) -> anyhow::Result<Response<ProxyBody>> {
    let (parts, body) = req.into_parts();
    let client = match bearer_token(&parts.headers) {
        Some(token) => inner.client_for(token)?,
        None => inner.admin.clone(),
    };
    let body = Limited::new(body, MAX_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|err| anyhow::anyhow!("reading the request body: {err}"))?
        .to_bytes();
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut upstream = Request::builder().method(parts.method.clone()).uri(target);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) && *name != header::AUTHORIZATION && *name != header::HOST {
            upstream = upstream.header(name, value);
        }
    }
    let upstream = upstream.body(kube::client::Body::from(body.to_vec()))?;
    let response = client
        .send(upstream)
        .await
        .context("the API server did not answer")?;
    let (mut parts, body) = response.into_parts();
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) && *name != header::CONTENT_LENGTH {
            headers.append(name, value.clone());
        }
    }
    parts.headers = headers;
    let body: ProxyBody = if is_watch {
        let mut generation = inner.faults.watch_generation();
        generation.mark_unchanged();
        let frames = until_dropped(body, generation);
        UnsyncBoxBody::new(StreamBody::new(frames))
    } else {
        body.map_err(|err| Box::new(err) as Error).boxed_unsync()
    };
    Ok(Response::from_parts(parts, body))
}

/// The frames of `body` until it ends or the watch generation changes.
fn until_dropped(
    body: kube::client::Body,
    generation: tokio::sync::watch::Receiver<u64>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Error>> + Send {
    futures::stream::unfold(
        (body, generation, false),
        |(mut body, mut generation, ended)| async move {
            if ended {
                return None;
            }
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => Some((Ok(frame), (body, generation, false))),
                    Some(Err(err)) => Some((Err(Box::new(err) as Error), (body, generation, true))),
                    None => None,
                },
                _ = generation.changed() => None,
            }
        },
    )
}

impl Inner {
    /// The upstream client that sends `token` (and no client certificate, which the API
    /// server would authenticate first).
    fn client_for(&self, token: &str) -> anyhow::Result<kube::Client> {
        let mut clients = self.by_token.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(token) {
            return Ok(client.clone());
        }
        let mut config = self.upstream.clone();
        config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))
            .context("a bearer token the client sent")?;
        let client = kube::Client::try_from(config)
            .context("building the proxy's client for a bearer token")?;
        if clients.len() >= MAX_TOKEN_CLIENTS {
            clients.pop_first();
        }
        clients.insert(token.to_owned(), client.clone());
        Ok(client)
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn hop_by_hop(name: &header::HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// The API server's `Status` object for an injected error `code`.
fn status_object(code: u16) -> serde_json::Value {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    };
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("injected by the fault proxy: {code} {reason}"),
        "reason": reason,
        "code": code,
    })
}

fn status_response(code: u16) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &status_object(code))
}

/// What the API server sends a watch from a resource version it no longer has: a 200 whose
/// only event is an ERROR carrying a 410 Status.
fn expired_watch() -> Response<ProxyBody> {
    let event = serde_json::json!({"type": "ERROR", "object": status_object(410)});
    json_response(StatusCode::OK, &event)
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut body = value.to_string().into_bytes();
    body.push(b'\n');
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn text_response(status: StatusCode, text: String) -> Response<ProxyBody> {
    let mut response = Response::new(full(text.into_bytes()));
    *response.status_mut() = status;
    response
}

fn full(bytes: Vec<u8>) -> ProxyBody {
    Full::new(Bytes::from(bytes))
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classified_by_resource_watch_and_write() {
        let get = Method::GET;
        let kind = |m: &Method, p: &str, q: Option<&str>| classify(m, p, q);
        assert_eq!(kind(&get, "/api", None).resource, None);
        assert_eq!(kind(&get, "/api/v1", None).resource, None);
        assert_eq!(
            kind(&get, "/apis/coordination.k8s.io/v1", None).resource,
            None
        );
        assert_eq!(kind(&get, "/version", None).resource, None);
        let lease = kind(
            &Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            None,
        );
        assert_eq!(lease.resource.as_deref(), Some("leases"));
        assert!(lease.is_write && !lease.is_watch);
        let watch = kind(
            &get,
            "/apis/marin3r.3scale.net/v1alpha1/envoyconfigs",
            Some("allowWatchBookmarks=true&watch=true&resourceVersion=5"),
        );
        assert_eq!(watch.resource.as_deref(), Some("envoyconfigs"));
        assert!(watch.is_watch && !watch.is_write);
        let legacy = kind(&get, "/api/v1/watch/namespaces/a/pods", None);
        assert_eq!(legacy.resource.as_deref(), Some("pods"));
        assert!(legacy.is_watch);
        assert_eq!(
            kind(&get, "/api/v1/namespaces/a", None).resource.as_deref(),
            Some("namespaces")
        );
        assert_eq!(
            kind(
                &Method::PATCH,
                "/api/v1/namespaces/a/secrets/s/status",
                None
            )
            .resource
            .as_deref(),
            Some("secrets")
        );
        assert!(!kind(&get, "/api/v1/pods", Some("watchers=true")).is_watch);
    }

    #[test]
    fn a_tokens_subject_names_its_user() {
        use base64::Engine as _;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sub":"system:serviceaccount:ops:operator","aud":["x"]}"#);
        let token = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln");
        assert_eq!(
            token_subject(Some(&token)),
            "system:serviceaccount:ops:operator"
        );
        assert_eq!(token_subject(Some("not-a-jwt")), "unknown");
        assert_eq!(token_subject(None), "unknown");
    }

    #[test]
    fn a_kubeconfig_names_the_endpoint_and_carries_the_token() {
        let endpoint = Endpoint {
            url: "http://127.0.0.1:1234".into(),
            user: "operator".into(),
            log: RequestLog::default(),
        };
        let parsed = kube::config::Kubeconfig::from_yaml(&endpoint.kubeconfig(Some("t0k")))
            .expect("a kubeconfig");
        let cluster = parsed.clusters[0].cluster.as_ref().expect("a cluster");
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:1234"));
        assert_eq!(parsed.current_context.as_deref(), Some("faults"));
        let yaml = endpoint.kubeconfig(None);
        assert!(!yaml.contains("token"), "{yaml}");
    }
}
