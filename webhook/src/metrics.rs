//! Prometheus metrics of the webhook: admissions by outcome and how long each took. Labels
//! are a fixed set (never a pod, namespace or message), so cardinality stays bounded.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    webhook: &'static str,
    outcome: &'static str,
}

/// Shared by every connection of a server; register it once with the process registry.
#[derive(Debug, Clone)]
pub struct WebhookMetrics {
    admissions: Family<OutcomeLabels, Counter>,
    duration: Histogram,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            admissions: Family::default(),
            // 50 µs to ~0.8 s: an admission is sub-millisecond unless something is wrong.
            duration: Histogram::new(exponential_buckets(0.000_05, 2.0, 15)),
        }
    }
}

impl WebhookMetrics {
    /// Adds `marin3r_webhook_admissions_total{outcome}` and
    /// `marin3r_webhook_admission_duration_seconds` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "marin3r_webhook_admissions",
            "AdmissionReviews answered, by webhook (sidecar-injection, envoyconfig-validation) and outcome (patched, unchanged, allowed, denied, bad_request)",
            self.admissions.clone(),
        );
        registry.register(
            "marin3r_webhook_admission_duration_seconds",
            "Time to decode, decide and encode one AdmissionReview",
            self.duration.clone(),
        );
    }

    pub(crate) fn observe(&self, webhook: &'static str, outcome: &'static str, took: Duration) {
        self.admissions
            .get_or_create(&OutcomeLabels { webhook, outcome })
            .inc();
        self.duration.observe(took.as_secs_f64());
    }
}
