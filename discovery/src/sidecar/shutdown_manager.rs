//! The shutdown manager (`marin3r shutdown-manager`), the container the webhook injects beside
//! an Envoy sidecar whose pod sets `shutdown-manager.enabled`: it drains Envoy when the pod
//! terminates, so open connections finish instead of being cut.
//!
//! Kubelet runs every container's preStop hook at once and sends a container SIGTERM only when
//! its own hook returns. Envoy's hook GETs `/shutdown`; the manager's own hook and those of the
//! `extra-lifecycle-hooks` containers GET `/drain`. The first of these starts the one drain:
//! Envoy's admin `POST /drain_listeners?graceful` (Envoy drains for `--drain-time-s` with its
//! `--drain-strategy`), then the manager counts the connections still open on Envoy's
//! listeners until there are none or the drain time has passed. Every caller waits for that
//! drain; `/shutdown` then asks Envoy to exit (`POST /quitquitquit`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use marin3r_webhook::sidecar::{DRAIN_PATH, HEALTHZ_PATH, READINESS_LISTENER, SHUTDOWN_PATH};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Listeners whose connections are not the pod's traffic: the admin's (the manager's own
/// polls) and the sidecar's readiness listener (kubelet's probes).
const IGNORED_LISTENERS: [&str; 2] = ["admin", READINESS_LISTENER];

#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port` of Envoy's admin interface.
    pub envoy_admin: SocketAddr,
    /// The longest the manager waits for connections to close: Envoy's `--drain-time-s`.
    pub drain_time: Duration,
    /// How long after the drain starts the connections are first counted: the pod leaves its
    /// Services' endpoints while the hooks run, and a client may still connect meanwhile.
    pub check_delay: Duration,
    /// How often the open connections are counted.
    pub check_interval: Duration,
    /// How long after the first call Envoy is asked to drain (the original's
    /// `--start-drain-delay`; zero by default).
    pub start_delay: Duration,
    /// The drain ends once no more than this many connections are open (the original's
    /// `--min-open-connections`; zero by default).
    pub min_open_connections: u64,
    /// A file created once the drain ends, and which `/shutdown` also waits for, checked every
    /// `ready_check_interval`: how the original's processes told each other the drain was over
    /// (`--ready-file`). `None`: no file, the drain is known in memory.
    pub ready_file: Option<PathBuf>,
    pub ready_check_interval: Duration,
    /// What `/drain` and `/shutdown` callers must present (`Authorization: Bearer <token>`):
    /// the injected pod's hooks have it, other pods on the network do not. `None`: anyone who
    /// reaches the port may drain, as with the original; `marin3r shutdown-manager` then
    /// listens on loopback only, so that only its own pod can.
    pub token: Option<String>,
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// No connection is left (or no more than `min_open_connections`).
    Drained,
    /// The drain time passed with connections still open.
    DeadlineReached { open: u64 },
    /// Envoy's admin could not be asked (Envoy gone, or the admin address wrong).
    Failed(String),
}

impl std::fmt::Display for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Drained => write!(f, "drained: no connection left"),
            Self::DeadlineReached { open } => {
                write!(f, "drain time over with {open} connection(s) still open")
            }
            Self::Failed(e) => write!(f, "drain failed: {e}"),
        }
    }
}

/// One drain per process, shared by every caller.
pub struct Manager {
    config: Config,
    started: AtomicBool,
    done: watch::Sender<Option<Drain>>,
}

impl Manager {
    pub fn new(config: Config) -> Arc<Self> {
        Arc::new(Self {
            config,
            started: AtomicBool::new(false),
            done: watch::Sender::new(None),
        })
    }

    /// Starts the drain unless it has started, and waits for its end. The drain runs on its
    /// own task: a hook that gives up (kubelet's grace period) does not stop it.
    pub async fn drain(self: &Arc<Self>) -> Drain {
        let mut done = self.done.subscribe();
        if !self.started.swap(true, Ordering::SeqCst) {
            let me = Arc::clone(self);
            tokio::spawn(async move {
                let outcome = me.run_drain().await;
                info!(%outcome, "drain finished");
                me.mark_ready();
                me.done.send_replace(Some(outcome));
            });
        }
        match done.wait_for(Option::is_some).await {
            Ok(outcome) => outcome
                .clone()
                .unwrap_or(Drain::Failed("no outcome".into())),
            Err(_) => Drain::Failed("the drain task ended without an outcome".into()),
        }
    }

    /// Creates the ready file, if there is one; a failure is logged, the drain is over anyway.
    fn mark_ready(&self) {
        if let Some(file) = &self.config.ready_file
            && let Err(e) = std::fs::write(file, b"")
        {
            warn!(file = %file.display(), error = %e, "could not create the ready file");
        }
    }

    /// Resolves once the ready file exists (never, without one).
    async fn ready_file_exists(&self) {
        let Some(file) = &self.config.ready_file else {
            return std::future::pending().await;
        };
        while !file.exists() {
            tokio::time::sleep(self.config.ready_check_interval).await;
        }
    }

    async fn run_drain(&self) -> Drain {
        tokio::time::sleep(self.config.start_delay).await;
        let started = Instant::now();
        let deadline = started + self.config.drain_time;
        info!(admin = %self.config.envoy_admin, drain_time = ?self.config.drain_time, "draining Envoy's listeners");
        if let Err(e) = self.admin_post("/drain_listeners?graceful").await {
            return Drain::Failed(e);
        }
        tokio::time::sleep_until((started + self.config.check_delay).min(deadline)).await;
        loop {
            let listeners = match self.admin_get("/stats?filter=downstream_cx_active").await {
                Ok(stats) => open_connections(&stats),
                Err(e) => return Drain::Failed(e),
            };
            let open: u64 = listeners.values().sum();
            if open <= self.config.min_open_connections {
                return Drain::Drained;
            }
            let now = Instant::now();
            if now >= deadline {
                return Drain::DeadlineReached { open };
            }
            info!(open, ?listeners, "waiting for Envoy's connections to close");
            tokio::time::sleep_until((now + self.config.check_interval).min(deadline)).await;
        }
    }

    /// Drains (or waits for the ready file another process creates), then asks Envoy to exit
    /// (even when the drain failed: Envoy may still be there).
    pub async fn shutdown(self: &Arc<Self>) -> (Drain, Result<(), String>) {
        let drain = tokio::select! {
            drain = self.drain() => drain,
            () = self.ready_file_exists() => Drain::Drained,
        };
        info!("asking Envoy to exit");
        let quit = self.admin_post("/quitquitquit").await.map(|_| ());
        (drain, quit)
    }

    async fn admin_post(&self, path: &str) -> Result<String, String> {
        self.admin("POST", path).await
    }

    async fn admin_get(&self, path: &str) -> Result<String, String> {
        self.admin("GET", path).await
    }

    async fn admin(&self, method: &'static str, path: &str) -> Result<String, String> {
        let url = format!("http://{}{path}", self.config.envoy_admin);
        tokio::task::spawn_blocking(move || admin_request(method, &url))
            .await
            .map_err(|e| format!("{method} {path}: {e}"))?
    }
}

fn admin_request(method: &str, url: &str) -> Result<String, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let response = if method == "POST" {
        agent.post(url).send_empty()
    } else {
        agent.get(url).call()
    };
    let mut response = response.map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("{method} {url}: reading the answer: {e}"))?;
    if !status.is_success() {
        return Err(format!("{method} {url}: {status}: {}", body.trim()));
    }
    Ok(body)
}

/// The connections open on Envoy's listeners, by listener, from its `/stats` text: every
/// non-zero `listener.<name>.downstream_cx_active` gauge, leaving out per-thread copies and
/// the listeners in [`IGNORED_LISTENERS`].
pub fn open_connections(stats: &str) -> BTreeMap<String, u64> {
    stats
        .lines()
        .filter_map(|line| line.split_once(": "))
        .filter_map(|(name, value)| {
            let listener = name
                .strip_prefix("listener.")?
                .strip_suffix(".downstream_cx_active")?;
            let per_thread = listener
                .rsplit_once('.')
                .is_some_and(|(_, last)| last.starts_with("worker_") || last == "main_thread");
            if per_thread || IGNORED_LISTENERS.contains(&listener) {
                return None;
            }
            let open = value.trim().parse::<u64>().ok().filter(|n| *n > 0)?;
            Some((listener.to_owned(), open))
        })
        .collect()
}

/// `/healthz`, `/drain` and `/shutdown` (GET, as kubelet's hooks call them, or POST); the
/// last two only for callers with the token, when there is one.
pub fn router(manager: Arc<Manager>) -> Router {
    let guarded = Router::new()
        .route(DRAIN_PATH, get(drain).post(drain))
        .route(SHUTDOWN_PATH, get(shutdown).post(shutdown))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&manager),
            authorized,
        ));
    Router::new()
        .route(HEALTHZ_PATH, get(|| async { "ok\n" }))
        .merge(guarded)
        .with_state(manager)
}

/// Lets a request through when it carries the manager's token (or the manager has none).
async fn authorized(
    State(manager): State<Arc<Manager>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Some(token) = &manager.config.token else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if presented.is_some_and(|p| same(p.as_bytes(), token.as_bytes())) {
        return next.run(request).await;
    }
    warn!(path = %request.uri().path(), "refused a drain request without this pod's token");
    (
        StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        "only this pod's preStop hooks may drain its Envoy\n",
    )
        .into_response()
}

/// Equal, in a time that does not depend on where the two first differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn drain(State(manager): State<Arc<Manager>>) -> (StatusCode, String) {
    let outcome = manager.drain().await;
    let status = match outcome {
        Drain::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::OK,
    };
    (status, format!("{outcome}\n"))
}

async fn shutdown(State(manager): State<Arc<Manager>>) -> (StatusCode, String) {
    match manager.shutdown().await {
        (Drain::Failed(e), quit) => {
            let quit = quit.err().map(|e| format!("; asking Envoy to exit: {e}"));
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("drain failed: {e}{}\n", quit.unwrap_or_default()),
            )
        }
        (outcome, Ok(())) => (StatusCode::OK, format!("{outcome}; Envoy asked to exit\n")),
        (outcome, Err(e)) => {
            warn!(error = %e, "asking Envoy to exit");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{outcome}; asking Envoy to exit: {e}\n"),
            )
        }
    }
}

/// Serves until `stop` resolves; requests under way (a hook waiting for the drain) finish.
pub async fn serve(
    listener: TcpListener,
    manager: Arc<Manager>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(manager))
        .with_graceful_shutdown(stop)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_traffic_listeners_connections_count() {
        let stats = "\
cluster.backend.upstream_cx_active: 7
http.admin.downstream_cx_active: 1
http.ingress.downstream_cx_active: 2
listener.0.0.0.0_8080.downstream_cx_active: 2
listener.0.0.0.0_8080.worker_0.downstream_cx_active: 2
listener.[__]_8443.downstream_cx_active: 3
listener.[__]_8443.worker_0.downstream_cx_active: 1
listener.[__]_8443.worker_1.downstream_cx_active: 2
listener.admin.downstream_cx_active: 1
listener.admin.main_thread.downstream_cx_active: 1
listener.marin3r_sidecar_readiness.downstream_cx_active: 4
listener.marin3r_sidecar_readiness.worker_0.downstream_cx_active: 4
";
        assert_eq!(
            open_connections(stats),
            BTreeMap::from([("0.0.0.0_8080".to_owned(), 2), ("[__]_8443".to_owned(), 3)])
        );
        assert!(open_connections("").is_empty());
        assert!(open_connections("listener.admin.downstream_cx_active: 1\n").is_empty());
        assert!(open_connections("listener.0.0.0.0_80.downstream_cx_active: 0\n").is_empty());
    }

    /// A stand-in for Envoy's admin: `/stats` reports `open` connections on one listener;
    /// returns its address and when `/drain_listeners` was called.
    async fn fake_admin(open: u64) -> (SocketAddr, Arc<std::sync::Mutex<Option<Instant>>>) {
        use axum::routing::post;
        let drained: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
        let at = Arc::clone(&drained);
        let router = Router::new()
            .route(
                "/drain_listeners",
                post(move || {
                    *at.lock().unwrap() = Some(Instant::now());
                    async { "OK\n" }
                }),
            )
            .route(
                "/stats",
                get(move || async move {
                    format!("listener.0.0.0.0_8080.downstream_cx_active: {open}\n")
                }),
            )
            .route("/quitquitquit", post(|| async { "OK\n" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        (addr, drained)
    }

    fn config(envoy_admin: SocketAddr) -> Config {
        Config {
            envoy_admin,
            drain_time: Duration::from_secs(10),
            check_delay: Duration::ZERO,
            check_interval: Duration::from_millis(50),
            start_delay: Duration::ZERO,
            min_open_connections: 0,
            ready_file: None,
            ready_check_interval: Duration::from_millis(50),
            token: None,
        }
    }

    #[tokio::test]
    async fn only_callers_with_the_token_may_drain_or_stop_envoy() {
        let (admin, drained_at) = fake_admin(0).await;
        let manager = Manager::new(Config {
            token: Some("s3cret".into()),
            ..config(admin)
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, manager, std::future::pending()));
        let call = |path: &'static str, token: Option<&'static str>| {
            tokio::task::spawn_blocking(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut request = agent.get(format!("http://{addr}{path}"));
                if let Some(token) = token {
                    request = request.header("Authorization", format!("Bearer {token}"));
                }
                request.call().unwrap().status().as_u16()
            })
        };
        assert_eq!(call(HEALTHZ_PATH, None).await.unwrap(), 200);
        for path in [DRAIN_PATH, SHUTDOWN_PATH] {
            assert_eq!(call(path, None).await.unwrap(), 401, "{path}");
            assert_eq!(call(path, Some("s3cres")).await.unwrap(), 401, "{path}");
            assert_eq!(call(path, Some("s3cret-")).await.unwrap(), 401, "{path}");
        }
        assert!(
            drained_at.lock().unwrap().is_none(),
            "Envoy was asked to drain"
        );
        assert_eq!(call(DRAIN_PATH, Some("s3cret")).await.unwrap(), 200);
        assert!(drained_at.lock().unwrap().is_some());
    }

    #[tokio::test]
    async fn the_drain_starts_after_the_delay_and_ends_at_the_minimum_of_connections() {
        let (admin, drained_at) = fake_admin(2).await;
        let manager = Manager::new(Config {
            start_delay: Duration::from_millis(300),
            min_open_connections: 2,
            ..config(admin)
        });
        let called = Instant::now();
        assert_eq!(manager.drain().await, Drain::Drained);
        let started = drained_at
            .lock()
            .unwrap()
            .expect("Envoy was asked to drain");
        assert!(started - called >= Duration::from_millis(300));
        // One connection over the minimum: the drain runs until its deadline.
        let (admin, _) = fake_admin(3).await;
        let manager = Manager::new(Config {
            drain_time: Duration::from_millis(200),
            min_open_connections: 2,
            ..config(admin)
        });
        assert_eq!(manager.drain().await, Drain::DeadlineReached { open: 3 });
    }

    #[tokio::test]
    async fn the_ready_file_is_written_after_the_drain_and_ends_a_shutdown_that_waits() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("shutdown-ok");
        let (admin, _) = fake_admin(0).await;
        let manager = Manager::new(Config {
            ready_file: Some(file.clone()),
            ..config(admin)
        });
        assert_eq!(manager.drain().await, Drain::Drained);
        assert!(file.exists(), "the drain did not create the ready file");
        // Another process's drain: the connections never close here, but the file appears.
        std::fs::remove_file(&file).unwrap();
        let (admin, _) = fake_admin(5).await;
        let manager = Manager::new(Config {
            ready_file: Some(file.clone()),
            ..config(admin)
        });
        let shutdown = tokio::spawn(async move { manager.shutdown().await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!shutdown.is_finished());
        std::fs::write(&file, b"").unwrap();
        let (drain, quit) = tokio::time::timeout(Duration::from_secs(5), shutdown)
            .await
            .expect("the ready file did not end the shutdown")
            .unwrap();
        assert_eq!((drain, quit), (Drain::Drained, Ok(())));
    }
}
