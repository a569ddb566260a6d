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

/// Whether this discovery service serves a namespace, as it knows now.
pub(crate) type Serves = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The gauge's source: the EnvoyConfig store while this replica leads (and which of its
/// namespaces this discovery service serves: the store holds every namespace's configs, and
/// another discovery service's leader reports those), nothing otherwise.
#[derive(Clone, Default)]
pub struct ProxyMetrics {
    store: Arc<Mutex<Option<Source>>>,
}

/// The configs, and which of their namespaces are served.
type Source = (Store<EnvoyConfig>, Serves);

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

    /// Reports the sums in the configs of `store` in the namespaces it `serves` until the
    /// returned guard is dropped.
    pub(crate) fn report(&self, store: Store<EnvoyConfig>, serves: Serves) -> Reporting {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = Some((store, serves));
        Reporting(self.clone())
    }

    /// The configs of the served namespaces while this replica leads; none otherwise.
    fn configs(&self) -> Vec<std::sync::Arc<EnvoyConfig>> {
        let Some((store, serves)) = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return Vec::new();
        };
        store
            .state()
            .into_iter()
            .filter(|ec| serves(&ec.namespace().unwrap_or_default()))
            .collect()
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
                    phase: rollout.phase.label(),
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
            "1 for the phase of an EnvoyConfig's rollout (held, progressing, paused, completed, rolled_back, aborted, undone: status.rollout.phase in lowercase), for configs with spec.rollout; reported by the leader",
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use kube::runtime::watcher::Event;
    use marin3r_api::rollout::{RolloutPhase, RolloutStatus};

    fn config(ns: &str, phase: RolloutPhase) -> EnvoyConfig {
        let spec = serde_json::from_value(serde_json::json!({
            "nodeID": "web", "resources": [], "rollout": {}
        }))
        .unwrap();
        let mut ec = EnvoyConfig::new("web", spec);
        ec.metadata.namespace = Some(ns.into());
        ec.status = Some(marin3r_api::EnvoyConfigStatus {
            rollout: Some(RolloutStatus {
                phase,
                ..Default::default()
            }),
            ..Default::default()
        });
        ec
    }

    /// Only the served namespaces' configs, phases in lowercase, and nothing once the term
    /// ends.
    #[test]
    fn the_leader_reports_its_own_namespaces_rollouts() {
        let (store, mut writer) = kube::runtime::reflector::store();
        for ec in [
            config("mine", RolloutPhase::RolledBack),
            config("theirs", RolloutPhase::Held),
        ] {
            writer.apply_watcher_event(&Event::Apply(ec));
        }
        let metrics = ProxyMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let text = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        let term = metrics.report(store, Arc::new(|ns: &str| ns == "mine"));
        let during = text();
        assert!(
            during.contains(
                r#"marin3r_envoyconfig_rollout_phase{namespace="mine",name="web",phase="rolled_back"} 1"#
            ),
            "{during}"
        );
        assert!(!during.contains("theirs"), "{during}");
        drop(term);
        assert!(!text().contains("namespace="), "{}", text());
    }
}
