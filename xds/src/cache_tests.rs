//! The snapshot cache: versions, stand-ins, bad snapshots, who wakes, and what a new snapshot shares with the one before.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::tracks::Watch;

fn res(kind: ResourceType, name: &str, body: &str) -> Resource {
    Resource {
        kind,
        name: name.into(),
        body: Bytes::from(body.to_owned()),
    }
}

fn snap(body: &str) -> Snapshot {
    Snapshot::new([
        res(ResourceType::Listener, "l", body),
        res(ResourceType::Cluster, "c", "cluster"),
    ])
    .unwrap()
}

#[test]
fn versions_are_content_hashes() {
    let a = snap("one");
    let b = snap("one");
    let c = snap("two");
    assert_eq!(a, b);
    assert_eq!(
        a.version(ResourceType::Listener),
        b.version(ResourceType::Listener)
    );
    assert_ne!(
        a.version(ResourceType::Listener),
        c.version(ResourceType::Listener)
    );
    // Only the changed type gets a new version.
    assert_eq!(
        a.version(ResourceType::Cluster),
        c.version(ResourceType::Cluster)
    );
    assert_eq!(a.version(ResourceType::Listener).len(), 16);
    // A rename is a change even with the same body.
    let renamed = Snapshot::new([
        res(ResourceType::Listener, "other", "one"),
        res(ResourceType::Cluster, "c", "cluster"),
    ])
    .unwrap();
    assert_ne!(
        renamed.version(ResourceType::Listener),
        a.version(ResourceType::Listener)
    );
    assert_eq!(
        Snapshot::empty().version(ResourceType::Secret),
        a.version(ResourceType::Secret)
    );
}

#[test]
fn a_missing_runtime_layer_is_served_empty() {
    let s = snap("x");
    let layer = s.requested(ResourceType::Runtime, "runtime").unwrap();
    let decoded = Runtime::decode(layer.resource.body.as_ref()).unwrap();
    assert_eq!(decoded.name, "runtime");
    assert_eq!(decoded.layer, Some(Struct::default()));
    assert_eq!(layer.version.len(), 16);
    assert_eq!(s.requested(ResourceType::Listener, "nope"), None);
    assert_eq!(
        s.requested(ResourceType::Listener, "l")
            .unwrap()
            .resource
            .name,
        "l"
    );
    // The user's own layer wins.
    let with_layer = Snapshot::new([res(ResourceType::Runtime, "runtime", "mine")]).unwrap();
    assert_eq!(
        with_layer
            .requested(ResourceType::Runtime, "runtime")
            .unwrap()
            .resource
            .body,
        Bytes::from_static(b"mine")
    );
}

#[test]
fn bad_snapshots_are_refused() {
    let dup = Snapshot::new([
        res(ResourceType::Cluster, "c", "1"),
        res(ResourceType::Cluster, "c", "2"),
    ]);
    assert_eq!(
        dup.unwrap_err().to_string(),
        "two clusters resources are named \"c\"; names must be unique per type"
    );
    // The same name in two types is fine.
    Snapshot::new([
        res(ResourceType::Cluster, "x", "1"),
        res(ResourceType::Listener, "x", "2"),
    ])
    .unwrap();
    assert!(matches!(
        Snapshot::new([res(ResourceType::Route, "", "1")]),
        Err(SnapshotError::EmptyName { .. })
    ));
}

async fn woke(w: &mut Watch) -> Option<Option<Published>> {
    tokio::time::timeout(Duration::from_millis(50), w.changed())
        .await
        .ok()
}

#[tokio::test]
async fn setting_a_snapshot_wakes_only_its_key() {
    let cache = Cache::new();
    let mut a = cache.watch(NodeKey::new("ns-a", "node"), "10.0.0.1".into());
    let mut b = cache.watch(NodeKey::new("ns-b", "node"), "10.0.0.1".into());
    // Nothing set yet: the first wake-up reports "no snapshot".
    assert!(woke(&mut a).await.unwrap().is_none());
    assert!(woke(&mut b).await.unwrap().is_none());

    assert!(cache.set_snapshot("ns-a", "node", snap("one")));
    let got = woke(&mut a).await.unwrap().unwrap();
    assert_eq!(*got.snapshot, snap("one"));
    assert!(woke(&mut b).await.is_none(), "ns-b must not wake");
    assert!(cache.snapshot("ns-b", "node").is_none());
}

#[tokio::test]
async fn several_sets_are_seen_as_the_newest_one() {
    let cache = Cache::new();
    let mut w = cache.watch(NodeKey::new("ns", "n"), "10.0.0.1".into());
    woke(&mut w).await.unwrap();
    for body in ["1", "2", "3"] {
        cache.set_snapshot("ns", "n", snap(body));
    }
    let got = woke(&mut w).await.unwrap().unwrap();
    assert_eq!(*got.snapshot, snap("3"));
    assert!(woke(&mut w).await.is_none());
}

#[tokio::test]
async fn an_identical_snapshot_wakes_nobody() {
    let cache = Cache::new();
    assert!(cache.set_snapshot("ns", "n", snap("1")));
    let mut w = cache.watch(NodeKey::new("ns", "n"), "10.0.0.1".into());
    assert!(woke(&mut w).await.unwrap().is_some());
    assert!(!cache.set_snapshot("ns", "n", snap("1")));
    assert!(woke(&mut w).await.is_none());
}

#[tokio::test]
async fn clearing_wakes_with_nothing_and_unused_slots_are_dropped() {
    let cache = Cache::new();
    cache.set_snapshot("ns", "n", snap("1"));
    let mut w = cache.watch(NodeKey::new("ns", "n"), "10.0.0.1".into());
    assert!(woke(&mut w).await.unwrap().is_some());
    cache.clear("ns", "n");
    assert!(woke(&mut w).await.unwrap().is_none());
    assert!(cache.snapshot("ns", "n").is_none());
    assert_eq!(cache.len(), 1, "the watcher keeps its slot");
    drop(w);
    assert!(cache.is_empty());

    // A snapshot set with nobody watching stays until cleared.
    cache.set_snapshot("ns", "m", snap("1"));
    drop(cache.watch(NodeKey::new("ns", "m"), "10.0.0.1".into()));
    assert!(cache.snapshot("ns", "m").is_some());
    cache.clear("ns", "m");
    assert!(cache.is_empty());
}

#[test]
fn a_new_snapshot_shares_with_the_one_it_replaces_what_they_have_in_common() {
    let cache = Cache::new();
    let first = Snapshot::new([
        res(ResourceType::Listener, "l", "one"),
        res(ResourceType::Cluster, "c", "cluster"),
    ])
    .unwrap();
    cache.set_snapshot("ns", "n", first);
    let old = cache.snapshot("ns", "n").unwrap();
    // Built apart, as the revision controller builds each one: the listener changes.
    cache.set_snapshot(
        "ns",
        "n",
        Snapshot::new([
            res(ResourceType::Listener, "l", "two"),
            res(ResourceType::Cluster, "c", "cluster"),
            res(ResourceType::Cluster, "d", "new"),
        ])
        .unwrap(),
    );
    let new = cache.snapshot("ns", "n").unwrap();
    let entry = |s: &Snapshot, kind, name: &str| Arc::clone(&s.of_type(kind).resources()[name]);
    let (listener, cluster) = (ResourceType::Listener, ResourceType::Cluster);
    // The unchanged cluster is the same entry; the changed listener keeps its name's string
    // and has a version and body of its own.
    assert!(Arc::ptr_eq(
        &entry(&old, cluster, "c"),
        &entry(&new, cluster, "c")
    ));
    let (was, now) = (entry(&old, listener, "l"), entry(&new, listener, "l"));
    assert!(Arc::ptr_eq(&was.name, &now.name));
    assert_ne!(was.version, now.version);
    assert_eq!(&now.resource.body[..], b"two");
    assert!(Arc::ptr_eq(
        new.of_type(listener).resources().keys().next().unwrap(),
        &now.name
    ));
    // The type whose content is unchanged keeps its version's string; the other does not.
    assert!(Arc::ptr_eq(
        old.of_type(ResourceType::Route).shared_version(),
        new.of_type(ResourceType::Route).shared_version()
    ));
    assert_ne!(old.version(listener), new.version(listener));
    assert_eq!(new.of_type(cluster).resources().len(), 2);
    // Content is what it would be without the sharing.
    assert_eq!(
        *new,
        Snapshot::new([
            res(ResourceType::Listener, "l", "two"),
            res(ResourceType::Cluster, "c", "cluster"),
            res(ResourceType::Cluster, "d", "new"),
        ])
        .unwrap()
    );
}
