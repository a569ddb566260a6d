//! Shared fixtures of the xDS tests: a PKI, the xDS server running on its own runtime with
//! its HTTP side, and real Envoy sidecars started from the product's bootstrap with a
//! Kubernetes-style client certificate folder.

#![allow(dead_code)] // each test file uses a part

pub mod plane;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use marin3r_certs::{CertificateInfo, IssuedCertificate};
use marin3r_discovery::sidecar::bootstrap::{self, Admin, AdsMode, BootstrapOptions};
use marin3r_e2e::envoy::{Envoy, get_body};
use marin3r_e2e::kubelet::volumes::{secret_files, write_atomic};
use marin3r_e2e::pki::TestPki;
use marin3r_xds::resource::Resource;
use marin3r_xds::{
    Cache, NackEvent, Server, Snapshot, SyncStatus, TlsFiles, TlsSource, server_config,
};
use tokio::sync::{mpsc, oneshot};

const DAY: Duration = Duration::from_secs(86_400);

/// The test CA (`pki.ca`) and the xDS server's certificate (for 127.0.0.1 and localhost).
pub struct Pki {
    pki: TestPki,
    pub server: IssuedCertificate,
}

impl Pki {
    pub fn new() -> Self {
        let pki = TestPki::new("marin3r-ca", DAY).unwrap();
        let server = pki.server(["127.0.0.1", "localhost"]).unwrap();
        Self { pki, server }
    }

    /// A client certificate for a namespace (`None`: no SPIFFE URI at all).
    pub fn client(&self, namespace: Option<&str>) -> IssuedCertificate {
        self.pki.client(namespace).unwrap()
    }
}

impl std::ops::Deref for Pki {
    type Target = TestPki;

    fn deref(&self) -> &TestPki {
        &self.pki
    }
}

pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    // Below the kernel's ephemeral range: a port from `bind(:0)` is free only until someone
    // else binds :0 (Envoy's admin, any client socket) and may be given it. Never the same
    // port twice in this process either.
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first_ephemeral: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let low = 10_000u32;
    let span = first_ephemeral.saturating_sub(low).max(1);
    let start = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as u32;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        let port = u16::try_from(low + start.wrapping_add(i) % span).unwrap();
        if !handed_out.contains(&port) && StdListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port between {low} and {first_ephemeral}");
}

/// Polls `f` until it returns `Some`, or fails the test naming `what` after `timeout`.
pub use marin3r_e2e::wait::until_sync as wait_for;

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
    serve: Option<tokio::task::JoinHandle<Result<(), marin3r_xds::ServeError>>>,
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
        Self::start_limited(pki, xds_addr, reload, marin3r_xds::Limits::default())
    }

    /// With the given limits on streams and requests.
    pub fn start_limited(
        pki: &Pki,
        xds_addr: SocketAddr,
        reload: Option<Duration>,
        limits: marin3r_xds::Limits,
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

/// A client certificate folder laid out as a mounted Kubernetes Secret: the files live in a
/// `..<timestamp>` folder, `..data` points at it, and `tls.crt` etc. point through `..data`.
pub struct SecretDir {
    pub path: PathBuf,
}

impl SecretDir {
    pub fn create(path: &Path, cert: &IssuedCertificate) -> Self {
        let mut dir = Self {
            path: path.to_owned(),
        };
        dir.swap(cert);
        dir
    }

    /// Atomically replaces the files, the way the kubelet does (with the kubelet's writer).
    pub fn swap(&mut self, cert: &IssuedCertificate) {
        let files = secret_files([
            ("tls.crt", cert.cert_pem.as_str()),
            ("tls.key", &cert.key_pem),
            ("ca.crt", &cert.ca_pem),
        ]);
        write_atomic(&self.path, &files).unwrap();
    }
}

/// A real Envoy started from the product's bootstrap, pointed at the test server.
pub struct Proxy {
    pub envoy: Envoy,
    pub certs: SecretDir,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub fn start(
        server: &XdsServer,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
    ) -> Self {
        Self::start_with(server, client, node_id, pod, mode, None)
    }

    /// `initial_fetch_timeout` (e.g. `"1s"`) shortens how long Envoy waits for its first
    /// configuration before it starts anyway (15 s by default): for proxies that get none.
    pub fn start_with(
        server: &XdsServer,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
        initial_fetch_timeout: Option<&str>,
    ) -> Self {
        Self::start_on_with(
            server.addr.port(),
            client,
            node_id,
            pod,
            mode,
            initial_fetch_timeout,
        )
    }

    /// Pointed at an xDS server on 127.0.0.1:`xds_port`.
    pub fn start_on(
        xds_port: u16,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
    ) -> Self {
        Self::start_on_with(xds_port, client, node_id, pod, mode, None)
    }

    pub fn start_on_with(
        xds_port: u16,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
        initial_fetch_timeout: Option<&str>,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("marin3r-proxy-")
            .tempdir()
            .unwrap();
        let certs = SecretDir::create(&dir.path().join("tls"), client);
        let bootstrap_dir = dir.path().join("bootstrap");
        let mut opts = BootstrapOptions::new("127.0.0.1", xds_port);
        opts.node_id = Some(node_id.into());
        opts.cluster_id = Some(node_id.into());
        opts.ads_mode = mode;
        opts.admin = Admin {
            bind_address: [127, 0, 0, 1].into(),
            port: 0,
            access_log_path: "/dev/null".into(),
        };
        opts.bootstrap_dir = bootstrap_dir.clone();
        opts.client_cert_dir = certs.path.clone();
        let rendered = bootstrap::render(&opts).unwrap();
        rendered.write_to(&bootstrap_dir).unwrap();
        // The sidecar injector adds the pod's name to the node metadata.
        let config_path = bootstrap_dir.join(bootstrap::CONFIG_FILE);
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        config["node"]["metadata"] = serde_json::json!({ "pod_name": pod, "pod_namespace": "x" });
        if let Some(timeout) = initial_fetch_timeout {
            config["dynamic_resources"]["cds_config"]["initial_fetch_timeout"] = timeout.into();
            config["dynamic_resources"]["lds_config"]["initial_fetch_timeout"] = timeout.into();
            config["layered_runtime"]["layers"][0]["rtds_layer"]["rtds_config"]["initial_fetch_timeout"] =
                timeout.into();
        }
        std::fs::write(&config_path, config.to_string()).unwrap();
        let log_dir = tempfile::Builder::new()
            .prefix("marin3r-envoy-")
            .tempdir()
            .unwrap();
        let envoy = Envoy::start_with_file(log_dir, &config_path, &[]).unwrap();
        Self {
            envoy,
            certs,
            _dir: dir,
        }
    }

    /// Waits until `GET http://127.0.0.1:port/` answers `body`.
    pub fn wait_for_body(&self, port: u16, body: &str) {
        let url = format!("http://127.0.0.1:{port}/");
        let mut last;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match get_body(&url) {
                Ok(b) if b == body => return,
                Ok(b) => last = b,
                Err(e) => last = format!("{e:#}"),
            }
            assert!(
                Instant::now() < deadline,
                "GET {url} never answered {body:?}; last: {last:?}\n{}",
                self.envoy.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of one of Envoy's counters or gauges.
    pub fn stat(&self, name: &str) -> u64 {
        let text = self
            .envoy
            .admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .unwrap();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

/// A certificate's serial as Envoy's admin `/certs` prints it.
pub fn envoy_serial(cert: &IssuedCertificate) -> String {
    CertificateInfo::from_pem(&cert.cert_pem)
        .unwrap()
        .serial
        .replace(':', "")
        .to_lowercase()
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
