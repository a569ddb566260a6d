//! `marin3r discovery-service`: the discovery pod's one process. The xDS server (mTLS), the
//! `EnvoyConfig`/`EnvoyConfigRevision`/Secret controllers that feed it, the metrics and
//! health HTTP server, the probe server (health only), the sync-status server on loopback,
//! and the webhook (sidecar injection and EnvoyConfig validation), on one server certificate.
//!
//! Shutdown (SIGTERM): `/readyz` turns 503 and the xDS and webhook listeners close at once;
//! the open xDS streams keep being served, new configs included, for the grace period; then
//! the streams end and the process exits.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::response::IntoResponse as _;
use clap::Args;
use marin3r_controller::leader::{LeaderMetrics, LeaseConfig};
use marin3r_webhook::server::WebhookServerConfig;
use marin3r_xds::{Cache, Server, TlsFiles};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::admin;

use crate::controllers::nacks::ReplicaPods;
use crate::controllers::{self, Readiness};
use marin3r_api::discovery_service::{
    DEFAULT_ADMIN_PORT, DEFAULT_METRICS_PORT, DEFAULT_PROBE_PORT, DEFAULT_WEBHOOK_PORT,
    DEFAULT_XDS_PORT,
};

#[derive(Debug, Args)]
pub struct DiscoveryServiceArgs {
    /// The Envoy binary the validating webhook and the EnvoyConfig controller run (`envoy
    /// --mode validate`) on what passes marin3r's own checks (default: /usr/local/bin/envoy
    /// when the image carries it).
    #[arg(long, value_name = "PATH")]
    envoy_binary: Option<std::path::PathBuf>,
    /// Port of the xDS server (gRPC ADS over mutual TLS).
    #[arg(long, default_value_t = DEFAULT_XDS_PORT)]
    xds_port: u16,
    /// Port of the plain-HTTP server: /metrics, /healthz, /readyz.
    #[arg(long, default_value_t = DEFAULT_METRICS_PORT)]
    metrics_port: u16,
    /// Port of the plain-HTTP health server the pod's probes use: /healthz, /readyz (the same
    /// answers as on the metrics port).
    #[arg(long, default_value_t = DEFAULT_PROBE_PORT)]
    probe_port: u16,
    /// Address of the admin HTTP server (/sync-status: every proxy of every namespace;
    /// /served-config: what one node is served, secrets redacted).
    /// Loopback by default, so only the pod itself reaches it (`marin3r proxy-status` does,
    /// through the API server's pod port-forward).
    #[arg(long, default_value_t = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_ADMIN_PORT))]
    admin_address: SocketAddr,
    /// Seconds the open xDS streams keep being served after SIGTERM, while /readyz reports
    /// 503 and no new connection is accepted; keep it under the pod's
    /// terminationGracePeriodSeconds (30 by default).
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    shutdown_grace_period: u64,
    /// Seconds between SIGTERM and closing the listeners: /readyz reports 503 at once, but
    /// new webhook and xDS connections are still accepted while the Service's endpoints (the
    /// API server's webhook client, kube-proxy) stop sending traffic to this pod. This delay
    /// plus --shutdown-grace-period must stay under terminationGracePeriodSeconds.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    shutdown_delay: u64,
    /// Port of the webhook (HTTPS): sidecar injection and EnvoyConfig validation.
    #[arg(long, default_value_t = DEFAULT_WEBHOOK_PORT)]
    webhook_port: u16,
    /// Folder with the server certificate (tls.crt, tls.key) and the CA that signs the
    /// proxies' client certificates (ca.crt): a Kubernetes TLS Secret mounted there.
    #[arg(long, value_name = "DIR")]
    server_cert_dir: PathBuf,
    /// Serve only EnvoyConfigs in namespaces labelled
    /// marin3r.3scale.net/discovery-service=NAME (default: every namespace).
    #[arg(long, value_name = "NAME")]
    discovery_service_name: Option<String>,
    /// Serve only this namespace's EnvoyConfigs, reading nothing outside it (EnvoyConfigs,
    /// revisions, Secrets and EndpointSlices through namespaced watches; Namespaces not at
    /// all): the discovery pod of a DiscoveryService that serves its own namespace.
    /// With --discovery-service-name too, the name only tells the injection webhook which
    /// discovery-service.name annotations are its own.
    #[arg(long, value_name = "NAMESPACE")]
    watch_namespace: Option<String>,
    /// Taint a revision when at least this percentage of its node's connected proxies
    /// has rejected it (NACK); 100: every one of them.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(1..=100))]
    taint_threshold_percent: u8,
    /// The namespace of the leader election Lease (default: POD_NAMESPACE). Only the leader
    /// runs the EnvoyConfig controller (revisions, publication, rollback) and writes taints;
    /// every replica serves what is published and reports the NACKs it sees.
    #[arg(long, value_name = "NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Run the EnvoyConfig controller without leader election (one replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// The label selector of the discovery pods (in the Lease's namespace): the reports of a
    /// replica whose pod is gone are ignored, and the leader waits for every live replica's
    /// count before it taints. Without it, the fresh reports alone are counted.
    #[arg(long, value_name = "SELECTOR")]
    replica_selector: Option<String>,
    /// Seconds one reconcile may take before it is abandoned and retried with fresh API
    /// requests (every API request also fails after 60 s without an answer).
    #[arg(long, value_name = "SECONDS", default_value_t = marin3r_controller::DEFAULT_RECONCILE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    reconcile_timeout_seconds: u64,
    /// Address to listen on (xDS, metrics, probe and webhook ports). `::` (the default) is
    /// every address of both IP families, or every IPv4 address where there is no IPv6.
    #[arg(long, default_value_t = super::listen::ANY)]
    bind_address: IpAddr,
    /// The image of the shutdown manager the webhook injects for pods that set
    /// marin3r.3scale.net/shutdown-manager.enabled and no shutdown-manager.image (the
    /// operator passes the discovery pod's own image).
    #[arg(long, value_name = "IMAGE", default_value = crate::IMAGE)]
    shutdown_manager_image: String,
    /// Debug logging.
    #[arg(long)]
    debug: bool,
    #[command(flatten)]
    log: super::logging::LogArgs,
    #[command(flatten)]
    xds_limits: super::limits::XdsLimitArgs,
    #[command(flatten)]
    webhook_limits: super::limits::WebhookLimitArgs,
    #[command(flatten)]
    sidecar: super::sidecar_defaults::SidecarDefaultArgs,
}

impl DiscoveryServiceArgs {
    pub fn debug(&self) -> bool {
        self.debug
    }

    pub fn log_format(&self) -> super::logging::LogFormat {
        self.log.log_format
    }
}

/// The probe port serves `/healthz` and `/readyz` only: not `/metrics`, which stays on the
/// metrics port the Service exposes.
async fn only_health_paths(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match request.uri().path() {
        "/healthz" | "/readyz" => next.run(request).await,
        _ => axum::http::StatusCode::NOT_FOUND.into_response(),
    }
}

/// The two phases of shutdown. `draining` (SIGTERM, once `--shutdown-delay` has passed)
/// closes the xDS and webhook listeners and ends the leader's term; `stopped` (once the xDS
/// server has drained its open streams) stops the controllers and the HTTP servers, which keep
/// feeding and probing the open streams until then.
#[derive(Debug, Clone, Default)]
struct Shutdown {
    draining: CancellationToken,
    stopped: CancellationToken,
}

/// Every port the process listens on, bound before anything starts so that a taken port is
/// an error at once, naming it.
struct Listeners {
    xds: TcpListener,
    metrics: TcpListener,
    probe: TcpListener,
    webhook: TcpListener,
    admin: TcpListener,
}

impl Listeners {
    async fn bind(args: &DiscoveryServiceArgs) -> anyhow::Result<Self> {
        let bind = |port, what: &'static str| {
            let addr = SocketAddr::new(args.bind_address, port);
            super::listen::bind(addr)
                .with_context(|| format!("listening on the {what} port {port}"))
        };
        Ok(Self {
            xds: bind(args.xds_port, "xDS")?,
            metrics: bind(args.metrics_port, "metrics")?,
            probe: bind(args.probe_port, "probe")?,
            webhook: bind(args.webhook_port, "webhook")?,
            admin: super::listen::bind(args.admin_address).with_context(|| {
                format!("listening on the admin address {}", args.admin_address)
            })?,
        })
    }
}

/// The servers' tasks; any of them ending before shutdown is fatal.
struct Servers {
    xds: JoinHandle<Result<(), marin3r_xds::ServeError>>,
    webhook: JoinHandle<Result<(), marin3r_webhook::server::ServeError>>,
    http: JoinHandle<std::io::Result<()>>,
    probes: JoinHandle<std::io::Result<()>>,
    admin: JoinHandle<std::io::Result<()>>,
}

impl Servers {
    /// Starts every server: the webhook and xDS until `draining`, the HTTP ones until
    /// `stopped`. The webhook is ready once its task is spawned.
    fn spawn(
        listeners: Listeners,
        (server, tls): (Server, TlsFiles),
        (webhook, webhook_ready): (WebhookServerConfig, &AtomicBool),
        health: axum::Router,
        shutdown: &Shutdown,
    ) -> Self {
        let admin_router = server
            .admin_router()
            .merge(crate::proxy_config::served::router(server.cache().clone()));
        let webhook = tokio::spawn(marin3r_webhook::serve(
            webhook,
            listeners.webhook,
            shutdown.draining.clone().cancelled_owned(),
        ));
        webhook_ready.store(true, Ordering::SeqCst);
        let draining = shutdown.draining.clone().cancelled_owned();
        // The probe port answers exactly what the metrics port answers for the two health paths.
        let probe_router = health
            .clone()
            .layer(axum::middleware::from_fn(only_health_paths));
        Self {
            xds: tokio::spawn(server.serve(listeners.xds, tls, draining)),
            webhook,
            probes: serve_http(listeners.probe, probe_router, shutdown),
            http: serve_http(listeners.metrics, health, shutdown),
            admin: serve_http(listeners.admin, admin_router, shutdown),
        }
    }
}

pub async fn run(args: DiscoveryServiceArgs) -> anyhow::Result<()> {
    let client = marin3r_controller::client::infer()
        .await
        .context("connecting to the Kubernetes API")?;
    let listeners = Listeners::bind(&args).await?;
    let tls = TlsFiles::in_dir(&args.server_cert_dir);
    // Refuse to start, naming the folder, rather than fail later inside a server task.
    marin3r_xds::server_config(&tls).with_context(|| {
        format!(
            "the server certificate in {} (--server-cert-dir)",
            args.server_cert_dir.display()
        )
    })?;
    let mut registry = Registry::default();
    admin::register_build_info(&mut registry, "discovery_service");
    let leader_metrics = LeaderMetrics::default();
    leader_metrics.register(&mut registry);
    let judge = marin3r_envoyconfig::judge::EnvoyJudge::in_image(args.envoy_binary.as_deref());
    let mut webhook = webhook_config(&args, &tls, judge.clone(), &mut registry);
    args.sidecar.apply(&client, &mut webhook.injection).await;
    let controller_metrics = controllers::ControllerMetrics::default();
    controller_metrics.register(&mut registry);
    let cache = Cache::new();
    let (server, nacks) = Server::builder(cache.clone())
        .control_plane_id(std::env::var("POD_NAME").unwrap_or_else(|_| "marin3r".into()))
        .metrics(&mut registry)
        .limits(args.xds_limits.limits())
        .drain_period(Duration::from_secs(args.shutdown_grace_period))
        .build();
    let metrics = (controller_metrics, leader_metrics);
    let config = controllers_config(&args, metrics, server.status_registry(), judge)?;
    let gates = Gates::default();
    let health = admin::router_with_readiness(registry, gates.readiness(&server));
    info!(
        xds = args.xds_port,
        metrics = args.metrics_port,
        probe = args.probe_port,
        webhook = args.webhook_port,
        admin = %args.admin_address,
        discovery_service = ?args.discovery_service_name,
        watch_namespace = ?args.watch_namespace,
        "starting the discovery service"
    );
    let shutdown = Shutdown::default();
    // The leader steps down when draining begins, so the replacement pod publishes at once.
    let controllers = tokio::spawn(controllers::run_stepping_down(
        client,
        config,
        cache,
        nacks,
        gates.controllers.clone(),
        shutdown.draining.clone().cancelled_owned(),
        shutdown.stopped.clone().cancelled_owned(),
    ));
    let mut servers = Servers::spawn(
        listeners,
        (server, tls),
        (webhook, &gates.webhook),
        health,
        &shutdown,
    );
    let failed = until_shutdown(&mut servers, &gates.serving, args.shutdown_delay).await;
    shutdown.draining.cancel();
    if let Some((what, result)) = failed {
        shutdown.stopped.cancel();
        controllers.abort();
        result
            .with_context(|| format!("{what} task"))?
            .with_context(|| what.to_owned())?;
        anyhow::bail!("{what} stopped unexpectedly");
    }
    info!(
        grace_period_seconds = args.shutdown_grace_period,
        "shutting down: no new connections; open xDS streams served until the grace period ends"
    );
    drain(servers, controllers, &shutdown).await?;
    info!("discovery service stopped");
    Ok(())
}

/// What `/readyz` waits for besides the xDS server.
struct Gates {
    controllers: Readiness,
    webhook: Arc<AtomicBool>,
    /// False from SIGTERM on: not ready while the listeners stay open for --shutdown-delay.
    serving: Arc<AtomicBool>,
}

impl Default for Gates {
    fn default() -> Self {
        Self {
            controllers: Readiness::default(),
            webhook: Arc::new(AtomicBool::new(false)),
            serving: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Gates {
    fn readiness(&self, server: &Server) -> admin::Readiness {
        admin::Readiness::default()
            .gate("xDS server", server.serving())
            .gate(
                "EnvoyConfig controller",
                self.controllers.envoy_configs.clone(),
            )
            .gate(
                "EnvoyConfigRevision controller",
                self.controllers.revisions.clone(),
            )
            .gate("webhook", self.webhook.clone())
            .gate("shutting down", self.serving.clone())
    }
}

/// The webhook's settings: the server certificate, the EnvoyConfig rules, and the defaults
/// its injections take from this discovery service; its metrics go to `registry`.
fn webhook_config(
    args: &DiscoveryServiceArgs,
    tls: &TlsFiles,
    judge: Option<marin3r_envoyconfig::judge::EnvoyJudge>,
    registry: &mut Registry,
) -> WebhookServerConfig {
    let mut webhook = WebhookServerConfig::new(&tls.cert, &tls.key);
    webhook.envoy_config_validator = Some(marin3r_envoyconfig::rules::validator_with(
        ALLOW_CROSS_NAMESPACE_SECRETS,
        judge,
    ));
    webhook.injection.shutdown_manager_image = args.shutdown_manager_image.clone();
    webhook.injection.json_logs = args.log_format() == super::logging::LogFormat::Json;
    webhook.injection.discovery_service = args.discovery_service_name.clone();
    args.webhook_limits.apply(&mut webhook);
    webhook.metrics.register(registry);
    webhook
}

/// Secrets of other namespaces are refused, by the webhook and the controllers alike.
const ALLOW_CROSS_NAMESPACE_SECRETS: bool = false;

/// What the controllers serve, who this replica is, and how it elects its leader.
fn controllers_config(
    args: &DiscoveryServiceArgs,
    (metrics, leader_metrics): (controllers::ControllerMetrics, LeaderMetrics),
    proxies: marin3r_xds::StatusRegistry,
    judge: Option<marin3r_envoyconfig::judge::EnvoyJudge>,
) -> anyhow::Result<controllers::Config> {
    let replica = std::env::var("POD_NAME").unwrap_or_else(|_| "discovery-service".into());
    let namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok());
    let leader_lease = match args.no_leader_election {
        true => None,
        false => {
            Some(leader_lease(args, namespace.as_deref(), &replica)?.with_metrics(leader_metrics))
        }
    };
    let replica_pods = match (&args.replica_selector, namespace) {
        (Some(selector), Some(namespace)) => Some(ReplicaPods {
            namespace,
            selector: selector.clone(),
        }),
        (Some(_), None) => anyhow::bail!(
            "--replica-selector needs the pods' namespace: set POD_NAMESPACE or \
             --leader-election-namespace"
        ),
        (None, _) => None,
    };
    Ok(controllers::Config {
        metrics,
        discovery_service: args.discovery_service_name.clone(),
        watch_namespace: args.watch_namespace.clone(),
        allow_cross_namespace_secrets: ALLOW_CROSS_NAMESPACE_SECRETS,
        taint_threshold: controllers::nacks::TaintThreshold::percent(args.taint_threshold_percent)
            .map_err(anyhow::Error::msg)?,
        replica,
        proxies,
        replica_pods,
        leader_lease,
        reconcile_timeout: Some(std::time::Duration::from_secs(
            args.reconcile_timeout_seconds,
        )),
        judge,
    })
}

/// The Lease the replicas of one discovery service elect their leader with.
fn leader_lease(
    args: &DiscoveryServiceArgs,
    namespace: Option<&str>,
    replica: &str,
) -> anyhow::Result<LeaseConfig> {
    let namespace = namespace.context(
        "leader election needs a namespace: set POD_NAMESPACE or \
         --leader-election-namespace, or pass --no-leader-election",
    )?;
    let lease = match &args.discovery_service_name {
        Some(name) => format!("marin3r-discovery-{name}"),
        None => "marin3r-discovery".to_owned(),
    };
    Ok(LeaseConfig::new(namespace, &lease, replica))
}

/// Serves `router` on `listener` until the controllers and streams have stopped.
fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    shutdown: &Shutdown,
) -> JoinHandle<std::io::Result<()>> {
    let stop = shutdown.stopped.clone().cancelled_owned();
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stop)
            .await
    })
}

type Failure = (
    &'static str,
    Result<anyhow::Result<()>, tokio::task::JoinError>,
);

/// A server task's result with its error as an `anyhow::Error`.
fn any<E>(
    r: Result<Result<(), E>, tokio::task::JoinError>,
) -> Result<anyhow::Result<()>, tokio::task::JoinError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    r.map(|r| r.map_err(anyhow::Error::from))
}

/// Waits for SIGTERM, then `delay` seconds with the pod not ready (`serving` false) while the
/// listeners stay open; `None` then. A server that stops on its own before is fatal (the pod
/// must restart rather than limp along): its name and result.
async fn until_shutdown(
    servers: &mut Servers,
    serving: &AtomicBool,
    delay: u64,
) -> Option<Failure> {
    let signal = super::shutdown_signal();
    tokio::pin!(signal);
    let mut listeners_close: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = &mut signal, if listeners_close.is_none() => {
                serving.store(false, Ordering::SeqCst);
                info!(
                    delay_seconds = delay,
                    "shutting down: not ready; new connections still accepted until the delay ends"
                );
                listeners_close = Some(tokio::time::Instant::now() + Duration::from_secs(delay));
            }
            () = tokio::time::sleep_until(
                listeners_close.unwrap_or_else(tokio::time::Instant::now),
            ), if listeners_close.is_some() => return None,
            r = &mut servers.xds => return Some(("xDS server", any(r))),
            r = &mut servers.http => return Some(("HTTP server", any(r))),
            r = &mut servers.probes => return Some(("probe server", any(r))),
            r = &mut servers.admin => return Some(("admin server", any(r))),
            r = &mut servers.webhook => return Some(("webhook", any(r))),
        }
    }
}

/// With the listeners closed: waits for the xDS server to drain its streams and for the
/// webhook, then stops the controllers and the HTTP servers; the first error, named.
async fn drain(
    servers: Servers,
    controllers: JoinHandle<()>,
    shutdown: &Shutdown,
) -> anyhow::Result<()> {
    let (x, w) = tokio::join!(servers.xds, servers.webhook);
    shutdown.stopped.cancel();
    let (h, p, a, _) = tokio::join!(servers.http, servers.probes, servers.admin, controllers);
    x.context("xDS server task")?.context("xDS server")?;
    w.context("webhook task")?.context("webhook")?;
    h.context("HTTP server task")?.context("HTTP server")?;
    p.context("probe server task")?.context("probe server")?;
    a.context("admin server task")?.context("admin server")?;
    Ok(())
}
