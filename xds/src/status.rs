//! Who is connected and how far each proxy got: the sync-status registry behind the
//! `/sync-status` endpoint and `marin3r proxy-status`, and the NACK events the revision
//! controller consumes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::resource::ResourceType;
use crate::tracks::Track;

/// Envoy rejected a configuration: everything the revision controller needs to taint it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NackEvent {
    pub namespace: String,
    pub node_id: String,
    /// From the node metadata key `pod_name`, when the proxy sets it.
    pub pod_name: Option<String>,
    pub resource_type: ResourceType,
    pub type_url: String,
    /// The rejected version (the type's version in the snapshot that was sent).
    pub version: String,
    /// Envoy's error message.
    pub message: String,
    /// When the NACK came: how many proxies of this (namespace, node id) connected to this
    /// server have rejected this version of this type as their latest NACK (this one
    /// included), out of how many are connected; proxies, not streams (see
    /// [`StatusRegistry::tally`]). The revision controller taints on a share
    /// of the node's proxies, not on one outlier.
    pub rejecting: usize,
    pub connected: usize,
}

/// The last NACK of one type, as the status endpoint shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastNack {
    pub version: String,
    pub message: String,
    pub at: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acked_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_nack: Option<LastNack>,
}

/// One connected proxy (one ADS stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyStatus {
    pub namespace: String,
    pub node_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// `sotw` or `delta`.
    pub protocol: String,
    /// The proxy's Envoy release (`1.34.1`), from its node's `user_agent_build_version`
    /// (or `user_agent_version`), when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_version: Option<String>,
    pub peer: String,
    pub connected_at: String,
    /// Keyed by the type's `spec.envoyResources` list name (`listeners`, `clusters`, ...).
    pub types: BTreeMap<String, TypeStatus>,
    /// `canary` while the proxy is served its node's canary snapshot; left out on the
    /// stable track.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub track: Option<String>,
    /// The port of the proxy's stats listener (`GET /stats/prometheus` on its address), from
    /// the node metadata key `stats_port`, when the proxy sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_port: Option<u16>,
}

impl ProxyStatus {
    /// The track the proxy is on.
    pub fn track(&self) -> Track {
        match self.track.as_deref() {
            Some("canary") => Track::Canary,
            _ => Track::Stable,
        }
    }
}

/// The JSON document of the sync-status endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncStatus {
    pub proxies: Vec<ProxyStatus>,
}

pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// The registry of connected proxies. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StatusRegistry {
    proxies: Arc<Mutex<HashMap<u64, ProxyStatus>>>,
    next_id: Arc<AtomicU64>,
}

impl StatusRegistry {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, ProxyStatus>> {
        self.proxies.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a proxy; it is removed when the handle is dropped.
    pub fn register(&self, status: ProxyStatus) -> ProxyHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, status);
        ProxyHandle {
            id,
            registry: self.clone(),
        }
    }

    /// Every connected proxy, ordered by namespace, node id and connection time.
    pub fn snapshot(&self) -> SyncStatus {
        let mut proxies: Vec<ProxyStatus> = self.lock().values().cloned().collect();
        proxies.sort_by(|a, b| {
            (&a.namespace, &a.node_id, &a.connected_at).cmp(&(
                &b.namespace,
                &b.node_id,
                &b.connected_at,
            ))
        });
        SyncStatus { proxies }
    }
}

/// A registered proxy's entry, updated by its stream.
#[derive(Debug)]
pub struct ProxyHandle {
    id: u64,
    registry: StatusRegistry,
}

impl ProxyHandle {
    fn update(&self, kind: ResourceType, f: impl FnOnce(&mut TypeStatus)) {
        if let Some(p) = self.registry.lock().get_mut(&self.id) {
            f(p.types.entry(kind.spec_field().to_owned()).or_default());
        }
    }

    /// The proxy is served the snapshot of `track`.
    pub fn on_track(&self, track: crate::tracks::Track) {
        if let Some(p) = self.registry.lock().get_mut(&self.id) {
            p.track = (track == crate::tracks::Track::Canary).then(|| track.as_str().to_owned());
        }
    }

    pub fn sent(&self, kind: ResourceType, version: &str) {
        self.update(kind, |t| t.sent_version = Some(version.to_owned()));
    }

    pub fn acked(&self, kind: ResourceType, version: &str) {
        self.update(kind, |t| t.acked_version = Some(version.to_owned()));
    }

    pub fn nacked(&self, kind: ResourceType, version: &str, message: &str) {
        self.update(kind, |t| {
            t.last_nack = Some(LastNack {
                version: version.to_owned(),
                message: message.to_owned(),
                at: now_rfc3339(),
            });
        });
    }
}

impl ProxyHandle {
    /// How many proxies of this proxy's (namespace, node id) and track have `version` of
    /// `kind` as their latest NACK, and how many are connected.
    pub fn tally(&self, kind: ResourceType, version: &str) -> (usize, usize) {
        let (namespace, node_id, track) = {
            let proxies = self.registry.lock();
            let Some(me) = proxies.get(&self.id) else {
                return (0, 0);
            };
            (me.namespace.clone(), me.node_id.clone(), me.track())
        };
        self.registry
            .tally(&namespace, &node_id, track, kind, version)
    }
}

impl StatusRegistry {
    /// How many proxies of (namespace, node id) connected to this process have `version` of
    /// `kind` as their latest NACK, and how many are connected. What a replica reports when
    /// another replica saw a NACK of that version.
    ///
    /// Proxies, not streams: the streams of one [`proxy_identity`] (one peer address) count
    /// once (rejecting when any of them rejected), so a holder of the namespace's certificate
    /// opening many streams under a node id, whatever pod names they declare, gets one vote,
    /// not one per stream.
    ///
    /// Only the proxies of `track` count: a canary version is judged by the proxies it was
    /// served to, not diluted by the ones still on the stable version (without a canary,
    /// every proxy is on the stable track).
    pub fn tally(
        &self,
        namespace: &str,
        node_id: &str,
        track: Track,
        kind: ResourceType,
        version: &str,
    ) -> (usize, usize) {
        let proxies = self.lock();
        let peers = proxies
            .values()
            .filter(|p| p.namespace == namespace && p.node_id == node_id && p.track() == track);
        let mut by_proxy: BTreeMap<String, bool> = BTreeMap::new();
        for p in peers {
            let nacked = p
                .types
                .get(kind.spec_field())
                .and_then(|t| t.last_nack.as_ref())
                .is_some_and(|n| n.version == version);
            *by_proxy.entry(proxy_identity(p)).or_default() |= nacked;
        }
        let rejecting = by_proxy.values().filter(|nacked| **nacked).count();
        (rejecting, by_proxy.len())
    }
}

/// Who a stream speaks for when NACKs and acknowledgements are counted: its peer's IP
/// address (not the port, which changes with each connection). Not the node metadata
/// `pod_name`, which is whatever the client declares: one holder of the namespace's
/// certificate naming a new pod on each stream would count as many proxies, diluting a
/// taint with ACKs or forcing one with NACKs. A pod's IP is its own, and
/// every stream of one Envoy comes from it; proxies sharing an address (host-network pods
/// of one node, clients behind one NAT) count as one.
pub fn proxy_identity(p: &ProxyStatus) -> String {
    match p.peer.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().to_canonical().to_string(),
        Err(_) => p.peer.clone(),
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_proxy(ns: &str, node: &str) -> ProxyStatus {
        mk_proxy_of(ns, node, Some("pod-1"), "127.0.0.1:1234")
    }

    fn mk_proxy_of(ns: &str, node: &str, pod: Option<&str>, peer: &str) -> ProxyStatus {
        ProxyStatus {
            namespace: ns.into(),
            node_id: node.into(),
            pod: pod.map(Into::into),
            protocol: "sotw".into(),
            envoy_version: None,
            peer: peer.into(),
            connected_at: now_rfc3339(),
            types: BTreeMap::new(),
            track: None,
            stats_port: None,
        }
    }

    #[test]
    fn proxies_are_listed_updated_and_removed_on_drop() {
        let reg = StatusRegistry::default();
        let b = reg.register(mk_proxy("ns-b", "node"));
        let a = reg.register(mk_proxy("ns-a", "node"));
        a.sent(ResourceType::Listener, "v1");
        a.acked(ResourceType::Listener, "v1");
        a.nacked(ResourceType::Cluster, "v2", "bad cluster");
        let s = reg.snapshot();
        assert_eq!(s.proxies.len(), 2);
        assert_eq!(s.proxies[0].namespace, "ns-a");
        let l = &s.proxies[0].types["listeners"];
        assert_eq!(l.acked_version.as_deref(), Some("v1"));
        let c = &s.proxies[0].types["clusters"];
        assert_eq!(c.last_nack.as_ref().unwrap().message, "bad cluster");
        let json = serde_json::to_string(&s).unwrap();
        let back: SyncStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        drop(a);
        drop(b);
        assert!(reg.snapshot().proxies.is_empty());
    }

    /// one client opening several streams under a node id
    /// is one proxy, whether it ACKs (to hold back a taint) or NACKs (to force one), and
    /// whatever pod name each stream declares: proxies are told apart by peer address.
    #[test]
    fn a_nack_is_tallied_over_distinct_proxies_not_streams() {
        let reg = StatusRegistry::default();
        let real = reg.register(mk_proxy_of("ns", "node", Some("web-1"), "10.0.0.1:40000"));
        real.nacked(ResourceType::Listener, "v2", "bad");
        // Five ACKing streams from one address, each claiming its own pod: one proxy.
        let acking: Vec<ProxyHandle> = (0..5)
            .map(|i| {
                let peer = format!("10.0.0.9:{}", 40000 + i);
                let pod = format!("web-{}", i + 2);
                reg.register(mk_proxy_of("ns", "node", Some(&pod), &peer))
            })
            .collect();
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (1, 2));
        // Five NACKing streams from another address, claiming pods (or none): one proxy.
        let nacking: Vec<ProxyHandle> = (0..5)
            .map(|i| {
                let peer = format!("10.0.0.8:{}", 40000 + i);
                let pod = format!("web-{}", i + 10);
                let pod = (i % 2 == 0).then_some(pod.as_str());
                let p = reg.register(mk_proxy_of("ns", "node", pod, &peer));
                p.nacked(ResourceType::Listener, "v2", "bad");
                p
            })
            .collect();
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (2, 3));
        // Claiming the real pod's name from another address is another proxy, not that pod.
        let impostor = reg.register(mk_proxy_of("ns", "node", Some("web-1"), "10.0.0.7:1"));
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (2, 4));
        drop(impostor);
        // A proxy counts as rejecting when any of its streams did.
        acking[0].nacked(ResourceType::Listener, "v2", "bad");
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (3, 3));
        drop((acking, nacking));
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (1, 1));
        // An IPv4 client over an IPv6 socket is the same address.
        let mapped = reg.register(mk_proxy_of("ns", "node", None, "[::ffff:10.0.0.1]:5"));
        assert_eq!(real.tally(ResourceType::Listener, "v2"), (1, 1));
        drop(mapped);
    }

    #[test]
    fn a_nack_is_tallied_over_the_connected_proxies_of_its_node() {
        let reg = StatusRegistry::default();
        let one = reg.register(mk_proxy_of("ns", "node", Some("pod-1"), "10.0.0.1:1"));
        let two = reg.register(mk_proxy_of("ns", "node", Some("pod-2"), "10.0.0.2:1"));
        let elsewhere = reg.register(mk_proxy("other", "node"));
        let other_node = reg.register(mk_proxy("ns", "gateway"));
        for p in [&elsewhere, &other_node] {
            p.nacked(ResourceType::Listener, "v2", "bad");
        }
        one.nacked(ResourceType::Listener, "v2", "bad");
        assert_eq!(one.tally(ResourceType::Listener, "v2"), (1, 2));
        // Another type or version is another question.
        assert_eq!(one.tally(ResourceType::Cluster, "v2"), (0, 2));
        two.nacked(ResourceType::Listener, "v1", "older");
        assert_eq!(two.tally(ResourceType::Listener, "v2"), (1, 2));
        two.nacked(ResourceType::Listener, "v2", "bad");
        assert_eq!(two.tally(ResourceType::Listener, "v2"), (2, 2));
        drop(one);
        assert_eq!(two.tally(ResourceType::Listener, "v2"), (1, 1));
    }

    /// A canary version is judged by the proxies it was served to: one canary of four
    /// rejecting it is all of its track; the stable track is counted on its own.
    #[test]
    fn a_nack_is_tallied_over_the_proxies_of_its_track() {
        let reg = StatusRegistry::default();
        let proxies: Vec<ProxyHandle> = (1..=4)
            .map(|i| reg.register(mk_proxy_of("ns", "node", None, &format!("10.0.0.{i}:1"))))
            .collect();
        proxies[0].on_track(Track::Canary);
        proxies[0].nacked(ResourceType::Listener, "canary", "bad");
        assert_eq!(proxies[0].tally(ResourceType::Listener, "canary"), (1, 1));
        assert_eq!(
            reg.tally(
                "ns",
                "node",
                Track::Canary,
                ResourceType::Listener,
                "canary"
            ),
            (1, 1)
        );
        assert_eq!(
            reg.tally(
                "ns",
                "node",
                Track::Stable,
                ResourceType::Listener,
                "canary"
            ),
            (0, 3)
        );
        proxies[1].nacked(ResourceType::Listener, "stable", "bad");
        assert_eq!(proxies[1].tally(ResourceType::Listener, "stable"), (1, 3));
        // Back on the stable track, it counts there again.
        proxies[0].on_track(Track::Stable);
        assert_eq!(proxies[1].tally(ResourceType::Listener, "stable"), (1, 4));
        let json = serde_json::to_value(reg.snapshot()).unwrap();
        assert!(json["proxies"][0].get("track").is_none(), "{json}");
    }
}
