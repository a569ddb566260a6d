//! The `EnvoyConfig` controller's decisions, tested without a cluster.

#![allow(clippy::unwrap_used)] // test code

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn config(name: &str, uid: &str, created: &str) -> EnvoyConfig {
    let mut ec = EnvoyConfig::new(name, Default::default());
    ec.metadata = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(uid.into()),
        creation_timestamp: Some(Time(created.parse().unwrap())),
        ..Default::default()
    };
    ec
}

#[test]
fn the_older_config_of_a_node_serves_it_then_the_first_by_name() {
    let old = config("zeta", "1", "2026-01-01T00:00:00Z");
    let new = config("alpha", "2", "2026-01-01T00:00:01Z");
    assert!(comes_first(&old, &new) && !comes_first(&new, &old));
    let same_second = config("beta", "3", "2026-01-01T00:00:01Z");
    assert!(comes_first(&new, &same_second) && !comes_first(&same_second, &new));
    assert!(
        !comes_first(&old, &old),
        "a config never comes before itself"
    );
}

#[test]
fn a_config_whose_node_is_served_by_another_is_invalid_naming_it() {
    let ec = config("second", "2", "2026-01-01T00:00:01Z");
    let obs = Observed {
        ec: &ec,
        node_served_by: Some("first".into()),
        allow_cross_namespace_secrets: false,
        revisions: Vec::new(),
        envoy_refusal: Vec::new(),
        now: Time("2026-01-01T00:00:02Z".parse().unwrap()),
    };
    let Plan::Invalid(outcome) = decide(&obs) else {
        panic!("a node served by another config must not be published")
    };
    let condition = &outcome.status.conditions[0];
    assert_eq!(condition.reason, "InvalidSpec");
    assert!(
        condition.message.contains("spec.nodeID") && condition.message.contains("first"),
        "{}",
        condition.message
    );
}

/// A revision of `ec`'s node at `version`, whose last load succeeded or failed.
fn mk_revision(ec: &EnvoyConfig, version: &str, loaded: bool) -> EnvoyConfigRevision {
    let mut r = new_revision(ec, version);
    r.spec.version = version.into();
    let mut status = EnvoyConfigRevisionStatus::default();
    let (reason, message) = match loaded {
        true => (RevisionReason::ResourcesLoaded, "served"),
        false => (RevisionReason::SecretNotFound, "Secret ns/web not found"),
    };
    let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
    status.set_resources_sync(loaded, reason, message, None, &now);
    r.status = Some(status);
    r
}

/// As the controller decides it: after v1..v9 each failed to load, the
/// tenth new version must not delete v0, which every running replica still serves.
#[test]
fn pruning_keeps_the_revision_served_while_newer_ones_fail_to_load() {
    let mut ec = config("edge", "1", "2026-01-01T00:00:00Z");
    ec.spec = serde_json::from_value(serde_json::json!({
        "nodeID": "edge",
        "resources": [{"type": "cluster", "value": {"name": "c"}}],
    }))
    .unwrap();
    let versions: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    let mut revisions: Vec<EnvoyConfigRevision> = versions
        .iter()
        .map(|v| mk_revision(&ec, v, v == "v0"))
        .collect();
    if let Some(status) = revisions[9].status.as_mut() {
        status.published = Some(true);
    }
    ec.status = Some(EnvoyConfigStatus {
        revisions: versions
            .iter()
            .map(|v| ConfigRevisionRef {
                version: v.clone(),
                revision_ref: ObjectReference::default(),
            })
            .collect(),
        ..Default::default()
    });
    let obs = Observed {
        ec: &ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions,
        envoy_refusal: Vec::new(),
        now: Time("2026-01-01T00:00:02Z".parse().unwrap()),
    };
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    assert!(publish.create.is_some());
    assert_eq!(publish.algorithm.delete, vec!["v1".to_owned()]);
    assert_eq!(publish.algorithm.revisions[0], "v0");
}

/// The soak's lost config: v2 and v3 were each created and published, but the status
/// writes that listed them failed (the spec changed meanwhile: 409). When Envoy rejects
/// v4, the proxies go back to v3, which they were served, not to v1, the last listed.
#[test]
fn a_rollback_returns_to_the_served_revision_even_when_the_status_missed_it() {
    let mut ec = config("edge", "1", "2026-01-01T00:00:00Z");
    let spec = |name: &str| {
        serde_json::from_value(serde_json::json!({
            "nodeID": "edge",
            "resources": [{"type": "cluster", "value": {"name": name}}],
        }))
        .unwrap()
    };
    let at = |s: u32| Time(format!("2026-01-01T00:00:0{s}Z").parse().unwrap());
    let mut revisions: Vec<EnvoyConfigRevision> = Vec::new();
    for (i, name) in ["v1", "v2", "v3"].iter().enumerate() {
        ec.spec = spec(name);
        let mut r = new_revision(&ec, &ec.spec.version());
        r.status = Some(EnvoyConfigRevisionStatus {
            published: Some(*name == "v3"),
            last_published_at: Some(at(i as u32 + 1)),
            ..Default::default()
        });
        revisions.push(r);
    }
    let versions: Vec<String> = revisions.iter().map(|r| r.spec.version.clone()).collect();
    ec.status = Some(EnvoyConfigStatus {
        revisions: vec![ConfigRevisionRef {
            version: versions[0].clone(),
            revision_ref: ObjectReference::default(),
        }],
        ..Default::default()
    });
    // v4, applied and rejected by Envoy.
    ec.spec = spec("v4");
    let mut v4 = new_revision(&ec, &ec.spec.version());
    v4.status = Some(EnvoyConfigRevisionStatus {
        tainted: Some(true),
        ..Default::default()
    });
    revisions.push(v4);
    let obs = Observed {
        ec: &ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions,
        envoy_refusal: Vec::new(),
        now: at(6),
    };
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    let algorithm = &publish.algorithm;
    assert_eq!(algorithm.publish, versions[2], "{:?}", algorithm.revisions);
    assert_eq!(algorithm.cache_state, CacheState::Rollback);
    assert_eq!(&algorithm.revisions[..3], &versions[..]);
    // The status written then lists every revision, so none is left out of the limit.
    let outcome = report(&obs, algorithm, &publish.mine, &publish.rollout);
    assert_eq!(outcome.status.revisions.len(), 4);
}

/// A re-applied old version that was published but whose status write failed is still
/// the one a later rejection returns to.
#[test]
fn the_published_revision_is_the_newest_before_the_desired_one() {
    let names = ["a", "b", "c"];
    let mut ec = config("edge", "1", "2026-01-01T00:00:00Z");
    let mut revisions = Vec::new();
    for name in names {
        ec.spec = serde_json::from_value(serde_json::json!({
            "nodeID": "edge",
            "resources": [{"type": "cluster", "value": {"name": name}}],
        }))
        .unwrap();
        let mut r = new_revision(&ec, &ec.spec.version());
        r.status = Some(EnvoyConfigRevisionStatus {
            published: Some(name == "a"),
            ..Default::default()
        });
        revisions.push(r);
    }
    let versions: Vec<String> = revisions.iter().map(|r| r.spec.version.clone()).collect();
    // The status still says a, b, c (c was desired then); a was re-applied and
    // published, then c applied again and rejected.
    ec.status = Some(EnvoyConfigStatus {
        revisions: versions
            .iter()
            .map(|v| ConfigRevisionRef {
                version: v.clone(),
                revision_ref: ObjectReference::default(),
            })
            .collect(),
        ..Default::default()
    });
    if let Some(status) = revisions[2].status.as_mut() {
        status.tainted = Some(true);
    }
    let obs = Observed {
        ec: &ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions,
        envoy_refusal: Vec::new(),
        now: Time("2026-01-01T00:00:09Z".parse().unwrap()),
    };
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    assert_eq!(publish.algorithm.publish, versions[0]);
    assert_eq!(
        publish.algorithm.revisions,
        vec![
            versions[1].clone(),
            versions[0].clone(),
            versions[2].clone()
        ]
    );
}

/// A new version Envoy refuses (it reached the controller without the webhook's verdict) is
/// invalid in Envoy's words, naming the resource: no revision is created, nothing is
/// (un)published, and the status keeps saying which version is served.
#[test]
fn a_version_envoy_refuses_is_invalid_and_the_served_one_stays() {
    let mut ec = config("edge", "1", "2026-01-01T00:00:00Z");
    ec.spec = serde_json::from_value(serde_json::json!({
        "nodeID": "edge",
        "resources": [{"type": "cluster", "value": {"name": "c"}}],
    }))
    .unwrap();
    let mut served = mk_revision(&ec, "v1", true);
    if let Some(status) = served.status.as_mut() {
        status.published = Some(true);
    }
    ec.status = Some(EnvoyConfigStatus {
        published_version: Some("v1".into()),
        cache_state: Some(CacheState::InSync),
        revisions: vec![ConfigRevisionRef {
            version: "v1".into(),
            revision_ref: ObjectReference::default(),
        }],
        ..Default::default()
    });
    let refusal = "spec.resources[0].value: Envoy: Error: terminal filter named \
                   envoy.filters.http.router of type envoy.filters.http.router must be the \
                   last filter in a http filter chain.";
    let mut obs = Observed {
        ec: &ec,
        node_served_by: None,
        allow_cross_namespace_secrets: false,
        revisions: vec![served],
        envoy_refusal: vec![refusal.to_owned()],
        now: Time("2026-01-01T00:00:02Z".parse().unwrap()),
    };
    let Plan::Invalid(outcome) = decide(&obs) else {
        panic!("a version Envoy refuses must not be published")
    };
    let version = ec.spec.version();
    let status = &outcome.status;
    assert_eq!(status.desired_version.as_deref(), Some(version.as_str()));
    assert_eq!(status.published_version.as_deref(), Some("v1"));
    assert_eq!(status.cache_state, Some(CacheState::InSync));
    assert_eq!(status.revisions.len(), 1);
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == CACHE_OUT_OF_SYNC)
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "InvalidSpec")
    );
    assert_eq!(
        condition.message,
        format!("version {version} is invalid and was not published: {refusal}")
    );
    assert_eq!(outcome.events.len(), 1);
    assert_eq!(outcome.state_change, None);

    // Accepted by Envoy (or not asked): the same observation publishes a new revision.
    obs.envoy_refusal.clear();
    let Plan::Publish(publish) = decide(&obs) else {
        panic!("a valid spec is published")
    };
    assert_eq!(publish.create.map(|r| r.spec.version), Some(version));
}
