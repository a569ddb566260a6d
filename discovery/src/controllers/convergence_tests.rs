use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use marin3r_api::EnvoyConfigSpec;

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn report(replica: &str, version: &str, connected: u32, acked: u32, nacked: u32) -> SyncReport {
    SyncReport {
        replica: replica.into(),
        version: version.into(),
        connected,
        acked,
        nacked,
        reported_at: at(1),
        canary: None,
    }
}

fn config(desired: &str, published: Option<&str>, reports: Vec<SyncReport>) -> EnvoyConfig {
    let mut ec = EnvoyConfig::new(
        "gateway",
        EnvoyConfigSpec {
            node_id: "gw".into(),
            ..Default::default()
        },
    );
    ec.metadata.namespace = Some("team-a".into());
    ec.metadata.generation = Some(3);
    ec.metadata.resource_version = Some("42".into());
    ec.status = Some(EnvoyConfigStatus {
        desired_version: Some(desired.into()),
        published_version: published.map(Into::into),
        sync_reports: reports,
        ..Default::default()
    });
    ec
}

/// Applies a patch of `summed` the way the API server merges it.
fn apply(ec: &mut EnvoyConfig, patch: serde_json::Value) {
    let mut status = serde_json::to_value(ec.status.clone().unwrap()).unwrap();
    for (key, value) in patch.as_object().unwrap() {
        status[key] = value.clone();
    }
    ec.status = Some(serde_json::from_value(status).unwrap());
}

fn condition(ec: &EnvoyConfig) -> (String, String, String) {
    let c = ec
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == SYNCED)
        .unwrap();
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn the_leader_sums_live_replicas_and_says_why_in_the_condition() {
    let live = BTreeSet::from(["d-1".to_owned(), "d-2".to_owned()]);
    let mut ec = config(
        "v2",
        Some("v2"),
        vec![
            report("d-1", "v2", 2, 2, 0),
            report("d-2", "v2", 1, 0, 0),
            // A replica that is gone: dropped, and not counted.
            report("d-0", "v2", 5, 0, 5),
        ],
    );
    let patch = summed(&ec, Some(&live), &at(10)).unwrap();
    apply(&mut ec, patch);
    let status = ec.status.clone().unwrap();
    let proxies = status.proxies.unwrap();
    assert_eq!(
        (
            proxies.connected,
            proxies.acked,
            proxies.nacked,
            proxies.pending
        ),
        (3, 2, 0, 1)
    );
    assert_eq!(proxies.synced, "2/3");
    assert_eq!(status.sync_reports.len(), 2);
    assert_eq!(
        condition(&ec),
        (
            "False".into(),
            "ProxiesPending".into(),
            "1 of 3 connected proxies have not acknowledged version v2 yet".into()
        )
    );
    // Written once: the same reports change nothing.
    assert_eq!(summed(&ec, Some(&live), &at(11)), None);
    // The last proxy acknowledges.
    ec.status.as_mut().unwrap().sync_reports[1] = report("d-2", "v2", 1, 1, 0);
    let patch = summed(&ec, Some(&live), &at(12)).unwrap();
    apply(&mut ec, patch);
    assert_eq!(
        ec.status.as_ref().unwrap().proxies.as_ref().unwrap().synced,
        "3/3"
    );
    assert_eq!(
        condition(&ec),
        (
            "True".into(),
            "AllProxiesSynced".into(),
            "all 3 connected proxies acknowledged version v2".into()
        )
    );
}

#[test]
fn rejections_rollbacks_and_an_empty_node_are_told_apart() {
    let nacked = config("v2", Some("v2"), vec![report("d-1", "v2", 4, 3, 1)]);
    let (ok, reason, message) = synced(
        nacked.status.as_ref().unwrap(),
        &ProxySync::sum("v2", &nacked.status.as_ref().unwrap().sync_reports),
        "gw",
    );
    assert_eq!(
        (ok, reason, message.as_str()),
        (
            false,
            SyncReason::ProxiesRejected,
            "1 of 4 connected proxies rejected version v2"
        )
    );
    // Rolled back: every proxy has the old version, which is not what the user asked for.
    let rolled_back = config("v3", Some("v2"), vec![report("d-1", "v2", 4, 4, 0)]);
    let status = rolled_back.status.as_ref().unwrap();
    let (ok, reason, _) = synced(status, &ProxySync::sum("v2", &status.sync_reports), "gw");
    assert_eq!(
        (ok, reason),
        (false, SyncReason::DesiredVersionNotPublished)
    );
    // Nobody connected: nothing to wait for.
    let empty = config("v2", Some("v2"), vec![]);
    let status = empty.status.as_ref().unwrap();
    let (ok, reason, message) = synced(status, &ProxySync::sum("v2", &[]), "gw");
    assert_eq!(
        (ok, reason, message.as_str()),
        (
            true,
            SyncReason::NoProxiesConnected,
            "version v2 is published; no proxy of node gw is connected"
        )
    );
    // Never published (an invalid spec): no counts are written at all.
    assert_eq!(summed(&config("v1", None, vec![]), None, &at(1)), None);
}

#[test]
fn a_replica_writes_its_entry_only_when_its_count_changed() {
    let c = |connected, acked, nacked| Convergence {
        connected,
        acked,
        nacked,
    };
    let ec = config("v2", Some("v2"), vec![report("d-2", "v2", 1, 1, 0)]);
    // A new entry, kept in replica order.
    let reports = reports_with(&ec, "d-1", Some(("v2".into(), c(2, 1, 0))), None).unwrap();
    let names: Vec<&str> = reports.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(names, ["d-1", "d-2"]);
    // The same count again: no write, whatever the time.
    let mut ec = ec;
    ec.status.as_mut().unwrap().sync_reports = reports;
    assert_eq!(
        reports_with(&ec, "d-1", Some(("v2".into(), c(2, 1, 0))), None),
        None
    );
    // Another version, or its proxies gone: rewritten, or removed.
    let moved = reports_with(&ec, "d-1", Some(("v3".into(), c(2, 1, 0))), None).unwrap();
    assert_eq!(moved[0].version, "v3");
    let gone = reports_with(&ec, "d-1", None, None).unwrap();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].replica, "d-2");
    // A replica with nothing to say and no entry writes nothing.
    assert_eq!(reports_with(&ec, "d-9", None, None), None);
}

#[test]
fn reports_beyond_one_per_replica_are_not_read() {
    let reports: Vec<SyncReport> = (0..1000)
        .map(|i| report(&format!("r-{i:04}"), "v2", 1, 0, 1))
        .collect();
    let mut ec = config("v2", Some("v2"), reports);
    let patch = summed(&ec, None, &at(1)).unwrap();
    apply(&mut ec, patch);
    let proxies = ec.status.unwrap().proxies.unwrap();
    assert_eq!(
        (proxies.connected, proxies.nacked),
        (MAX_REPORTS as u32, MAX_REPORTS as u32)
    );
}
