//! The process's plain-HTTP admin server, one for each long-running `marin3r` process:
//! Prometheus `/metrics` (every metric of the process, in one registry) and `/healthz` (the
//! process answers); the discovery service adds `/readyz`, ready while every one of its
//! readiness gates is open. Every replica serves it, leader or not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    component: &'static str,
}

/// Adds `marin3r_build_info{version,component} 1` to `registry`: which release a process
/// runs (`component` is `operator` or `discovery_service`), for joins such as
/// `up * on(instance) group_left(version) marin3r_build_info`.
pub fn register_build_info(registry: &mut Registry, component: &'static str) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION"),
        component,
    })
    .set(1);
    registry.register(
        "marin3r_build_info",
        "The marin3r version this process runs (always 1)",
        info,
    );
}

/// `/metrics` and `/healthz`.
pub fn router(registry: Registry) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::new(registry))
}

/// [`router`] and `/readyz`, answering what `readiness` says.
pub fn router_with_readiness(registry: Registry, readiness: Readiness) -> axum::Router {
    let readyz = axum::Router::new()
        .route("/readyz", get(readyz))
        .with_state(Arc::new(readiness));
    router(registry).merge(readyz)
}

/// What the process waits for before `/readyz` says ready: named flags, each reported by its
/// name while it is false, in the order they were added.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    gates: Vec<(&'static str, Arc<AtomicBool>)>,
}

impl Readiness {
    /// `/readyz` also waits for `flag`, reporting `name` while it is false.
    pub fn gate(mut self, name: &'static str, flag: Arc<AtomicBool>) -> Self {
        self.gates.push((name, flag));
        self
    }

    /// The names of the gates still closed; empty when ready.
    pub fn waiting(&self) -> Vec<&'static str> {
        self.gates
            .iter()
            .filter(|(_, flag)| !flag.load(Ordering::SeqCst))
            .map(|(name, _)| *name)
            .collect()
    }
}

async fn metrics(State(registry): State<Arc<Registry>>) -> axum::response::Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
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

async fn readyz(State(readiness): State<Arc<Readiness>>) -> (StatusCode, String) {
    let waiting = readiness.waiting();
    if waiting.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", waiting.join(", ")),
        )
    }
}

/// Binds `addr` (an error names it) and returns the task that serves `router` until `stop`.
pub async fn serve(
    addr: SocketAddr,
    router: axum::Router,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = super::listen::bind(addr)
        .map_err(|e| anyhow::anyhow!("binding the metrics address {addr}: {e}"))?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    Ok(tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_names_the_version() {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "operator");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = format!(
            "marin3r_build_info{{version=\"{}\",component=\"operator\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{text}");
    }

    #[tokio::test]
    async fn readyz_names_every_closed_gate_in_order() {
        let (server, controller) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let readiness = Arc::new(
            Readiness::default()
                .gate("xDS server", server.clone())
                .gate("EnvoyConfig controller", controller.clone()),
        );
        let (code, body) = readyz(State(readiness.clone())).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "not ready: xDS server, EnvoyConfig controller\n");
        server.store(true, Ordering::SeqCst);
        let (_, body) = readyz(State(readiness.clone())).await;
        assert_eq!(body, "not ready: EnvoyConfig controller\n");
        controller.store(true, Ordering::SeqCst);
        assert_eq!(
            readyz(State(readiness)).await,
            (StatusCode::OK, "ready\n".to_owned())
        );
    }
}
