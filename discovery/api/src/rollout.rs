//! `spec.rollout` and `status.rollout` of an `EnvoyConfig`: how a new version reaches the
//! node's proxies. Without `spec.rollout` a new version is published at once, as it always
//! was. With it, a version that removes much of what the node serves, or empties one of its
//! listeners, is held until a person approves it (the blast-radius guard); and with `steps`,
//! a new version is served first to some of the node's proxies (the canaries), step by step,
//! each step baking for a while, and published to all once the last step has baked. A
//! canary that Envoy rejects, or whose traffic does worse than the stable proxies' (the
//! health analysis), rolls the version back before the other proxies ever get it.
//!
//! The strategy is not part of the config's version: changing it makes no revision.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The annotation that approves a held version: its value is the version
/// (`status.rollout.version`). Bound to a version, so an approval left behind never lets a
/// later version through.
pub const APPROVE_ANNOTATION: &str = "marin3r.3scale.net/rollout-approve";
/// The annotation that pauses a rollout's steps (`"true"`): the current step keeps its
/// canaries and does not end; a canary's NACK still rolls the version back.
pub const PAUSE_ANNOTATION: &str = "marin3r.3scale.net/rollout-paused";
/// The annotation that ends the current step's bake at once: `<version>/<step>`, so it acts
/// on that step of that version only.
pub const PROMOTE_ANNOTATION: &str = "marin3r.3scale.net/rollout-promote";
/// The annotation that aborts the rollout of a version (its value): every proxy gets the
/// published version back, and the version is not published while the annotation names it.
pub const ABORT_ANNOTATION: &str = "marin3r.3scale.net/rollout-abort";
/// The annotation that publishes an earlier revision in place of the desired version:
/// `<revision version>@<desired version>`, so it lapses once the spec changes.
pub const UNDO_ANNOTATION: &str = "marin3r.3scale.net/rollout-undo";
/// Condition on the EnvoyConfig: a version is held for approval.
pub const ROLLOUT_HELD: &str = "RolloutHeld";

/// The default of `blastRadius.maxRemovedPercent`.
pub const DEFAULT_MAX_REMOVED_PERCENT: u8 = 30;
/// The most steps a rollout takes.
pub const MAX_STEPS: usize = 10;
/// The default bake time of a step.
pub const DEFAULT_BAKE: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest bake time of a step.
pub const MAX_BAKE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

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
    /// The canary steps, at most 10: a new version is served to the proxies each step names
    /// (chosen stably among the node's connected proxies by the hash of their address), the
    /// others keeping the version served before; once the last step has baked, it is
    /// published to every proxy. A NACK from the canaries rolls it back, as does their failing
    /// the health analysis (`analysis`). Empty (the default): published to every proxy at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub steps: Vec<RolloutStep>,
    /// How the canaries' traffic is judged during each step (with `steps` only; on with its
    /// defaults whenever there are steps). The discovery replicas read the Envoy stats of
    /// the node's proxies and compare the canaries with the proxies still on the stable
    /// version; a canary doing worse than these limits rolls the version back at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
}

/// The default of `analysis.minRequests`.
pub const DEFAULT_MIN_REQUESTS: u32 = 20;
/// The default of `analysis.max5xxPercentagePoints` and
/// `analysis.maxUpstreamFailurePercentagePoints`.
pub const DEFAULT_MAX_POINTS: u8 = 5;

/// `spec.rollout.analysis`: the limits a step's canaries are held to, each against the
/// proxies still on the stable version over the same step (their share where they had
/// traffic, zero where they had none). A limit of 100 turns that check off.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Analysis {
    /// How many requests the canaries must have served in the step before they are judged
    /// (default 20). With fewer the step is not judged: it bakes for its time and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub min_requests: Option<u32>,
    /// How many percentage points the canaries' share of 5xx responses (Envoy's
    /// `downstream_rq_5xx` over `downstream_rq_total`, every HTTP connection manager but
    /// marin3r's own) may exceed the stable proxies' (default 5).
    #[serde(
        default,
        rename = "max5xxPercentagePoints",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub max_5xx_percentage_points: Option<u8>,
    /// How many percentage points the canaries' share of failed upstream attempts (connect
    /// failures, resets by the upstream and timeouts, over the requests sent upstream plus
    /// the connect failures) may exceed the stable proxies' (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_upstream_failure_percentage_points: Option<u8>,
    /// The lowest request rate per canary, in percent of the rate per stable proxy, below
    /// which the canaries' traffic counts as collapsed (default 0: off, as a sidecar's
    /// traffic is its own pod's and proxies seldom get the same share). Judged once the
    /// stable proxies served `minRequests` each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub min_request_rate_percent: Option<u8>,
}

impl Analysis {
    pub fn min_requests(&self) -> u64 {
        u64::from(self.min_requests.unwrap_or(DEFAULT_MIN_REQUESTS).max(1))
    }

    pub fn max_5xx_points(&self) -> u8 {
        self.max_5xx_percentage_points.unwrap_or(DEFAULT_MAX_POINTS)
    }

    pub fn max_upstream_failure_points(&self) -> u8 {
        self.max_upstream_failure_percentage_points
            .unwrap_or(DEFAULT_MAX_POINTS)
    }

    pub fn min_request_rate_percent(&self) -> u8 {
        self.min_request_rate_percent.unwrap_or(0)
    }

    /// Why these limits cannot be used, each naming its field path.
    pub fn problems(&self) -> Vec<String> {
        let at = "spec.rollout.analysis";
        let mut out = Vec::new();
        if self.min_requests == Some(0) {
            out.push(format!("{at}.minRequests: must be at least 1"));
        }
        for (field, value) in [
            ("max5xxPercentagePoints", self.max_5xx_percentage_points),
            (
                "maxUpstreamFailurePercentagePoints",
                self.max_upstream_failure_percentage_points,
            ),
            ("minRequestRatePercent", self.min_request_rate_percent),
        ] {
            if let Some(v) = value.filter(|v| *v > 100) {
                out.push(format!("{at}.{field}: {v} is not from 0 to 100"));
            }
        }
        out
    }
}

/// One canary step: `proxies` or `percent` (exactly one), and how long it bakes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.proxies) != has(self.percent)",
    "message": "a step names either proxies or percent"
}]))]
pub struct RolloutStep {
    /// How many of the node's connected proxies get the new version (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub proxies: Option<u32>,
    /// Which share of the node's connected proxies gets it, rounded up (from 1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub percent: Option<u8>,
    /// How long the step lasts before the next one, as a Go duration (`30s`, `5m`; default
    /// `1m`, at most `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake: Option<String>,
}

impl RolloutStep {
    /// How many of `connected` proxies the step takes: at least one when any is connected,
    /// at most all.
    pub fn target(&self, connected: u32) -> u32 {
        let wanted = match (self.proxies, self.percent) {
            (Some(n), _) => n,
            (None, Some(p)) => (u64::from(connected) * u64::from(p)).div_ceil(100) as u32,
            (None, None) => connected,
        };
        wanted.clamp(1, connected.max(1)).min(connected)
    }

    /// The bake time, or why it is not one.
    pub fn bake(&self) -> Result<std::time::Duration, String> {
        let Some(text) = &self.bake else {
            return Ok(DEFAULT_BAKE);
        };
        let bake = crate::duration::parse_go_duration(text)?;
        if bake > MAX_BAKE {
            return Err(format!("{text:?} is longer than 24h"));
        }
        Ok(bake)
    }

    /// What the step takes, for people: `1 proxy`, `25%`.
    pub fn describe(&self) -> String {
        match (self.proxies, self.percent) {
            (Some(1), _) => "1 proxy".into(),
            (Some(n), _) => format!("{n} proxies"),
            (None, Some(p)) => format!("{p}%"),
            (None, None) => "all".into(),
        }
    }
}

/// Why `steps` cannot be rolled out, each naming its field path.
pub fn step_problems(steps: &[RolloutStep]) -> Vec<String> {
    let mut out = Vec::new();
    if steps.len() > MAX_STEPS {
        out.push(format!(
            "spec.rollout.steps: {} steps; at most {MAX_STEPS}",
            steps.len()
        ));
    }
    for (i, step) in steps.iter().enumerate() {
        let at = format!("spec.rollout.steps[{i}]");
        match (step.proxies, step.percent) {
            (Some(_), Some(_)) | (None, None) => {
                out.push(format!("{at}: name either proxies or percent"));
            }
            (Some(0), _) => out.push(format!("{at}.proxies: must be at least 1")),
            (_, Some(p)) if !(1..=100).contains(&p) => {
                out.push(format!("{at}.percent: {p} is not from 1 to 100"));
            }
            _ => {}
        }
        if let Err(why) = step.bake() {
            out.push(format!("{at}.bake: {why}"));
        }
    }
    out
}

/// The version an undo annotation (`<version>@<desired>`) publishes while the spec's version
/// is `desired`.
pub fn undo_target<'a>(annotation: &'a str, desired: &str) -> Option<&'a str> {
    let (version, at) = annotation.split_once('@')?;
    (at == desired && !version.is_empty() && version != desired).then_some(version)
}

impl RolloutStrategy {
    /// The guard's limits, defaults filled in.
    pub fn blast_radius(&self) -> BlastRadius {
        self.blast_radius.clone().unwrap_or_default()
    }

    /// The analysis' limits, defaults filled in.
    pub fn analysis(&self) -> Analysis {
        self.analysis.clone().unwrap_or_default()
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
    /// Why it is in this phase: for `Held`, what the version removes or empties; for
    /// `Progressing`, what the step waits for.
    #[serde(default)]
    pub message: String,
    /// While `Progressing`: the step being baked (from 1), null otherwise.
    #[serde(default)]
    pub step: Option<u32>,
    /// How many canary steps the rollout has.
    #[serde(default)]
    pub steps: Option<u32>,
    /// When the current step started.
    #[serde(default)]
    pub step_started_at: Option<Time>,
    /// While `Progressing`: how many proxies get the new version, of how many are connected
    /// (`1/4`), null otherwise.
    #[serde(default)]
    pub canary: Option<String>,
    /// The last health analysis of the canaries' traffic: what was measured on the canaries
    /// and on the stable proxies during the step, and what it decided.
    #[serde(default)]
    pub analysis: Option<String>,
}

/// The phase of a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    /// Held by the blast-radius guard until approved; the stable version is served.
    Held,
    /// Served to the canaries of a step; the others keep the stable version.
    Progressing,
    /// The version is published.
    #[default]
    Completed,
    /// Envoy rejected the version, or its canaries failed the health analysis; an earlier
    /// one is served.
    RolledBack,
    /// The steps are paused by a person (`marin3r rollout pause`).
    Paused,
    /// Aborted by a person (`marin3r rollout abort`): the published version is served to
    /// every proxy.
    Aborted,
    /// An earlier revision is published in place of this version by a person (`marin3r
    /// rollout undo`).
    Undone,
}

impl RolloutPhase {
    /// The phase as a metric's label value: lowercase, as every marin3r label value is.
    pub fn label(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Progressing => "progressing",
            Self::Completed => "completed",
            Self::RolledBack => "rolled_back",
            Self::Paused => "paused",
            Self::Aborted => "aborted",
            Self::Undone => "undone",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "Held",
            Self::Progressing => "Progressing",
            Self::Completed => "Completed",
            Self::RolledBack => "RolledBack",
            Self::Paused => "Paused",
            Self::Aborted => "Aborted",
            Self::Undone => "Undone",
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
