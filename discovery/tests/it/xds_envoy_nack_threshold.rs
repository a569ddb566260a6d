//! `spec.nackThreshold` against a real Envoy, in both ADS flavours: with a threshold of 3 a
//! bad listener is sent to the proxy until it has rejected it three times, and only the third
//! rejection reaches the NACK consumer (the taint controller); the proxy keeps its last good
//! configuration throughout, and the version is not sent a fourth time.

use crate::support;

use std::time::Duration;

use marin3r_testkit::xds::resources::{ListenerFlaw, direct_response_config};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use support::{Pki, Proxy, XdsServer, free_port, snapshot, wait_for};

const NS: &str = "team-n";
const NODE: &str = "nacky";
const POD: &str = "nacky-6b7c8-klmno";

fn rejected_as_often_as_the_threshold(mode: AdsMode, flaw: ListenerFlaw) {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let port = free_port();
    let config = |body: &str, flaw| snapshot(direct_response_config(port.into(), body, flaw));
    server
        .cache
        .set_snapshot(NS, NODE, config("good", ListenerFlaw::None));
    let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, mode);
    proxy.wait_for_body(port, "good");

    let bad = config("good", flaw).with_nack_threshold(3);
    let bad_listeners = bad.version(ResourceType::Listener).to_owned();
    server.cache.set_snapshot(NS, NODE, bad);
    let nack = server
        .next_nack(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no NACK event\n{}", proxy.envoy.log_tail()));
    // The one event comes with the third rejection.
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 3);
    assert_eq!(
        (nack.version.as_str(), nack.pod_name.as_deref()),
        (bad_listeners.as_str(), Some(POD))
    );
    assert_eq!(nack.resource_type, ResourceType::Listener);
    assert_eq!(
        server.metric(r#"marin3r_xds_nacks_total{resource_type="listeners"}"#),
        3.0
    );
    let sent = r#"marin3r_xds_responses_total{resource_type="listeners"}"#;
    let sent_after = server.metric(sent);
    // Not a fourth time, however long: no more rejections, responses or events.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 3);
    assert_eq!(server.metric(sent), sent_after);
    assert!(server.next_nack(Duration::from_millis(200)).is_none());
    proxy.wait_for_body(port, "good");

    // The sync status shows the rejection once it counts.
    let status = server.sync_status();
    let listeners = &status.proxies[0].types["listeners"];
    assert_eq!(
        listeners.last_nack.as_ref().map(|n| n.version.as_str()),
        Some(bad_listeners.as_str())
    );

    // A good version is taken at once.
    server.cache.set_snapshot(
        NS,
        NODE,
        config("fixed", ListenerFlaw::None).with_nack_threshold(3),
    );
    proxy.wait_for_body(port, "fixed");
    wait_for("no further rejection", Duration::from_secs(2), || {
        (proxy.stat("listener_manager.lds.update_rejected") == 3).then_some(())
    });
}

#[test]
fn sotw_envoy_rejects_a_version_as_often_as_the_nack_threshold() {
    rejected_as_often_as_the_threshold(AdsMode::StateOfTheWorld, ListenerFlaw::PortOutOfRange);
}

#[test]
fn delta_envoy_rejects_a_version_as_often_as_the_nack_threshold() {
    rejected_as_often_as_the_threshold(AdsMode::Delta, ListenerFlaw::RouterNotLast);
}
