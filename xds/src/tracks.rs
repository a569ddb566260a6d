//! Two tracks per node: beside the stable snapshot every proxy of a node gets, a canary
//! snapshot for some of them. Which proxies is a cutoff in a hash space, not a list: a proxy
//! is on the canary track when the hash of (the canary's salt, its namespace, node id and
//! identity) is at most the cutoff. The identity is the proxy's IP address, which it cannot
//! choose (the node metadata it declares it can); the salt is the canary version, so each
//! rollout picks its own proxies and keeps them while it lasts. The hash depends on nothing a
//! replica holds alone, so every discovery replica puts a proxy on the same track, and one
//! that reconnects elsewhere keeps its track.
//!
//! A stream's [`Watch`] picks its track whenever the node's value changes and wakes only when
//! what it picked changed: moving the cutoff wakes the proxies that switch, no other.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::cache::{Cache, Canary, NodeKey, Published, Served, Snapshot};
use crate::frame::Encoded;

/// Which snapshot a proxy gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Track {
    #[default]
    Stable,
    Canary,
}

impl Track {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Canary => "canary",
        }
    }
}

/// Where a proxy falls in the canary's hash space: the first 8 bytes of the SHA-256 of the
/// salt, the namespace, the node id and the identity, each length-prefixed.
pub fn track_hash(salt: &str, key: &NodeKey, identity: &str) -> u64 {
    let mut hasher = Sha256::new();
    for part in [salt, &key.namespace, &key.node_id, identity] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl Cache {
    /// Serves `snapshot` to the proxies of a node whose [`track_hash`] under `salt` is at
    /// most `cutoff`; the others keep the stable snapshot. The same snapshot and salt again
    /// only move the cutoff. Returns whether anything changed.
    pub fn set_canary(
        &self,
        namespace: &str,
        node_id: &str,
        snapshot: Snapshot,
        salt: &str,
        cutoff: u64,
    ) -> bool {
        let key = NodeKey::new(namespace, node_id);
        let stable = self
            .slot_value(&key)
            .and_then(|s| s.stable.map(|p| Arc::clone(&p.snapshot)));
        // The canary differs from the stable snapshot by its changes only: share the rest.
        let snapshot = match stable {
            Some(stable) => snapshot.sharing_with(&stable),
            None => snapshot,
        };
        self.modify(key, |served| {
            if let Some(c) = &served.canary
                && *c.salt == *salt
                && *c.published.snapshot == snapshot
            {
                return move_cutoff(served, cutoff);
            }
            served.canary = Some(Arc::new(Canary {
                published: Published {
                    encoded: Arc::new(Encoded::for_snapshot_of(snapshot.resource_bytes())),
                    snapshot: Arc::new(snapshot),
                    set_at: std::time::Instant::now(),
                },
                salt: salt.into(),
                cutoff,
            }));
            true
        })
    }

    /// Moves the cutoff of a node's canary; false when it has none or the cutoff is the same.
    pub fn set_canary_cutoff(&self, namespace: &str, node_id: &str, cutoff: u64) -> bool {
        self.modify(NodeKey::new(namespace, node_id), |served| {
            move_cutoff(served, cutoff)
        })
    }

    /// Ends a node's canary: its proxies get the stable snapshot again.
    pub fn clear_canary(&self, namespace: &str, node_id: &str) -> bool {
        self.modify(NodeKey::new(namespace, node_id), |served| {
            served.canary.take().is_some()
        })
    }

    /// A node's canary snapshot, its salt and its cutoff, if it has one.
    pub fn canary(&self, namespace: &str, node_id: &str) -> Option<(Arc<Snapshot>, Arc<str>, u64)> {
        let canary = self.slot_value(&NodeKey::new(namespace, node_id))?.canary?;
        Some((
            Arc::clone(&canary.published.snapshot),
            Arc::clone(&canary.salt),
            canary.cutoff,
        ))
    }

    /// Subscribes a stream to a key, as the proxy `identity` (its IP address): the returned
    /// watch sees its track's current snapshot as changed at once when there is one.
    pub fn watch(&self, key: NodeKey, identity: String) -> Watch {
        let mut rx = self.subscribe(&key);
        rx.mark_changed();
        Watch {
            rx: Some(rx),
            key,
            identity,
            cache: self.clone(),
            returned: None,
            hashed: None,
            track: Track::Stable,
        }
    }
}

fn move_cutoff(served: &mut Served, cutoff: u64) -> bool {
    match &served.canary {
        Some(c) if c.cutoff != cutoff => {
            served.canary = Some(Arc::new(Canary {
                published: c.published.clone(),
                salt: Arc::clone(&c.salt),
                cutoff,
            }));
            true
        }
        _ => false,
    }
}

/// A stream's subscription to one key, as one proxy; the slot is dropped with its last
/// watcher when nothing is served, so the cache does not grow with proxies that come and go.
pub struct Watch {
    rx: Option<watch::Receiver<Served>>,
    key: NodeKey,
    identity: String,
    cache: Cache,
    /// The snapshot last returned (held, so a new one can never be mistaken for it); None
    /// before the first call.
    returned: Option<Option<Arc<Snapshot>>>,
    /// The proxy's hash under the last canary salt seen.
    hashed: Option<(Arc<str>, u64)>,
    track: Track,
}

impl Watch {
    /// Waits until the snapshot of this proxy's track changes (or is cleared, or the proxy
    /// changes track) and returns the newest value; several changes in between are seen as
    /// one. A change to the other track does not wake it.
    pub async fn changed(&mut self) -> Option<Published> {
        let Self {
            rx,
            key,
            identity,
            returned,
            hashed,
            track,
            ..
        } = self;
        let rx = rx.as_mut()?;
        loop {
            // The sender lives in the cache map for as long as a receiver exists, so this
            // only fails if the cache itself is gone; then nothing will ever change again.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let served = rx.borrow_and_update();
            let (picked, on) = pick(&served, key, identity, hashed);
            let snapshot = picked.map(|p| Arc::clone(&p.snapshot));
            let same = returned.as_ref().is_some_and(|r| match (r, &snapshot) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            });
            if same {
                continue;
            }
            *returned = Some(snapshot);
            *track = on;
            return picked.cloned();
        }
    }

    pub fn key(&self) -> &NodeKey {
        &self.key
    }

    /// The track of the snapshot last returned.
    pub fn track(&self) -> Track {
        self.track
    }
}

/// The snapshot `identity` gets, and its track.
fn pick<'a>(
    served: &'a Served,
    key: &NodeKey,
    identity: &str,
    hashed: &mut Option<(Arc<str>, u64)>,
) -> (Option<&'a Published>, Track) {
    if let Some(canary) = &served.canary {
        let hash = match hashed {
            Some((salt, hash)) if Arc::ptr_eq(salt, &canary.salt) => *hash,
            _ => {
                let hash = track_hash(&canary.salt, key, identity);
                *hashed = Some((Arc::clone(&canary.salt), hash));
                hash
            }
        };
        if hash <= canary.cutoff {
            return (Some(&canary.published), Track::Canary);
        }
    }
    (served.stable.as_ref(), Track::Stable)
}

impl Drop for Watch {
    fn drop(&mut self) {
        drop(self.rx.take());
        self.cache.forget_if_unused(&self.key);
    }
}

#[cfg(test)]
#[path = "tracks_tests.rs"]
mod tests;
