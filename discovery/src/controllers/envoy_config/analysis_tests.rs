//! The health analysis' verdicts on a step's sums.

#![allow(clippy::unwrap_used)] // test code

use super::*;

fn traffic(proxies: u32, requests: u64, errors_5xx: u64, attempts: u64, failures: u64) -> Traffic {
    Traffic {
        proxies,
        requests,
        errors_5xx,
        upstream_attempts: attempts,
        upstream_failures: failures,
    }
}

fn step(canary: Traffic, stable: Traffic) -> StepTraffic {
    StepTraffic {
        step: 1,
        canary,
        stable,
        unread: 0,
    }
}

fn limits(json: serde_json::Value) -> Analysis {
    serde_json::from_value(json).unwrap()
}

#[test]
fn a_canary_answering_5xx_fails_and_one_no_worse_than_stable_passes() {
    let defaults = Analysis::default();
    // Every canary request a 503 (a route to a cluster that answers 503), none on stable.
    let broken = decide(
        &defaults,
        &step(traffic(1, 57, 57, 0, 0), traffic(3, 170, 0, 0, 0)),
    );
    let Verdict::Failing(why) = &broken else {
        panic!("{broken:?}")
    };
    assert!(why.contains("5xx responses are 100.0%"), "{why}");
    assert!(why.contains("the stable proxies' 0.0%"), "{why}");
    // An upstream down for everyone is not the version's fault.
    let everyone = decide(
        &defaults,
        &step(traffic(1, 50, 50, 50, 50), traffic(3, 150, 150, 150, 150)),
    );
    assert!(matches!(everyone, Verdict::Healthy(_)), "{everyone:?}");
    // Within the limit: 4 points over.
    let close = decide(
        &defaults,
        &step(traffic(1, 100, 5, 0, 0), traffic(3, 300, 3, 0, 0)),
    );
    assert!(matches!(close, Verdict::Healthy(_)), "{close:?}");
    // Over it: 6 points.
    let over = decide(
        &defaults,
        &step(traffic(1, 100, 7, 0, 0), traffic(3, 300, 3, 0, 0)),
    );
    assert!(matches!(over, Verdict::Failing(_)), "{over:?}");
    // Stable with too little traffic to compare counts as healthy (zero).
    let alone = decide(
        &defaults,
        &step(traffic(1, 100, 7, 0, 0), traffic(3, 3, 0, 0, 0)),
    );
    assert!(matches!(alone, Verdict::Failing(_)), "{alone:?}");
}

#[test]
fn failed_upstream_attempts_fail_once_there_are_enough() {
    let defaults = Analysis::default();
    // Connect failures and resets the downstream never saw as 5xx (retried elsewhere).
    let failing = decide(
        &defaults,
        &step(traffic(1, 40, 0, 40, 10), traffic(3, 120, 0, 120, 0)),
    );
    let Verdict::Failing(why) = &failing else {
        panic!("{failing:?}")
    };
    assert!(why.contains("failed upstream attempts are 25.0%"), "{why}");
    // Too few attempts to judge the upstream; the requests alone are healthy.
    let few = decide(
        &defaults,
        &step(traffic(1, 40, 0, 4, 4), traffic(3, 120, 0, 120, 0)),
    );
    assert!(matches!(few, Verdict::Healthy(_)), "{few:?}");
    // 100 turns the check off.
    let off = limits(
        serde_json::json!({"maxUpstreamFailurePercentagePoints": 100, "max5xxPercentagePoints": 100}),
    );
    let quiet = decide(
        &off,
        &step(traffic(1, 40, 40, 40, 40), traffic(3, 120, 0, 120, 0)),
    );
    assert!(matches!(quiet, Verdict::Healthy(_)), "{quiet:?}");
}

#[test]
fn without_traffic_a_step_is_not_judged_and_says_why() {
    let defaults = Analysis::default();
    let mut t = step(traffic(1, 19, 19, 0, 0), traffic(3, 500, 0, 0, 0));
    let v = decide(&defaults, &t);
    assert!(
        matches!(&v, Verdict::Inconclusive(m) if m.contains("served 19 of the 20 requests needed")),
        "{v:?}"
    );
    t.unread = 2;
    t.canary = traffic(0, 0, 0, 0, 0);
    let v = decide(&defaults, &t);
    assert!(
        v.message()
            .contains("the stats of 2 proxies could not be read"),
        "{v:?}"
    );
    let fewer = limits(serde_json::json!({"minRequests": 5}));
    let v = decide(
        &fewer,
        &step(traffic(1, 5, 5, 0, 0), traffic(3, 0, 0, 0, 0)),
    );
    assert!(matches!(v, Verdict::Failing(_)), "{v:?}");
}

#[test]
fn a_collapsed_request_rate_fails_only_when_asked() {
    // 2 requests per canary, 100 per stable proxy.
    let t = step(traffic(2, 4, 0, 0, 0), traffic(2, 200, 0, 0, 0));
    assert!(matches!(
        decide(&Analysis::default(), &t),
        Verdict::Inconclusive(_)
    ));
    let watch = limits(serde_json::json!({"minRequestRatePercent": 10}));
    let v = decide(&watch, &t);
    assert!(
        matches!(&v, Verdict::Failing(m) if m.contains("request rate collapsed")),
        "{v:?}"
    );
    // At 20% of the stable rate: not collapsed.
    let fine = step(traffic(2, 40, 0, 0, 0), traffic(2, 200, 0, 0, 0));
    assert!(matches!(decide(&watch, &fine), Verdict::Healthy(_)));
}

#[test]
fn the_replicas_sums_of_the_step_and_version_are_judged_together() {
    use marin3r_api::proxy_sync::{CanaryReport, SyncReport};
    let report =
        |replica: &str, version: &str, step_no: u32, canary: Traffic, stable: Traffic| SyncReport {
            replica: replica.into(),
            version: "old".into(),
            connected: 2,
            acked: 2,
            nacked: 0,
            reported_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
            canary: Some(CanaryReport {
                version: version.into(),
                proxies: 2,
                lowest: Vec::new(),
                traffic: Some(StepTraffic {
                    step: step_no,
                    canary,
                    stable,
                    unread: 0,
                }),
            }),
        };
    let spec = serde_json::from_value(serde_json::json!({"nodeID": "n", "resources": []})).unwrap();
    let mut ec = EnvoyConfig::new("web", spec);
    ec.status = Some(marin3r_api::EnvoyConfigStatus {
        sync_reports: vec![
            // 10 canary requests on each replica: 20 in all, all 503.
            report(
                "d-1",
                "v2",
                1,
                traffic(1, 10, 10, 0, 0),
                traffic(1, 50, 0, 0, 0),
            ),
            report(
                "d-2",
                "v2",
                1,
                traffic(0, 10, 10, 0, 0),
                traffic(1, 50, 0, 0, 0),
            ),
            // Another step's and another version's counts are not these.
            report(
                "d-3",
                "v2",
                2,
                traffic(1, 900, 0, 0, 0),
                traffic(1, 50, 0, 0, 0),
            ),
            report(
                "d-4",
                "v1",
                1,
                traffic(1, 900, 0, 0, 0),
                traffic(1, 50, 0, 0, 0),
            ),
        ],
        ..Default::default()
    });
    let v = judge(&ec, &Analysis::default(), "v2", 1);
    assert!(
        matches!(&v, Verdict::Failing(m) if m.contains("1 proxies, 20 requests")),
        "{v:?}"
    );
    let none = judge(&ec, &Analysis::default(), "v3", 1);
    assert!(
        matches!(&none, Verdict::Inconclusive(m) if m.contains("no proxy's stats")),
        "{none:?}"
    );
}
