//! The xDS server: builds the shared state, runs the mTLS accept loop and tonic with the ADS
//! service, and shuts down gracefully (report not ready and stop accepting, keep serving the
//! open streams for the drain period, end every stream, let connections close, then give up
//! after a grace period).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cache::Cache;
use super::limits::{Limits, NamespaceBytes, NamespaceConnections, NamespaceStreams};
use super::metrics::Metrics;
use super::status::{NackEvent, StatusRegistry, SyncStatus};
use super::stream::Shared;
use super::sync_status;
use super::tls::{self, TlsSource};
use super::wire::AdsService;

/// How long connections may take to close after shutdown before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// HTTP/2 flow-control windows: what a client may send that the server has not read yet
/// (a stream whose task is busy sending, or a proxy that does not read its responses, stops
/// reading its requests). Read bytes are counted (see `requests`); these bound the rest,
/// 128 KiB a connection instead of hyper's 1 MiB. Discovery requests are small, and a large
/// one (an ACK naming thousands of resources) only takes a few more round trips.
pub const STREAM_WINDOW: u32 = 64 << 10;
/// The connection's window: see [`STREAM_WINDOW`].
pub const CONNECTION_WINDOW: u32 = 128 << 10;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("xDS server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("xDS server TLS: {0}")]
    Tls(#[from] tls::TlsError),
}

/// Configures a [`Server`].
pub struct ServerBuilder {
    cache: Cache,
    control_plane_id: String,
    nack_capacity: usize,
    metrics: Option<Metrics>,
    drain: Duration,
    limits: Limits,
}

impl ServerBuilder {
    /// The identifier sent as `control_plane.identifier` in every response (e.g. the pod name).
    pub fn control_plane_id(mut self, id: impl Into<String>) -> Self {
        self.control_plane_id = id.into();
        self
    }

    /// How many NACK events may wait for their consumer before new ones are dropped (and
    /// counted in `marin3r_xds_dropped_nack_events_total`).
    pub fn nack_capacity(mut self, capacity: usize) -> Self {
        self.nack_capacity = capacity.max(1);
        self
    }

    /// What one client or namespace may take of the server (see [`Limits`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How long, after shutdown begins, the open streams keep being served (and pushed new
    /// configs) while no new connection is accepted; zero by default.
    pub fn drain_period(mut self, drain: Duration) -> Self {
        self.drain = drain;
        self
    }

    /// Registers the server's metrics (`marin3r_xds_*`) in the process's `registry`, which
    /// the process serves; without it they are counted but not exported.
    pub fn metrics(mut self, registry: &mut Registry) -> Self {
        self.metrics = Some(Metrics::register(registry));
        self
    }

    /// The server and the receiving end of its NACK events.
    pub fn build(self) -> (Server, mpsc::Receiver<NackEvent>) {
        let metrics = self
            .metrics
            .unwrap_or_else(|| Metrics::register(&mut Registry::default()));
        let (nacks, nack_rx) = mpsc::channel(self.nack_capacity);
        let bytes = Arc::new(NamespaceBytes::new(self.limits.max_process_bytes));
        let shared = Arc::new(Shared {
            cache: self.cache,
            metrics,
            status: StatusRegistry::default(),
            nacks,
            control_plane: ControlPlane {
                identifier: self.control_plane_id,
            },
            stop: CancellationToken::new(),
            limits: self.limits,
            streams: Arc::new(NamespaceStreams::default()),
            bytes,
        });
        let server = Server {
            shared,
            serving: Arc::new(AtomicBool::new(false)),
            drain: self.drain,
        };
        (server, nack_rx)
    }
}

/// The ADS server over mutual TLS. Controllers write to its [`Cache`]; it serves from it.
pub struct Server {
    shared: Arc<Shared>,
    serving: Arc<AtomicBool>,
    drain: Duration,
}

impl Server {
    pub fn builder(cache: Cache) -> ServerBuilder {
        ServerBuilder {
            cache,
            control_plane_id: "marin3r".into(),
            nack_capacity: 1024,
            metrics: None,
            drain: Duration::ZERO,
            limits: Limits::default(),
        }
    }

    pub fn cache(&self) -> &Cache {
        &self.shared.cache
    }

    /// The registry of connected proxies, for the controllers' per-replica NACK reports.
    pub fn status_registry(&self) -> StatusRegistry {
        self.shared.status.clone()
    }

    /// Every connected proxy and how far it got.
    pub fn sync_status(&self) -> SyncStatus {
        self.shared.status.snapshot()
    }

    /// True while the server accepts connections: from the start of [`Server::serve`] until
    /// shutdown begins. What the process's `/readyz` waits for.
    pub fn serving(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.serving)
    }

    /// `/sync-status`, for the admin port: it names every tenant's proxies and shows their
    /// NACK texts, so it is served on loopback only, never on the network.
    pub fn admin_router(&self) -> axum::Router {
        sync_status::admin_router(self.shared.status.clone())
    }

    /// Serves ADS on `listener` until `shutdown` completes, then ends every stream and waits
    /// (up to a grace period) for the connections to close. `tls` is a fixed
    /// `Arc<rustls::ServerConfig>` or [`TlsFiles`](super::TlsFiles), reloaded when they change.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: impl Into<TlsSource>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let stop = self.shared.stop.clone();
        let tls = tls.into().watch(stop.clone())?;
        let (conns, incoming) = mpsc::channel(256);
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "xDS server listening (mTLS)");
        }
        let limit = tls::ConnectionLimit {
            open: Arc::new(NamespaceConnections::default()),
            max_per_namespace: self.shared.limits.max_connections_per_namespace,
        };
        let accept = tokio::spawn(tls::accept_loop(
            listener,
            (tls, limit),
            self.shared.metrics.clone(),
            conns,
            stop.clone(),
        ));
        // One stream more than the limit, so that a client over it gets a status naming the
        // limit; HTTP/2 refuses any stream beyond that.
        let h2_streams = self
            .shared
            .limits
            .max_streams_per_connection
            .saturating_add(1);
        let server = tonic::transport::Server::builder()
            .max_concurrent_streams(Some(h2_streams))
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .max_connection_age(self.shared.limits.max_connection_age)
            .max_connection_age_grace(crate::limits::CONNECTION_AGE_GRACE)
            .add_service(AdsService::new(Arc::clone(&self.shared)))
            .serve_with_incoming_shutdown(
                ReceiverStream::new(incoming),
                stop.clone().cancelled_owned(),
            );
        tokio::pin!(server);
        self.serving.store(true, Ordering::SeqCst);
        let mut early = tokio::select! {
            r = &mut server => Some(r),
            () = shutdown => None,
        };
        // Not ready, and new connections are refused (the listener closes with the accept
        // loop); the proxies already connected keep their streams for the drain period.
        self.serving.store(false, Ordering::SeqCst);
        accept.abort();
        if early.is_none() && !self.drain.is_zero() {
            info!(drain = ?self.drain, "xDS server draining: no new connections, open streams still served");
            early = tokio::select! {
                r = &mut server => Some(r),
                () = tokio::time::sleep(self.drain) => None,
            };
        }
        stop.cancel();
        let result = match early {
            Some(r) => r,
            None => {
                info!("xDS server shutting down: ending streams");
                match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
                    Ok(r) => r,
                    Err(_) => {
                        warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the grace period; dropping them");
                        Ok(())
                    }
                }
            }
        };
        Ok(result?)
    }
}
