//! The HTTPS server: `/pod-v1-mutate` (sidecar injection), the EnvoyConfig validation path
//! (both AdmissionReview v1) and `/healthz`, TLS 1.2+ with a
//! certificate reloaded from disk, bounded bodies, bounded connections, graceful shutdown.
//!
//! Slow or idle clients must never stall admissions (`failurePolicy: Fail` would then block pod
//! creation): bodies and headers have deadlines, a review permit is taken only once its body is
//! read, and idle connections give their slot up after a timeout or as soon as a new connection
//! waits for one. Pod injections and EnvoyConfig validations have capacities of their own, and
//! validations take turns by namespace ([`crate::validate_turns`]): every admission comes from
//! the API server's one address, so a tenant flooding slow validations must not hold up
//! another tenant's pods or configs.

use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::clients::Clients;
use crate::config::InjectionConfig;
use crate::conn::{Conn, ConnLimits, Peer, Slot};
use crate::metrics::{
    BAD_REQUEST, ENVOY_CONFIG_VALIDATION, Refusal, SIDECAR_INJECTION, THROTTLED, WebhookMetrics,
};
use crate::review::{BadRequest, Outcome, review};
use crate::tls::{TlsError, load_cert, server_config};
use crate::validate::{EnvoyConfigValidator, review_envoy_config};
use crate::validate_turns::{Turns, ValidationLimits};

pub const MUTATE_PATH: &str = "/pod-v1-mutate";
/// The path the original MARIN3R (controller-runtime) validates EnvoyConfigs at.
pub const VALIDATE_ENVOY_CONFIG_PATH: &str = "/validate-marin3r-3scale-net-v1alpha1-envoyconfig";
pub const HEALTHZ_PATH: &str = "/healthz";

/// The default share of one client address: a quarter of the default 256 connection slots,
/// and four times as many requests in flight as pod reviews are decided at once (the rest wait
/// for a decision permit). Validations hold at most a seventh of it
/// ([`crate::validate_turns`], 36 judged or waiting by default), so pod reviews from the API
/// server's address keep the rest whatever tenants write. The API server spreads its calls over few HTTP/2 connections; a
/// burst of pod creations (a large Deployment scaled up) sends it a few hundred at once at
/// most, and a request over the share fails its admission, so the share is generous.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
pub const DEFAULT_MAX_REQUESTS_PER_ADDRESS: usize = 256;

/// How the webhook server runs.
#[derive(Debug, Clone)]
pub struct WebhookServerConfig {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub injection: InjectionConfig,
    /// Judges EnvoyConfigs at [`VALIDATE_ENVOY_CONFIG_PATH`]; without one that path is not
    /// served (404, which the API server treats as a failed call).
    pub envoy_config_validator: Option<EnvoyConfigValidator>,
    /// Larger bodies get 413. The API server caps objects at 3 MiB; a review wraps one.
    pub max_body_bytes: usize,
    /// How often the certificate files are checked for a new pair.
    pub reload_interval: Duration,
    /// Connections beyond this are closed at once.
    pub max_connections: usize,
    /// Pod reviews decided at once; more wait (briefly: a decision takes a millisecond).
    /// EnvoyConfig validations never take one of these.
    pub max_in_flight: usize,
    /// EnvoyConfig validations judged at once, in total and per namespace, and how long one
    /// waits for its turn; see [`crate::validate_turns`].
    pub validations: ValidationLimits,
    /// A client that has not finished the TLS handshake or sent its headers by then is dropped.
    /// A new connection that finds every slot taken waits this long for one.
    pub handshake_timeout: Duration,
    /// A request whose body has not fully arrived by then gets 408. Keep it well under the
    /// webhook's `timeoutSeconds` (10 s). A request whose body is still arriving a tenth of it
    /// (at least 50 ms) after its headers is stalled: while a new connection waits for a slot,
    /// a connection whose every request is stalled is dropped at once, one with stalled and
    /// fully read requests is closed gracefully, and one whose requests have all been read is
    /// left alone, however long their answers take.
    pub body_timeout: Duration,
    /// A connection with no request in flight for this long is closed (HTTP/1 keep-alive and
    /// HTTP/2 alike). While a new one waits for a slot, a connection is also closed once it
    /// has been idle for a tenth of `body_timeout`: not before, so that a client that has just
    /// connected, or just been answered, can send its request.
    pub idle_timeout: Duration,
    /// HTTP/2 streams (requests) at once on one connection.
    pub max_concurrent_streams: u32,
    /// Connections one client address may hold at once (slots and waits for one together);
    /// more from it are closed at once, so one address never takes every slot.
    pub max_connections_per_address: usize,
    /// Requests one client address may have in flight at once, over all its connections;
    /// more get `429` at once.
    pub max_requests_per_address: usize,
    /// Where admissions are counted; register it with the process's Prometheus registry.
    pub metrics: Arc<WebhookMetrics>,
}

impl WebhookServerConfig {
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            injection: InjectionConfig::default(),
            envoy_config_validator: None,
            max_body_bytes: 4 * 1024 * 1024,
            reload_interval: Duration::from_secs(2),
            max_connections: 256,
            max_in_flight: 64,
            validations: ValidationLimits::default(),
            handshake_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            max_concurrent_streams: 32,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_requests_per_address: DEFAULT_MAX_REQUESTS_PER_ADDRESS,
            metrics: Arc::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Tls(#[from] TlsError),
}

struct AppState {
    injection: InjectionConfig,
    envoy_config_validator: Option<EnvoyConfigValidator>,
    metrics: Arc<WebhookMetrics>,
    max_body_bytes: usize,
    body_timeout: Duration,
    injections: Semaphore,
    turns: Arc<Turns>,
}

/// The routes, without TLS: for serving and for in-process tests.
pub fn router(config: &WebhookServerConfig) -> Router {
    let mut router = Router::new()
        .route(MUTATE_PATH, post(mutate_handler))
        .route(HEALTHZ_PATH, get(|| async { "ok" }));
    if config.envoy_config_validator.is_some() {
        router = router.route(VALIDATE_ENVOY_CONFIG_PATH, post(validate_handler));
    }
    router.with_state(Arc::new(AppState {
        injection: config.injection.clone(),
        envoy_config_validator: config.envoy_config_validator.clone(),
        metrics: config.metrics.clone(),
        max_body_bytes: config.max_body_bytes,
        body_timeout: config.body_timeout,
        injections: Semaphore::new(config.max_in_flight.max(1)),
        turns: Arc::new(Turns::new(config.validations)),
    }))
}

async fn mutate_handler(State(state): State<Arc<AppState>>, body: Body) -> Response {
    let body = match read_body(&state, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    // Bounds the CPU spent deciding at once; a decision is quick, so waiters do not wait long.
    // Validations never take one of these: injections do not wait behind Envoy.
    let Ok(_permit) = state.injections.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    };
    let started = Instant::now();
    let result = review(&body, &state.injection);
    let outcome = match &result {
        Ok((_, Outcome::Patched)) => "patched",
        Ok((_, Outcome::Unchanged)) => "unchanged",
        Ok((_, Outcome::Denied(_))) => "denied",
        Err(_) => BAD_REQUEST,
    };
    state
        .metrics
        .observe(SIDECAR_INJECTION, outcome, started.elapsed());
    answer(SIDECAR_INJECTION, result)
}

/// Reads an EnvoyConfig review, waits for its namespace's turn (see [`crate::validate_turns`])
/// and judges it. Decoding and judging run on blocking threads: judging may run Envoy for
/// seconds, and the injections on the same runtime are never held up by it.
async fn validate_handler(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<Peer>>,
    body: Body,
) -> Response {
    let Some(validator) = state.envoy_config_validator.clone() else {
        return (
            StatusCode::NOT_FOUND,
            "EnvoyConfig validation is not configured\n",
        )
            .into_response();
    };
    let body = match read_body(&state, body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    let started = Instant::now();
    let webhook = ENVOY_CONFIG_VALIDATION;
    let (head, body) = match blocking(move || (crate::validate::head(&body), body)).await {
        Ok(read) => read,
        Err(failed) => return failed,
    };
    // Every admission comes from the API server's address: the namespace tells tenants apart.
    let addr = peer.map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |Extension(Peer(p))| p);
    let _turn = match state.turns.take(addr, &head.namespace).await {
        Ok(turn) => turn,
        Err(refused) => {
            // Counted, not logged one by one: a flood would flood the log.
            tracing::debug!(webhook, namespace = %head.namespace, %refused, "validation refused its turn");
            state.metrics.observe(webhook, THROTTLED, started.elapsed());
            return encoded(&crate::validate::throttled(&head.uid, refused.to_string()));
        }
    };
    let result = match blocking(move || review_envoy_config(&body, &validator)).await {
        Ok(result) => result,
        Err(failed) => return failed,
    };
    let outcome = match &result {
        Ok((_, Outcome::Denied(_))) => "denied",
        Ok((_, Outcome::Patched | Outcome::Unchanged)) => "allowed",
        Err(_) => BAD_REQUEST,
    };
    state.metrics.observe(webhook, outcome, started.elapsed());
    answer(webhook, result)
}

/// Runs `work` on a blocking thread; a panic in it (a bug) is a 500.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, "the decision failed\n").into_response())
}

/// The review body, read under the body deadline and size limit; else the response that
/// refuses it. It is read before a permit is taken: a client trickling its body holds only
/// its own stream, never a permit that real reviews wait for.
async fn read_body(state: &AppState, body: Body) -> Result<axum::body::Bytes, Response> {
    let read = tokio::time::timeout(
        state.body_timeout,
        axum::body::to_bytes(body, state.max_body_bytes),
    )
    .await;
    match read {
        Ok(Ok(body)) => Ok(body),
        Err(_) => {
            let timeout = state.body_timeout;
            let message = format!("the body did not arrive within {timeout:?}\n");
            Err((StatusCode::REQUEST_TIMEOUT, message).into_response())
        }
        Ok(Err(e)) => {
            let too_large = e
                .into_inner()
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            Err(if too_large {
                let limit = state.max_body_bytes;
                let message = format!("the body is larger than {limit} bytes\n");
                (StatusCode::PAYLOAD_TOO_LARGE, message).into_response()
            } else {
                (StatusCode::BAD_REQUEST, "reading the body failed\n").into_response()
            })
        }
    }
}

/// The HTTP response to a decision: the AdmissionReview, or why the body is not one.
fn answer(
    webhook: &'static str,
    result: Result<(serde_json::Value, Outcome), BadRequest>,
) -> Response {
    match result {
        Ok((response, outcome)) => {
            match &outcome {
                Outcome::Denied(message) => tracing::info!(webhook, %message, "admission denied"),
                Outcome::Patched => tracing::debug!("sidecar injected"),
                Outcome::Unchanged => tracing::debug!(webhook, "admitted unchanged"),
            }
            encoded(&response)
        }
        Err(bad) => {
            tracing::info!(webhook, error = %bad, "not an AdmissionReview");
            (StatusCode::BAD_REQUEST, format!("{bad}\n")).into_response()
        }
    }
}

/// An AdmissionReview response as the HTTP response's JSON body.
fn encoded(response: &serde_json::Value) -> Response {
    match serde_json::to_vec(response) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Serves the webhook on `listener` until `shutdown` resolves, then lets open requests finish
/// (for at most ten seconds). Fails at once when the certificate pair cannot be loaded.
pub async fn serve(
    config: WebhookServerConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cert = Arc::new(load_cert(
        &config.cert_path,
        &config.key_path,
        provider.clone(),
    )?);
    let acceptor = TlsAcceptor::from(Arc::new(server_config(cert.clone(), provider)?));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(());
    let watcher = tokio::spawn(cert.watch(config.reload_interval, async move {
        let _ = stop_rx.changed().await;
    }));

    let app = router(&config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    // New connections waiting for a slot; beyond this many they are closed at once.
    let waiting = Arc::new(Semaphore::new(config.max_connections));
    // Bumped by a connection that waits for a slot: idle connections then close.
    let (pressure, _) = tokio::sync::watch::channel(0u64);
    let pressure = Arc::new(pressure);
    let limits = ConnLimits::new(
        config.handshake_timeout,
        config.body_timeout,
        config.idle_timeout,
        config.max_concurrent_streams,
    );
    let clients = Arc::new(Clients::new(
        config.max_connections_per_address,
        config.max_requests_per_address,
    ));
    let (closing, _) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // A response written in two segments otherwise waits for the client's delayed ACK
        // (40 ms on Linux): `hack/bench --only abuse` measured reviews on new connections at
        // p50 43 ms without it, 1.5 ms with it.
        let _ = tcp.set_nodelay(true);
        // An address at its share is refused before it may press idle connections to close.
        let Some(place) = clients.connection(peer.ip()) else {
            tracing::warn!(%peer, "too many connections from this address; closing this one");
            config.metrics.refused(Refusal::ConnectionsPerAddress);
            continue;
        };
        let Some(slot) = Slot::offer(&slots, &waiting) else {
            tracing::warn!(%peer, "too many connections; closing this one");
            config.metrics.refused(Refusal::Connections);
            continue;
        };
        let conn = Conn {
            slots: slots.clone(),
            pressure: pressure.clone(),
            closing: closing.subscribe(),
            acceptor: acceptor.clone(),
            app: app.clone(),
            limits: limits.clone(),
            clients: clients.clone(),
            metrics: config.metrics.clone(),
        };
        tokio::spawn(conn.run(tcp, peer, slot, place));
    }
    drop(listener);
    let _ = stop_tx.send(());
    let _ = closing.send(true);
    all_closed(&slots, config.max_connections).await;
    let _ = watcher.await;
    Ok(())
}

/// Waits (ten seconds at most) for every connection to end. Every connection holds a slot
/// until it ends: all slots back means all connections done.
async fn all_closed(slots: &Semaphore, max_connections: usize) {
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(Duration::from_secs(10), slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("requests still open after 10 s at shutdown");
    }
}
