//! What each proxy key is being served: the xDS cache plus, per (namespace, node id), which
//! revision loaded it. Only the revision that loaded a key may clear it, and only by being
//! deleted (or its namespace leaving): an unpublished revision keeps being served until
//! another revision of its key has loaded, so a new revision that cannot load (a missing
//! Secret) never leaves a proxy with nothing. A NACK's per-type version is mapped back to
//! the revision whose snapshot carried it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use marin3r_xds::resource::ResourceType;
use marin3r_xds::{Cache, NackEvent, NodeKey, Snapshot};

/// How many loads per key are remembered to map late NACKs (a NACK for a snapshot that was
/// already replaced) back to their revision.
const HISTORY: usize = 16;

/// One snapshot loaded by a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Load {
    /// The `EnvoyConfigRevision`'s name.
    pub revision: String,
    /// Its uid: a revision deleted and created again under the same name is another one.
    pub uid: String,
    /// Its version (`spec.version`).
    pub version: String,
    /// The per-type versions of the snapshot, as Envoy sees them.
    pub types: BTreeMap<ResourceType, String>,
}

#[derive(Default)]
struct Entry {
    current: Option<Load>,
    /// The revision served to the node's canaries, while one is.
    canary: Option<Load>,
    /// Newest last.
    history: VecDeque<Load>,
}

impl Load {
    fn of(revision: &str, uid: &str, version: &str, snapshot: &Snapshot) -> Self {
        Self {
            revision: revision.to_owned(),
            uid: uid.to_owned(),
            version: version.to_owned(),
            types: snapshot
                .versions()
                .into_iter()
                .map(|(t, v)| (t, v.to_owned()))
                .collect(),
        }
    }
}

impl Entry {
    fn remember(&mut self, load: &Load) {
        if self.history.back() != Some(load) {
            self.history.push_back(load.clone());
            while self.history.len() > HISTORY {
                self.history.pop_front();
            }
        }
    }
}

/// Writes to the xDS cache on behalf of revisions. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    cache: Cache,
    entries: Arc<Mutex<HashMap<NodeKey, Entry>>>,
}

impl Publisher {
    pub fn new(cache: Cache) -> Self {
        Self {
            cache,
            entries: Arc::default(),
        }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<NodeKey, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `snapshot` to `key` on behalf of revision `revision` (`uid`); returns whether
    /// the proxies get anything new.
    pub fn load(
        &self,
        key: &NodeKey,
        revision: &str,
        uid: &str,
        version: &str,
        snapshot: Snapshot,
    ) -> bool {
        let load = Load::of(revision, uid, version, &snapshot);
        let mut entries = self.lock();
        let entry = entries.entry(key.clone()).or_default();
        entry.remember(&load);
        // The canary, published: its proxies now get it as the stable snapshot.
        let promoted = entry.canary.as_ref().is_some_and(|c| c.uid == uid);
        if promoted {
            entry.canary = None;
        }
        entry.current = Some(load);
        // Under the lock, so a concurrent unload of another revision cannot interleave.
        let changed = self
            .cache
            .set_snapshot(key.namespace.clone(), key.node_id.clone(), snapshot);
        changed | (promoted && self.cache.clear_canary(&key.namespace, &key.node_id))
    }

    /// Serves `snapshot` of revision `revision` (`uid`) to the proxies of `key` that the
    /// canary `cutoff` picks, as canary version `version`; returns whether any proxy gets
    /// anything new. The same revision again only moves the cutoff.
    pub fn load_canary(
        &self,
        key: &NodeKey,
        revision: &str,
        uid: &str,
        version: &str,
        snapshot: Snapshot,
        cutoff: u64,
    ) -> bool {
        let load = Load::of(revision, uid, version, &snapshot);
        let mut entries = self.lock();
        let entry = entries.entry(key.clone()).or_default();
        // NACKs of the canary's versions map back to it.
        entry.remember(&load);
        entry.canary = Some(load);
        self.cache
            .set_canary(&key.namespace, &key.node_id, snapshot, version, cutoff)
    }

    /// The revision with `uid` is no longer a canary (tainted, deleted, its rollout over):
    /// its proxies get the stable snapshot again. Returns whether it was the canary.
    pub fn end_canary(&self, key: &NodeKey, uid: &str) -> bool {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        if entry.canary.as_ref().is_none_or(|c| c.uid != uid) {
            return false;
        }
        entry.canary = None;
        self.cache.clear_canary(&key.namespace, &key.node_id);
        true
    }

    /// The revision served to `key`'s canaries, if any.
    pub fn canary(&self, key: &NodeKey) -> Option<Load> {
        self.lock().get(key).and_then(|e| e.canary.clone())
    }

    /// The revision with `uid` is no longer published. What it loaded stays served until
    /// another revision of `key` loads: unpublishing happens as soon as a newer revision is
    /// published, before that one has loaded, and it may never load (a missing Secret).
    /// Returns whether `key` is still being served by it.
    pub fn retire(&self, key: &NodeKey, uid: &str) -> bool {
        self.lock()
            .get(key)
            .and_then(|e| e.current.as_ref())
            .is_some_and(|l| l.uid == uid)
    }

    /// Stops serving `key` if the revision with `uid` is what it serves: the revision was
    /// deleted, or its namespace is no longer served (a deleted revision never clears what
    /// another revision of the same node published, nor what a revision re-created under its
    /// name loaded). Returns whether it did.
    pub fn unload(&self, key: &NodeKey, uid: &str) -> bool {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(key) else {
            return false;
        };
        if entry.canary.as_ref().is_some_and(|c| c.uid == uid) {
            entry.canary = None;
            self.cache.clear_canary(&key.namespace, &key.node_id);
        }
        if entry.current.as_ref().is_none_or(|l| l.uid != uid) {
            return false;
        }
        entry.current = None;
        // Clears the canary too: its revision loads it again on its next reconcile.
        entry.canary = None;
        self.cache.clear(&key.namespace, &key.node_id);
        true
    }

    /// The revision currently served to `key`.
    pub fn current(&self, key: &NodeKey) -> Option<Load> {
        self.lock().get(key).and_then(|e| e.current.clone())
    }

    /// Every key served, with the uid of its revision.
    pub fn served(&self) -> Vec<(NodeKey, String)> {
        self.lock()
            .iter()
            .filter_map(|(k, e)| Some((k.clone(), e.current.as_ref()?.uid.clone())))
            .collect()
    }

    /// The revision a NACK rejected: the current one when its snapshot carries the rejected
    /// version of that type, otherwise the newest earlier load that did. Versions are content
    /// hashes, so two revisions may share one for a type; the newest load is the one Envoy
    /// was sent last, which is the one it answered.
    pub fn revision_of(&self, nack: &NackEvent) -> Option<Load> {
        let key = NodeKey::new(nack.namespace.clone(), nack.node_id.clone());
        let entries = self.lock();
        let entry = entries.get(&key)?;
        let carries = |l: &Load| l.types.get(&nack.resource_type) == Some(&nack.version);
        if let Some(current) = entry.current.as_ref().filter(|l| carries(l)) {
            return Some(current.clone());
        }
        entry.history.iter().rev().find(|l| carries(l)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_xds::resource::Resource;

    fn runtime(value: &str) -> Snapshot {
        use prost::Message;
        let layer = envoy_types::pb::envoy::service::runtime::v3::Runtime {
            name: "runtime".into(),
            layer: Some(envoy_types::pb::google::protobuf::Struct {
                fields: [(
                    "k".to_owned(),
                    envoy_types::pb::google::protobuf::Value {
                        kind: Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                            value.into(),
                        )),
                    },
                )]
                .into(),
            }),
        };
        Snapshot::new([Resource {
            kind: ResourceType::Runtime,
            name: "runtime".into(),
            body: layer.encode_to_vec().into(),
        }])
        .unwrap()
    }

    fn nack(snapshot: &Snapshot) -> NackEvent {
        NackEvent {
            namespace: "ns".into(),
            node_id: "node".into(),
            pod_name: None,
            resource_type: ResourceType::Runtime,
            type_url: ResourceType::Runtime.type_url().into(),
            version: snapshot.version(ResourceType::Runtime).into(),
            message: "bad".into(),
            rejecting: 1,
            connected: 1,
        }
    }

    #[test]
    fn only_the_serving_revision_clears_its_key() {
        let p = Publisher::new(Cache::new());
        let key = NodeKey::new("ns", "node");
        assert!(p.load(&key, "node-a", "uid-a", "a", runtime("a")));
        assert!(p.load(&key, "node-b", "uid-b", "b", runtime("b")));
        assert!(!p.unload(&key, "uid-a"));
        assert!(p.cache().snapshot("ns", "node").is_some());
        // The same name re-created (another uid) is not cleared by the old one's deletion.
        assert!(!p.load(&key, "node-b", "uid-b2", "b", runtime("b")));
        assert!(!p.unload(&key, "uid-b"));
        assert!(p.unload(&key, "uid-b2"));
        assert!(p.cache().snapshot("ns", "node").is_none());
        assert!(p.current(&key).is_none());
    }

    #[test]
    fn an_unpublished_revision_is_served_until_its_successor_loads() {
        let p = Publisher::new(Cache::new());
        let key = NodeKey::new("ns", "node");
        p.load(&key, "node-a", "uid-a", "a", runtime("a"));
        // a is unpublished in favour of b, which has not loaded (or never will).
        assert!(p.retire(&key, "uid-a"));
        assert_eq!(
            p.cache().snapshot("ns", "node").as_deref(),
            Some(&runtime("a"))
        );
        assert_eq!(p.current(&key).unwrap().uid, "uid-a");
        // b loads: it replaces a, and a's retirement no longer concerns the key.
        p.load(&key, "node-b", "uid-b", "b", runtime("b"));
        assert!(!p.retire(&key, "uid-a"));
        assert_eq!(
            p.cache().snapshot("ns", "node").as_deref(),
            Some(&runtime("b"))
        );
        // Only a deletion clears.
        assert!(p.unload(&key, "uid-b"));
        assert!(p.cache().snapshot("ns", "node").is_none());
    }

    #[test]
    fn nacks_map_to_the_revision_that_carried_the_version() {
        let p = Publisher::new(Cache::new());
        let key = NodeKey::new("ns", "node");
        let (a, b) = (runtime("a"), runtime("b"));
        let (nack_a, nack_b) = (nack(&a), nack(&b));
        p.load(&key, "node-a", "uid-a", "a", a);
        p.load(&key, "node-b", "uid-b", "b", b);
        assert_eq!(p.revision_of(&nack_b).unwrap().revision, "node-b");
        // A late NACK of the older snapshot still names its revision.
        assert_eq!(p.revision_of(&nack_a).unwrap().revision, "node-a");
        // Another key, or a version never served: nothing.
        let mut other = nack_b.clone();
        other.namespace = "other".into();
        assert!(p.revision_of(&other).is_none());
        let mut unknown = nack_b;
        unknown.version = "0000".into();
        assert!(p.revision_of(&unknown).is_none());
    }
}
