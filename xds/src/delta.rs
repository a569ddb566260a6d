//! The incremental (delta) protocol of one ADS stream as a pure state machine: per type, the
//! subscription (wildcard and names), the version of every resource the proxy holds, and the
//! response in flight. Only resources whose version differs from what the proxy holds are
//! sent; resources it holds that are gone are listed as removed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::resource::ResourceType;

use super::cache::{Snapshot, VersionedResource};
use super::limits::Limit;
use super::protocol::{Ack, Ignored, Nonces, Outcome, PUSH_ORDER, RejectedVersions, Rejection};

/// The parts of a `DeltaDiscoveryRequest` the protocol looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaRequest {
    pub type_url: String,
    pub subscribe: Vec<String>,
    pub unsubscribe: Vec<String>,
    pub initial_resource_versions: BTreeMap<String, String>,
    pub response_nonce: String,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeltaResponse {
    pub kind: ResourceType,
    pub system_version: String,
    pub nonce: String,
    pub resources: Vec<VersionedResource>,
    pub removed: Vec<String>,
}

#[derive(Debug)]
struct InFlight {
    system_version: String,
    /// What the proxy will hold once it ACKs: name -> version, `None` for removed.
    changes: Vec<(String, Option<String>)>,
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// The version of every resource the proxy holds, as far as it has acknowledged.
    known: BTreeMap<String, String>,
    last_nonce: Option<String>,
    in_flight: Option<InFlight>,
    /// A response is owed even if nothing differs (first request, new names).
    owed: bool,
    acked: Option<String>,
    rejected: RejectedVersions,
    /// Names to send again even though the proxy holds their version: the endpoints of
    /// clusters just sent, since Envoy re-creates a changed cluster and waits for them.
    resend: BTreeSet<String>,
}

impl TypeState {
    fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// One delta stream's protocol state.
#[derive(Debug)]
pub struct DeltaState {
    types: HashMap<ResourceType, TypeState>,
    nonces: Nonces,
    /// Names a request may carry, and the subscription may hold, per type.
    max_names: usize,
}

impl Default for DeltaState {
    fn default() -> Self {
        Self::with_max_names(crate::limits::Limits::default().max_names_per_type)
    }
}

impl DeltaState {
    pub fn with_max_names(max_names: usize) -> Self {
        Self {
            types: HashMap::new(),
            nonces: Nonces::default(),
            max_names,
        }
    }

    pub fn on_request(
        &mut self,
        req: &DeltaRequest,
        snapshot: Option<&Snapshot>,
    ) -> Outcome<DeltaResponse> {
        let mut out = Outcome::default();
        let Some(kind) = ResourceType::from_type_url(&req.type_url) else {
            out.ignored = Some(Ignored::UnknownType(req.type_url.clone()));
            return out;
        };
        // Checked before any work: a request may carry hundreds of thousands of names.
        if req.subscribe.len() > self.max_names
            || req.initial_resource_versions.len() > self.max_names
        {
            out.exceeded = Some(Limit::NamesPerType);
            return out;
        }
        let first = !self.types.contains_key(&kind);
        let st = self.types.entry(kind).or_default();
        if first {
            // What the proxy kept from an earlier stream (or server) is what it holds now.
            st.known = req.initial_resource_versions.clone();
            // The legacy wildcard: a first request naming nothing subscribes to everything.
            st.wildcard = req.subscribe.is_empty();
            st.owed = true;
        } else if !req.response_nonce.is_empty() {
            if st.last_nonce.as_deref() == Some(req.response_nonce.as_str()) {
                if let Some(flight) = st.in_flight.take() {
                    match &req.error {
                        Some(message) => {
                            st.rejected.insert(flight.system_version.clone());
                            out.nack = Some(Rejection {
                                kind,
                                version: flight.system_version,
                                message: message.clone(),
                            });
                        }
                        None => {
                            for (name, version) in flight.changes {
                                match version {
                                    Some(v) => st.known.insert(name, v),
                                    None => st.known.remove(&name),
                                };
                            }
                            st.acked = Some(flight.system_version.clone());
                            out.ack = Some(Ack {
                                kind,
                                version: flight.system_version,
                            });
                        }
                    }
                }
            } else if req.subscribe.is_empty() && req.unsubscribe.is_empty() {
                out.ignored = Some(Ignored::StaleNonce);
                return out;
            }
            // A stale nonce does not void the subscription changes the request carries.
        }
        for name in &req.subscribe {
            if name == "*" {
                st.owed |= !st.wildcard;
                st.wildcard = true;
            } else if st.names.insert(name.clone()) && !st.known.contains_key(name) {
                st.owed = true;
            }
        }
        for name in &req.unsubscribe {
            if name == "*" {
                st.wildcard = false;
            } else {
                st.names.remove(name);
            }
        }
        // The subscription grows across requests; it is bounded as a whole.
        if st.names.len() > self.max_names {
            out.exceeded = Some(Limit::NamesPerType);
            return out;
        }
        // The proxy drops what it unsubscribed from; forget it so a later subscribe resends.
        let TypeState {
            known,
            wildcard,
            names,
            ..
        } = st;
        known.retain(|name, _| *wildcard || names.contains(name));
        out.response = respond(st, kind, snapshot, &mut self.nonces);
        if let Some(r) = &out.response
            && kind == ResourceType::Cluster
        {
            self.endpoints_follow(r);
            if let Some(eds) = self.types.get_mut(&ResourceType::Endpoint) {
                out.also.extend(respond(
                    eds,
                    ResourceType::Endpoint,
                    snapshot,
                    &mut self.nonces,
                ));
            }
        }
        out
    }

    pub fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<DeltaResponse> {
        let mut out = Vec::new();
        for kind in PUSH_ORDER {
            let Some(st) = self.types.get_mut(&kind) else {
                continue;
            };
            if let Some(r) = respond(st, kind, Some(snapshot), &mut self.nonces) {
                if kind == ResourceType::Cluster {
                    // Endpoints come later in the push order and pick this up.
                    self.endpoints_follow(&r);
                }
                out.push(r);
            }
        }
        out
    }

    fn endpoints_follow(&mut self, clusters: &DeltaResponse) {
        if let Some(eds) = self.types.get_mut(&ResourceType::Endpoint) {
            eds.resend
                .extend(clusters.resources.iter().map(|r| r.resource.name.clone()));
        }
    }

    #[cfg(test)]
    pub fn acked(&self, kind: ResourceType) -> Option<&str> {
        self.types.get(&kind)?.acked.as_deref()
    }
}

fn respond(
    st: &mut TypeState,
    kind: ResourceType,
    snapshot: Option<&Snapshot>,
    nonces: &mut Nonces,
) -> Option<DeltaResponse> {
    let snapshot = snapshot?;
    if st.in_flight.is_some() {
        return None;
    }
    let typed = snapshot.of_type(kind);
    if st.rejected.contains(typed.version()) {
        return None;
    }
    let resend = |st: &TypeState, name: &str| !st.resend.is_empty() && st.resend.contains(name);
    // One pass over the snapshot and what the proxy holds, both sorted by name: what it
    // lacks or holds at another version, and what it holds that the snapshot no longer has.
    // (Looking every name up in the other map showed in profiles of 1,000 streams.)
    let mut resources: Vec<VersionedResource> = Vec::new();
    let mut gone: Vec<&String> = Vec::new();
    let mut held = st.known.iter().peekable();
    for (name, r) in typed.resources() {
        while let Some((k, _)) = held.next_if(|(k, _)| *k < name) {
            gone.push(k);
        }
        let version = held.next_if(|(k, _)| *k == name).map(|(_, v)| v);
        if st.subscribed(name) && (version != Some(&r.version) || resend(st, name)) {
            resources.push(r.clone());
        }
    }
    gone.extend(held.map(|(k, _)| k));
    // Names asked for that the snapshot lacks but still serves (an empty runtime layer).
    let stand_ins: BTreeMap<String, VersionedResource> = st
        .names
        .iter()
        .filter(|n| !typed.resources().contains_key(*n))
        .filter_map(|n| snapshot.requested(kind, n))
        .map(|r| (r.resource.name.clone(), r))
        .collect();
    resources.extend(
        stand_ins
            .values()
            .filter(|r| {
                st.known.get(&r.resource.name) != Some(&r.version) || resend(st, &r.resource.name)
            })
            .cloned(),
    );
    let removed: Vec<String> = gone
        .into_iter()
        .filter(|name| !stand_ins.contains_key(*name))
        .cloned()
        .collect();
    if !st.resend.is_empty() {
        for r in &resources {
            st.resend.remove(&r.resource.name);
        }
    }
    if resources.is_empty() && removed.is_empty() && !st.owed {
        return None;
    }
    st.owed = false;
    let nonce = nonces.next();
    let changes = resources
        .iter()
        .map(|r| (r.resource.name.clone(), Some(r.version.clone())))
        .chain(removed.iter().map(|n| (n.clone(), None)))
        .collect();
    st.last_nonce = Some(nonce.clone());
    st.in_flight = Some(InFlight {
        system_version: typed.version().to_owned(),
        changes,
    });
    Some(DeltaResponse {
        kind,
        system_version: typed.version().to_owned(),
        nonce,
        resources,
        removed,
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::resource::Resource;

    const CDS: ResourceType = ResourceType::Cluster;
    const EDS: ResourceType = ResourceType::Endpoint;

    fn mk_snapshot(kind: ResourceType, items: &[(&str, &str)]) -> Snapshot {
        Snapshot::new(items.iter().map(|(name, body)| Resource {
            kind,
            name: (*name).into(),
            body: Bytes::from(body.to_string()),
        }))
        .unwrap()
    }

    fn mk_req(kind: ResourceType, subscribe: &[&str], nonce: &str) -> DeltaRequest {
        DeltaRequest {
            type_url: kind.type_url().into(),
            subscribe: subscribe.iter().map(|s| (*s).into()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn ack(resp: &DeltaResponse) -> DeltaRequest {
        mk_req(resp.kind, &[], &resp.nonce)
    }

    fn names(resp: &DeltaResponse) -> Vec<&str> {
        resp.resources
            .iter()
            .map(|r| r.resource.name.as_str())
            .collect()
    }

    #[test]
    fn wildcard_gets_everything_then_only_changes_and_removals() {
        let s1 = mk_snapshot(CDS, &[("a", "1"), ("b", "1")]);
        let mut st = DeltaState::default();
        let r1 = st
            .on_request(&mk_req(CDS, &[], ""), Some(&s1))
            .response
            .unwrap();
        assert_eq!(names(&r1), ["a", "b"]);
        assert!(r1.removed.is_empty());
        assert_eq!(r1.system_version, s1.version(CDS));
        let out = st.on_request(&ack(&r1), Some(&s1));
        assert_eq!(out.ack.unwrap().version, s1.version(CDS));
        assert_eq!(out.response, None);

        // b changes, a goes away, c appears.
        let s2 = mk_snapshot(CDS, &[("b", "2"), ("c", "1")]);
        let r2 = st.on_snapshot(&s2).remove(0);
        assert_eq!(names(&r2), ["b", "c"]);
        assert_eq!(r2.removed, ["a"]);
        st.on_request(&ack(&r2), Some(&s2));
        assert!(st.on_snapshot(&s2).is_empty());
    }

    #[test]
    fn initial_resource_versions_skip_what_the_proxy_already_has() {
        let s = mk_snapshot(CDS, &[("a", "1"), ("b", "1")]);
        let a_version = s.of_type(CDS).resources()["a"].version.clone();
        let mut st = DeltaState::default();
        let req = DeltaRequest {
            initial_resource_versions: [
                ("a".to_string(), a_version),
                ("gone".to_string(), "x".to_string()),
            ]
            .into(),
            ..mk_req(CDS, &[], "")
        };
        let r = st.on_request(&req, Some(&s)).response.unwrap();
        assert_eq!(names(&r), ["b"]);
        assert_eq!(r.removed, ["gone"]);

        // Everything already there: the first request still gets an (empty) answer.
        let mut st = DeltaState::default();
        let versions = s
            .of_type(CDS)
            .resources()
            .iter()
            .map(|(n, r)| (n.clone(), r.version.clone()))
            .collect();
        let req = DeltaRequest {
            initial_resource_versions: versions,
            ..mk_req(CDS, &[], "")
        };
        let r = st.on_request(&req, Some(&s)).response.unwrap();
        assert!(r.resources.is_empty() && r.removed.is_empty());
    }

    #[test]
    fn named_subscriptions_and_unsubscribe() {
        let s = mk_snapshot(EDS, &[("a", "1"), ("b", "1"), ("c", "1")]);
        let mut st = DeltaState::default();
        let r1 = st
            .on_request(&mk_req(EDS, &["a"], ""), Some(&s))
            .response
            .unwrap();
        assert_eq!(names(&r1), ["a"]);
        st.on_request(&ack(&r1), Some(&s));
        // Subscribing to more names (no nonce: not an ACK) sends just those.
        let r2 = st
            .on_request(&mk_req(EDS, &["b", "zz"], ""), Some(&s))
            .response
            .unwrap();
        assert_eq!(names(&r2), ["b"]);
        st.on_request(&ack(&r2), Some(&s));
        // Unsubscribing sends nothing, and the name is forgotten...
        let unsub = DeltaRequest {
            unsubscribe: vec!["a".into()],
            ..mk_req(EDS, &[], "")
        };
        assert_eq!(st.on_request(&unsub, Some(&s)).response, None);
        // ...so a change to it is not sent, and resubscribing sends it again.
        let s2 = mk_snapshot(EDS, &[("a", "2"), ("b", "1"), ("c", "1")]);
        assert!(st.on_snapshot(&s2).is_empty());
        let r3 = st
            .on_request(&mk_req(EDS, &["a"], ""), Some(&s2))
            .response
            .unwrap();
        assert_eq!(names(&r3), ["a"]);
    }

    #[test]
    fn nack_keeps_what_the_proxy_holds_and_never_resends_the_version() {
        let good = mk_snapshot(CDS, &[("a", "good")]);
        let bad = mk_snapshot(CDS, &[("a", "bad"), ("b", "bad")]);
        let mut st = DeltaState::default();
        let r1 = st
            .on_request(&mk_req(CDS, &[], ""), Some(&good))
            .response
            .unwrap();
        st.on_request(&ack(&r1), Some(&good));
        let r2 = st.on_snapshot(&bad).remove(0);
        let nack = DeltaRequest {
            error: Some("bad cluster".into()),
            ..ack(&r2)
        };
        let out = st.on_request(&nack, Some(&bad));
        assert_eq!(
            out.nack,
            Some(Rejection {
                kind: CDS,
                version: bad.version(CDS).into(),
                message: "bad cluster".into()
            })
        );
        assert_eq!(out.response, None);
        assert_eq!(st.acked(CDS), Some(good.version(CDS)));
        assert!(st.on_snapshot(&bad).is_empty());
        // Rolling back: the proxy still holds the good "a", so nothing differs.
        assert!(st.on_snapshot(&good).is_empty());
        let fixed = mk_snapshot(CDS, &[("a", "fixed")]);
        assert_eq!(names(&st.on_snapshot(&fixed)[0]), ["a"]);
    }

    #[test]
    fn stale_nonces_are_ignored_and_one_response_at_a_time() {
        let s1 = mk_snapshot(CDS, &[("a", "1")]);
        let s2 = mk_snapshot(CDS, &[("a", "2")]);
        let s3 = mk_snapshot(CDS, &[("a", "3")]);
        let mut st = DeltaState::default();
        let r1 = st
            .on_request(&mk_req(CDS, &[], ""), Some(&s1))
            .response
            .unwrap();
        st.on_request(&ack(&r1), Some(&s1));
        let r2 = st.on_snapshot(&s2).remove(0);
        assert!(st.on_snapshot(&s3).is_empty(), "r2 in flight");
        let out = st.on_request(&ack(&r1), Some(&s3));
        assert_eq!(out.ignored, Some(Ignored::StaleNonce));
        let out = st.on_request(&ack(&r2), Some(&s3));
        assert_eq!(out.ack.unwrap().version, s2.version(CDS));
        let r3 = out.response.unwrap();
        assert_eq!(r3.system_version, s3.version(CDS));
    }

    #[test]
    fn endpoints_of_sent_clusters_are_resent_for_warming() {
        let snap = |cluster_body: &str| {
            Snapshot::new([
                Resource {
                    kind: CDS,
                    name: "a".into(),
                    body: Bytes::from(cluster_body.to_owned()),
                },
                Resource {
                    kind: CDS,
                    name: "b".into(),
                    body: Bytes::from_static(b"b"),
                },
                Resource {
                    kind: EDS,
                    name: "a".into(),
                    body: Bytes::from_static(b"ea"),
                },
                Resource {
                    kind: EDS,
                    name: "b".into(),
                    body: Bytes::from_static(b"eb"),
                },
            ])
            .unwrap()
        };
        let s1 = snap("a1");
        let mut st = DeltaState::default();
        let c = st
            .on_request(&mk_req(CDS, &[], ""), Some(&s1))
            .response
            .unwrap();
        st.on_request(&ack(&c), Some(&s1));
        let e = st
            .on_request(&mk_req(EDS, &["a", "b"], ""), Some(&s1))
            .response
            .unwrap();
        st.on_request(&ack(&e), Some(&s1));
        // Cluster "a" changes: its endpoints (unchanged) follow, "b"'s do not.
        let s2 = snap("a2");
        let pushed = st.on_snapshot(&s2);
        assert_eq!(pushed.len(), 2);
        assert_eq!(names(&pushed[0]), ["a"]);
        assert_eq!((pushed[1].kind, names(&pushed[1])), (EDS, vec!["a"]));
        st.on_request(&ack(&pushed[0]), Some(&s2));
        st.on_request(&ack(&pushed[1]), Some(&s2));
        assert!(st.on_snapshot(&s2).is_empty());
    }

    #[test]
    fn a_missing_runtime_layer_is_sent_empty_once_and_replaced_by_the_real_one() {
        let rtds = ResourceType::Runtime;
        let mut st = DeltaState::default();
        let empty = Snapshot::empty();
        let r1 = st
            .on_request(&mk_req(rtds, &["runtime"], ""), Some(&empty))
            .response
            .unwrap();
        assert_eq!(names(&r1), ["runtime"]);
        st.on_request(&ack(&r1), Some(&empty));
        // Nothing changes, nothing is sent; not listed as removed either.
        assert!(st.on_snapshot(&empty).is_empty());
        let real = mk_snapshot(rtds, &[("runtime", "real layer")]);
        let r2 = st.on_snapshot(&real).remove(0);
        assert_eq!(names(&r2), ["runtime"]);
        assert_eq!(
            r2.resources[0].resource.body,
            Bytes::from_static(b"real layer")
        );
        assert!(r2.removed.is_empty());
    }

    #[test]
    fn explicit_wildcard_subscription() {
        let s = mk_snapshot(CDS, &[("a", "1"), ("b", "1")]);
        let mut st = DeltaState::default();
        let r1 = st
            .on_request(&mk_req(CDS, &["a"], ""), Some(&s))
            .response
            .unwrap();
        assert_eq!(names(&r1), ["a"]);
        st.on_request(&ack(&r1), Some(&s));
        let r2 = st
            .on_request(&mk_req(CDS, &["*"], ""), Some(&s))
            .response
            .unwrap();
        assert_eq!(names(&r2), ["b"]);
    }

    #[test]
    fn subscriptions_are_bounded_per_type_across_requests() {
        let rtds = ResourceType::Runtime;
        let empty = mk_snapshot(CDS, &[]);
        let many = |from: usize, n: usize| -> Vec<String> {
            (from..from + n).map(|i| format!("layer-{i}")).collect()
        };
        let mut st = DeltaState::with_max_names(100);
        // One request over the limit is refused before any work, whatever it carries.
        let huge = DeltaRequest {
            type_url: rtds.type_url().into(),
            subscribe: many(0, 50_000),
            initial_resource_versions: many(0, 50_000)
                .into_iter()
                .map(|n| (n, "v".to_string()))
                .collect(),
            ..Default::default()
        };
        let out = st.on_request(&huge, Some(&empty));
        assert_eq!(out.exceeded, Some(Limit::NamesPerType));
        assert_eq!(out.response, None);
        let versions_only = subscribe_versions_only(&huge);
        let out = st.on_request(&versions_only, Some(&empty));
        assert_eq!(out.exceeded, Some(Limit::NamesPerType));

        // Requests under the limit that add up to more than it are refused too.
        let mut st = DeltaState::with_max_names(100);
        let r = st
            .on_request(&mk_req(rtds, &[], ""), Some(&empty))
            .response
            .unwrap();
        let mut last = r;
        for batch in 0..2 {
            let req = DeltaRequest {
                subscribe: many(batch * 50, 50),
                ..ack(&last)
            };
            let out = st.on_request(&req, Some(&empty));
            assert_eq!(out.exceeded, None, "batch {batch}");
            last = out.response.unwrap();
            assert_eq!(
                last.resources.len(),
                50,
                "empty layers stand in for the names"
            );
        }
        let req = DeltaRequest {
            subscribe: many(100, 1),
            ..ack(&last)
        };
        assert_eq!(
            st.on_request(&req, Some(&empty)).exceeded,
            Some(Limit::NamesPerType)
        );
    }

    fn subscribe_versions_only(req: &DeltaRequest) -> DeltaRequest {
        DeltaRequest {
            subscribe: vec!["layer-0".into()],
            initial_resource_versions: req.initial_resource_versions.clone(),
            ..req.clone()
        }
    }
}
