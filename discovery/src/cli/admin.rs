//! The operator's plain-HTTP admin port: Prometheus `/metrics` (the controllers' reconcile
//! metrics) and `/healthz` (the process answers). Every replica serves it, leader or not.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub fn router(registry: Registry) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::new(registry))
}

async fn metrics(State(registry): State<Arc<Registry>>) -> axum::response::Response {
    marin3r_xds::metrics_response(&registry)
}

/// Binds `addr` (an error names it) and returns the task that serves until `stop`.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding the metrics address {addr}: {e}"))?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    Ok(tokio::spawn(async move {
        axum::serve(listener, router(registry))
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    }))
}
