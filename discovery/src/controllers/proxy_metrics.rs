//! `marin3r_envoyconfig_proxies{namespace,name,state}`: the leader's sum of every replica's
//! sync reports (an EnvoyConfig's `status.proxies`), read from the watch's store when
//! Prometheus scrapes. One series per EnvoyConfig and state, as cert-manager exports one per
//! certificate, since an alert must name the config; they go with the object, so a deleted
//! config leaves no stale series. Only the leader reports (it writes the sums), so take
//! `max by (namespace, name, state)` over the discovery pods.
//!
//! Beside it, from the same status: `marin3r_envoyconfig_rollout_phase{namespace,name,phase}`
//! (1 for the phase of a config's rollout, for configs with `spec.rollout`) and
//! `marin3r_envoyconfig_rollout_step_started_timestamp_seconds{namespace,name}` (while a step
//! runs), what the rollout alerts read.

use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use marin3r_api::EnvoyConfig;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProxyLabels {
    namespace: String,
    name: String,
    state: &'static str,
}

/// The gauge's source: the EnvoyConfig store while this replica leads, nothing otherwise.
#[derive(Clone, Default)]
pub struct ProxyMetrics {
    store: Arc<Mutex<Option<Store<EnvoyConfig>>>>,
}

impl std::fmt::Debug for ProxyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyMetrics").finish_non_exhaustive()
    }
}

/// Reports while it lives: dropped when the leader's term ends, however it ends.
pub(crate) struct Reporting(ProxyMetrics);

impl Drop for Reporting {
    fn drop(&mut self) {
        *self.0.store.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl ProxyMetrics {
    /// Adds `marin3r_envoyconfig_proxies{namespace,name,state}` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// Reports the sums in the configs of `store` until the returned guard is dropped.
    pub(crate) fn report(&self, store: Store<EnvoyConfig>) -> Reporting {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = Some(store);
        Reporting(self.clone())
    }

    /// The configs of the store while this replica leads; none otherwise.
    fn configs(&self) -> Vec<std::sync::Arc<EnvoyConfig>> {
        let store = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        store.iter().flat_map(Store::state).collect()
    }

    fn family(&self) -> Family<ProxyLabels, Gauge> {
        let family = Family::<ProxyLabels, Gauge>::default();
        for ec in self.configs() {
            let Some(sum) = ec.status.as_ref().and_then(|s| s.proxies.as_ref()) else {
                continue;
            };
            let (namespace, name) = (ec.namespace().unwrap_or_default(), ec.name_any());
            for (state, n) in [
                ("synced", sum.acked),
                ("nacked", sum.nacked),
                ("pending", sum.pending),
            ] {
                let labels = ProxyLabels {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    state,
                };
                family.get_or_create(&labels).set(i64::from(n));
            }
        }
        family
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    namespace: String,
    name: String,
    phase: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigLabels {
    namespace: String,
    name: String,
}

impl ProxyMetrics {
    /// The rollouts' phases and their steps' starts, from the configs' `status.rollout`.
    fn rollouts(&self) -> (Family<RolloutLabels, Gauge>, Family<ConfigLabels, Gauge>) {
        let phases = Family::<RolloutLabels, Gauge>::default();
        let started = Family::<ConfigLabels, Gauge>::default();
        for ec in self.configs() {
            let Some(rollout) = ec.status.as_ref().and_then(|s| s.rollout.as_ref()) else {
                continue;
            };
            let (namespace, name) = (ec.namespace().unwrap_or_default(), ec.name_any());
            phases
                .get_or_create(&RolloutLabels {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    phase: rollout.phase.as_str(),
                })
                .set(1);
            if let Some(at) = &rollout.step_started_at {
                started
                    .get_or_create(&ConfigLabels { namespace, name })
                    .set(at.0.as_second());
            }
        }
        (phases, started)
    }
}

impl Collector for ProxyMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = self.family();
        family.encode(encoder.encode_descriptor(
            "marin3r_envoyconfig_proxies",
            "Connected proxies of an EnvoyConfig's node by state for its published version (synced: acknowledged, nacked: rejected, pending: not answered yet), summed over every discovery replica; reported by the leader",
            None,
            family.metric_type(),
        )?)?;
        let (phases, started) = self.rollouts();
        phases.encode(encoder.encode_descriptor(
            "marin3r_envoyconfig_rollout_phase",
            "1 for the phase of an EnvoyConfig's rollout (Held, Progressing, Paused, Completed, RolledBack, Aborted, Undone), for configs with spec.rollout; reported by the leader",
            None,
            phases.metric_type(),
        )?)?;
        started.encode(encoder.encode_descriptor(
            "marin3r_envoyconfig_rollout_step_started_timestamp_seconds",
            "When the current canary step of an EnvoyConfig's rollout started (Unix seconds), while one runs; reported by the leader",
            None,
            started.metric_type(),
        )?)?;
        Ok(())
    }
}
