//! Reconcile metrics, per controller. Labels are fixed sets (the controller, the result),
//! never an object name or an error text.

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

type Durations = Family<ControllerLabels, Histogram, fn() -> Histogram>;

fn durations() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Reconciles counted by controller and result, and how long they took. Cheap to clone; every
/// clone counts into the same series.
#[derive(Debug, Clone)]
pub struct ReconcileMetrics {
    reconciles: Family<ResultLabels, Counter>,
    durations: Durations,
}

impl Default for ReconcileMetrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(durations),
        }
    }
}

impl ReconcileMetrics {
    /// Adds `marin3r_controller_reconciles_total{controller,result}` and
    /// `marin3r_controller_reconcile_duration_seconds{controller}` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "marin3r_controller_reconciles",
            "Reconciles by controller and result (ok, error)",
            self.reconciles.clone(),
        );
        registry.register(
            "marin3r_controller_reconcile_duration_seconds",
            "How long reconciles take, by controller",
            self.durations.clone(),
        );
    }

    /// Runs one reconcile of `controller`, counting its result and timing it.
    pub async fn measure<T, E>(
        &self,
        controller: &'static str,
        reconcile: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let start = Instant::now();
        let result = reconcile.await;
        self.durations
            .get_or_create(&ControllerLabels { controller })
            .observe(start.elapsed().as_secs_f64());
        let result_label = if result.is_ok() { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&ResultLabels {
                controller,
                result: result_label,
            })
            .inc();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn results_and_durations_are_counted_per_controller() {
        let metrics = ReconcileMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let _ = metrics.measure("a", async { Ok::<_, ()>(()) }).await;
        let _ = metrics.measure("a", async { Err::<(), _>(()) }).await;
        let _ = metrics
            .clone()
            .measure("a", async { Ok::<_, ()>(()) })
            .await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"marin3r_controller_reconciles_total{controller="a",result="ok"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"marin3r_controller_reconciles_total{controller="a",result="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"marin3r_controller_reconcile_duration_seconds_count{controller="a"} 3"#
            ),
            "{text}"
        );
    }
}
