//! How the connected proxies of each node stand with the snapshot served to it: acknowledged,
//! rejected, or not answered yet. What each discovery replica reports for the `SYNCED`
//! column of `EnvoyConfig`s.

use std::collections::{BTreeMap, HashMap};

use crate::resource::ResourceType;
use crate::status::{ProxyStatus, SyncStatus, proxy_identity};

/// The types Envoy asks for as soon as it connects over ADS (the others only when a listener
/// or cluster names them): a proxy has not acknowledged a snapshot until it has these.
const ROOT_TYPES: [ResourceType; 2] = [ResourceType::Cluster, ResourceType::Listener];

/// The proxies of one node, counted once each (see [`proxy_identity`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Convergence {
    pub connected: usize,
    /// Their latest answer for every type they use is an ACK of the served version.
    pub acked: usize,
    /// Their latest answer for some type is a NACK of the served version.
    pub nacked: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Answer {
    Acked,
    Pending,
    Nacked,
}

/// One stream's answer to the snapshot whose per-type versions are `served`. The types that
/// count are the root types the snapshot has and every other type the proxy was sent.
fn answer(p: &ProxyStatus, served: &BTreeMap<ResourceType, String>) -> Answer {
    let mut pending = false;
    for (kind, version) in served {
        let Some(t) = p.types.get(kind.spec_field()) else {
            pending |= ROOT_TYPES.contains(kind);
            continue;
        };
        if t.last_nack.as_ref().is_some_and(|n| &n.version == version)
            && t.acked_version.as_ref() != Some(version)
        {
            return Answer::Nacked;
        }
        pending |= t.acked_version.as_ref() != Some(version);
    }
    if pending || served.is_empty() {
        Answer::Pending
    } else {
        Answer::Acked
    }
}

/// Counts the proxies of `proxies` (all of one node) against `served`. A proxy with several
/// streams (a holder of the namespace's certificate opening many) counts once: rejecting when
/// any of its streams rejected, acknowledged only when all of them did.
pub fn count<'a>(
    proxies: impl IntoIterator<Item = &'a ProxyStatus>,
    served: &BTreeMap<ResourceType, String>,
) -> Convergence {
    let mut by_proxy: HashMap<String, Answer> = HashMap::new();
    for p in proxies {
        let a = answer(p, served);
        by_proxy
            .entry(proxy_identity(p))
            .and_modify(|worst| *worst = (*worst).max(a))
            .or_insert(a);
    }
    let mut c = Convergence {
        connected: by_proxy.len(),
        ..Convergence::default()
    };
    for a in by_proxy.values() {
        match a {
            Answer::Acked => c.acked += 1,
            Answer::Nacked => c.nacked += 1,
            Answer::Pending => {}
        }
    }
    c
}

/// The proxies of a sync status grouped by (namespace, node id).
pub fn by_node(status: &SyncStatus) -> HashMap<(&str, &str), Vec<&ProxyStatus>> {
    let mut nodes: HashMap<(&str, &str), Vec<&ProxyStatus>> = HashMap::new();
    for p in &status.proxies {
        nodes
            .entry((p.namespace.as_str(), p.node_id.as_str()))
            .or_default()
            .push(p);
    }
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{LastNack, TypeStatus};

    /// A stream of `pod`, from the pod's own address (each test pod name starts with its
    /// own letter).
    fn proxy(pod: &str, types: &[(&str, Option<&str>, Option<&str>)]) -> ProxyStatus {
        ProxyStatus {
            namespace: "ns".into(),
            node_id: "node".into(),
            pod: Some(pod.into()),
            protocol: "sotw".into(),
            envoy_version: None,
            peer: format!("10.0.0.{}:1", pod.as_bytes()[0]),
            connected_at: String::new(),
            types: types
                .iter()
                .map(|(kind, acked, nacked)| {
                    let status = TypeStatus {
                        sent_version: acked.or(*nacked).map(Into::into),
                        acked_version: acked.map(Into::into),
                        last_nack: nacked.map(|v| LastNack {
                            version: v.into(),
                            message: "bad".into(),
                            at: String::new(),
                        }),
                    };
                    ((*kind).to_owned(), status)
                })
                .collect(),
            track: None,
            stats_port: None,
        }
    }

    fn served() -> BTreeMap<ResourceType, String> {
        BTreeMap::from([
            (ResourceType::Cluster, "c2".to_owned()),
            (ResourceType::Listener, "l2".to_owned()),
            (ResourceType::Route, "r2".to_owned()),
            (ResourceType::Secret, "s2".to_owned()),
        ])
    }

    #[test]
    fn each_proxy_is_acked_nacked_or_pending() {
        let proxies = [
            // Both root types and the routes it uses: acknowledged (it never asked for
            // secrets, so they do not count).
            proxy(
                "a",
                &[
                    ("clusters", Some("c2"), None),
                    ("listeners", Some("l2"), None),
                    ("routes", Some("r2"), None),
                ],
            ),
            // The new listeners rejected, the old ones kept.
            proxy(
                "b",
                &[
                    ("clusters", Some("c2"), None),
                    ("listeners", Some("l1"), Some("l2")),
                ],
            ),
            // Still on the old routes.
            proxy(
                "c",
                &[
                    ("clusters", Some("c2"), None),
                    ("listeners", Some("l2"), None),
                    ("routes", Some("r1"), None),
                ],
            ),
            // Just connected: no listeners yet.
            proxy("d", &[("clusters", Some("c2"), None)]),
            // Rejected an older version, then acknowledged the served one.
            proxy(
                "e",
                &[
                    ("clusters", Some("c2"), Some("c1")),
                    ("listeners", Some("l2"), None),
                ],
            ),
        ];
        assert_eq!(
            count(&proxies, &served()),
            Convergence {
                connected: 5,
                acked: 2,
                nacked: 1
            }
        );
        // Nothing served yet: nobody has acknowledged anything.
        assert_eq!(
            count(&proxies[..1], &BTreeMap::new()),
            Convergence {
                connected: 1,
                acked: 0,
                nacked: 0
            }
        );
    }

    #[test]
    fn streams_of_one_pod_address_count_once_at_their_worst() {
        let good = [
            ("clusters", Some("c2"), None),
            ("listeners", Some("l2"), None),
        ];
        let proxies = [
            proxy("a", &good),
            proxy("a", &good),
            proxy("a", &[("clusters", Some("c2"), None)]),
            proxy("b", &good),
            proxy("b", &[("clusters", Some("c1"), Some("c2"))]),
        ];
        assert_eq!(
            count(&proxies, &served()),
            Convergence {
                connected: 2,
                acked: 0,
                nacked: 1
            }
        );
    }
}
