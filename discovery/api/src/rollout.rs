//! `spec.rollout` and `status.rollout` of an `EnvoyConfig`: how a new version reaches the
//! node's proxies. Without `spec.rollout` a new version is published at once, as it always
//! was. With it, a version that removes much of what the node serves, or empties one of its
//! listeners, is held until a person approves it (the blast-radius guard).
//!
//! The strategy is not part of the config's version: changing it makes no revision.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The annotation that approves a held version: its value is the version
/// (`status.rollout.version`). Bound to a version, so an approval left behind never lets a
/// later version through.
pub const APPROVE_ANNOTATION: &str = "marin3r.3scale.net/rollout-approve";
/// Condition on the EnvoyConfig: a version is held for approval.
pub const ROLLOUT_HELD: &str = "RolloutHeld";

/// The default of `blastRadius.maxRemovedPercent`.
pub const DEFAULT_MAX_REMOVED_PERCENT: u8 = 30;

/// `spec.rollout`: how a new version reaches the proxies. Set (even empty, `rollout: {}`),
/// the blast-radius guard is on with its defaults.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    /// When a new version is held for a person's approval instead of published. The guard
    /// is on whenever `rollout` is set; turning it off takes `maxRemovedPercent: 100` and
    /// `holdEmptiedListeners: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blast_radius: Option<BlastRadius>,
}

impl RolloutStrategy {
    /// The guard's limits, defaults filled in.
    pub fn blast_radius(&self) -> BlastRadius {
        self.blast_radius.clone().unwrap_or_default()
    }
}

/// `spec.rollout.blastRadius`: a version that removes more than `maxRemovedPercent` of the
/// listeners, the clusters or the route configurations the published version serves (each
/// type on its own), or that empties one of its listeners, is held until approved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlastRadius {
    /// The largest share, in percent, of one type's resources a version may remove and
    /// still be published without approval (default 30; 100 never holds for removals). A
    /// renamed resource counts as removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_removed_percent: Option<u8>,
    /// Hold a version in which a listener that routed traffic (an HTTP route, a TCP proxy's
    /// cluster, any other network filter) routes nothing (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_emptied_listeners: Option<bool>,
}

impl BlastRadius {
    pub fn max_removed_percent(&self) -> u8 {
        self.max_removed_percent
            .unwrap_or(DEFAULT_MAX_REMOVED_PERCENT)
    }

    pub fn hold_emptied_listeners(&self) -> bool {
        self.hold_emptied_listeners.unwrap_or(true)
    }
}

/// `status.rollout`: where the desired version's rollout stands. Set only while
/// `spec.rollout` is.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The version being rolled out (the desired version).
    pub version: String,
    /// The version the proxies were served before it. Always written (null when none), as
    /// is `message`: the status is written as a merge patch, and a field left out would
    /// keep its old value.
    #[serde(default)]
    pub stable_version: Option<String>,
    pub phase: RolloutPhase,
    /// Why it is in this phase: for `Held`, what the version removes or empties.
    #[serde(default)]
    pub message: String,
}

/// The phase of a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    /// Held by the blast-radius guard until approved; the stable version is served.
    Held,
    /// The version is published.
    #[default]
    Completed,
    /// Envoy rejected the version; an earlier one is served.
    RolledBack,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "Held",
            Self::Completed => "Completed",
            Self::RolledBack => "RolledBack",
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::EnvoyConfigSpec;
    use crate::envoy_config_revision::EnvoyConfigRevisionSpec;

    /// Changing the strategy makes no new version, and a revision does not carry it.
    #[test]
    fn the_strategy_is_not_part_of_the_version() {
        let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "gw",
            "resources": [{"type": "cluster", "value": {"name": "c"}}],
        }))
        .unwrap();
        let mut with = spec.clone();
        with.rollout = Some(
            serde_json::from_value(serde_json::json!({
                "blastRadius": {"maxRemovedPercent": 50}
            }))
            .unwrap(),
        );
        assert_eq!(with.version(), spec.version());
        let revision = EnvoyConfigRevisionSpec::of(&with, &with.version());
        let json = serde_json::to_value(&revision).unwrap();
        assert!(json.get("rollout").is_none(), "{json}");
        assert_eq!(revision.config().rollout, None);
        let limits = with.rollout.unwrap().blast_radius();
        assert_eq!(
            (
                limits.max_removed_percent(),
                limits.hold_emptied_listeners()
            ),
            (50, true)
        );
        let defaults = super::RolloutStrategy::default().blast_radius();
        assert_eq!(
            (
                defaults.max_removed_percent(),
                defaults.hold_emptied_listeners()
            ),
            (30, true)
        );
    }
}
