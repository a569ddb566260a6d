//! What `spec.rollout` and a person's annotations decided about the desired version, in one
//! place: the blast-radius guard (`gate`), the canary steps (`steps`) and an undo. Which
//! version stays published in its place, what the desired revision's canary status is, and
//! what `Ready` says meanwhile.

use std::time::Duration;

use super::gate::{Gate, undone_message};
use super::reason::Reason;
use super::revisions::Hold;
use super::steps::Steps;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_config_revision::RevisionCanary;
use marin3r_api::{EnvoyConfig, EnvoyConfigStatus};
use marin3r_controller::Note;

/// What `spec.rollout` decided about the desired version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// The blast-radius guard.
    pub gate: Gate,
    /// The canary steps.
    pub steps: Steps,
    /// The earlier version a person published in place of the desired one (`rollout undo`).
    pub undone: Option<String>,
}

impl Rollout {
    /// The version published in place of the desired one: the one a person named (`rollout
    /// undo`), or the stable one while the desired version is held, in a canary step or
    /// aborted.
    pub fn stable(&self) -> Option<Hold<'_>> {
        if let Some(v) = &self.undone {
            return Some(Hold::Pinned(v));
        }
        match &self.steps {
            Steps::Canary(step) => Some(Hold::Stable(&step.stable)),
            Steps::Aborted { stable, .. } | Steps::Failed { stable, .. } => {
                Some(Hold::Stable(stable))
            }
            _ => self.gate.held().map(Hold::Stable),
        }
    }

    /// When to decide again though nothing changes: when a canary step's bake ends.
    pub fn requeue(&self) -> Option<Duration> {
        match &self.steps {
            Steps::Canary(step) => Some(step.requeue),
            _ => None,
        }
    }

    /// `CacheOutOfSync` while the desired version is not published because of the rollout
    /// (undone, held, in a step, aborted); None otherwise.
    pub fn served_condition(
        &self,
        status: &EnvoyConfigStatus,
        version: &str,
    ) -> Option<(bool, Reason, String)> {
        if let Some(v) = &self.undone {
            return Some((true, Reason::Undone, undone_message(v, version)));
        }
        match (&self.gate, &self.steps, &status.rollout) {
            (Gate::Held { .. }, _, Some(r)) => Some((true, Reason::RolloutHeld, r.message.clone())),
            (_, Steps::Canary(step), _) => Some((
                true,
                match step.paused {
                    true => Reason::RolloutPaused,
                    false => Reason::RolloutInProgress,
                },
                format!("version {version} is rolling out: {}", step.message),
            )),
            (_, Steps::Aborted { message, .. }, _) => {
                Some((true, Reason::RolloutAborted, message.clone()))
            }
            (_, Steps::Failed { .. }, Some(r)) => {
                Some((true, Reason::FailedAnalysis, r.message.clone()))
            }
            _ => None,
        }
    }

    /// Writes `status.rollout` and `RolloutHeld` (the plan chose cache state `state`); the
    /// Events to send.
    pub fn write(
        &self,
        ec: &EnvoyConfig,
        version: &str,
        now: &Time,
        status: &mut EnvoyConfigStatus,
        state: CacheState,
    ) -> Vec<Note> {
        let report = super::gate::Report { ec, version, now };
        report.write(
            status,
            &self.gate,
            &self.steps,
            self.undone.as_deref(),
            state,
        )
    }

    /// Why the canaries failed the health analysis, when they did: the desired revision is
    /// to be tainted for it.
    pub fn failed(&self) -> Option<String> {
        match &self.steps {
            Steps::Failed {
                step, of, analysis, ..
            } => Some(super::gate::failed_message(*step, *of, analysis)),
            _ => None,
        }
    }

    /// The desired revision's canary status: its step and cutoff while in a step.
    pub fn canary(&self) -> Option<&RevisionCanary> {
        match &self.steps {
            Steps::Canary(step) => step.canary.as_ref(),
            _ => None,
        }
    }
}
