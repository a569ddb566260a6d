//! The blast-radius guard as the controller decides it, without a cluster.

#![allow(clippy::unwrap_used)] // test code

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::{Value, json};

use super::super::plan::{Observed, Plan, decide, report};
use super::*;
use marin3r_api::envoy_config_revision::EnvoyConfigRevisionStatus;
use marin3r_api::{EnvoyConfigRevisionSpec, EnvoyConfigSpec};

fn spec(clusters: &[&str], rollout: Option<Value>) -> EnvoyConfigSpec {
    let resources: Vec<Value> = clusters
        .iter()
        .map(|n| json!({"type": "cluster", "value": {"name": n, "connect_timeout": "1s"}}))
        .collect();
    let mut spec = json!({"nodeID": "edge", "resources": resources});
    if let Some(r) = rollout {
        spec["rollout"] = r;
    }
    serde_json::from_value(spec).unwrap()
}

/// A config serving `a`..`e` (published, in sync), whose spec now keeps only `kept`.
fn scene(kept: &[&str], rollout: Option<Value>) -> (EnvoyConfig, Vec<EnvoyConfigRevision>) {
    let served = spec(&["a", "b", "c", "d", "e"], None);
    let version = served.version();
    let mut stable = EnvoyConfigRevision::new(
        &format!("edge-{version}"),
        EnvoyConfigRevisionSpec::of(&served, &version),
    );
    stable.status = Some(EnvoyConfigRevisionStatus {
        published: Some(true),
        ..Default::default()
    });
    let mut ec = EnvoyConfig::new("edge", spec(kept, rollout));
    ec.metadata = ObjectMeta {
        name: Some("edge".into()),
        namespace: Some("team-a".into()),
        uid: Some("uid".into()),
        generation: Some(2),
        ..Default::default()
    };
    ec.status = Some(marin3r_api::EnvoyConfigStatus {
        published_version: Some(version.clone()),
        desired_version: Some(version),
        cache_state: Some(CacheState::InSync),
        ..Default::default()
    });
    (ec, vec![stable])
}

fn observe(ec: &EnvoyConfig, revisions: Vec<EnvoyConfigRevision>) -> Observed<'_> {
    Observed {
        ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions,
        envoy_refusal: Vec::new(),
        now: Time("2026-01-01T00:00:02Z".parse().unwrap()),
    }
}

fn condition<'a>(status: &'a EnvoyConfigStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Decides and reports, as the controller does (the created revision joins `mine`).
fn run(
    ec: &EnvoyConfig,
    revisions: Vec<EnvoyConfigRevision>,
) -> (String, super::super::plan::Outcome) {
    let obs = observe(ec, revisions);
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    let mut mine = publish.mine.clone();
    mine.extend(publish.create.clone());
    let outcome = report(&obs, &publish.algorithm, &mine, &publish.rollout);
    (publish.algorithm.publish.clone(), outcome)
}

#[test]
fn without_a_strategy_a_version_is_published_as_always() {
    let (ec, revisions) = scene(&["a"], None);
    let (published, outcome) = run(&ec, revisions);
    assert_eq!(published, ec.spec.version());
    assert_eq!(outcome.status.rollout, None);
    assert_eq!(condition(&outcome.status, ROLLOUT_HELD), None);
    assert_eq!(
        condition(&outcome.status, "Ready"),
        Some(("True", "InSync"))
    );
}

#[test]
fn a_version_removing_most_clusters_is_held_until_approved() {
    let (mut ec, revisions) = scene(&["a"], Some(json!({})));
    let stable = revisions[0].spec.version.clone();
    let desired = ec.spec.version();
    let (published, outcome) = run(&ec, revisions.clone());
    assert_eq!(published, stable, "the served version stays served");
    let status = &outcome.status;
    assert_eq!(status.published_version.as_deref(), Some(stable.as_str()));
    assert_eq!(status.desired_version.as_deref(), Some(desired.as_str()));
    assert_eq!(status.cache_state, Some(CacheState::InSync));
    assert_eq!(outcome.state_change, None);
    assert_eq!(
        condition(status, ROLLOUT_HELD),
        Some(("True", "BlastRadiusExceeded"))
    );
    assert_eq!(condition(status, "Ready"), Some(("False", "RolloutHeld")));
    assert_eq!(
        condition(status, "CacheOutOfSync"),
        Some(("True", "RolloutHeld"))
    );
    let rollout = status.rollout.as_ref().unwrap();
    assert_eq!(rollout.phase, RolloutPhase::Held);
    assert_eq!(rollout.version, desired);
    assert_eq!(rollout.stable_version.as_deref(), Some(stable.as_str()));
    assert!(
        rollout
            .message
            .contains("removes 4 of 5 clusters (80% > 30%): b, c, d, e")
            && rollout
                .message
                .contains("marin3r rollout promote edge -n team-a"),
        "{}",
        rollout.message
    );
    assert_eq!(outcome.events.len(), 1);
    assert_eq!(outcome.events[0].reason.to_string(), "BlastRadiusExceeded");
    // The held version is the newest revision, so `rollout diff` finds it.
    assert_eq!(status.revisions.last().unwrap().version, desired);

    // An approval of another version changes nothing.
    ec.metadata.annotations = Some([(APPROVE_ANNOTATION.to_owned(), stable.clone())].into());
    assert_eq!(run(&ec, revisions.clone()).0, stable);
    // Approving this version publishes it.
    ec.metadata.annotations = Some([(APPROVE_ANNOTATION.to_owned(), desired.clone())].into());
    ec.status = Some(outcome.status.clone());
    let (published, outcome) = run(&ec, revisions);
    assert_eq!(published, desired);
    let status = &outcome.status;
    assert_eq!(condition(status, ROLLOUT_HELD), Some(("False", "Approved")));
    assert_eq!(condition(status, "Ready"), Some(("True", "InSync")));
    let rollout = status.rollout.as_ref().unwrap();
    assert_eq!(rollout.phase, RolloutPhase::Completed);
    assert_eq!(rollout.stable_version.as_deref(), Some(stable.as_str()));
    assert_eq!(rollout.message, "");
    let reasons: Vec<String> = outcome
        .events
        .iter()
        .map(|e| e.reason.to_string())
        .collect();
    assert_eq!(reasons, ["Approved"]);
}

#[test]
fn a_small_change_a_rejected_version_and_a_tainted_stable_are_not_held() {
    // One cluster of five removed: within 30%.
    let (ec, revisions) = scene(&["a", "b", "c", "d"], Some(json!({})));
    let (published, outcome) = run(&ec, revisions);
    assert_eq!(published, ec.spec.version());
    assert_eq!(
        condition(&outcome.status, ROLLOUT_HELD),
        Some(("False", "WithinBlastRadius"))
    );
    assert_eq!(
        outcome.status.rollout.as_ref().unwrap().phase,
        RolloutPhase::Completed
    );
    // The limit is the config's own.
    let (ec, revisions) = scene(
        &["a"],
        Some(json!({"blastRadius": {"maxRemovedPercent": 100}})),
    );
    assert_eq!(run(&ec, revisions).0, ec.spec.version());
    // A published revision Envoy rejected holds nothing back: the fix goes out.
    let (ec, mut revisions) = scene(&["a"], Some(json!({})));
    revisions[0].status.as_mut().unwrap().tainted = Some(true);
    assert_eq!(run(&ec, revisions).0, ec.spec.version());
}

#[test]
fn dropping_the_strategy_clears_the_rollout_status() {
    let (mut ec, revisions) = scene(&["a"], Some(json!({})));
    let (_, held) = run(&ec, revisions.clone());
    ec.status = Some(held.status);
    ec.spec.rollout = None;
    let (published, outcome) = run(&ec, revisions);
    assert_eq!(published, ec.spec.version());
    assert_eq!(outcome.status.rollout, None);
    assert_eq!(condition(&outcome.status, ROLLOUT_HELD), None);
}
