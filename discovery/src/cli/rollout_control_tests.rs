use k8s_openapi::api::core::v1::ObjectReference;
use marin3r_api::envoy_config_revision::EnvoyConfigRevisionStatus;
use marin3r_api::{ConfigRevisionRef, EnvoyConfigRevisionSpec, EnvoyConfigStatus};

use super::*;

/// A config whose revisions are `listed` in order, `published` published, the spec's
/// version `desired`; `tainted` were rejected by Envoy.
fn scene(
    listed: &[&str],
    published: &str,
    tainted: &[&str],
) -> (EnvoyConfig, Vec<EnvoyConfigRevision>) {
    let mut ec = EnvoyConfig::new(
        "web",
        serde_json::from_value(serde_json::json!({"nodeID": "web"})).unwrap(),
    );
    let desired = ec.spec.version();
    ec.status = Some(EnvoyConfigStatus {
        published_version: Some(published.into()),
        revisions: listed
            .iter()
            .map(|v| ConfigRevisionRef {
                version: if *v == "desired" {
                    desired.clone()
                } else {
                    (*v).into()
                },
                revision_ref: ObjectReference::default(),
            })
            .collect(),
        ..Default::default()
    });
    let revisions = listed
        .iter()
        .map(|v| {
            let version = if *v == "desired" {
                desired.clone()
            } else {
                (*v).into()
            };
            let mut r = EnvoyConfigRevision::new(
                &format!("web-{version}"),
                EnvoyConfigRevisionSpec::of(&ec.spec, &version),
            );
            r.status = Some(EnvoyConfigRevisionStatus {
                tainted: Some(tainted.contains(v)),
                ..Default::default()
            });
            r
        })
        .collect();
    (ec, revisions)
}

#[test]
fn undo_goes_back_past_rejected_revisions_to_one_before_the_published_one() {
    let (ec, revisions) = scene(&["a", "b", "c", "desired"], "desired", &["b"]);
    // Before the published one, skipping the rejected b.
    assert_eq!(undo_target(&ec, &revisions, None).unwrap(), "c");
    let (ec, revisions) = scene(&["a", "b", "c", "desired"], "c", &["c", "b"]);
    assert_eq!(undo_target(&ec, &revisions, None).unwrap(), "a");
    // Named: any revision Envoy did not reject.
    assert_eq!(undo_target(&ec, &revisions, Some("a")).unwrap(), "a");
    let err = undo_target(&ec, &revisions, Some("b")).unwrap_err();
    assert!(err.contains("rejected by Envoy"), "{err}");
    let err = undo_target(&ec, &revisions, Some("zz")).unwrap_err();
    assert!(
        err.contains("no revision of version zz") && err.contains("a, b, c"),
        "{err}"
    );
    let desired = ec.spec.version();
    let err = undo_target(&ec, &revisions, Some(&desired)).unwrap_err();
    assert!(err.contains("is the desired version"), "{err}");
    // Nothing earlier to go back to.
    let (ec, revisions) = scene(&["desired"], "desired", &[]);
    let err = undo_target(&ec, &revisions, None).unwrap_err();
    assert!(err.contains("--to-revision"), "{err}");
}
