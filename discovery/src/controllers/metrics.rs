//! Prometheus metrics of the discovery service's controllers. Labels are fixed sets (the
//! controller, the result, the cache state), never an object name or an error text; the one
//! exception, the proxy counts per EnvoyConfig, is [`super::proxy_metrics`].

use marin3r_controller::ReconcileMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use marin3r_api::envoy_config::CacheState;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    pub state: &'static str,
}

/// Shared by every controller; register it once with the process registry.
#[derive(Debug, Clone, Default)]
pub struct ControllerMetrics {
    pub(crate) reconciles: ReconcileMetrics,
    pub(crate) cache_state_changes: Family<StateLabels, Counter>,
    pub(crate) taints: Counter,
    /// NACKs that did not (yet) reach the taint threshold of their node.
    pub(crate) nacks_below_threshold: Counter,
    /// NACK events dropped because their namespace's queue was full.
    pub(crate) nacks_dropped: Counter,
    /// The leader's proxy counts per EnvoyConfig.
    pub(crate) proxies: super::proxy_metrics::ProxyMetrics,
}

impl ControllerMetrics {
    /// Adds `marin3r_controller_reconciles_total{controller,result}`,
    /// `marin3r_controller_reconcile_duration_seconds{controller}`,
    /// `marin3r_envoyconfig_cache_state_changes_total{state}` and
    /// `marin3r_revision_taints_total`, `marin3r_nacks_below_threshold_total` and
    /// `marin3r_nack_events_dropped_total`, and `marin3r_envoyconfig_proxies{namespace,name,state}`
    /// to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        self.reconciles.register(registry);
        self.proxies.register(registry);
        // Each state's series from the start, at 0, so `increase()` counts the first entry
        // (an alert on `rollback_failed` fires on the first one).
        for state in [
            CacheState::InSync,
            CacheState::Rollback,
            CacheState::RollbackFailed,
        ] {
            let _ = self.cache_state_changes.get_or_create(&StateLabels {
                state: state.label(),
            });
        }
        registry.register(
            "marin3r_envoyconfig_cache_state_changes",
            "EnvoyConfigs entering a cache state (in_sync, rollback, rollback_failed)",
            self.cache_state_changes.clone(),
        );
        registry.register(
            "marin3r_revision_taints",
            "EnvoyConfigRevisions tainted because Envoy rejected them",
            self.taints.clone(),
        );
        registry.register(
            "marin3r_nacks_below_threshold",
            "NACKs that did not taint: too few of the node's connected proxies rejected the version",
            self.nacks_below_threshold.clone(),
        );
        registry.register(
            "marin3r_nack_events_dropped",
            "NACK events dropped because their namespace's queue was full",
            self.nacks_dropped.clone(),
        );
    }
}
