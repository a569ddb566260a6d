//! Canary steps in the `EnvoyConfig` controller (the leader), pure: where the desired version's
//! rollout stands, which proxies get it, and when the next step is due.
//!
//! The rollout's state is the config's `status.rollout` (version, step, when it started); the
//! proxies are the replicas' reports (`status.syncReports[].canary`: how many distinct
//! proxies each has, and the lowest of their hashes under the version). A step's canaries are
//! the proxies with the lowest hashes: the cutoff is the hash of the last one taken, so every
//! replica puts the same proxies on the canary track, and a higher step takes more of the same
//! order (the cutoff only grows while a version rolls out). Beyond the hashes reported (32 per
//! replica), the cutoff is the share of the hash space, which is as good at that size.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::analysis::{self, Verdict};
use kube::ResourceExt;
use marin3r_api::envoy_config_revision::RevisionCanary;
use marin3r_api::rollout::{
    ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RolloutPhase, RolloutStatus,
    RolloutStep,
};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};

/// How soon to look again while the replicas have not reported the node's proxies yet.
const REPORTS_WAIT: Duration = Duration::from_secs(2);
/// How often a paused step is looked at again.
const PAUSED_LOOK: Duration = Duration::from_secs(300);

/// Where the desired version's rollout stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steps {
    /// No step to take: no steps in the strategy, or nothing to roll out (the first version,
    /// a version Envoy rejected, one the guard holds, one published already).
    None,
    /// In a step: `stable` stays published, the desired revision is the canary.
    Canary(Box<Step>),
    /// Every step has baked: publish it.
    Done,
    /// Aborted by a person: `stable` stays published, to every proxy.
    Aborted { stable: String, message: String },
    /// The canaries failed the health analysis: `stable` stays published, to every proxy,
    /// and the version is tainted (`FailedAnalysis`).
    Failed {
        stable: String,
        step: u32,
        of: u32,
        analysis: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub stable: String,
    /// From 1.
    pub number: u32,
    pub of: u32,
    /// None while it waits for the replicas' reports: its bake has not begun.
    pub started: Option<Time>,
    /// Which proxies get the desired version; None while no proxy is known.
    pub canary: Option<RevisionCanary>,
    /// How many proxies get it, of how many are connected.
    pub target: u32,
    pub connected: u32,
    /// When to look again (the rest of the bake, or sooner while waiting for reports).
    pub requeue: Duration,
    /// What the step is, for people.
    pub message: String,
    /// Paused by a person: the step does not end.
    pub paused: bool,
    /// The last health analysis of the step's traffic (of the step `status.rollout`
    /// records, which this one may be the next of).
    pub analysis: Option<String>,
}

/// The rollout of the desired version `version`; `rejected`: Envoy rejected it; `held`: the
/// blast-radius guard holds it.
pub fn judge(
    ec: &EnvoyConfig,
    mine: &[EnvoyConfigRevision],
    version: &str,
    rejected: bool,
    held: bool,
    now: &Time,
) -> Steps {
    let Some(strategy) = ec.spec.rollout.as_ref() else {
        return Steps::None;
    };
    let steps = &strategy.steps;
    if steps.is_empty() || rejected || held {
        return Steps::None;
    }
    let Some(stable) = mine
        .iter()
        .find(|r| r.is_published() && !r.is_tainted() && r.spec.version != version)
    else {
        return Steps::None;
    };
    let said = |key: &str| ec.annotations().get(key).map(String::as_str);
    if said(ABORT_ANNOTATION) == Some(version) {
        return aborted(version, &stable.spec.version);
    }
    let paused = said(PAUSE_ANNOTATION) == Some("true");
    let desired = mine.iter().find(|r| r.spec.version == version);
    let of = u32::try_from(steps.len()).unwrap_or(u32::MAX);
    // The step under way is judged on its traffic before anything moves on.
    let analysis = match analyse(ec, version) {
        Err((step, analysis)) => {
            return Steps::Failed {
                stable: stable.spec.version.clone(),
                step,
                of,
                analysis,
            };
        }
        Ok(said) => said,
    };
    let (number, started) = progress(ec, version, steps, paused, now);
    let Some(step) = steps.get(index(number)) else {
        return Steps::Done;
    };
    let reports = Reports::of(ec, version);
    let previous = desired
        .and_then(|r| r.status.as_ref()?.canary.as_ref())
        .and_then(RevisionCanary::cutoff);
    let cutoff = reports.cutoff(step, previous);
    let target = reports.taken(cutoff, step);
    let base = Step {
        stable: stable.spec.version.clone(),
        number,
        of,
        started: None,
        canary: None,
        target,
        connected: reports.connected,
        requeue: REPORTS_WAIT,
        message: String::new(),
        paused,
        analysis,
    };
    let started = match started {
        Some(t) => t,
        // Proxies are connected, but no replica has said which yet: the step has not begun.
        None if !reports.reported && reports.any => {
            return Steps::Canary(Box::new(Step {
                canary: previous.map(|c| RevisionCanary::new(number, c)),
                message: format!(
                    "step {number} of {of} ({}): waiting for the discovery replicas to report \
                     the node's proxies",
                    step.describe()
                ),
                ..base
            }));
        }
        None => now.clone(),
    };
    let left = bake(step).saturating_sub(since(&started, now));
    Steps::Canary(Box::new(Step {
        message: base.describe(step, version, &ends(&started, bake(step))),
        started: Some(started),
        canary: cutoff.map(|c| RevisionCanary::new(number, c)),
        // A little after the bake ends, so the next run finds it over (paused: a person's
        // annotation wakes it; the look now and then is a safety net).
        requeue: match paused {
            true => PAUSED_LOOK,
            false => left + Duration::from_millis(100),
        },
        ..base
    }))
}

impl Step {
    /// What the step does, for people; its bake ends at `ends`. The same words for the whole
    /// step (no countdown), so the status is not written again for the time alone.
    fn describe(&self, step: &RolloutStep, version: &str, ends: &str) -> String {
        let (number, of) = (self.number, self.of);
        if self.paused {
            return format!(
                "paused at step {number} of {of} ({} of {} proxies get version {version}); \
                 `marin3r rollout resume` continues",
                self.target, self.connected
            );
        }
        if self.connected == 0 {
            return format!(
                "step {number} of {of} ({}): no proxy of the node is connected; the step bakes \
                 for {}",
                step.describe(),
                seconds(bake(step))
            );
        }
        format!(
            "step {number} of {of} ({}): {} of {} proxies get version {version}, the others \
             version {}; the step ends at {ends}",
            step.describe(),
            self.target,
            self.connected,
            self.stable,
        )
    }
}

fn aborted(version: &str, stable: &str) -> Steps {
    let message = format!(
        "the rollout of version {version} was aborted; version {stable} is served to every \
         proxy. Apply another spec, or `marin3r rollout resume` to start it again"
    );
    Steps::Aborted {
        stable: stable.to_owned(),
        message,
    }
}

/// The step `version` is in and when it started (None: not yet): the one `status.rollout`
/// says, or the next once its bake is over (one step per run, so each is reported) or a
/// person ended it (`rollout promote`, paused or not); step 1 for a new rollout.
fn progress(
    ec: &EnvoyConfig,
    version: &str,
    steps: &[RolloutStep],
    paused: bool,
    now: &Time,
) -> (u32, Option<Time>) {
    let Some(r) = ongoing(ec, version) else {
        return (1, None);
    };
    let number = r.step.unwrap_or(1).max(1);
    let promote = format!("{version}/{number}");
    let promoted = ec.annotations().get(PROMOTE_ANNOTATION) == Some(&promote);
    let elapsed = r.step_started_at.as_ref().map(|t| since(t, now));
    match (steps.get(index(number)), elapsed) {
        (Some(step), Some(elapsed)) if promoted || (!paused && elapsed >= bake(step)) => {
            (number + 1, None)
        }
        _ => (number, r.step_started_at.clone()),
    }
}

/// The health analysis of the step of `version` under way: what it says (None: no step under
/// way), or the step and why when its canaries failed it.
fn analyse(ec: &EnvoyConfig, version: &str) -> Result<Option<String>, (u32, String)> {
    let (Some(strategy), Some(step)) = (
        ec.spec.rollout.as_ref(),
        ongoing(ec, version).and_then(|r| r.step),
    ) else {
        return Ok(None);
    };
    match analysis::judge(ec, &strategy.analysis(), version, step) {
        Verdict::Failing(why) => Err((step, why)),
        verdict => Ok(Some(format!("step {step}: {}", verdict.message()))),
    }
}

/// The rollout of `version` under way, as `status.rollout` records it.
fn ongoing<'a>(ec: &'a EnvoyConfig, version: &str) -> Option<&'a RolloutStatus> {
    ec.status.as_ref()?.rollout.as_ref().filter(|r| {
        r.version == version && matches!(r.phase, RolloutPhase::Progressing | RolloutPhase::Paused)
    })
}

fn index(number: u32) -> usize {
    usize::try_from(number.saturating_sub(1)).unwrap_or(usize::MAX)
}

/// A step's bake; the default for a value the validation refused (it never gets here).
fn bake(step: &RolloutStep) -> Duration {
    step.bake().unwrap_or(marin3r_api::rollout::DEFAULT_BAKE)
}

fn since(t: &Time, now: &Time) -> Duration {
    let millis = now.0.as_millisecond().saturating_sub(t.0.as_millisecond());
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// When a step started at `started` and baking `bake` ends, for people.
fn ends(started: &Time, bake: Duration) -> String {
    k8s_openapi::jiff::SignedDuration::try_from(bake)
        .ok()
        .and_then(|d| started.0.checked_add(d).ok())
        .map_or_else(|| "the end of its bake".to_owned(), |t| t.to_string())
}

fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64().ceil())
}

/// What the replicas reported of the node's proxies for a rollout of `version`.
struct Reports {
    /// Distinct proxies, summed over the replicas that reported for `version`.
    connected: u32,
    /// Their lowest hashes, merged, lowest first, each once.
    lowest: Vec<u64>,
    /// Whether every replica with proxies of the node reported them for `version`: until
    /// then a cutoff would be chosen among some of the proxies, and could take more than the
    /// step's share (a proxy of a replica not heard from may hash lower).
    reported: bool,
    /// Whether any replica reported connected proxies at all.
    any: bool,
}

impl Reports {
    /// The cutoff that takes `step`'s share of the reported proxies, never below
    /// `previous` (a canary stays one while the version rolls out).
    fn cutoff(&self, step: &RolloutStep, previous: Option<u64>) -> Option<u64> {
        cutoff(step.target(self.connected), self.connected, &self.lowest).map(|c| match previous {
            Some(p) => c.max(p),
            None => c,
        })
    }

    /// How many proxies `cutoff` takes: counted where every hash is known, else the step's
    /// share.
    fn taken(&self, cutoff: Option<u64>, step: &RolloutStep) -> u32 {
        match cutoff {
            Some(c) if self.lowest.len() == self.connected as usize => {
                u32::try_from(self.lowest.iter().filter(|h| **h <= c).count()).unwrap_or(u32::MAX)
            }
            _ => step.target(self.connected),
        }
    }

    fn of(ec: &EnvoyConfig, version: &str) -> Self {
        let reports = ec
            .status
            .as_ref()
            .map(|s| s.sync_reports.as_slice())
            .unwrap_or_default();
        let with_proxies = || reports.iter().filter(|r| r.connected > 0);
        let mut out = Self {
            connected: 0,
            lowest: Vec::new(),
            reported: with_proxies()
                .all(|r| r.canary.as_ref().is_some_and(|c| c.version == version)),
            any: with_proxies().next().is_some(),
        };
        for canary in reports.iter().filter_map(|r| r.canary.as_ref()) {
            if canary.version != version {
                continue;
            }
            out.connected = out.connected.saturating_add(canary.proxies);
            out.lowest.extend(
                canary
                    .lowest
                    .iter()
                    .filter(|h| h.len() == 16)
                    .filter_map(|h| u64::from_str_radix(h, 16).ok()),
            );
        }
        out.lowest.sort_unstable();
        out.lowest.dedup();
        out
    }
}

/// The cutoff that puts `target` of `connected` proxies on the canary track: the hash of the
/// `target`-th lowest when known, all when `target` takes every proxy, else the share of the
/// hash space. None when no proxy is connected.
pub fn cutoff(target: u32, connected: u32, lowest: &[u64]) -> Option<u64> {
    if connected == 0 || target == 0 {
        return None;
    }
    if target >= connected {
        return Some(u64::MAX);
    }
    let nth = usize::try_from(target - 1).unwrap_or(usize::MAX);
    if let Some(h) = lowest.get(nth) {
        return Some(*h);
    }
    let share = f64::from(target) / f64::from(connected);
    // Saturating: a float conversion to an integer clamps.
    Some((share * u64::MAX as f64) as u64)
}

#[cfg(test)]
#[path = "steps_tests.rs"]
mod tests;
