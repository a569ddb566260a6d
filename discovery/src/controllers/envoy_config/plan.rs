//! The `EnvoyConfig` controller's decisions, pure: from the config and its revisions to the
//! revisions to create, (un)publish and delete (the revision algorithm,
//! `revisions::plan`), and from the revisions then to the status and Events.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};
use marin3r_controller::{Note, Reason as _, set_condition};

use super::gate;
pub use super::reason::Reason;
use super::revisions::{self, MAX_REVISIONS};
pub use super::rollout::Rollout;
use super::steps;
use super::{CACHE_OUT_OF_SYNC, READY, ROLLBACK_FAILED, revision_name};
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_config_revision::{
    ENVOY_API_LABEL, NODE_ID_LABEL, REVISION_PUBLISHED, RevisionReason, VERSION_LABEL,
};
use marin3r_api::{
    ConfigRevisionRef, EnvoyConfig, EnvoyConfigRevision, EnvoyConfigRevisionSpec,
    EnvoyConfigRevisionStatus, EnvoyConfigStatus,
};
use marin3r_envoyconfig::rules::problems;

/// What the controller read for one config.
pub struct Observed<'a> {
    pub ec: &'a EnvoyConfig,
    /// Another config of the namespace with the same node id that [`comes_first`].
    pub node_served_by: Option<String>,
    pub allow_cross_namespace_secrets: bool,
    /// The revisions it owns.
    pub revisions: Vec<EnvoyConfigRevision>,
    /// Envoy's reasons for refusing the desired version (`path: Envoy: message`); empty when
    /// Envoy accepted it, could not judge it, or was not asked (it has a revision already,
    /// or the discovery pod has no Envoy).
    pub envoy_refusal: Vec<String>,
    pub now: Time,
}

/// What to do about one config.
pub enum Plan {
    /// The spec cannot be published: report why.
    Invalid(Box<Outcome>),
    Publish(Box<Publish>),
}

pub struct Publish {
    /// Revisions of a node id the config no longer has: not served to anyone.
    pub stale: Vec<String>,
    /// The revisions of its node id.
    pub mine: Vec<EnvoyConfigRevision>,
    /// The revision of the desired version, when it has none yet.
    pub create: Option<EnvoyConfigRevision>,
    pub algorithm: revisions::Plan,
    pub rollout: Rollout,
}

/// What to write after acting.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: EnvoyConfigStatus,
    pub events: Vec<Note>,
    /// The cache state, when it changed.
    pub state_change: Option<CacheState>,
    /// When to decide again though nothing changed (a canary step's bake ends).
    pub requeue: Option<std::time::Duration>,
}

pub fn decide(obs: &Observed<'_>) -> Plan {
    let ec = obs.ec;
    let ns = ec.namespace().unwrap_or_default();
    let version = ec.spec.version();
    let mut problems = problems(&ec.spec, &ns, obs.allow_cross_namespace_secrets);
    if let Some(other) = &obs.node_served_by {
        problems.push(format!(
            "spec.nodeID: node {:?} is already served by EnvoyConfig {other} in namespace \
             {ns}; a node takes its config from one EnvoyConfig (this one is used once that \
             one is deleted or names another node)",
            ec.spec.node_id
        ));
    }
    problems.extend(obs.envoy_refusal.iter().cloned());
    if !problems.is_empty() {
        return Plan::Invalid(Box::new(invalid(obs, &version, &problems)));
    }
    let (mine, stale): (Vec<_>, Vec<_>) = obs
        .revisions
        .iter()
        .cloned()
        .partition(|r| r.spec.node_id == ec.spec.node_id);
    // An empty spec where something is served is far more likely a field the API server
    // dropped (an old CRD, a misspelt field) than a wish to strip every listener from the
    // node: it is refused, and what is served stays served.
    if ec.spec.entries() == 0
        && let Some(served) = mine
            .iter()
            .find(|r| r.is_published() && r.spec.entries() > 0)
    {
        return Plan::Invalid(Box::new(refused_empty(obs, &version, served)));
    }
    let existing: BTreeSet<String> = mine.iter().map(|r| r.spec.version.clone()).collect();
    let tainted: BTreeSet<String> = mine
        .iter()
        .filter(|r| r.is_tainted())
        .map(|r| r.spec.version.clone())
        .collect();
    let current: Vec<String> = ec
        .status
        .iter()
        .flat_map(|s| &s.revisions)
        .map(|r| r.version.clone())
        .collect();
    let loaded: BTreeSet<String> = mine
        .iter()
        .filter(|r| r.is_loaded())
        .map(|r| r.spec.version.clone())
        .collect();
    let order: Vec<String> = current
        .iter()
        .cloned()
        .chain(since_status(&mine, &current))
        .collect();
    let rollout = decide_rollout(obs, &mine, &version, &tainted);
    let algorithm = revisions::plan(
        &order,
        &existing,
        &version,
        &tainted,
        &loaded,
        MAX_REVISIONS,
        rollout.stable(),
    );
    Plan::Publish(Box::new(Publish {
        stale: stale.iter().map(ResourceExt::name_any).collect(),
        create: algorithm.create.then(|| new_revision(ec, &version)),
        mine,
        algorithm,
        rollout,
    }))
}

/// What `spec.rollout` and a person's annotations decide about `version`: an undo stands
/// over the guard and the steps (a person chose what is served).
fn decide_rollout(
    obs: &Observed<'_>,
    mine: &[EnvoyConfigRevision],
    version: &str,
    tainted: &BTreeSet<String>,
) -> Rollout {
    let ec = obs.ec;
    if let Some(undone) = gate::undone(ec, mine, version) {
        return Rollout {
            gate: gate::Gate::Within,
            steps: steps::Steps::None,
            undone: Some(undone),
        };
    }
    let gate = gate::judge(ec, mine, version, tainted.contains(version));
    let steps = steps::judge(
        ec,
        mine,
        version,
        tainted.contains(version),
        gate.held().is_some(),
        &obs.now,
    );
    Rollout {
        gate,
        steps,
        undone: None,
    }
}

/// The revisions acted on after the status was last written, oldest first: they come after
/// every version `status.revisions` lists. A status write can fail after its revision was
/// created and published (a 409 because the spec changed meanwhile, a 500); the next run
/// then reads a status without it, and a rollback must still return to the revision the
/// proxies were served, not to an older one. So: revisions the status does not list (by
/// when they were last published, then created), then the published one (what proxies
/// get now: the newest before the desired version, whatever the status says).
fn since_status(mine: &[EnvoyConfigRevision], current: &[String]) -> Vec<String> {
    let published_at = |r: &EnvoyConfigRevision| {
        r.status
            .as_ref()
            .and_then(|s| s.last_published_at.as_ref())
            .map(|t| t.0)
    };
    let key = |r: &&EnvoyConfigRevision| {
        (
            published_at(r),
            r.creation_timestamp().map(|t| t.0),
            r.name_any(),
        )
    };
    let mut unlisted: Vec<&EnvoyConfigRevision> = mine
        .iter()
        .filter(|r| !current.contains(&r.spec.version))
        .collect();
    unlisted.sort_by_key(key);
    let mut published: Vec<&EnvoyConfigRevision> =
        mine.iter().filter(|r| r.is_published()).collect();
    published.sort_by_key(key);
    unlisted
        .into_iter()
        .chain(published)
        .map(|r| r.spec.version.clone())
        .collect()
}

/// Of two configs of one node id, the one that serves it: the older, or on the same second
/// the first by name. Whether `a` comes before `b`.
pub fn comes_first(a: &EnvoyConfig, b: &EnvoyConfig) -> bool {
    let key = |ec: &EnvoyConfig| (ec.creation_timestamp().map(|t| t.0), ec.name_any());
    a.uid() != b.uid() && key(a) < key(b)
}

fn invalid(obs: &Observed<'_>, version: &str, problems: &[String]) -> Outcome {
    let ec = obs.ec;
    let mut status = ec.status.clone().unwrap_or_default();
    status.desired_version = Some(version.to_owned());
    let message = format!(
        "version {version} is invalid and was not published: {}",
        problems.join("; ")
    );
    let changed = set_served(
        &mut status,
        true,
        Reason::InvalidSpec,
        &message,
        ec.metadata.generation,
        &obs.now,
    );
    Outcome {
        status,
        events: changed
            .then(|| Note::warning(Reason::InvalidSpec, message))
            .into_iter()
            .collect(),
        state_change: None,
        requeue: None,
    }
}

fn refused_empty(obs: &Observed<'_>, version: &str, served: &EnvoyConfigRevision) -> Outcome {
    let ec = obs.ec;
    let mut status = ec.status.clone().unwrap_or_default();
    status.desired_version = Some(version.to_owned());
    let message = format!(
        "version {version} declares no resources and was not published: it would remove \
         every resource that version {} serves to node {}. If the manifest has resources, \
         the API server dropped them: check the field names (spec.resources or \
         spec.envoyResources) and that the CRDs are up to date. To stop serving the node, \
         delete the EnvoyConfig",
        served.spec.version, ec.spec.node_id
    );
    let changed = set_served(
        &mut status,
        true,
        Reason::EmptyConfigRefused,
        &message,
        ec.metadata.generation,
        &obs.now,
    );
    Outcome {
        status,
        events: changed
            .then(|| Note::warning(Reason::EmptyConfigRefused, message))
            .into_iter()
            .collect(),
        state_change: None,
        requeue: None,
    }
}

/// The revision of `version`, owned by the config.
fn new_revision(ec: &EnvoyConfig, version: &str) -> EnvoyConfigRevision {
    let name = revision_name(&ec.spec.node_id, version);
    let mut revision =
        EnvoyConfigRevision::new(&name, EnvoyConfigRevisionSpec::of(&ec.spec, version));
    revision.metadata.namespace = ec.namespace();
    revision.metadata.labels = Some(
        [
            (NODE_ID_LABEL.to_owned(), ec.spec.node_id.clone()),
            (VERSION_LABEL.to_owned(), version.to_owned()),
            (
                ENVOY_API_LABEL.to_owned(),
                ec.spec.envoy_api.as_str().to_owned(),
            ),
        ]
        .into(),
    );
    revision.metadata.owner_references = ec.controller_owner_ref(&()).map(|o| vec![o]);
    revision
}

/// A revision's status once (un)published; None when it already says so.
pub fn publication(
    revision: &EnvoyConfigRevision,
    published: bool,
    now: &Time,
) -> Option<EnvoyConfigRevisionStatus> {
    let mut status = revision.status.clone().unwrap_or_default();
    let has_condition = status.conditions.iter().any(|c| {
        c.type_ == REVISION_PUBLISHED && c.status == if published { "True" } else { "False" }
    });
    if status.published == Some(published) && has_condition {
        return None;
    }
    status.published = Some(published);
    if published {
        status.last_published_at = Some(now.clone());
    }
    let (reason, message) = if published {
        (
            RevisionReason::Published,
            "this revision is served to its node",
        )
    } else {
        (
            RevisionReason::Unpublished,
            "another revision is served to its node",
        )
    };
    set_condition(
        &mut status.conditions,
        REVISION_PUBLISHED,
        published,
        reason,
        message,
        revision.metadata.generation,
        now,
    );
    Some(status)
}

/// The status after publishing: the revisions in order, the cache state and why, and an
/// Event when the cache state changed. `mine` are the revisions of its node id, created
/// ones included.
pub fn report(
    obs: &Observed<'_>,
    plan: &revisions::Plan,
    mine: &[EnvoyConfigRevision],
    rollout: &Rollout,
) -> Outcome {
    let ec = obs.ec;
    let generation = ec.metadata.generation;
    let version = ec.spec.version();
    let mut status = ec.status.clone().unwrap_or_default();
    let previous_state = status.cache_state;
    let mut events = rollout.write(ec, &version, &obs.now, &mut status, plan.cache_state);
    status.desired_version = Some(version.clone());
    status.revisions = plan
        .revisions
        .iter()
        .map(|v| ConfigRevisionRef {
            version: v.clone(),
            revision_ref: revision_ref(ec, mine, v),
        })
        .collect();
    status.published_version = Some(plan.publish.clone());
    // A held or rolling version leaves the cache state what it was: it describes what is
    // served.
    let cache_state = match rollout.stable() {
        Some(_) => previous_state.unwrap_or(plan.cache_state),
        None => plan.cache_state,
    };
    status.cache_state = Some(cache_state);
    let taint = mine
        .iter()
        .find(|r| r.spec.version == version)
        .and_then(|r| r.taint_condition());
    let nack = taint.map(|c| c.message.clone());
    // Tainted because its canaries failed the health analysis, not by Envoy.
    let analysis = taint.is_some_and(|c| c.reason == RevisionReason::FailedAnalysis.as_str());
    let (out_of_sync, reason, message) = rollout
        .served_condition(&status, &version)
        .unwrap_or_else(|| served_condition(plan, mine, &version, nack.as_deref(), analysis));
    let set = |status: &mut EnvoyConfigStatus, type_, value, reason, message: &str| {
        set_condition(
            &mut status.conditions,
            type_,
            value,
            reason,
            message,
            generation,
            &obs.now,
        )
    };
    set_served(
        &mut status,
        out_of_sync,
        reason,
        &message,
        generation,
        &obs.now,
    );
    let failed = plan.cache_state == CacheState::RollbackFailed;
    let (reason, why) = if failed {
        (
            Reason::AllRevisionsTainted,
            "every revision was rejected by Envoy".to_owned(),
        )
    } else {
        (
            Reason::UntaintedRevisionPublished,
            format!("version {} is untainted", plan.publish),
        )
    };
    set(&mut status, ROLLBACK_FAILED, failed, reason, &why);
    status.last_nack_message = nack.filter(|_| !analysis);
    let changed = previous_state != Some(cache_state);
    if changed {
        events.push(match cache_state {
            CacheState::InSync => Note::normal(Reason::from(cache_state), message),
            _ => Note::warning(Reason::from(cache_state), message),
        });
    }
    Outcome {
        status,
        events,
        state_change: changed.then_some(cache_state),
        requeue: rollout.requeue(),
    }
}

/// The `CacheOutOfSync` condition: the cache state's, unless the published revision cannot
/// be loaded (then it is not what proxies get either).
/// Sets `CacheOutOfSync` and its positive twin `Ready` (what `kubectl wait
/// --for=condition=Ready`, kstatus and GitOps tools read): the same reason and message,
/// opposite status. Whether `CacheOutOfSync` changed.
fn set_served(
    status: &mut EnvoyConfigStatus,
    out_of_sync: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let changed = set_condition(
        &mut status.conditions,
        CACHE_OUT_OF_SYNC,
        out_of_sync,
        reason,
        message,
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        READY,
        !out_of_sync,
        reason,
        message,
        generation,
        now,
    );
    changed
}

fn served_condition(
    plan: &revisions::Plan,
    mine: &[EnvoyConfigRevision],
    desired: &str,
    nack: Option<&str>,
    analysis: bool,
) -> (bool, Reason, String) {
    let published = mine.iter().find(|r| r.spec.version == plan.publish);
    match published.and_then(|r| r.load_failure()) {
        Some(why) => (
            true,
            Reason::ResourcesOutOfSync,
            format!(
                "version {} is published but cannot be served: {why}",
                plan.publish
            ),
        ),
        None => cache_condition(plan.cache_state, desired, &plan.publish, nack, analysis),
    }
}

/// The `CacheOutOfSync` condition (status, reason, message) for a cache state: why the
/// desired version is not what proxies get, with Envoy's words when it rejected it, or the
/// health analysis' when its canaries failed it (`analysis`).
pub fn cache_condition(
    state: CacheState,
    desired: &str,
    published: &str,
    nack: Option<&str>,
    analysis: bool,
) -> (bool, Reason, String) {
    let why = nack.map(|m| format!(": {m}")).unwrap_or_default();
    let rejected = match analysis {
        true => format!("the canaries of version {desired} failed the health analysis"),
        false => format!("Envoy rejected version {desired}"),
    };
    let message = match state {
        CacheState::InSync => format!("version {desired} is published"),
        CacheState::Rollback => format!("{rejected}; rolled back to version {published}{why}"),
        CacheState::RollbackFailed => format!(
            "{rejected} and no earlier revision is untainted; it stays published until the \
             spec is fixed{why}"
        ),
    };
    (state != CacheState::InSync, Reason::from(state), message)
}

fn revision_ref(
    ec: &EnvoyConfig,
    revisions: &[EnvoyConfigRevision],
    version: &str,
) -> ObjectReference {
    let found = revisions.iter().find(|r| r.spec.version == version);
    ObjectReference {
        api_version: Some(EnvoyConfigRevision::api_version(&()).into_owned()),
        kind: Some(EnvoyConfigRevision::kind(&()).into_owned()),
        // Revisions made by the original MARIN3R are named `<nodeID>-v3-<version>`.
        name: Some(found.map_or_else(
            || revision_name(&ec.spec.node_id, version),
            ResourceExt::name_any,
        )),
        namespace: ec.namespace(),
        uid: found.and_then(|r| r.uid()),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
