//! The xDS server's own HTTP endpoint, for the process's admin port, which it binds to
//! loopback only: `/sync-status` (JSON, every connected proxy of every namespace, with their
//! NACK texts; what `marin3r proxy-status` prints, reached through the API server's pod
//! port-forward). The process's `/metrics`, `/healthz` and `/readyz` are the process's own.

use axum::Json;
use axum::extract::State;
use axum::routing::get;

use super::status::{StatusRegistry, SyncStatus};

/// The path of the sync-status endpoint.
pub const SYNC_STATUS_PATH: &str = "/sync-status";

pub(crate) fn admin_router(status: StatusRegistry) -> axum::Router {
    axum::Router::new()
        .route(SYNC_STATUS_PATH, get(sync_status))
        .with_state(status)
}

async fn sync_status(State(status): State<StatusRegistry>) -> Json<SyncStatus> {
    Json(status.snapshot())
}
