//! The snapshot cache: one immutable [`Snapshot`] per (namespace, node id), published through a
//! `watch` channel per key so that setting a snapshot wakes only the streams of that key, and a
//! stream that falls behind simply reads the newest value when it gets to it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use envoy_types::pb::envoy::service::runtime::v3::Runtime;
use envoy_types::pb::google::protobuf::Struct;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::frame::Encoded;
use crate::resource::{Resource, ResourceType};

/// Who a snapshot is for: the proxy's namespace (from its client certificate) and its node id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeKey {
    pub namespace: String,
    pub node_id: String,
}

impl NodeKey {
    pub fn new(namespace: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            node_id: node_id.into(),
        }
    }
}

impl fmt::Display for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.node_id)
    }
}

/// A resource with the content hash Envoy sees as its (delta) version.
///
/// The name and the version are shared strings: a delta stream remembers the name and
/// version of every resource its proxy holds, and clones these pointers rather than the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedResource {
    pub resource: Resource,
    pub name: Arc<str>,
    pub version: Arc<str>,
}

/// Every resource of one type, and the type's version: a hash of the names and contents, so
/// the same configuration always has the same version, across restarts too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeSnapshot {
    version: Arc<str>,
    /// Shared, so that a response carries pointers to them rather than copies.
    resources: BTreeMap<Arc<str>, Arc<VersionedResource>>,
}

impl TypeSnapshot {
    fn new(resources: BTreeMap<Arc<str>, Arc<VersionedResource>>) -> Self {
        let mut hasher = Sha256::new();
        for (name, r) in &resources {
            hasher.update((name.len() as u64).to_be_bytes());
            hasher.update(name.as_bytes());
            hasher.update(r.version.as_bytes());
        }
        Self {
            version: short_hex(&hasher.finalize()).into(),
            resources,
        }
    }

    pub fn version(&self) -> &str {
        &self.version
    }

    /// The version as the shared string streams keep.
    pub fn shared_version(&self) -> &Arc<str> {
        &self.version
    }

    pub fn resources(&self) -> &BTreeMap<Arc<str>, Arc<VersionedResource>> {
        &self.resources
    }
}

/// The whole configuration of one proxy: every [`ResourceType`], each with its own version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    types: BTreeMap<ResourceType, TypeSnapshot>,
    /// How many times one proxy rejects a version before it counts as rejecting it; until
    /// then the version is sent to it again after each rejection. 1: the first counts.
    nack_threshold: u8,
}

/// The highest NACK threshold a snapshot takes: each rejection below it costs a resend.
pub const MAX_NACK_THRESHOLD: u8 = 10;

/// A snapshot that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("two {kind} resources are named {name:?}; names must be unique per type")]
    DuplicateName { kind: ResourceType, name: String },
    #[error("a {kind} resource has an empty name")]
    EmptyName { kind: ResourceType },
}

impl Snapshot {
    /// Builds a snapshot from resources of any types; types without resources are empty.
    ///
    /// A runtime layer a proxy subscribes to (the sidecar bootstrap's `runtime`) that the
    /// snapshot does not hold is served as an empty layer (see [`Snapshot::requested`]).
    pub fn new(resources: impl IntoIterator<Item = Resource>) -> Result<Self, SnapshotError> {
        let mut by_type: BTreeMap<ResourceType, BTreeMap<Arc<str>, Arc<VersionedResource>>> =
            ResourceType::ALL
                .into_iter()
                .map(|t| (t, BTreeMap::new()))
                .collect();
        for resource in resources {
            let kind = resource.kind;
            if resource.name.is_empty() {
                return Err(SnapshotError::EmptyName { kind });
            }
            let version = short_hex(&Sha256::digest(&resource.body)).into();
            let slot = by_type.entry(kind).or_default();
            if slot.contains_key(resource.name.as_str()) {
                return Err(SnapshotError::DuplicateName {
                    kind,
                    name: resource.name,
                });
            }
            let name: Arc<str> = resource.name.as_str().into();
            slot.insert(
                Arc::clone(&name),
                Arc::new(VersionedResource {
                    resource,
                    name,
                    version,
                }),
            );
        }
        Ok(Self {
            types: by_type
                .into_iter()
                .map(|(t, r)| (t, TypeSnapshot::new(r)))
                .collect(),
            nack_threshold: 1,
        })
    }

    /// The same snapshot with a NACK threshold (see [`Snapshot::nack_threshold`]), kept
    /// within 1 and [`MAX_NACK_THRESHOLD`].
    pub fn with_nack_threshold(mut self, threshold: u8) -> Self {
        self.nack_threshold = threshold.clamp(1, MAX_NACK_THRESHOLD);
        self
    }

    /// How many times one proxy rejects a version of a type before it counts as rejecting
    /// it (and the version is no longer sent to it); 1 unless set.
    pub fn nack_threshold(&self) -> u8 {
        self.nack_threshold
    }

    /// Replaces the version of one type, for callers with a version of their own meaning (the
    /// revision controller versions SDS secrets `<revision>-<hash of the loaded secrets>`).
    /// The version must still change whenever that type's content does.
    pub fn with_version(mut self, kind: ResourceType, version: impl Into<String>) -> Self {
        if let Some(t) = self.types.get_mut(&kind) {
            t.version = version.into().into();
        }
        self
    }

    /// A snapshot with no resources at all.
    pub fn empty() -> Self {
        Self {
            types: ResourceType::ALL
                .into_iter()
                .map(|t| (t, TypeSnapshot::new(BTreeMap::new())))
                .collect(),
            nack_threshold: 1,
        }
    }

    pub fn of_type(&self, kind: ResourceType) -> &TypeSnapshot {
        // Every type is present by construction; the fallback only keeps this total.
        static EMPTY: std::sync::OnceLock<TypeSnapshot> = std::sync::OnceLock::new();
        self.types
            .get(&kind)
            .unwrap_or_else(|| EMPTY.get_or_init(|| TypeSnapshot::new(BTreeMap::new())))
    }

    pub fn version(&self, kind: ResourceType) -> &str {
        self.of_type(kind).version()
    }

    /// The resource a proxy asked for by name. A runtime layer the snapshot lacks is served
    /// empty: Envoy waits for every RTDS layer of its bootstrap before it starts (15 s by
    /// default), and a configuration without runtime values means exactly an empty layer.
    pub fn requested(&self, kind: ResourceType, name: &str) -> Option<Arc<VersionedResource>> {
        if let Some(r) = self.of_type(kind).resources().get(name) {
            return Some(Arc::clone(r));
        }
        has_stand_ins(kind).then(|| empty_runtime_layer(Arc::from(name)))
    }

    /// Whether [`Snapshot::requested`] answers `name` with a stand-in the snapshot lacks.
    pub fn stands_in(&self, kind: ResourceType, name: &str) -> bool {
        has_stand_ins(kind) && !self.of_type(kind).resources().contains_key(name)
    }

    /// [`Snapshot::requested`] for a name the caller keeps: a stand-in shares its string, so
    /// a stream that remembers the stand-in it sent keeps no second copy of the name.
    pub(crate) fn requested_shared(
        &self,
        kind: ResourceType,
        name: &Arc<str>,
    ) -> Option<Arc<VersionedResource>> {
        if let Some(r) = self.of_type(kind).resources().get(&**name) {
            return Some(Arc::clone(r));
        }
        has_stand_ins(kind).then(|| empty_runtime_layer(Arc::clone(name)))
    }

    /// The bytes of every resource's encoded body, every type together.
    pub(crate) fn resource_bytes(&self) -> usize {
        self.types
            .values()
            .flat_map(|t| t.resources.values())
            .map(|r| r.resource.body.len())
            .sum()
    }

    /// The versions of every type, for logs and status.
    pub fn versions(&self) -> BTreeMap<ResourceType, &str> {
        self.types.iter().map(|(t, s)| (*t, s.version())).collect()
    }
}

/// Whether a name the snapshot lacks is served a stand-in for `kind`: only runtime layers, since
/// Envoy waits for every RTDS layer of its bootstrap.
fn has_stand_ins(kind: ResourceType) -> bool {
    kind == ResourceType::Runtime
}

fn empty_runtime_layer(name: Arc<str>) -> Arc<VersionedResource> {
    let body = Runtime {
        name: name.to_string(),
        layer: Some(Struct::default()),
    }
    .encode_to_vec();
    Arc::new(VersionedResource {
        version: short_hex(&Sha256::digest(&body)).into(),
        resource: Resource {
            kind: ResourceType::Runtime,
            name: name.to_string(),
            body: body.into(),
        },
        name,
    })
}

fn short_hex(digest: &[u8]) -> String {
    // 64 bits of SHA-256: versions only need to tell a proxy's configurations apart.
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A snapshot as published, with the instant it was set (for convergence latency).
#[derive(Debug, Clone)]
pub struct Published {
    pub snapshot: Arc<Snapshot>,
    pub set_at: Instant,
    /// The responses already encoded from this snapshot, shared by its streams.
    pub(crate) encoded: Arc<Encoded>,
}

type Slot = watch::Sender<Option<Published>>;

/// The shared snapshot cache. Cloning is cheap; all clones see the same snapshots.
#[derive(Clone, Default)]
pub struct Cache {
    slots: Arc<Mutex<HashMap<NodeKey, Slot>>>,
}

impl fmt::Debug for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("keys", &self.lock().len())
            .finish()
    }
}

impl Cache {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<NodeKey, Slot>> {
        // A panic elsewhere while holding the lock leaves the map itself consistent.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a snapshot for a proxy. Streams of that key are woken unless the snapshot is
    /// identical to the current one; returns whether anything changed.
    pub fn set_snapshot(
        &self,
        namespace: impl Into<String>,
        node_id: impl Into<String>,
        snapshot: Snapshot,
    ) -> bool {
        let key = NodeKey::new(namespace, node_id);
        let published = Published {
            encoded: Arc::new(Encoded::for_snapshot_of(snapshot.resource_bytes())),
            snapshot: Arc::new(snapshot),
            set_at: Instant::now(),
        };
        let mut slots = self.lock();
        let slot = slots.entry(key).or_insert_with(|| watch::Sender::new(None));
        slot.send_if_modified(|current| {
            let same = current
                .as_ref()
                .is_some_and(|c| c.snapshot == published.snapshot);
            if !same {
                *current = Some(published);
            }
            !same
        })
    }

    /// Removes a proxy's snapshot. Connected proxies keep the configuration they have (nothing
    /// is sent); they get the next snapshot set for their key.
    pub fn clear(&self, namespace: &str, node_id: &str) {
        let key = NodeKey::new(namespace, node_id);
        let mut slots = self.lock();
        if let Some(slot) = slots.get(&key) {
            slot.send_replace(None);
            if slot.receiver_count() == 0 {
                slots.remove(&key);
            }
        }
    }

    /// The current snapshot of a proxy, if any.
    pub fn snapshot(&self, namespace: &str, node_id: &str) -> Option<Arc<Snapshot>> {
        let key = NodeKey::new(namespace, node_id);
        self.lock()
            .get(&key)
            .and_then(|s| s.borrow().as_ref().map(|p| Arc::clone(&p.snapshot)))
    }

    /// How many keys the cache holds (with a snapshot or with a watching stream).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Subscribes to a key; the returned watch sees the current snapshot as changed at once
    /// when there is one.
    pub fn watch(&self, key: NodeKey) -> Watch {
        let mut rx = {
            let mut slots = self.lock();
            slots
                .entry(key.clone())
                .or_insert_with(|| watch::Sender::new(None))
                .subscribe()
        };
        rx.mark_changed();
        Watch {
            rx: Some(rx),
            key,
            cache: self.clone(),
        }
    }
}

/// A stream's subscription to one key; the slot is dropped with its last watcher when no
/// snapshot is set, so the cache does not grow with proxies that come and go.
pub struct Watch {
    rx: Option<watch::Receiver<Option<Published>>>,
    key: NodeKey,
    cache: Cache,
}

impl Watch {
    /// Waits until the key's snapshot changes (or is cleared) and returns the newest value;
    /// several changes in between are seen as one.
    pub async fn changed(&mut self) -> Option<Published> {
        let rx = self.rx.as_mut()?;
        // The sender lives in the cache map for as long as a receiver exists, so this only
        // fails if the cache itself is gone; then nothing will ever change again.
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        rx.borrow_and_update().clone()
    }

    pub fn key(&self) -> &NodeKey {
        &self.key
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut slots = self.cache.lock();
        if let Some(slot) = slots.get(&self.key)
            && slot.receiver_count() == 0
            && slot.borrow().is_none()
        {
            slots.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;

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
        let mut a = cache.watch(NodeKey::new("ns-a", "node"));
        let mut b = cache.watch(NodeKey::new("ns-b", "node"));
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
        let mut w = cache.watch(NodeKey::new("ns", "n"));
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
        let mut w = cache.watch(NodeKey::new("ns", "n"));
        assert!(woke(&mut w).await.unwrap().is_some());
        assert!(!cache.set_snapshot("ns", "n", snap("1")));
        assert!(woke(&mut w).await.is_none());
    }

    #[tokio::test]
    async fn clearing_wakes_with_nothing_and_unused_slots_are_dropped() {
        let cache = Cache::new();
        cache.set_snapshot("ns", "n", snap("1"));
        let mut w = cache.watch(NodeKey::new("ns", "n"));
        assert!(woke(&mut w).await.unwrap().is_some());
        cache.clear("ns", "n");
        assert!(woke(&mut w).await.unwrap().is_none());
        assert!(cache.snapshot("ns", "n").is_none());
        assert_eq!(cache.len(), 1, "the watcher keeps its slot");
        drop(w);
        assert!(cache.is_empty());

        // A snapshot set with nobody watching stays until cleared.
        cache.set_snapshot("ns", "m", snap("1"));
        drop(cache.watch(NodeKey::new("ns", "m")));
        assert!(cache.snapshot("ns", "m").is_some());
        cache.clear("ns", "m");
        assert!(cache.is_empty());
    }
}
