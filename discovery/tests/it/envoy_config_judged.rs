//! The EnvoyConfig controller with Envoy as the last judge, on the real cluster's API server
//! with a real Envoy proxy. The plane has no validating webhook, as a cluster where configs
//! were created before the webhook was registered (or while it was removed): a new version
//! Envoy refuses is `InvalidSpec` in Envoy's words, naming the resource, no revision is made
//! and the published one stays served; one only a running proxy rejects passes the judge and
//! is NACKed and rolled back; with an Envoy that cannot run, the controller publishes on its
//! own checks.

use crate::support;

use marin3r_api::envoy_config::CacheState;
use marin3r_envoyconfig::judge::EnvoyJudge;
use marin3r_webhook::bootstrap::AdsMode;
use support::free_port;
use support::plane::{NS, Plane, condition, nacked_spec, revision_versions, spec};

/// RFC 5737's TEST-NET-3: an address the proxy does not have.
const NOT_LOCAL: &str = "203.0.113.1";

fn plane_judging_with(judge: EnvoyJudge) -> Plane {
    Plane::start_with(&[NS], move |config, _| config.judge = Some(judge))
}

fn invalid_spec(ec: &marin3r_api::EnvoyConfig) -> bool {
    condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
}

#[test]
fn a_version_envoy_refuses_is_not_published_and_the_served_one_stays() {
    let envoy = marin3r_testkit::tools::envoy().unwrap();
    let plane =
        plane_judging_with(EnvoyJudge::new(envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r")));
    let ns = plane.ns(NS);
    let (node, port) = ("judged", free_port());
    plane.apply(ns, "gw", spec(node, port, "v1"));
    let v1 = plane.wait_in_sync(ns, "gw").spec.version();
    let proxy = plane.proxy(ns, node, AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "v1");

    // The router followed by another filter: our own checks pass it, Envoy refuses it.
    plane.apply(ns, "gw", nacked_spec(node, port, "refused"));
    let ec = plane.wait_status(ns, "gw", "the InvalidSpec condition", invalid_spec);
    let refused = ec.spec.version();
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert_eq!(
        message,
        &format!(
            "version {refused} is invalid and was not published: \
             spec.envoyResources.listeners[0].value: Envoy: Error: terminal filter named \
             envoy.filters.http.router of type envoy.filters.http.router must be the last \
             filter in a http filter chain."
        )
    );
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.desired_version.as_deref(), Some(refused.as_str()));
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(status.cache_state, Some(CacheState::InSync));
    assert_eq!(revision_versions(&ec), std::slice::from_ref(&v1));
    let revisions = plane.list_revisions(ns);
    assert_eq!(revisions.len(), 1, "no revision for the refused version");
    assert!(revisions[0].is_published());
    // The proxy never saw it.
    proxy.wait_for_body(port, "v1");
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 0);

    // A listener on an address the proxy lacks: Envoy's validate mode binds nothing and
    // accepts it, the running proxy NACKs it, and the controller rolls back.
    let mut elsewhere = spec(node, port, "elsewhere");
    let listener = elsewhere["envoyResources"]["listeners"][0]["value"]
        .as_str()
        .unwrap()
        .replace("address: 127.0.0.1,", &format!("address: {NOT_LOCAL},"));
    assert!(listener.contains(NOT_LOCAL));
    elsewhere["envoyResources"]["listeners"][0]["value"] = listener.into();
    plane.apply(ns, "gw", elsewhere);
    let ec = plane.wait_status(ns, "gw", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    let nack = status.last_nack_message.as_deref().unwrap();
    assert!(
        nack.contains(&format!("cannot bind '{NOT_LOCAL}:{port}'")),
        "{nack}"
    );
    proxy.wait_for_body(port, "v1");

    // The fix is judged, published and served.
    plane.apply(ns, "gw", spec(node, port, "v2"));
    plane.wait_in_sync(ns, "gw");
    proxy.wait_for_body(port, "v2");
}

/// Envoy that cannot run is no verdict: the config is published on marin3r's own checks
/// (the NACK and the rollback still protect the proxies).
#[test]
fn without_a_runnable_envoy_the_controller_publishes_on_its_own_checks() {
    let dir = tempfile::tempdir().unwrap();
    let plane = plane_judging_with(
        EnvoyJudge::new(dir.path().join("no-envoy-here"))
            .with_launcher(env!("CARGO_BIN_EXE_marin3r")),
    );
    let ns = plane.ns(NS);
    let (node, port) = ("unjudged", free_port());
    plane.apply(ns, "gw", spec(node, port, "v1"));
    let v1 = plane.wait_in_sync(ns, "gw").spec.version();
    plane.apply(ns, "gw", nacked_spec(node, port, "bad"));
    let ec = plane.wait_in_sync(ns, "gw");
    assert_ne!(ec.spec.version(), v1);
    assert!(!invalid_spec(&ec));
    assert_eq!(plane.list_revisions(ns).len(), 2);
}
