//! Canary steps as the leader decides them, without a cluster.

#![allow(clippy::unwrap_used)] // test code

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::super::plan::{Observed, Plan, decide, report};
use super::*;
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_config_revision::EnvoyConfigRevisionStatus;
use marin3r_api::proxy_sync::{CanaryReport, SyncReport};
use marin3r_api::rollout::RolloutStatus;
use marin3r_api::{EnvoyConfigRevisionSpec, EnvoyConfigSpec, EnvoyConfigStatus};

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

/// A spec with cluster `a`, and `cluster` too (adding one holds nothing back).
fn spec(cluster: &str, steps: Value) -> EnvoyConfigSpec {
    let names: std::collections::BTreeSet<&str> = ["a", cluster].into();
    let clusters: Vec<Value> = names
        .iter()
        .map(|n| json!({"type": "cluster", "value": {"name": n, "connect_timeout": "1s"}}))
        .collect();
    serde_json::from_value(json!({
        "nodeID": "edge",
        "resources": clusters,
        "rollout": {"steps": steps},
    }))
    .unwrap()
}

fn revision(spec: &EnvoyConfigSpec, published: bool) -> EnvoyConfigRevision {
    let version = spec.version();
    let mut r = EnvoyConfigRevision::new(
        &format!("edge-{version}"),
        EnvoyConfigRevisionSpec::of(spec, &version),
    );
    r.status = Some(EnvoyConfigRevisionStatus {
        published: Some(published),
        ..Default::default()
    });
    r
}

fn hex(h: u64) -> String {
    format!("{h:016x}")
}

/// Two replicas, two proxies each, reporting for `version`.
fn reports(version: &str) -> Vec<SyncReport> {
    [("d-1", [10u64, 30]), ("d-2", [20, 40])]
        .into_iter()
        .map(|(replica, hashes)| SyncReport {
            replica: replica.into(),
            version: "stable".into(),
            connected: 2,
            acked: 2,
            nacked: 0,
            reported_at: at(0),
            canary: Some(CanaryReport {
                version: version.into(),
                proxies: 2,
                lowest: hashes.iter().map(|h| hex(*h)).collect(),
                traffic: None,
            }),
        })
        .collect()
}

/// A config serving `a`, whose spec is now `b` with two steps of 10 s, and its revisions.
fn scene() -> (EnvoyConfig, Vec<EnvoyConfigRevision>) {
    let steps = json!([{"proxies": 1, "bake": "10s"}, {"percent": 50, "bake": "10s"}]);
    let stable = spec("a", steps.clone());
    let desired = spec("b", steps);
    let mut ec = EnvoyConfig::new("edge", desired.clone());
    ec.metadata = ObjectMeta {
        name: Some("edge".into()),
        namespace: Some("team-a".into()),
        generation: Some(2),
        ..Default::default()
    };
    ec.status = Some(EnvoyConfigStatus {
        published_version: Some(stable.version()),
        desired_version: Some(stable.version()),
        cache_state: Some(CacheState::InSync),
        sync_reports: reports(&desired.version()),
        ..Default::default()
    });
    (ec, vec![revision(&stable, true), revision(&desired, false)])
}

/// `ec`'s status says the rollout of its version is in `step`, started at `started`.
fn in_step(ec: &mut EnvoyConfig, step: u32, started: i64) {
    let status = ec.status.as_mut().unwrap();
    status.rollout = Some(RolloutStatus {
        version: ec.spec.version(),
        phase: RolloutPhase::Progressing,
        step: Some(step),
        steps: Some(2),
        step_started_at: Some(at(started)),
        ..Default::default()
    });
}

/// What the plan decides for `ec` and its revisions `mine` at second 5, and what it reports.
fn planned(
    ec: &EnvoyConfig,
    mine: &[EnvoyConfigRevision],
) -> (super::super::plan::Publish, super::super::plan::Outcome) {
    let obs = Observed {
        ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions: mine.to_vec(),
        envoy_refusal: Vec::new(),
        now: at(5),
    };
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    let outcome = report(&obs, &publish.algorithm, &publish.mine, &publish.rollout);
    (*publish, outcome)
}

fn step(steps: Steps) -> Step {
    match steps {
        Steps::Canary(step) => *step,
        other => panic!("not in a step: {other:?}"),
    }
}

#[test]
fn the_cutoff_takes_the_lowest_hashes_then_a_share_of_the_space() {
    let lowest = [10, 20, 30, 40];
    assert_eq!(cutoff(1, 4, &lowest), Some(10));
    assert_eq!(cutoff(3, 4, &lowest), Some(30));
    assert_eq!(cutoff(4, 4, &lowest), Some(u64::MAX));
    assert_eq!(cutoff(9, 4, &lowest), Some(u64::MAX));
    assert_eq!(cutoff(1, 0, &lowest), None);
    // Beyond the hashes reported: half the proxies, about half the space.
    let half = cutoff(50, 100, &lowest).unwrap();
    assert!(half.abs_diff(u64::MAX / 2) < u64::MAX / 1000, "{half:x}");
}

#[test]
fn each_step_takes_its_share_of_the_reported_proxies_and_bakes() {
    let (mut ec, mine) = scene();
    let version = ec.spec.version();
    let stable = mine[0].spec.version.clone();
    // Step 1 starts now: the lowest of the four hashes.
    let first = step(judge(&ec, &mine, &version, false, false, &at(5)));
    assert_eq!(
        (first.number, first.of, first.target, first.connected),
        (1, 2, 1, 4)
    );
    assert_eq!(first.stable, stable);
    assert_eq!(first.canary, Some(RevisionCanary::new(1, 10)));
    assert_eq!(first.started, Some(at(5)));
    assert_eq!(first.requeue, Duration::from_millis(10_100));
    assert!(
        first
            .message
            .starts_with("step 1 of 2 (1 proxy): 1 of 4 proxies get version"),
        "{}",
        first.message
    );
    // Midway, the same step, the rest of its bake.
    in_step(&mut ec, 1, 5);
    let mid = step(judge(&ec, &mine, &version, false, false, &at(9)));
    assert_eq!((mid.number, mid.started.clone()), (1, Some(at(5))));
    assert_eq!(mid.requeue, Duration::from_millis(6_100));
    // Baked: step 2, 50% of four, from now.
    let second = step(judge(&ec, &mine, &version, false, false, &at(15)));
    assert_eq!((second.number, second.target), (2, 2));
    assert_eq!(second.canary, Some(RevisionCanary::new(2, 20)));
    assert_eq!(second.started, Some(at(15)));
    // The last step baked: published.
    in_step(&mut ec, 2, 15);
    assert_eq!(
        judge(&ec, &mine, &version, false, false, &at(25)),
        Steps::Done
    );
}

#[test]
fn the_cutoff_never_shrinks_and_a_step_waits_for_the_reports() {
    let (mut ec, mut mine) = scene();
    let version = ec.spec.version();
    // A proxy left: the step would now end lower, but a canary never goes back.
    mine[1].status.as_mut().unwrap().canary = Some(RevisionCanary::new(1, 35));
    let kept = step(judge(&ec, &mine, &version, false, false, &at(0)));
    assert_eq!(kept.canary, Some(RevisionCanary::new(1, 35)));
    // Every hash is known: the count is of the proxies the cutoff takes, not the share.
    assert_eq!((kept.target, kept.connected), (3, 4));
    // Proxies are connected but no replica has reported them for this version yet: the
    // step has not begun.
    for r in &mut ec.status.as_mut().unwrap().sync_reports {
        r.canary = None;
    }
    mine[1].status.as_mut().unwrap().canary = None;
    let waiting = step(judge(&ec, &mine, &version, false, false, &at(0)));
    assert_eq!((waiting.started, waiting.canary), (None, None));
    assert_eq!(waiting.requeue, Duration::from_secs(2));
    assert!(
        waiting
            .message
            .contains("waiting for the discovery replicas"),
        "{}",
        waiting.message
    );
    // One replica of two has reported: a cutoff among its proxies alone could take more
    // than one (the other's may hash lower), so the step still waits.
    ec.status.as_mut().unwrap().sync_reports = reports(&version);
    ec.status.as_mut().unwrap().sync_reports[1].canary = None;
    let partial = step(judge(&ec, &mine, &version, false, false, &at(0)));
    assert_eq!((partial.started, partial.canary), (None, None));
    // No proxy connected anywhere: nothing to wait for; the step bakes.
    ec.status.as_mut().unwrap().sync_reports.clear();
    let empty = step(judge(&ec, &mine, &version, false, false, &at(0)));
    assert_eq!((empty.canary, empty.started), (None, Some(at(0))));
    assert!(
        empty.message.contains("no proxy of the node is connected"),
        "{}",
        empty.message
    );
}

#[test]
fn nothing_steps_without_steps_a_stable_version_or_a_version_to_trust() {
    let (ec, mine) = scene();
    let version = ec.spec.version();
    assert_eq!(
        judge(&ec, &mine, &version, true, false, &at(0)),
        Steps::None,
        "rejected"
    );
    assert_eq!(
        judge(&ec, &mine, &version, false, true, &at(0)),
        Steps::None,
        "held"
    );
    assert_eq!(
        judge(&ec, &mine[1..], &version, false, false, &at(0)),
        Steps::None,
        "first"
    );
    let mut plain = ec.clone();
    plain.spec.rollout = Some(Default::default());
    assert_eq!(
        judge(&plain, &mine, &version, false, false, &at(0)),
        Steps::None
    );
}

/// As the controller decides and reports it: the stable version stays published, the
/// desired one is the canary, and the status and Events say where it stands.
#[test]
fn a_rolling_version_keeps_the_stable_one_published_until_done() {
    let (mut ec, mine) = scene();
    let version = ec.spec.version();
    let stable = mine[0].spec.version.clone();
    let run = |ec: &EnvoyConfig| planned(ec, &mine);
    let (publish, outcome) = run(&ec);
    assert_eq!(publish.algorithm.publish, stable);
    assert_eq!(publish.rollout.canary(), Some(&RevisionCanary::new(1, 10)));
    let status = &outcome.status;
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "RolloutInProgress")
    );
    let rollout = status.rollout.as_ref().unwrap();
    assert_eq!(rollout.phase, RolloutPhase::Progressing);
    assert_eq!(
        (rollout.step, rollout.steps, rollout.canary.as_deref()),
        (Some(1), Some(2), Some("1/4"))
    );
    assert_eq!(rollout.stable_version.as_deref(), Some(stable.as_str()));
    assert_eq!(status.cache_state, Some(CacheState::InSync));
    assert_eq!(outcome.requeue, Some(Duration::from_millis(10_100)));
    let reasons: Vec<String> = outcome
        .events
        .iter()
        .map(|e| e.reason.to_string())
        .collect();
    assert_eq!(reasons, ["RolloutStep"]);
    // The same step again: no new Event.
    ec.status = Some(outcome.status.clone());
    let (_, again) = run(&ec);
    assert!(again.events.is_empty(), "{:?}", again.events);
    // Both steps baked: published, and said so.
    in_step(&mut ec, 2, -20);
    let (publish, done) = run(&ec);
    assert_eq!(publish.algorithm.publish, version);
    assert_eq!(publish.rollout.canary(), None);
    assert_eq!(
        done.status.rollout.as_ref().unwrap().phase,
        RolloutPhase::Completed
    );
    let reasons: Vec<String> = done.events.iter().map(|e| e.reason.to_string()).collect();
    assert_eq!(reasons, ["RolloutCompleted"]);
    assert_eq!(done.requeue, None);
}

fn annotate(ec: &mut EnvoyConfig, key: &str, value: &str) {
    ec.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value.to_owned());
}

#[test]
fn a_person_pauses_promotes_and_aborts_a_step() {
    use marin3r_api::rollout::{ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION};
    let (mut ec, mine) = scene();
    let version = ec.spec.version();
    in_step(&mut ec, 1, 0);
    // Paused: the bake is long over, the step stays.
    annotate(&mut ec, PAUSE_ANNOTATION, "true");
    let paused = step(judge(&ec, &mine, &version, false, false, &at(60)));
    assert_eq!((paused.number, paused.paused), (1, true));
    assert!(
        paused.message.starts_with("paused at step 1 of 2"),
        "{}",
        paused.message
    );
    assert_eq!(paused.requeue, Duration::from_secs(300));
    // Promoted: this step ends now, paused or not; a promotion of another step is nothing.
    annotate(&mut ec, PROMOTE_ANNOTATION, &format!("{version}/2"));
    assert_eq!(
        step(judge(&ec, &mine, &version, false, false, &at(60))).number,
        1
    );
    annotate(&mut ec, PROMOTE_ANNOTATION, &format!("{version}/1"));
    assert_eq!(
        step(judge(&ec, &mine, &version, false, false, &at(3))).number,
        2
    );
    // Aborted: the published version stays, to every proxy.
    annotate(&mut ec, ABORT_ANNOTATION, &version);
    let Steps::Aborted { stable, message } = judge(&ec, &mine, &version, false, false, &at(3))
    else {
        panic!("aborted")
    };
    assert_eq!(stable, mine[0].spec.version);
    assert!(message.contains("was aborted"), "{message}");
    // An abort of another version is nothing.
    annotate(&mut ec, ABORT_ANNOTATION, "other");
    assert!(matches!(
        judge(&ec, &mine, &version, false, false, &at(3)),
        Steps::Canary(_)
    ));
}

/// As the controller decides it: an aborted rollout publishes nothing new and says so; an
/// undo publishes the revision a person named in place of the desired version.
#[test]
fn an_abort_and_an_undo_are_what_is_served_until_the_spec_changes() {
    use marin3r_api::rollout::{ABORT_ANNOTATION, UNDO_ANNOTATION};
    let (mut ec, mine) = scene();
    let version = ec.spec.version();
    let stable = mine[0].spec.version.clone();
    let run = |ec: &EnvoyConfig, mine: &[EnvoyConfigRevision]| {
        let (publish, outcome) = planned(ec, mine);
        (
            publish.algorithm.publish.clone(),
            publish.rollout.canary().cloned(),
            outcome,
        )
    };
    let reason = |outcome: &super::super::plan::Outcome| {
        let ready = outcome
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        (ready.status.clone(), ready.reason.clone())
    };
    in_step(&mut ec, 1, 0);
    annotate(&mut ec, ABORT_ANNOTATION, &version);
    let (published, canary, outcome) = run(&ec, &mine);
    assert_eq!((published.as_str(), canary), (stable.as_str(), None));
    assert_eq!(reason(&outcome), ("False".into(), "RolloutAborted".into()));
    assert_eq!(
        outcome.status.rollout.as_ref().unwrap().phase,
        RolloutPhase::Aborted
    );
    let events: Vec<String> = outcome
        .events
        .iter()
        .map(|e| e.reason.to_string())
        .collect();
    assert_eq!(events, ["RolloutAborted"]);

    // The new version published to all, then undone to the one before.
    let mut ec = scene().0;
    let mut mine = mine.clone();
    for r in &mut mine {
        r.status.as_mut().unwrap().published = Some(r.spec.version == version);
    }
    ec.status.as_mut().unwrap().published_version = Some(version.clone());
    annotate(&mut ec, UNDO_ANNOTATION, &format!("{stable}@{version}"));
    let (published, _, outcome) = run(&ec, &mine);
    assert_eq!(published, stable);
    assert_eq!(reason(&outcome), ("False".into(), "Undone".into()));
    let rollout = outcome.status.rollout.as_ref().unwrap();
    assert_eq!(rollout.phase, RolloutPhase::Undone);
    assert!(
        rollout.message.contains("by `marin3r rollout undo`"),
        "{}",
        rollout.message
    );
    // Once the spec changes, the undo lapses: an undo of another desired version is nothing.
    annotate(&mut ec, UNDO_ANNOTATION, &format!("{stable}@elsewhere"));
    assert_eq!(run(&ec, &mine).0, version);
    // And one naming a rejected revision is nothing either.
    annotate(&mut ec, UNDO_ANNOTATION, &format!("{stable}@{version}"));
    mine[0].status.as_mut().unwrap().tainted = Some(true);
    assert_eq!(run(&ec, &mine).0, version);
}

/// The canaries' and the stable proxies' traffic in step 1, as both replicas read it.
fn with_traffic(ec: &mut EnvoyConfig, canary_5xx: u64) {
    use marin3r_api::proxy_sync::{StepTraffic, Traffic};
    let version = ec.spec.version();
    let status = ec.status.as_mut().unwrap();
    for (i, r) in status.sync_reports.iter_mut().enumerate() {
        let c = r.canary.as_mut().unwrap();
        assert_eq!(c.version, version);
        c.traffic = Some(StepTraffic {
            step: 1,
            canary: Traffic {
                proxies: u32::from(i == 0),
                requests: 30,
                errors_5xx: canary_5xx,
                ..Traffic::default()
            },
            stable: Traffic {
                proxies: 1,
                requests: 30,
                ..Traffic::default()
            },
            unread: 0,
        });
    }
}

#[test]
fn canaries_failing_the_analysis_roll_the_version_back_before_the_others_get_it() {
    let (mut ec, mine) = scene();
    let version = ec.spec.version();
    let stable = mine[0].spec.version.clone();
    in_step(&mut ec, 1, 0);
    // Healthy: the step goes on, and says what it saw.
    with_traffic(&mut ec, 0);
    let healthy = step(judge(&ec, &mine, &version, false, false, &at(5)));
    assert_eq!(healthy.number, 1);
    let said = healthy.analysis.unwrap();
    assert!(said.starts_with("step 1: healthy"), "{said}");
    // Every canary request a 5xx: failed, in the middle of the bake.
    with_traffic(&mut ec, 30);
    let failed = judge(&ec, &mine, &version, false, false, &at(5));
    let Steps::Failed {
        stable: kept,
        step: 1,
        of: 2,
        analysis,
    } = &failed
    else {
        panic!("{failed:?}")
    };
    assert_eq!(kept, &stable);
    assert!(analysis.contains("5xx responses are 100.0%"), "{analysis}");
    // Through the plan: the stable version stays published to all, no canary is marked,
    // the revision is to be tainted, and it says so.
    let (publish, outcome) = planned(&ec, &mine);
    assert_eq!(publish.algorithm.publish, stable);
    assert_eq!(publish.rollout.canary(), None);
    let why = publish.rollout.failed().unwrap();
    assert!(
        why.contains("failed the health analysis in step 1 of 2"),
        "{why}"
    );
    let rollout = outcome.status.rollout.as_ref().unwrap();
    assert_eq!(rollout.phase, RolloutPhase::RolledBack);
    assert!(rollout.analysis.as_deref().unwrap().contains("100.0%"));
    let ready = outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "FailedAnalysis")
    );
    let events: Vec<(String, String)> = outcome
        .events
        .iter()
        .map(|e| (e.reason.to_string(), e.message.clone()))
        .collect();
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "RolloutRolledBack" && m.contains("failed the health analysis")),
        "{events:?}"
    );
    // Paused, it still fails: a person's pause never keeps a broken canary.
    annotate(&mut ec, PAUSE_ANNOTATION, "true");
    assert!(matches!(
        judge(&ec, &mine, &version, false, false, &at(5)),
        Steps::Failed { .. }
    ));
}
