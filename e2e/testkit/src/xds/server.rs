//! The xDS server under test on its own runtime, with its HTTP side on one loopback port,
//! serving a throwaway PKI's certificate; shut down gracefully on drop.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fixture: a server that cannot start is the test's failure"
)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use marin3r_xds::resource::Resource;
use marin3r_xds::{
    Cache, Limits, NackEvent, ServeError, Server, Snapshot, SyncStatus, TlsFiles, TlsSource,
    server_config,
};
use tokio::sync::{mpsc, oneshot};

use crate::envoy::get_body;
use crate::pki::Pki;
use crate::wait::until_sync as wait_for;

pub fn snapshot(resources: Vec<Resource>) -> Snapshot {
    Snapshot::new(resources).unwrap()
}

/// The xDS server on its own runtime, with its HTTP side; shut down gracefully on drop.
pub struct XdsServer {
    pub rt: tokio::runtime::Runtime,
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub cache: Cache,
    nacks: Mutex<mpsc::Receiver<NackEvent>>,
    shutdown: Option<oneshot::Sender<()>>,
    serve: Option<tokio::task::JoinHandle<Result<(), ServeError>>>,
    _dir: tempfile::TempDir,
}

impl XdsServer {
    pub fn start(pki: &Pki) -> Self {
        Self::start_at(pki, "127.0.0.1:0".parse().unwrap())
    }

    /// Starts on a given address (e.g. the one of a server that was shut down).
    pub fn start_at(pki: &Pki, xds_addr: SocketAddr) -> Self {
        Self::start_with(pki, xds_addr, None)
    }

    /// With `reload`, the server re-reads its TLS files (see [`Self::tls_dir`]) that often.
    pub fn start_with(pki: &Pki, xds_addr: SocketAddr, reload: Option<Duration>) -> Self {
        Self::start_limited(pki, xds_addr, reload, Limits::default())
    }

    /// With the given limits on streams and requests.
    pub fn start_limited(
        pki: &Pki,
        xds_addr: SocketAddr,
        reload: Option<Duration>,
        limits: Limits,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), &pki.server.cert_pem).unwrap();
        std::fs::write(dir.path().join("tls.key"), &pki.server.key_pem).unwrap();
        std::fs::write(dir.path().join("ca.crt"), pki.ca_pem()).unwrap();
        let files = TlsFiles::in_dir(dir.path());
        let tls: TlsSource = match reload {
            None => server_config(&files).unwrap().into(),
            Some(interval) => TlsSource::Files { files, interval },
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cache = Cache::new();
        let mut registry = prometheus_client::registry::Registry::default();
        let (server, nacks) = Server::builder(cache.clone())
            .control_plane_id("marin3r-test")
            .limits(limits)
            .metrics(&mut registry)
            .build();
        // One loopback port for the server's metrics, whether it accepts connections, and its
        // admin router; the process serves these on its own admin server.
        let router = server
            .admin_router()
            .merge(health_router(registry, server.serving()));
        let (listener, http) = rt.block_on(async {
            (
                tokio::net::TcpListener::bind(xds_addr).await.unwrap(),
                tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            )
        });
        let addr = listener.local_addr().unwrap();
        let http_addr = http.local_addr().unwrap();
        rt.spawn(async move {
            let _ = axum::serve(http, router).await;
        });
        let (tx, rx) = oneshot::channel::<()>();
        let serve = rt.spawn(server.serve(listener, tls, async {
            let _ = rx.await;
        }));
        let this = Self {
            rt,
            addr,
            http_addr,
            cache,
            nacks: Mutex::new(nacks),
            shutdown: Some(tx),
            serve: Some(serve),
            _dir: dir,
        };
        wait_for(
            "the xDS server to be ready",
            Duration::from_secs(10),
            || this.http("/readyz").starts_with("ready").then_some(()),
        );
        this
    }

    pub fn tls_dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn http(&self, path: &str) -> String {
        get_body(&format!("http://{}{path}", self.http_addr)).unwrap_or_default()
    }

    pub fn sync_status(&self) -> SyncStatus {
        serde_json::from_str(&self.http("/sync-status")).unwrap()
    }

    /// The value of one sample line of `/metrics` (0 when absent).
    pub fn metric(&self, sample: &str) -> f64 {
        metric_value(&self.http("/metrics"), sample)
    }

    pub fn next_nack(&self, timeout: Duration) -> Option<NackEvent> {
        let mut rx = self.nacks.lock().unwrap();
        self.rt.block_on(async {
            tokio::time::timeout(timeout, rx.recv())
                .await
                .ok()
                .flatten()
        })
    }

    /// Shuts down gracefully and returns how long it took.
    pub fn shutdown(&mut self) -> Duration {
        let start = Instant::now();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(serve) = self.serve.take() {
            self.rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(20), serve).await })
                .expect("serve did not return after shutdown")
                .unwrap()
                .unwrap();
        }
        start.elapsed()
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(serve) = self.serve.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(15), serve).await });
        }
    }
}

pub fn metric_value(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(sample)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

/// `/metrics` (the server's registry), `/healthz` and `/readyz` (`ready` while the server
/// accepts connections), as the process serves them.
fn health_router(
    registry: prometheus_client::registry::Registry,
    serving: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> axum::Router {
    use axum::routing::get;
    let registry = std::sync::Arc::new(registry);
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut body = String::new();
                    prometheus_client::encoding::text::encode(&mut body, &registry).unwrap();
                    body
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = serving.load(std::sync::atomic::Ordering::SeqCst);
                async move {
                    match ready {
                        true => "ready\n",
                        false => "xDS server not accepting connections\n",
                    }
                }
            }),
        )
}
