//! Prometheus metrics of the webhook: admissions by outcome and how long each took. Labels
//! are a fixed set (never a pod, namespace or message), so cardinality stays bounded.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `webhook` label of the admission metrics.
pub(crate) const SIDECAR_INJECTION: &str = "sidecar-injection";
pub(crate) const ENVOY_CONFIG_VALIDATION: &str = "envoyconfig-validation";
/// The outcome of a request that is no AdmissionReview.
pub(crate) const BAD_REQUEST: &str = "bad_request";
/// The outcome of a validation refused its turn.
pub(crate) const THROTTLED: &str = "throttled";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    webhook: &'static str,
    outcome: &'static str,
}

/// Why a connection or request was refused before it was read: the `limit` label of
/// `marin3r_webhook_refused_total`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Refusal {
    /// Every connection slot stayed taken (`max_connections`).
    Connections,
    /// The client's address held its share of connections.
    ConnectionsPerAddress,
    /// The client's address had its share of requests in flight.
    RequestsPerAddress,
}

impl Refusal {
    /// Its `limit` label value: lowercase snake_case, as Prometheus label values are.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::ConnectionsPerAddress => "connections_per_address",
            Self::RequestsPerAddress => "requests_per_address",
        }
    }
}

impl EncodeLabelValue for Refusal {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    limit: Refusal,
}

/// Shared by every connection of a server; register it once with the process registry.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    admissions: Family<OutcomeLabels, Counter>,
    duration: Histogram,
    refusals: Family<RefusalLabels, Counter>,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            admissions: Family::default(),
            // 50 µs to ~0.8 s: an admission is sub-millisecond unless something is wrong.
            duration: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
            refusals: Family::default(),
        }
    }
}

impl WebhookMetrics {
    /// Adds `marin3r_webhook_admissions_total{outcome}` and
    /// `marin3r_webhook_admission_duration_seconds` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        // The error series from the start, at 0, so `increase()` counts the first error and
        // the shipped alerts fire on it.
        for webhook in [SIDECAR_INJECTION, ENVOY_CONFIG_VALIDATION] {
            let _ = self.admissions.get_or_create(&OutcomeLabels {
                webhook,
                outcome: BAD_REQUEST,
            });
        }
        for limit in [
            Refusal::Connections,
            Refusal::ConnectionsPerAddress,
            Refusal::RequestsPerAddress,
        ] {
            let _ = self.refusals.get_or_create(&RefusalLabels { limit });
        }
        registry.register(
            "marin3r_webhook_admissions",
            "AdmissionReviews answered, by webhook (sidecar-injection, envoyconfig-validation) and outcome (patched, unchanged, allowed, denied, throttled, bad_request)",
            self.admissions.clone(),
        );
        registry.register(
            "marin3r_webhook_admission_duration_seconds",
            "Time to decode, decide and encode one AdmissionReview",
            self.duration.clone(),
        );
        registry.register(
            "marin3r_webhook_refused",
            "Connections and requests refused before they were read, by limit (connections, connections_per_address, requests_per_address)",
            self.refusals.clone(),
        );
    }

    pub(crate) fn refused(&self, limit: Refusal) {
        self.refusals.get_or_create(&RefusalLabels { limit }).inc();
    }

    pub(crate) fn observe(&self, webhook: &'static str, outcome: &'static str, took: Duration) {
        self.admissions
            .get_or_create(&OutcomeLabels { webhook, outcome })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_label_values_are_snake_case() {
        let metrics = WebhookMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.refused(Refusal::ConnectionsPerAddress);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("marin3r_webhook_refused_total{limit=\"connections_per_address\"} 1"),
            "{text}"
        );
    }

    /// The error series exist at 0 before the first error, so `increase()` sees it.
    #[test]
    fn error_series_start_at_zero() {
        let mut registry = Registry::default();
        WebhookMetrics::default().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for series in [
            r#"marin3r_webhook_admissions_total{webhook="sidecar-injection",outcome="bad_request"} 0"#,
            r#"marin3r_webhook_admissions_total{webhook="envoyconfig-validation",outcome="bad_request"} 0"#,
            r#"marin3r_webhook_refused_total{limit="requests_per_address"} 0"#,
        ] {
            assert!(text.contains(series), "no {series} in {text}");
        }
    }
}
