//! `marin3r operator`: the certificate, DiscoveryService and EnvoyDeployment controllers, run by the replica
//! that holds the leader Lease, until SIGINT or SIGTERM; every replica serves `/metrics` and
//! `/healthz`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use marin3r_certs::controller as certificates;
use marin3r_controller::ReconcileMetrics;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use marin3r_controller::leader;
use marin3r_operator as operator;

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Namespaces whose certificates may write Secrets to and read CAs from other namespaces
    /// (repeatable). Defaults to the operator's own namespace (POD_NAMESPACE). A
    /// DiscoveryService in one of them serves the namespaces listed or labelled for it; one
    /// anywhere else serves its own namespace only.
    #[arg(long = "trusted-namespace", value_name = "NAMESPACE")]
    trusted_namespaces: Vec<String>,
    /// The discovery pods' image when a DiscoveryService sets none (default: this binary's
    /// own image and version).
    #[arg(long, env = "MARIN3R_IMAGE", default_value = crate::IMAGE)]
    discovery_service_image: String,
    /// The namespace of the leader election Lease (default: POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Run the controllers without leader election (one replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// Where to serve /metrics (the reconcile metrics) and /healthz. `[::]` (the default) is
    /// every address of both IP families, or every IPv4 address where there is no IPv6.
    #[arg(long, value_name = "ADDR", default_value = "[::]:8383")]
    metrics_addr: SocketAddr,
    /// How long (seconds) a changed Secret may take to reach every pod that mounts it; each
    /// step of a CA rotation (trust the next CA, sign with it, drop the previous one) waits
    /// this long after the step before reached every Secret.
    #[arg(long, value_name = "SECONDS", default_value_t = marin3r_certs::controller::rotation::DEFAULT_TRUST_PROPAGATION.as_secs())]
    trust_propagation_seconds: u64,
    /// Seconds one reconcile may take before it is abandoned and retried with fresh API
    /// requests (every API request also fails after 60 s without an answer).
    #[arg(long, value_name = "SECONDS", default_value_t = marin3r_controller::DEFAULT_RECONCILE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    reconcile_timeout_seconds: u64,
    #[command(flatten)]
    pub(super) log: super::logging::LogArgs,
}

const LEASE_NAME: &str = "marin3r-operator";

pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let client = marin3r_controller::client::infer().await?;
    let stop = CancellationToken::new();
    let controllers = Controllers::new(&args);
    let leader_metrics = leader::LeaderMetrics::default();
    let mut registry = Registry::default();
    super::admin::register_build_info(&mut registry, "operator");
    controllers.metrics.register(&mut registry);
    controllers.certificates.register(&mut registry);
    leader_metrics.register(&mut registry);
    let admin = super::admin::serve(
        args.metrics_addr,
        super::admin::router(registry),
        stop.clone(),
    )
    .await?;
    let work = controllers.run(client.clone(), stop.clone());
    tokio::spawn({
        let stop = stop.clone();
        async move {
            super::shutdown_signal().await;
            stop.cancel();
        }
    });
    let result = if args.no_leader_election {
        work.await;
        Ok(())
    } else {
        let namespace = args.leader_election_namespace;
        lead(client, namespace, leader_metrics, stop.clone(), work).await
    };
    stop.cancel();
    admin.await??;
    result
}

/// The leader's three controllers: their settings from the flags, and the metrics they record.
struct Controllers {
    trusted: BTreeSet<String>,
    image: String,
    /// The pods the operator runs log as it does.
    json_logs: bool,
    trust_propagation: Duration,
    reconcile_timeout: Option<Duration>,
    metrics: ReconcileMetrics,
    certificates: certificates::CertificateMetrics,
}

impl Controllers {
    fn new(args: &OperatorArgs) -> Self {
        let mut trusted: BTreeSet<String> = args.trusted_namespaces.iter().cloned().collect();
        if trusted.is_empty()
            && let Ok(ns) = std::env::var("POD_NAMESPACE")
        {
            trusted.insert(ns);
        }
        Self {
            trusted,
            image: args.discovery_service_image.clone(),
            json_logs: args.log.log_format == super::logging::LogFormat::Json,
            trust_propagation: Duration::from_secs(args.trust_propagation_seconds),
            reconcile_timeout: Some(Duration::from_secs(args.reconcile_timeout_seconds)),
            metrics: ReconcileMetrics::default(),
            certificates: certificates::CertificateMetrics::default(),
        }
    }

    /// Runs the certificate, DiscoveryService and EnvoyDeployment controllers until `stop`.
    async fn run(self, client: kube::Client, stop: CancellationToken) {
        let Self {
            trusted,
            image,
            json_logs,
            trust_propagation,
            reconcile_timeout,
            metrics,
            certificates: certificate_metrics,
        } = self;
        tracing::info!(
            ?trusted,
            "starting the certificate, DiscoveryService and EnvoyDeployment controllers"
        );
        let certs = certificates::run(
            client.clone(),
            certificates::Config {
                trusted_namespaces: trusted.clone(),
                metrics: metrics.clone(),
                certificates: certificate_metrics,
                trust_propagation,
                reconcile_timeout,
                ..Default::default()
            },
            stop.clone().cancelled_owned(),
        );
        let gateways = operator::envoy_deployment::run(
            client.clone(),
            operator::envoy_deployment::Config {
                marin3r_image: image.clone(),
                json_logs,
                metrics: metrics.clone(),
                reconcile_timeout,
            },
            stop.clone().cancelled_owned(),
        );
        let discovery_services = operator::run(
            client,
            operator::Config {
                default_image: image,
                json_logs,
                trusted_namespaces: trusted,
                metrics,
                reconcile_timeout,
            },
            stop.cancelled_owned(),
        );
        tokio::join!(certs, gateways, discovery_services);
    }
}

/// Runs `work` while this replica holds the leader Lease.
async fn lead(
    client: kube::Client,
    namespace: Option<String>,
    metrics: leader::LeaderMetrics,
    stop: CancellationToken,
    work: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let namespace = namespace
        .context("leader election needs a namespace: set POD_NAMESPACE or --leader-election-namespace, or pass --no-leader-election")?;
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("marin3r-operator-{}", std::process::id()));
    let config = leader::LeaseConfig::new(&namespace, LEASE_NAME, &identity).with_metrics(metrics);
    Ok(leader::run_as_leader(client, config, stop, work).await?)
}
