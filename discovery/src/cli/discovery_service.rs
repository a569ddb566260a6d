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
use marin3r_webhook::server::WebhookServerConfig;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::info;

use crate::api::discovery_service::{
    DEFAULT_ADMIN_PORT, DEFAULT_METRICS_PORT, DEFAULT_PROBE_PORT, DEFAULT_WEBHOOK_PORT,
    DEFAULT_XDS_PORT,
};
use crate::controllers::nacks::ReplicaPods;
use crate::controllers::{self, Readiness};
use crate::operator::leader::LeaseConfig;
use crate::xds::{Cache, Limits, Server, TlsFiles};

#[derive(Debug, Args)]
pub struct DiscoveryServiceArgs {
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
    /// Address of the admin HTTP server (/sync-status: every proxy of every namespace).
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
    /// Address to listen on (xDS, metrics, probe and webhook ports).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::UNSPECIFIED))]
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
    xds_limits: XdsLimitArgs,
}

/// What one proxy, or one namespace, may take of the xDS server. A stream over a limit is
/// closed with a gRPC status naming the flag and counted in marin3r_xds_refused_streams_total.
#[derive(Debug, Args)]
struct XdsLimitArgs {
    /// ADS streams open at once on one connection (Envoy opens one).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_streams_per_connection)]
    xds_max_streams_per_connection: u32,
    /// ADS streams open at once for one namespace, across its connections (about one per
    /// proxy).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_streams_per_namespace)]
    xds_max_streams_per_namespace: usize,
    /// Seconds a new ADS stream may take to send its first request.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().first_request_timeout.as_secs())]
    xds_first_request_timeout: u64,
    /// The largest discovery request accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_request_bytes)]
    xds_max_request_bytes: usize,
    /// Resource names one stream may subscribe to per resource type.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_names_per_type)]
    xds_max_names_per_type: usize,
    /// Seconds after which a proxy's connection is closed (it reconnects at once), so its
    /// certificate and namespace are checked again.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().max_connection_age.as_secs())]
    xds_max_connection_age: u64,
}

impl XdsLimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_streams_per_connection: self.xds_max_streams_per_connection.max(1),
            max_streams_per_namespace: self.xds_max_streams_per_namespace.max(1),
            first_request_timeout: std::time::Duration::from_secs(
                self.xds_first_request_timeout.max(1),
            ),
            max_request_bytes: self.xds_max_request_bytes.max(1024),
            max_names_per_type: self.xds_max_names_per_type.max(1),
            max_connection_age: std::time::Duration::from_secs(self.xds_max_connection_age.max(10)),
        }
    }
}

impl DiscoveryServiceArgs {
    pub fn debug(&self) -> bool {
        self.debug
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

pub async fn run(args: DiscoveryServiceArgs) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let bind = |port| SocketAddr::new(args.bind_address, port);
    let xds_listener = TcpListener::bind(bind(args.xds_port))
        .await
        .with_context(|| format!("listening on the xDS port {}", args.xds_port))?;
    let http_listener = TcpListener::bind(bind(args.metrics_port))
        .await
        .with_context(|| format!("listening on the metrics port {}", args.metrics_port))?;
    let probe_listener = TcpListener::bind(bind(args.probe_port))
        .await
        .with_context(|| format!("listening on the probe port {}", args.probe_port))?;
    let webhook_listener = TcpListener::bind(bind(args.webhook_port))
        .await
        .with_context(|| format!("listening on the webhook port {}", args.webhook_port))?;
    let admin_listener = TcpListener::bind(args.admin_address)
        .await
        .with_context(|| format!("listening on the admin address {}", args.admin_address))?;

    let tls = TlsFiles::in_dir(&args.server_cert_dir);
    // Refuse to start, naming the folder, rather than fail later inside a server task.
    crate::xds::server_config(&tls).with_context(|| {
        format!(
            "the server certificate in {} (--server-cert-dir)",
            args.server_cert_dir.display()
        )
    })?;
    // Secrets of other namespaces are refused, as the controllers below are configured.
    let allow_cross_namespace_secrets = false;
    let mut webhook = WebhookServerConfig::new(&tls.cert, &tls.key);
    webhook.envoy_config_validator =
        Some(crate::admission::validator(allow_cross_namespace_secrets));
    webhook.injection.shutdown_manager_image = args.shutdown_manager_image.clone();
    webhook.injection.discovery_service = args.discovery_service_name.clone();
    let mut registry = Registry::default();
    webhook.metrics.register(&mut registry);
    let controller_metrics = controllers::ControllerMetrics::default();
    controller_metrics.register(&mut registry);

    let readiness = Readiness::default();
    let webhook_ready = Arc::new(AtomicBool::new(false));
    // False from SIGTERM on: not ready while the listeners stay open for --shutdown-delay.
    let serving = Arc::new(AtomicBool::new(true));
    let cache = Cache::new();
    let (server, nacks) = Server::builder(cache.clone())
        .control_plane_id(std::env::var("POD_NAME").unwrap_or_else(|_| "marin3r".into()))
        .registry(registry)
        .limits(args.xds_limits.limits())
        .ready_when("EnvoyConfig controller", readiness.envoy_configs.clone())
        .ready_when(
            "EnvoyConfigRevision controller",
            readiness.revisions.clone(),
        )
        .ready_when("webhook", webhook_ready.clone())
        .ready_when("shutting down", serving.clone())
        .drain_period(Duration::from_secs(args.shutdown_grace_period))
        .build();
    let router = server.http_router();
    // The probe port answers exactly what the metrics port answers for the two health paths.
    let probe_router = router
        .clone()
        .layer(axum::middleware::from_fn(only_health_paths));
    let admin_router = server.admin_router();

    // Two phases: `draining` (SIGTERM) closes the xDS and webhook listeners; `stopped` (once
    // the xDS server has drained) stops the controllers and the HTTP servers, which keep
    // feeding and probing the open streams until then.
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let draining = move || {
        let mut rx = drain_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let replica = std::env::var("POD_NAME").unwrap_or_else(|_| "discovery-service".into());
    let namespace = args
        .leader_election_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok());
    let leader_lease = if args.no_leader_election {
        None
    } else {
        let namespace = namespace.clone().context(
            "leader election needs a namespace: set POD_NAMESPACE or \
             --leader-election-namespace, or pass --no-leader-election",
        )?;
        let lease = match &args.discovery_service_name {
            Some(name) => format!("marin3r-discovery-{name}"),
            None => "marin3r-discovery".to_owned(),
        };
        Some(LeaseConfig::new(&namespace, &lease, &replica))
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
    let config = controllers::Config {
        metrics: controller_metrics,
        discovery_service: args.discovery_service_name.clone(),
        watch_namespace: args.watch_namespace.clone(),
        allow_cross_namespace_secrets,
        taint_threshold: controllers::nacks::TaintThreshold::percent(args.taint_threshold_percent)
            .map_err(anyhow::Error::msg)?,
        replica,
        proxies: server.status_registry(),
        replica_pods,
        leader_lease,
    };
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
    // The leader steps down when draining begins, so the replacement pod publishes at once.
    let controllers = tokio::spawn(controllers::run_stepping_down(
        client,
        config,
        cache,
        nacks,
        readiness,
        draining(),
        stopped(),
    ));
    let mut http = tokio::spawn({
        let stop = stopped();
        async move {
            axum::serve(http_listener, router)
                .with_graceful_shutdown(stop)
                .await
        }
    });
    let mut probes = tokio::spawn({
        let stop = stopped();
        async move {
            axum::serve(probe_listener, probe_router)
                .with_graceful_shutdown(stop)
                .await
        }
    });
    let mut admin = tokio::spawn({
        let stop = stopped();
        async move {
            axum::serve(admin_listener, admin_router)
                .with_graceful_shutdown(stop)
                .await
        }
    });
    let mut webhook_task = tokio::spawn(marin3r_webhook::serve(
        webhook,
        webhook_listener,
        draining(),
    ));
    webhook_ready.store(true, Ordering::SeqCst);
    let mut xds = tokio::spawn(server.serve(xds_listener, tls, draining()));

    // A server that stops on its own is fatal: the pod must restart rather than limp along.
    // SIGTERM first makes the pod not ready; the listeners close when the delay ends.
    let signal = super::shutdown_signal();
    tokio::pin!(signal);
    let mut listeners_close: Option<tokio::time::Instant> = None;
    let early = loop {
        tokio::select! {
            () = &mut signal, if listeners_close.is_none() => {
                serving.store(false, Ordering::SeqCst);
                info!(
                    delay_seconds = args.shutdown_delay,
                    "shutting down: not ready; new connections still accepted until the delay ends"
                );
                listeners_close = Some(
                    tokio::time::Instant::now() + Duration::from_secs(args.shutdown_delay),
                );
            }
            () = tokio::time::sleep_until(
                listeners_close.unwrap_or_else(tokio::time::Instant::now),
            ), if listeners_close.is_some() => break None,
            r = &mut xds => break Some(("xDS server", r.map(|r| r.map_err(anyhow::Error::from)))),
            r = &mut http => break Some(("HTTP server", r.map(|r| r.map_err(anyhow::Error::from)))),
            r = &mut probes => break Some(("probe server", r.map(|r| r.map_err(anyhow::Error::from)))),
            r = &mut admin => break Some(("admin server", r.map(|r| r.map_err(anyhow::Error::from)))),
            r = &mut webhook_task => break Some(("webhook", r.map(|r| r.map_err(anyhow::Error::from)))),
        }
    };
    let _ = drain_tx.send(true);
    if let Some((what, result)) = early {
        let _ = stop_tx.send(true);
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
    let (x, w) = tokio::join!(xds, webhook_task);
    let _ = stop_tx.send(true);
    let (h, p, a, _) = tokio::join!(http, probes, admin, controllers);
    x.context("xDS server task")?.context("xDS server")?;
    w.context("webhook task")?.context("webhook")?;
    h.context("HTTP server task")?.context("HTTP server")?;
    p.context("probe server task")?.context("probe server")?;
    a.context("admin server task")?.context("admin server")?;
    info!("discovery service stopped");
    Ok(())
}
