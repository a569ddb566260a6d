//! The HTTPS server: `/pod-v1-mutate` (AdmissionReview v1) and `/healthz`, TLS 1.2+ with a
//! certificate reloaded from disk, bounded bodies, bounded connections, graceful shutdown.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::config::InjectionConfig;
use crate::metrics::WebhookMetrics;
use crate::review::{Outcome, review};
use crate::tls::{ReloadingCert, TlsError, server_config};

pub const MUTATE_PATH: &str = "/pod-v1-mutate";
pub const HEALTHZ_PATH: &str = "/healthz";

/// How the webhook server runs.
#[derive(Debug, Clone)]
pub struct WebhookServerConfig {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    pub injection: InjectionConfig,
    /// Larger bodies get 413. The API server caps objects at 3 MiB; a review wraps one.
    pub max_body_bytes: usize,
    /// How often the certificate files are checked for a new pair.
    pub reload_interval: Duration,
    /// Connections beyond this are closed at once.
    pub max_connections: usize,
    /// Reviews read and decided at once; more wait. With `max_body_bytes` this bounds the
    /// memory request bodies can take.
    pub max_in_flight: usize,
    /// A client that has not finished the TLS handshake or sent its headers by then is dropped.
    pub handshake_timeout: Duration,
    /// Where admissions are counted; register it with the process's Prometheus registry.
    pub metrics: Arc<WebhookMetrics>,
}

impl WebhookServerConfig {
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            injection: InjectionConfig::default(),
            max_body_bytes: 4 * 1024 * 1024,
            reload_interval: Duration::from_secs(2),
            max_connections: 256,
            max_in_flight: 64,
            handshake_timeout: Duration::from_secs(10),
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
    metrics: Arc<WebhookMetrics>,
    max_body_bytes: usize,
    in_flight: Semaphore,
}

/// The routes, without TLS: for serving and for in-process tests.
pub fn router(config: &WebhookServerConfig) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate_handler))
        .route(HEALTHZ_PATH, get(|| async { "ok" }))
        .with_state(Arc::new(AppState {
            injection: config.injection.clone(),
            metrics: config.metrics.clone(),
            max_body_bytes: config.max_body_bytes,
            in_flight: Semaphore::new(config.max_in_flight.max(1)),
        }))
}

async fn mutate_handler(State(state): State<Arc<AppState>>, body: Body) -> Response {
    // The permit is taken before the body is read, so waiting requests hold no body memory.
    let Ok(_permit) = state.in_flight.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response();
    };
    let body = match axum::body::to_bytes(body, state.max_body_bytes).await {
        Ok(body) => body,
        Err(e) => {
            let too_large = e
                .into_inner()
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            return if too_large {
                let limit = state.max_body_bytes;
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is larger than {limit} bytes\n"),
                )
                    .into_response()
            } else {
                (StatusCode::BAD_REQUEST, "reading the body failed\n").into_response()
            };
        }
    };
    let started = Instant::now();
    let result = review(&body, &state.injection);
    let outcome = match &result {
        Ok((_, Outcome::Patched)) => "patched",
        Ok((_, Outcome::Unchanged)) => "unchanged",
        Ok((_, Outcome::Denied(_))) => "denied",
        Err(_) => "bad_request",
    };
    state.metrics.observe(outcome, started.elapsed());
    match result {
        Ok((response, outcome)) => {
            match &outcome {
                Outcome::Denied(message) => tracing::info!(%message, "admission denied"),
                Outcome::Patched => tracing::debug!("sidecar injected"),
                Outcome::Unchanged => tracing::debug!("pod left unchanged"),
            }
            match serde_json::to_vec(&response) {
                Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
            }
        }
        Err(bad) => {
            tracing::info!(error = %bad, "not an AdmissionReview");
            (StatusCode::BAD_REQUEST, format!("{bad}\n")).into_response()
        }
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
    let cert = Arc::new(ReloadingCert::load(
        &config.cert_path,
        &config.key_path,
        provider,
    )?);
    let acceptor = TlsAcceptor::from(Arc::new(server_config(cert.clone())?));
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(());
    let watcher = tokio::spawn(cert.watch(config.reload_interval, async move {
        let _ = stop_rx.changed().await;
    }));

    let app = router(&config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let graceful = GracefulShutdown::new();
    let handshake_timeout = config.handshake_timeout;
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "too many connections; closing this one");
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let watch = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(handshake_timeout);
            builder.http2().max_concurrent_streams(32);
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watch.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(());
    if tokio::time::timeout(Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still open after 10 s at shutdown");
    }
    let _ = watcher.await;
    Ok(())
}
