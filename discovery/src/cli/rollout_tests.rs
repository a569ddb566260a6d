//! `marin3r rollout`'s history rows, the revisions `diff` picks, and the comparison it prints.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use marin3r_api::envoy_config::EnvoyConfigStatus;
use marin3r_api::envoy_config_revision::{
    EnvoyConfigRevisionSpec, EnvoyConfigRevisionStatus, REVISION_TAINTED,
};
use serde_json::json;

use super::*;

fn revision(version: &str, published: bool, taint: Option<(&str, &str)>) -> EnvoyConfigRevision {
    let spec = EnvoyConfigRevisionSpec {
        node_id: "web".into(),
        version: version.into(),
        ..Default::default()
    };
    let mut r = EnvoyConfigRevision::new(&format!("web-{version}"), spec);
    r.metadata.namespace = Some("team".into());
    let conditions = taint
        .map(|(reason, message)| Condition {
            type_: REVISION_TAINTED.into(),
            status: "True".into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Default::default()),
            observed_generation: None,
        })
        .into_iter()
        .collect();
    r.status = Some(EnvoyConfigRevisionStatus {
        published: Some(published),
        tainted: Some(taint.is_some()),
        conditions,
        ..Default::default()
    });
    r
}

fn history(desired: &str, published: &str, objects: Vec<EnvoyConfigRevision>) -> History {
    let mut config = EnvoyConfig::new("web", Default::default());
    config.metadata.namespace = Some("team".into());
    config.status = Some(EnvoyConfigStatus {
        desired_version: Some(desired.into()),
        published_version: Some(published.into()),
        ..Default::default()
    });
    History::of(&config, objects)
}

#[test]
fn the_history_says_which_is_published_which_desired_and_why_one_is_tainted() {
    let h = history(
        "b2",
        "a1",
        vec![
            revision("a1", true, None),
            revision(
                "b2",
                false,
                Some(("RejectedByEnvoy", "listener http: cannot bind\nmore")),
            ),
        ],
    );
    let table = h.table();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("VERSION"), "{table}");
    assert!(
        lines[1].starts_with("a1") && lines[1].ends_with("published"),
        "{table}"
    );
    assert!(
        lines[2].ends_with("desired, tainted (RejectedByEnvoy): listener http: cannot bind"),
        "{table}"
    );
    let doc = serde_json::to_value(&h).unwrap();
    assert_eq!(doc["envoyConfig"], "team/web");
    assert_eq!(doc["revisions"][1]["taintReason"], "RejectedByEnvoy");
    assert_eq!(doc["revisions"][0]["published"], true);
    assert!(doc["revisions"][0].get("taintReason").is_none());
    let empty = history("a1", "a1", Vec::new());
    assert_eq!(empty.table(), "EnvoyConfig team/web has no revision yet.\n");
}

#[test]
fn diff_compares_the_published_revision_with_the_one_before_unless_told() {
    let h = history(
        "c3",
        "b2",
        vec![
            revision("a1", false, None),
            revision("b2", true, None),
            revision("c3", false, Some(("RejectedByEnvoy", "no"))),
        ],
    );
    let versions = |(a, b): (&EnvoyConfigRevision, &EnvoyConfigRevision)| {
        (a.spec.version.clone(), b.spec.version.clone())
    };
    assert_eq!(
        versions(h.pair(None, None).unwrap()),
        ("a1".into(), "b2".into())
    );
    assert_eq!(
        versions(h.pair(None, Some("c3")).unwrap()),
        ("b2".into(), "c3".into())
    );
    assert_eq!(
        versions(h.pair(Some("c3"), Some("a1")).unwrap()),
        ("c3".into(), "a1".into())
    );
    let err = h.pair(Some("zz"), None).unwrap_err().to_string();
    assert!(
        err.contains("no revision of version zz") && err.contains("a1, b2, c3"),
        "{err}"
    );
    let err = h.pair(None, Some("a1")).unwrap_err().to_string();
    assert!(
        err.contains("is the first") && err.contains("--from"),
        "{err}"
    );
    let none = history("a1", "a1", Vec::new());
    assert!(
        none.pair(None, None)
            .unwrap_err()
            .to_string()
            .contains("no revision yet")
    );
}

fn side(label: &str, resources: &[(&str, serde_json::Value)], sources: &[&str]) -> Side {
    Side {
        label: label.into(),
        resources: resources
            .iter()
            .map(|(key, config)| {
                let (kind, name) = key.split_once('/').unwrap();
                let entry = Entry {
                    kind: kind.into(),
                    name: name.into(),
                    state: "served".into(),
                    version: None,
                    last_updated: None,
                    config: config.clone(),
                };
                ((*key).to_owned(), entry)
            })
            .collect(),
        sources: sources.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[test]
fn a_diff_names_what_was_added_removed_changed_and_built_differently() {
    let from = side(
        "a1",
        &[
            ("clusters/old", json!({"name": "old"})),
            ("listeners/http", json!({"name": "http", "port": 8080})),
            ("routes/r", json!({"name": "r"})),
        ],
        &["secret web-cert from Secret web-cert"],
    );
    let to = side(
        "b2",
        &[
            ("clusters/new", json!({"name": "new"})),
            ("listeners/http", json!({"name": "http", "port": 9090})),
            ("routes/r", json!({"name": "r"})),
        ],
        &[],
    );
    let report = compare(&from, &to);
    assert!(!report.alike);
    let text = report.text;
    assert!(
        text.starts_with("from a1\nto   b2\n1 resource(s) alike.\n"),
        "{text}"
    );
    assert!(text.contains("  removed: clusters/old\n"), "{text}");
    assert!(text.contains("  added: clusters/new\n"), "{text}");
    assert!(
        text.contains("  no longer built: secret web-cert from Secret web-cert\n"),
        "{text}"
    );
    assert!(text.contains("  changed: listeners/http\n"), "{text}");
    assert!(
        text.contains("--- listeners/http a1\n+++ listeners/http b2\n"),
        "{text}"
    );
    assert!(
        text.contains("-  \"port\": 8080") && text.contains("+  \"port\": 9090"),
        "{text}"
    );
    let same = compare(&to, &to);
    assert!(same.alike);
    assert!(
        same.text
            .ends_with("No difference: the 3 resource(s) are alike.\n")
    );
}
