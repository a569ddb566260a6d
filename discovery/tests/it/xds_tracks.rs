//! Two tracks per node against real Envoys: four proxies of one node, each from its own
//! address; a canary snapshot reaches exactly the proxies its cutoff picks (by the hash of
//! their address, which they cannot choose), the others keep the stable snapshot; after the
//! server restarts and they reconnect, each keeps its track; a higher cutoff moves the rest,
//! and ending the canary gives everyone the stable snapshot back.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::{Resource, ResourceType};
use marin3r_xds::{NodeKey, track_hash};
use prost::Message;
use support::{Pki, Proxy, XdsServer, pod_address, snapshot, wait_for};

const NS: &str = "team-a";
const NODE: &str = "gw";
const SALT: &str = "canary-version";

/// A static cluster with no endpoints: a proxy's `/clusters` names it, and nothing binds.
fn cluster(name: &str) -> Vec<Resource> {
    let body = Cluster {
        name: name.into(),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        ..Default::default()
    }
    .encode_to_vec();
    vec![Resource {
        kind: ResourceType::Cluster,
        name: name.into(),
        body: Bytes::from(body),
    }]
}

/// Which of `stable` and `canary` the proxy's Envoy has.
fn has(proxy: &Proxy) -> Option<&'static str> {
    let clusters = proxy.envoy.admin_get("/clusters").ok()?;
    let stable = clusters.lines().any(|l| l.starts_with("stable::"));
    let canary = clusters.lines().any(|l| l.starts_with("canary::"));
    match (stable, canary) {
        (true, false) => Some("stable"),
        (false, true) => Some("canary"),
        _ => None,
    }
}

/// The track each pod is on, as the server reports it, by pod name.
fn tracks(server: &XdsServer) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = server
        .sync_status()
        .proxies
        .into_iter()
        .map(|p| {
            let track = p.track.unwrap_or_else(|| "stable".into());
            (p.pod.unwrap_or_default(), track)
        })
        .collect();
    out.sort();
    out
}

fn tracks_follow_the_cutoff_and_survive_a_reconnect(mode: AdsMode) {
    let pki = Pki::new();
    let mut first = XdsServer::start(&pki);
    first
        .cache
        .set_snapshot(NS, NODE, snapshot(cluster("stable")));
    let client = pki.client(Some(NS));
    // Four pods, lowest hash first: the order the cutoff takes them in.
    let key = NodeKey::new(NS, NODE);
    let mut pods: Vec<(String, u64)> = ["gw-a", "gw-b", "gw-c", "gw-d"]
        .iter()
        .map(|p| {
            let hash = track_hash(SALT, &key, &pod_address(p).to_string());
            ((*p).to_owned(), hash)
        })
        .collect();
    pods.sort_by_key(|(_, h)| *h);
    let proxies: Vec<Proxy> = pods
        .iter()
        .map(|(pod, _)| Proxy::start(&first, &client, NODE, pod, mode))
        .collect();
    let on = |want: &[&str]| {
        proxies
            .iter()
            .zip(want)
            .all(|(p, w)| has(p) == Some(*w))
            .then_some(())
    };
    let expected = |canaries: usize| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = pods
            .iter()
            .enumerate()
            .map(|(i, (pod, _))| {
                let track = if i < canaries { "canary" } else { "stable" };
                (pod.clone(), track.to_owned())
            })
            .collect();
        out.sort();
        out
    };
    let all_stable = ["stable"; 4];
    wait_for("every proxy on stable", Duration::from_secs(30), || {
        on(&all_stable)
    });

    // The cutoff at the lowest hash: one canary.
    assert!(
        first
            .cache
            .set_canary(NS, NODE, snapshot(cluster("canary")), SALT, pods[0].1)
    );
    let one = ["canary", "stable", "stable", "stable"];
    wait_for("the first proxy on canary", Duration::from_secs(20), || {
        on(&one)
    });
    wait_for("the server's view", Duration::from_secs(10), || {
        (tracks(&first) == expected(1)).then_some(())
    });
    let added = "cluster_manager.cluster_added";
    let before: Vec<u64> = proxies.iter().map(|p| p.stat(added)).collect();

    // Another replica (the server restarted at the same address) with the same state: every
    // proxy reconnects to its own track, and nothing is resent.
    let addr = first.addr;
    first.shutdown();
    drop(first);
    let second = XdsServer::start_at(&pki, addr);
    second
        .cache
        .set_snapshot(NS, NODE, snapshot(cluster("stable")));
    second
        .cache
        .set_canary(NS, NODE, snapshot(cluster("canary")), SALT, pods[0].1);
    wait_for(
        "every proxy back, on its track",
        Duration::from_secs(30),
        || (tracks(&second) == expected(1)).then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(on(&one), Some(()));
    let after: Vec<u64> = proxies.iter().map(|p| p.stat(added)).collect();
    assert_eq!(after, before, "no proxy was sent a cluster again");

    // A higher cutoff takes the next two; then all.
    assert!(second.cache.set_canary_cutoff(NS, NODE, pods[2].1));
    let three = ["canary", "canary", "canary", "stable"];
    wait_for("three proxies on canary", Duration::from_secs(20), || {
        on(&three)
    });
    assert!(second.cache.set_canary_cutoff(NS, NODE, u64::MAX));
    wait_for("every proxy on canary", Duration::from_secs(20), || {
        on(&["canary"; 4])
    });
    assert_eq!(tracks(&second), expected(4));
    // Ended: everyone gets the stable snapshot back.
    assert!(second.cache.clear_canary(NS, NODE));
    wait_for(
        "every proxy on stable again",
        Duration::from_secs(20),
        || on(&all_stable),
    );
    assert_eq!(tracks(&second), expected(0));
}

#[test]
fn sotw_envoys_follow_their_tracks() {
    tracks_follow_the_cutoff_and_survive_a_reconnect(AdsMode::StateOfTheWorld);
}

#[test]
fn delta_envoys_follow_their_tracks() {
    tracks_follow_the_cutoff_and_survive_a_reconnect(AdsMode::Delta);
}
