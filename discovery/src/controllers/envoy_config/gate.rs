//! The blast-radius guard in the `EnvoyConfig` controller, pure: whether the desired version
//! is held for approval (`spec.rollout`), and what the status says of it. A held version has
//! its revision (so `marin3r rollout diff` can show it) but is not published: the version the
//! proxies are served stays served until a person approves (`marin3r rollout promote`, or
//! the annotation `marin3r.3scale.net/rollout-approve: <version>`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use marin3r_controller::{Note, set_condition};

use marin3r_api::envoy_config::CacheState;
use marin3r_api::rollout::{
    APPROVE_ANNOTATION, ROLLOUT_HELD, RolloutPhase, RolloutStatus, UNDO_ANNOTATION, undo_target,
};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision, EnvoyConfigStatus};
use marin3r_envoyconfig::convert::validate_config;
use marin3r_envoyconfig::guard;

use super::steps::Steps;

marin3r_controller::reasons! {
    /// The reasons of `RolloutHeld` and of the guard's Events.
    pub enum Reason {
        /// Held: what the version takes away.
        BlastRadiusExceeded,
        /// A person approved the version the guard held.
        Approved,
        WithinBlastRadius,
        /// A canary step started.
        RolloutStep,
        /// The version was published to every proxy after its steps.
        RolloutCompleted,
        /// The version was rolled back during its steps.
        RolloutRolledBack,
        /// A person paused the steps.
        RolloutPaused,
        /// A person aborted the rollout.
        RolloutAborted,
        /// A person published an earlier revision in place of the desired version.
        RolloutUndone,
    }
}

/// What the guard decided about the desired version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// The config has no `spec.rollout`: published as it always was.
    Off,
    /// Nothing held: within the limits, or nothing to compare with (nothing else is
    /// published, the published revision is tainted, the desired version is published
    /// already or was rejected by Envoy).
    Within,
    /// The guard would hold it, and a person approved this version.
    Approved { why: String },
    /// Held: `stable` stays published.
    Held { stable: String, why: String },
}

impl Gate {
    /// The version to publish in place of the desired one, when held.
    pub fn held(&self) -> Option<&str> {
        match self {
            Self::Held { stable, .. } => Some(stable),
            _ => None,
        }
    }
}

/// Judges the desired version (`version`, valid and converted already) against the published
/// revision among `mine`. `rejected`: Envoy rejected the desired version (it is not
/// published anyway).
pub fn judge(
    ec: &EnvoyConfig,
    mine: &[EnvoyConfigRevision],
    version: &str,
    rejected: bool,
) -> Gate {
    let Some(strategy) = &ec.spec.rollout else {
        return Gate::Off;
    };
    // A fix is never held behind a broken revision: a tainted one is served only because
    // nothing else could be.
    let stable = mine
        .iter()
        .find(|r| r.is_published() && !r.is_tainted() && r.spec.version != version);
    let Some(stable) = stable.filter(|_| !rejected) else {
        return Gate::Within;
    };
    // Either version failing to convert leaves nothing to compare: the desired one was
    // checked already, and a stable one that no longer converts is not served as written.
    let (Ok(before), Ok(after)) = (
        validate_config(&stable.spec.config()),
        validate_config(&ec.spec),
    ) else {
        return Gate::Within;
    };
    let Some(why) = guard::compare(&before, &after).hold(&strategy.blast_radius()) else {
        return Gate::Within;
    };
    if ec.annotations().get(APPROVE_ANNOTATION).map(String::as_str) == Some(version) {
        Gate::Approved { why }
    } else {
        Gate::Held {
            stable: stable.spec.version.clone(),
            why,
        }
    }
}

/// The earlier version a person published in place of `version` (`rollout undo`): the
/// undo annotation names it for this desired version, and it is a revision of the config
/// Envoy has not rejected.
pub fn undone(ec: &EnvoyConfig, mine: &[EnvoyConfigRevision], version: &str) -> Option<String> {
    let annotation = ec.annotations().get(UNDO_ANNOTATION)?;
    let target = undo_target(annotation, version)?;
    mine.iter()
        .find(|r| r.spec.version == target && !r.is_tainted())
        .map(|r| r.spec.version.clone())
}

/// What `status.rollout`, `RolloutHeld` and the rollout's Events say.
pub struct Report<'a> {
    pub ec: &'a EnvoyConfig,
    pub version: &'a str,
    pub now: &'a Time,
}

impl Report<'_> {
    /// Writes `status.rollout` and `RolloutHeld` for `gate` and `steps`, with the cache
    /// state the plan chose (`state`). The Events to send.
    pub fn write(
        &self,
        status: &mut EnvoyConfigStatus,
        gate: &Gate,
        steps: &Steps,
        undone: Option<&str>,
        state: CacheState,
    ) -> Vec<Note> {
        if self.ec.spec.rollout.is_none() {
            status.rollout = None;
            status.conditions.retain(|c| c.type_ != ROLLOUT_HELD);
            return Vec::new();
        }
        let previous = status.published_version.clone();
        let before = status.rollout.clone();
        let version = self.version;
        let (mut events, held) = self.held_condition(status, gate);
        let mut rollout = RolloutStatus {
            version: version.to_owned(),
            // The version served before this rollout: kept while the rollout is of one
            // version.
            stable_version: match &before {
                Some(r) if r.version == version => r.stable_version.clone(),
                _ => previous.filter(|p| p != version),
            },
            phase: phase_of(state),
            ..RolloutStatus::default()
        };
        if let Some(published) = undone {
            rollout.phase = RolloutPhase::Undone;
            rollout.message = undone_message(published, version);
        } else if let Some(message) = held {
            rollout.phase = RolloutPhase::Held;
            rollout.message = message;
        } else if let Steps::Canary(step) = steps {
            rollout.phase = match step.paused {
                true => RolloutPhase::Paused,
                false => RolloutPhase::Progressing,
            };
            rollout.message.clone_from(&step.message);
            rollout.step = Some(step.number);
            rollout.steps = Some(step.of);
            rollout.step_started_at.clone_from(&step.started);
            rollout.canary = Some(format!("{}/{}", step.target, step.connected));
            rollout.analysis.clone_from(&step.analysis);
        } else if let Steps::Aborted { message, .. } = steps {
            rollout.phase = RolloutPhase::Aborted;
            rollout.message.clone_from(message);
        } else if let Steps::Failed {
            stable,
            step,
            of,
            analysis,
        } = steps
        {
            rollout.phase = RolloutPhase::RolledBack;
            rollout.message = format!(
                "version {version} is rolled back: {}; version {stable} is served to every \
                 proxy",
                failed_message(*step, *of, analysis)
            );
            rollout.analysis = Some(analysis.clone());
        }
        // What the last analysis said, and why the version was rolled back, stay while the
        // rollout is of this version.
        if let Some(b) = before.as_ref().filter(|b| b.version == version) {
            if rollout.analysis.is_none() {
                rollout.analysis.clone_from(&b.analysis);
            }
            if rollout.message.is_empty() && b.phase == rollout.phase {
                rollout.message.clone_from(&b.message);
            }
        }
        events.extend(step_events(before.as_ref(), &rollout));
        status.rollout = Some(rollout);
        events
    }

    /// Sets `RolloutHeld`; the Events, and why the version is held when it is.
    fn held_condition(
        &self,
        status: &mut EnvoyConfigStatus,
        gate: &Gate,
    ) -> (Vec<Note>, Option<String>) {
        let generation = self.ec.metadata.generation;
        let version = self.version;
        let mut set = |value: bool, reason: Reason, message: &str| {
            set_condition(
                &mut status.conditions,
                ROLLOUT_HELD,
                value,
                reason,
                message,
                generation,
                self.now,
            )
        };
        match gate {
            Gate::Held { stable, why } => {
                let message = format!(
                    "version {version} is held by the blast-radius guard and not published \
                     (version {stable} is served): it {why}. If that is intended, approve it \
                     with `marin3r rollout promote {name} -n {ns}` (or annotate the \
                     EnvoyConfig {APPROVE_ANNOTATION}={version})",
                    name = self.ec.name_any(),
                    ns = self.ec.namespace().unwrap_or_default(),
                );
                let changed = set(true, Reason::BlastRadiusExceeded, &message);
                let events = changed
                    .then(|| Note::warning(Reason::BlastRadiusExceeded, message.clone()))
                    .into_iter()
                    .collect();
                (events, Some(message))
            }
            Gate::Approved { why } => {
                let message = format!("version {version} was approved though it {why}");
                let changed = set(false, Reason::Approved, &message);
                let events = changed
                    .then(|| Note::normal(Reason::Approved, message))
                    .into_iter()
                    .collect();
                (events, None)
            }
            Gate::Within | Gate::Off => {
                let message = format!("version {version} is within the blast-radius limits");
                set(false, Reason::WithinBlastRadius, &message);
                (Vec::new(), None)
            }
        }
    }
}

/// The Events of a rollout moving from `before` to `after`: a step started, the version
/// published after its steps, or rolled back during them.
fn step_events(before: Option<&RolloutStatus>, after: &RolloutStatus) -> Vec<Note> {
    let was_rolling = before.filter(|b| {
        b.version == after.version
            && matches!(b.phase, RolloutPhase::Progressing | RolloutPhase::Paused)
    });
    let entered = before.is_none_or(|b| b.version != after.version || b.phase != after.phase);
    let person = |reason: Reason| {
        entered
            .then(|| Note::normal(reason, after.message.clone()))
            .into_iter()
            .collect()
    };
    match after.phase {
        RolloutPhase::Progressing => {
            let same_step = was_rolling.is_some_and(|b| b.step == after.step);
            (!same_step)
                .then(|| Note::normal(Reason::RolloutStep, after.message.clone()))
                .into_iter()
                .collect()
        }
        RolloutPhase::Completed => was_rolling
            .map(|b| {
                Note::normal(
                    Reason::RolloutCompleted,
                    format!(
                        "version {} is published to every proxy after {} step(s)",
                        after.version,
                        b.steps.unwrap_or(0)
                    ),
                )
            })
            .into_iter()
            .collect(),
        RolloutPhase::RolledBack => was_rolling
            .map(|b| {
                let message = match after.message.is_empty() {
                    true => format!(
                        "version {} was rolled back during step {} of {}: its canaries \
                         rejected it; the other proxies never got it",
                        after.version,
                        b.step.unwrap_or(0),
                        b.steps.unwrap_or(0)
                    ),
                    false => after.message.clone(),
                };
                Note::warning(Reason::RolloutRolledBack, message)
            })
            .into_iter()
            .collect(),
        RolloutPhase::Paused => person(Reason::RolloutPaused),
        RolloutPhase::Aborted => person(Reason::RolloutAborted),
        RolloutPhase::Undone => person(Reason::RolloutUndone),
        RolloutPhase::Held => Vec::new(),
    }
}

/// Why a version's canaries were rolled back in step `step` of `of`.
pub fn failed_message(step: u32, of: u32, analysis: &str) -> String {
    format!(
        "its canaries failed the health analysis in step {step} of {of}, and the other \
         proxies never got it: {analysis}"
    )
}

/// Why the desired version is not published after an undo.
pub fn undone_message(published: &str, desired: &str) -> String {
    format!(
        "version {published} is published in place of version {desired} by `marin3r rollout \
         undo`; apply another spec to publish that, or remove the annotation \
         {UNDO_ANNOTATION} to publish version {desired} again"
    )
}

fn phase_of(state: CacheState) -> RolloutPhase {
    match state {
        CacheState::InSync => RolloutPhase::Completed,
        CacheState::Rollback | CacheState::RollbackFailed => RolloutPhase::RolledBack,
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
