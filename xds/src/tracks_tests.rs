//! Two tracks per node: who is picked, who wakes, and what a canary shares.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::resource::{Resource, ResourceType};

fn snap(body: &str) -> Snapshot {
    Snapshot::new([
        Resource {
            kind: ResourceType::Listener,
            name: "l".into(),
            body: Bytes::from(body.to_owned()),
        },
        Resource {
            kind: ResourceType::Cluster,
            name: "c".into(),
            body: Bytes::from_static(b"cluster"),
        },
    ])
    .unwrap()
}

async fn woke(w: &mut Watch) -> Option<Option<Published>> {
    tokio::time::timeout(Duration::from_millis(50), w.changed())
        .await
        .ok()
}

fn key() -> NodeKey {
    NodeKey::new("ns", "gw")
}

/// Eight proxies, by address, with their hashes under `salt`, lowest hash first.
fn proxies(salt: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = (1..=8)
        .map(|i| {
            let ip = format!("10.0.0.{i}");
            let h = track_hash(salt, &key(), &ip);
            (ip, h)
        })
        .collect();
    out.sort_by_key(|(_, h)| *h);
    out
}

#[test]
fn the_hash_depends_on_the_salt_the_node_and_the_address_only() {
    let a = track_hash("v2", &key(), "10.0.0.1");
    assert_eq!(a, track_hash("v2", &key(), "10.0.0.1"));
    assert_ne!(a, track_hash("v3", &key(), "10.0.0.1"));
    assert_ne!(a, track_hash("v2", &key(), "10.0.0.2"));
    assert_ne!(
        a,
        track_hash("v2", &NodeKey::new("other", "gw"), "10.0.0.1")
    );
    // Length-prefixed: moving a character between parts changes the hash.
    assert_ne!(
        track_hash("v2", &NodeKey::new("ab", "c"), "x"),
        track_hash("v2", &NodeKey::new("a", "bc"), "x")
    );
    // Another salt orders the same proxies differently.
    let order = |salt| {
        proxies(salt)
            .into_iter()
            .map(|(ip, _)| ip)
            .collect::<Vec<_>>()
    };
    assert_ne!(order("v2"), order("v3"));
}

#[tokio::test]
async fn the_cutoff_picks_the_canaries_and_growing_it_wakes_only_the_new_ones() {
    let cache = Cache::new();
    cache.set_snapshot("ns", "gw", snap("stable"));
    let order = proxies("v2");
    let mut watches: Vec<Watch> = order
        .iter()
        .map(|(ip, _)| cache.watch(key(), ip.clone()))
        .collect();
    for w in &mut watches {
        let got = woke(w).await.unwrap().unwrap();
        assert_eq!(*got.snapshot, snap("stable"));
        assert_eq!(w.track(), Track::Stable);
    }
    // The two lowest hashes get the canary; the others are not woken.
    assert!(cache.set_canary("ns", "gw", snap("canary"), "v2", order[1].1));
    for (i, w) in watches.iter_mut().enumerate() {
        let got = woke(w).await;
        if i < 2 {
            assert_eq!(*got.unwrap().unwrap().snapshot, snap("canary"), "proxy {i}");
            assert_eq!(w.track(), Track::Canary);
        } else {
            assert!(got.is_none(), "proxy {i} stays stable and asleep");
            assert_eq!(w.track(), Track::Stable);
        }
    }
    // The same canary again changes nothing; a higher cutoff wakes only the proxies that
    // move.
    assert!(!cache.set_canary("ns", "gw", snap("canary"), "v2", order[1].1));
    assert!(cache.set_canary("ns", "gw", snap("canary"), "v2", order[3].1));
    for (i, w) in watches.iter_mut().enumerate() {
        let got = woke(w).await;
        assert_eq!(got.is_some(), (2..4).contains(&i), "proxy {i}");
    }
    assert!(cache.set_canary_cutoff("ns", "gw", u64::MAX));
    assert!(!cache.set_canary_cutoff("ns", "gw", u64::MAX));
    for (i, w) in watches.iter_mut().enumerate() {
        assert_eq!(woke(w).await.is_some(), i >= 4, "proxy {i}");
        assert_eq!(w.track(), Track::Canary);
    }
    let (canary, salt, cutoff) = cache.canary("ns", "gw").unwrap();
    assert_eq!(
        (*canary == snap("canary"), &*salt, cutoff),
        (true, "v2", u64::MAX)
    );
    // The stable snapshot is still the stable one.
    assert_eq!(*cache.snapshot("ns", "gw").unwrap(), snap("stable"));
}

#[tokio::test]
async fn ending_a_canary_gives_its_proxies_the_stable_snapshot_back() {
    let cache = Cache::new();
    cache.set_snapshot("ns", "gw", snap("stable"));
    let order = proxies("v2");
    let mut canary = cache.watch(key(), order[0].0.clone());
    let mut stable = cache.watch(key(), order[7].0.clone());
    woke(&mut canary).await.unwrap();
    woke(&mut stable).await.unwrap();
    cache.set_canary("ns", "gw", snap("canary"), "v2", order[0].1);
    assert_eq!(
        *woke(&mut canary).await.unwrap().unwrap().snapshot,
        snap("canary")
    );
    assert!(cache.clear_canary("ns", "gw"));
    assert!(!cache.clear_canary("ns", "gw"));
    assert_eq!(
        *woke(&mut canary).await.unwrap().unwrap().snapshot,
        snap("stable")
    );
    assert_eq!(canary.track(), Track::Stable);
    assert!(
        woke(&mut stable).await.is_none(),
        "the stable proxy never moved"
    );
    assert!(!cache.set_canary_cutoff("ns", "gw", 5), "no canary to move");
}

#[tokio::test]
async fn a_stable_snapshot_that_catches_up_ends_the_canary() {
    let cache = Cache::new();
    cache.set_snapshot("ns", "gw", snap("stable"));
    let order = proxies("v2");
    let mut canary = cache.watch(key(), order[0].0.clone());
    let mut stable = cache.watch(key(), order[7].0.clone());
    woke(&mut canary).await.unwrap();
    woke(&mut stable).await.unwrap();
    cache.set_canary("ns", "gw", snap("canary"), "v2", order[0].1);
    woke(&mut canary).await.unwrap();
    // Promoted: the canary's content becomes the stable snapshot.
    assert!(cache.set_snapshot("ns", "gw", snap("canary")));
    assert!(cache.canary("ns", "gw").is_none());
    assert_eq!(
        *woke(&mut stable).await.unwrap().unwrap().snapshot,
        snap("canary")
    );
    // The canary proxy switches track to the same content (nothing to send it).
    assert_eq!(
        *woke(&mut canary).await.unwrap().unwrap().snapshot,
        snap("canary")
    );
    assert_eq!(canary.track(), Track::Stable);
}

#[test]
fn a_canary_shares_with_the_stable_snapshot_what_they_have_in_common() {
    let cache = Cache::new();
    cache.set_snapshot("ns", "gw", snap("stable"));
    cache.set_canary("ns", "gw", snap("canary"), "v2", 0);
    let stable = cache.snapshot("ns", "gw").unwrap();
    let (canary, _, _) = cache.canary("ns", "gw").unwrap();
    let unchanged = |s: &Snapshot| Arc::clone(&s.of_type(ResourceType::Cluster).resources()["c"]);
    assert!(Arc::ptr_eq(&unchanged(&stable), &unchanged(&canary)));
    // Clearing the node clears both; an unwatched empty slot goes.
    cache.clear("ns", "gw");
    assert!(cache.canary("ns", "gw").is_none());
    assert!(cache.is_empty());
}
