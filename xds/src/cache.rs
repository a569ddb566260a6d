//! The snapshot cache: one immutable [`Snapshot`] per (namespace, node id), published through a
//! `watch` channel per key so that setting a snapshot wakes only the streams of that key, and a
//! stream that falls behind simply reads the newest value when it gets to it. A node may also
//! have a canary snapshot for some of its proxies (`tracks`).

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

    /// Takes from `old` every string and entry the two have in common: names, unchanged
    /// entries whole, and the type's version if it is the same.
    fn share_with(&mut self, old: &TypeSnapshot) {
        if self.version == old.version {
            self.version = Arc::clone(&old.version);
        }
        let resources = std::mem::take(&mut self.resources);
        self.resources = resources
            .into_iter()
            .map(|(name, r)| match old.resources.get_key_value(&name) {
                Some((old_name, old_r))
                    if old_r.version == r.version && old_r.resource == r.resource =>
                {
                    (Arc::clone(old_name), Arc::clone(old_r))
                }
                Some((old_name, _)) => {
                    let changed = VersionedResource {
                        name: Arc::clone(old_name),
                        ..Arc::unwrap_or_clone(r)
                    };
                    (Arc::clone(old_name), Arc::new(changed))
                }
                None => (name, r),
            })
            .collect();
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

    /// The same snapshot with every string and entry it has in common with `previous` (the
    /// one it replaces) taken from there. What a delta stream holds is the previous snapshot's
    /// strings: those of the next are then the same pointers, and telling what changed for a
    /// proxy compares addresses, not names. (Comparing names across snapshots built apart
    /// showed in profiles of 2,000 delta streams.)
    pub(crate) fn sharing_with(mut self, previous: &Snapshot) -> Self {
        for (kind, typed) in &mut self.types {
            typed.share_with(previous.of_type(*kind));
        }
        self
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

/// What one node is served: the stable snapshot, and the canary one for some proxies.
#[derive(Debug, Clone, Default)]
pub struct Served {
    pub(crate) stable: Option<Published>,
    pub(crate) canary: Option<Arc<Canary>>,
}

impl Served {
    pub(crate) fn is_empty(&self) -> bool {
        self.stable.is_none() && self.canary.is_none()
    }
}

/// The canary snapshot of a node and which proxies get it.
#[derive(Debug)]
pub struct Canary {
    pub(crate) published: Published,
    /// The canary version: what makes each rollout's choice of proxies its own.
    pub salt: Arc<str>,
    /// Proxies whose [`crate::track_hash`] is at most this get the canary (`u64::MAX`: all).
    pub cutoff: u64,
}

type Slot = watch::Sender<Served>;

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
        // Shared with the snapshot it replaces outside the lock of every node; a set racing
        // this one only makes the sharing less, never wrong (equal content is all it takes).
        let previous = self
            .slot_value(&key)
            .and_then(|served| served.stable.map(|p| Arc::clone(&p.snapshot)));
        let snapshot = match previous {
            Some(previous) => snapshot.sharing_with(&previous),
            None => snapshot,
        };
        let published = Published {
            encoded: Arc::new(Encoded::for_snapshot_of(snapshot.resource_bytes())),
            snapshot: Arc::new(snapshot),
            set_at: Instant::now(),
        };
        self.modify(key, |served| {
            let same = served
                .stable
                .as_ref()
                .is_some_and(|c| c.snapshot == published.snapshot);
            // A canary the stable snapshot has caught up with is over: its proxies get the
            // same content from the stable one (nothing is resent: versions are hashes).
            let caught_up = served
                .canary
                .as_ref()
                .is_some_and(|c| c.published.snapshot == published.snapshot);
            if caught_up {
                served.canary = None;
            }
            if !same {
                served.stable = Some(published);
            }
            !same || caught_up
        })
    }

    /// Changes the value of `key` with `f` (which says whether it changed anything), waking
    /// the key's streams when it did.
    pub(crate) fn modify(&self, key: NodeKey, f: impl FnOnce(&mut Served) -> bool) -> bool {
        let mut slots = self.lock();
        let slot = slots
            .entry(key)
            .or_insert_with(|| watch::Sender::new(Served::default()));
        slot.send_if_modified(f)
    }

    /// The value of `key`, if the cache holds it.
    pub(crate) fn slot_value(&self, key: &NodeKey) -> Option<Served> {
        self.lock().get(key).map(|slot| slot.borrow().clone())
    }

    /// A receiver of `key`'s value, creating the key's slot if needed.
    pub(crate) fn subscribe(&self, key: &NodeKey) -> watch::Receiver<Served> {
        let mut slots = self.lock();
        slots
            .entry(key.clone())
            .or_insert_with(|| watch::Sender::new(Served::default()))
            .subscribe()
    }

    /// Drops `key`'s slot when no stream watches it and nothing is served there.
    pub(crate) fn forget_if_unused(&self, key: &NodeKey) {
        let mut slots = self.lock();
        if let Some(slot) = slots.get(key)
            && slot.receiver_count() == 0
            && slot.borrow().is_empty()
        {
            slots.remove(key);
        }
    }

    /// Removes a proxy's snapshot, and its canary. Connected proxies keep the configuration
    /// they have (nothing is sent); they get the next snapshot set for their key.
    pub fn clear(&self, namespace: &str, node_id: &str) {
        let key = NodeKey::new(namespace, node_id);
        let mut slots = self.lock();
        if let Some(slot) = slots.get(&key) {
            slot.send_replace(Served::default());
            if slot.receiver_count() == 0 {
                slots.remove(&key);
            }
        }
    }

    /// The current (stable) snapshot of a proxy, if any.
    pub fn snapshot(&self, namespace: &str, node_id: &str) -> Option<Arc<Snapshot>> {
        let key = NodeKey::new(namespace, node_id);
        self.slot_value(&key)?
            .stable
            .map(|p| Arc::clone(&p.snapshot))
    }

    /// How many keys the cache holds (with a snapshot or with a watching stream).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
