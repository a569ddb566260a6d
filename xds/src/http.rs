//! The discovery service's plain-HTTP side. On the metrics port: Prometheus `/metrics`,
//! `/healthz`, `/readyz` (ready while the xDS server accepts connections and every readiness
//! gate is open). On the admin port, which the process binds to loopback only:
//! `/sync-status` (JSON, every connected proxy of every namespace, with their NACK texts;
//! what `marin3r proxy-status` prints, reached through the API server's pod port-forward).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::status::{StatusRegistry, SyncStatus};

/// The path of the sync-status endpoint.
pub const SYNC_STATUS_PATH: &str = "/sync-status";

#[derive(Clone)]
pub(crate) struct HttpState {
    pub registry: Arc<Registry>,
    pub ready: Arc<AtomicBool>,
    pub gates: Arc<Vec<super::server::ReadinessGate>>,
}

pub(crate) fn router(state: HttpState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

pub(crate) fn admin_router(status: StatusRegistry) -> axum::Router {
    axum::Router::new()
        .route(SYNC_STATUS_PATH, get(sync_status))
        .with_state(status)
}

async fn metrics(State(state): State<HttpState>) -> axum::response::Response {
    metrics_response(&state.registry)
}

/// `registry` as a `/metrics` answer (OpenMetrics text); a 500 naming the problem when it
/// cannot be encoded.
pub fn metrics_response(registry: &Registry) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics: {e}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, String) {
    if !state.ready.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "xDS server not accepting connections\n".to_owned(),
        );
    }
    let waiting: Vec<&str> = state
        .gates
        .iter()
        .filter(|(_, flag)| !flag.load(Ordering::SeqCst))
        .map(|(name, _)| *name)
        .collect();
    if waiting.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", waiting.join(", ")),
        )
    }
}

async fn sync_status(State(status): State<StatusRegistry>) -> Json<SyncStatus> {
    Json(status.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readyz_waits_for_the_server_and_every_gate() {
        let gate = Arc::new(AtomicBool::new(false));
        let state = HttpState {
            registry: Arc::new(Registry::default()),
            ready: Arc::new(AtomicBool::new(false)),
            gates: Arc::new(vec![("EnvoyConfig controller", gate.clone())]),
        };
        let status = |state: &HttpState| {
            let state = state.clone();
            async move { readyz(State(state)).await.into_response().status() }
        };
        assert_eq!(status(&state).await, StatusCode::SERVICE_UNAVAILABLE);
        state.ready.store(true, Ordering::SeqCst);
        let (code, body) = readyz(State(state.clone())).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: EnvoyConfig controller\n");
        gate.store(true, Ordering::SeqCst);
        assert_eq!(status(&state).await, StatusCode::OK);
    }
}
