//! What one client may take of the discovery pod's servers: the `marin3r discovery-service`
//! flags that bound the webhook per client address and the xDS server per proxy and per
//! namespace, and the settings they give those servers.

use clap::Args;
use marin3r_webhook::server::WebhookServerConfig;
use marin3r_xds::Limits;

/// What one client address may take of the webhook, which anyone reaching its port can call
/// without a certificate: its share leaves the API server's calls their slots.
#[derive(Debug, Args)]
pub struct WebhookLimitArgs {
    /// Webhook connections one client address may hold at once; more are closed at once.
    #[arg(long, value_name = "N", default_value_t = marin3r_webhook::server::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    webhook_max_connections_per_address: usize,
    /// Webhook requests one client address may have in flight at once; more get 429.
    #[arg(long, value_name = "N", default_value_t = marin3r_webhook::server::DEFAULT_MAX_REQUESTS_PER_ADDRESS)]
    webhook_max_requests_per_address: usize,
    /// EnvoyConfig validations judged at once, every namespace together (pod injections never
    /// wait for these); 8 times as many may wait for their turn, more are refused (429).
    #[arg(long, value_name = "N", default_value_t = marin3r_webhook::validate_turns::DEFAULT_MAX_VALIDATIONS)]
    webhook_max_validations: usize,
    /// EnvoyConfig validations of one namespace judged at once; 8 times as many may wait for
    /// their turn, more are refused (429).
    #[arg(long, value_name = "N", default_value_t = marin3r_webhook::validate_turns::DEFAULT_MAX_VALIDATIONS_PER_NAMESPACE)]
    webhook_max_validations_per_namespace: usize,
    /// Milliseconds an EnvoyConfig validation waits for its turn before it is refused (429).
    /// With Envoy's 6 s to judge, keep it under the webhook's 10 s timeout.
    #[arg(long, value_name = "MS", default_value_t = marin3r_webhook::validate_turns::DEFAULT_VALIDATION_WAIT_MS, value_parser = clap::value_parser!(u64).range(0..=3_000))]
    webhook_validation_wait_ms: u64,
}

impl WebhookLimitArgs {
    /// Sets the webhook's limits; a share of no connection or request is raised to one.
    pub fn apply(&self, webhook: &mut WebhookServerConfig) {
        webhook.max_connections_per_address = self.webhook_max_connections_per_address.max(1);
        webhook.max_requests_per_address = self.webhook_max_requests_per_address.max(1);
        webhook.validations = marin3r_webhook::validate_turns::ValidationLimits {
            at_once: self.webhook_max_validations,
            per_namespace: self.webhook_max_validations_per_namespace,
            wait: std::time::Duration::from_millis(self.webhook_validation_wait_ms),
        };
    }
}

/// What one proxy, or one namespace, may take of the xDS server. A stream over a limit is
/// closed with a gRPC status naming the flag and counted in marin3r_xds_refused_streams_total.
#[derive(Debug, Args)]
pub struct XdsLimitArgs {
    /// ADS streams open at once on one connection (Envoy opens one).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_streams_per_connection)]
    xds_max_streams_per_connection: u32,
    /// ADS streams open at once for one namespace, across its connections (about one per
    /// proxy).
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_streams_per_namespace)]
    xds_max_streams_per_namespace: usize,
    /// Authenticated xDS connections open at once for one namespace, idle ones included
    /// (about one per proxy); more are closed right after their handshake.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections_per_namespace)]
    xds_max_connections_per_namespace: usize,
    /// Seconds a new ADS stream may take to send its first request.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().first_request_timeout.as_secs())]
    xds_first_request_timeout: u64,
    /// Seconds a discovery request may take to arrive whole once its first bytes have.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().request_timeout.as_secs())]
    xds_request_timeout: u64,
    /// The largest discovery request accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_request_bytes)]
    xds_max_request_bytes: usize,
    /// Resource names one stream may subscribe to per resource type.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_names_per_type)]
    xds_max_names_per_type: usize,
    /// The longest resource name (or reported version) a discovery request may carry, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_name_bytes)]
    xds_max_name_bytes: usize,
    /// Bytes of resource names one stream may subscribe to per resource type.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_subscription_bytes_per_type)]
    xds_max_subscription_bytes_per_type: usize,
    /// Bytes of resource names subscribed, and of requests being received, by every stream
    /// of one namespace together.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_subscription_bytes_per_namespace)]
    xds_max_subscription_bytes_per_namespace: usize,
    /// The same bytes summed over every namespace: the most the xDS server holds for all its
    /// clients together.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_process_bytes)]
    xds_max_process_bytes: usize,
    /// Seconds after which a proxy's connection is closed (it reconnects at once), so its
    /// certificate and namespace are checked again.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().max_connection_age.as_secs())]
    xds_max_connection_age: u64,
}

impl XdsLimitArgs {
    /// The xDS server's limits; a flag set below what Envoy's own requests need is raised.
    pub fn limits(&self) -> Limits {
        Limits {
            max_streams_per_connection: self.xds_max_streams_per_connection.max(1),
            max_streams_per_namespace: self.xds_max_streams_per_namespace.max(1),
            max_connections_per_namespace: self.xds_max_connections_per_namespace.max(1),
            first_request_timeout: std::time::Duration::from_secs(
                self.xds_first_request_timeout.max(1),
            ),
            request_timeout: std::time::Duration::from_secs(self.xds_request_timeout.max(1)),
            max_request_bytes: self.xds_max_request_bytes.max(1024),
            max_names_per_type: self.xds_max_names_per_type.max(1),
            // Envoy's own names (a cluster's, a secret's) must always fit.
            max_name_bytes: self.xds_max_name_bytes.max(256),
            max_subscription_bytes_per_type: self.xds_max_subscription_bytes_per_type.max(4096),
            max_subscription_bytes_per_namespace: self
                .xds_max_subscription_bytes_per_namespace
                .max(4096),
            max_process_bytes: self.xds_max_process_bytes.max(4096),
            max_connection_age: std::time::Duration::from_secs(self.xds_max_connection_age.max(10)),
        }
    }
}
