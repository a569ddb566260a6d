//! The incremental (delta) protocol of one ADS stream as a pure state machine: per type, the
//! subscription (wildcard and names), the version of every resource the proxy holds, and the
//! response in flight. Only resources whose version differs from what the proxy holds are
//! sent; resources it holds that are gone are listed as removed.
//!
//! A stream remembers every name and version its proxy holds, and thousands of streams hold
//! the same ones: those that came from a snapshot are the snapshot's shared strings
//! ([`VersionedResource::name`], [`VersionedResource::version`]), so the state of a stream is
//! pointers. Only what the proxy brings itself (names the snapshot lacks, versions it
//! reported from an earlier stream) is stored per stream.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::resource::ResourceType;

use super::cache::{Snapshot, TypeSnapshot, VersionedResource};
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

/// A change to what the proxy holds: a name and its new version, `None` for removed.
type Change = (Arc<str>, Option<Arc<str>>);

#[derive(Debug)]
struct InFlight {
    system_version: Arc<str>,
    /// What the proxy will hold once it ACKs, sorted by name.
    changes: Vec<Change>,
}

/// The name and version of every resource the proxy holds of one type, sorted by name: a
/// vector of shared strings, two pointers per resource (a map would add its nodes' slack).
#[derive(Debug, Default)]
struct Held(Vec<(Arc<str>, Arc<str>)>);

impl Held {
    /// What a proxy reports holding when its stream starts, sharing the snapshot's strings
    /// where they are the same.
    fn reported(versions: &BTreeMap<String, String>, typed: Option<&TypeSnapshot>) -> Self {
        let held = versions
            .iter()
            .map(
                |(name, version)| match typed.and_then(|t| t.resources().get(name.as_str())) {
                    Some(r) if *r.version == **version => {
                        (Arc::clone(&r.name), Arc::clone(&r.version))
                    }
                    Some(r) => (Arc::clone(&r.name), Arc::from(version.as_str())),
                    None => (Arc::from(name.as_str()), Arc::from(version.as_str())),
                },
            )
            .collect();
        // A BTreeMap iterates in name order: the vector is sorted already.
        Self(held)
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(name))
    }

    fn contains(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    fn get(&self, name: &str) -> Option<&Arc<str>> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    fn iter(&self) -> impl Iterator<Item = &(Arc<str>, Arc<str>)> {
        self.0.iter()
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let before = self.0.len();
        self.0.retain(|(name, _)| keep(name));
        if self.0.len() < before {
            self.0.shrink_to_fit();
        }
    }

    /// Applies an acknowledged response's changes (sorted by name) in one merge pass.
    fn apply(&mut self, changes: Vec<Change>) {
        let mut merged = Vec::with_capacity(self.0.len() + changes.len());
        let mut old = std::mem::take(&mut self.0).into_iter().peekable();
        for (name, version) in changes {
            while let Some(kept) = old.next_if(|(k, _)| *k < name) {
                merged.push(kept);
            }
            // The old version of a changed or removed resource is dropped.
            old.next_if(|(k, _)| *k == name);
            if let Some(version) = version {
                merged.push((name, version));
            }
        }
        merged.extend(old);
        merged.shrink_to_fit();
        self.0 = merged;
    }
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<Arc<str>>,
    /// The version of every resource the proxy holds, as far as it has acknowledged.
    known: Held,
    last_nonce: Option<String>,
    in_flight: Option<InFlight>,
    /// A response is owed even if nothing differs (first request, new names).
    owed: bool,
    acked: Option<Arc<str>>,
    rejected: RejectedVersions,
    /// Names to send again even though the proxy holds their version: the endpoints of
    /// clusters just sent, since Envoy re-creates a changed cluster and waits for them.
    resend: BTreeSet<Arc<str>>,
}

impl TypeState {
    fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// The snapshot's own string for a name it holds, or a string of the stream's own.
fn shared_name(name: &str, typed: Option<&TypeSnapshot>) -> Arc<str> {
    match typed.and_then(|t| t.resources().get_key_value(name)) {
        Some((shared, _)) => Arc::clone(shared),
        None => Arc::from(name),
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
        let typed = snapshot.map(|s| s.of_type(kind));
        let first = !self.types.contains_key(&kind);
        let st = self.types.entry(kind).or_default();
        if first {
            // What the proxy kept from an earlier stream (or server) is what it holds now.
            st.known = Held::reported(&req.initial_resource_versions, typed);
            // The legacy wildcard: a first request naming nothing subscribes to everything.
            st.wildcard = req.subscribe.is_empty();
            st.owed = true;
        } else if !req.response_nonce.is_empty() {
            if st.last_nonce.as_deref() == Some(req.response_nonce.as_str()) {
                if let Some(flight) = st.in_flight.take() {
                    match &req.error {
                        Some(message) => {
                            st.rejected.insert(flight.system_version.to_string());
                            out.nack = Some(Rejection {
                                kind,
                                version: flight.system_version.to_string(),
                                message: message.clone(),
                            });
                        }
                        None => {
                            st.known.apply(flight.changes);
                            out.ack = Some(Ack {
                                kind,
                                version: flight.system_version.to_string(),
                            });
                            st.acked = Some(flight.system_version);
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
            } else if !st.names.contains(name.as_str()) {
                st.names.insert(shared_name(name, typed));
                if !st.known.contains(name) {
                    st.owed = true;
                }
            }
        }
        for name in &req.unsubscribe {
            if name == "*" {
                st.wildcard = false;
            } else {
                st.names.remove(name.as_str());
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
        known.retain(|name| *wildcard || names.contains(name));
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
                .extend(clusters.resources.iter().map(|r| Arc::clone(&r.name)));
        }
    }

    #[cfg(test)]
    pub fn acked(&self, kind: ResourceType) -> Option<&str> {
        self.types.get(&kind)?.acked.as_deref()
    }

    /// Every name and version a type's state holds, for tests of what is shared.
    #[cfg(test)]
    fn held(&self, kind: ResourceType) -> Vec<(Arc<str>, Arc<str>)> {
        self.types
            .get(&kind)
            .map(|st| st.known.iter().cloned().collect())
            .unwrap_or_default()
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
    let mut gone: Vec<&Arc<str>> = Vec::new();
    let mut held = st.known.iter().peekable();
    for (name, r) in typed.resources() {
        while let Some((k, _)) = held.next_if(|(k, _)| k < name) {
            gone.push(k);
        }
        let version = held.next_if(|(k, _)| k == name).map(|(_, v)| v);
        if st.subscribed(name) && (version != Some(&r.version) || resend(st, name)) {
            resources.push(r.clone());
        }
    }
    gone.extend(held.map(|(k, _)| k));
    // Names asked for that the snapshot lacks but still serves (an empty runtime layer).
    let stand_ins: BTreeMap<Arc<str>, VersionedResource> = st
        .names
        .iter()
        .filter(|n| !typed.resources().contains_key(&***n))
        .filter_map(|n| snapshot.requested(kind, n))
        .map(|r| (Arc::clone(&r.name), r))
        .collect();
    resources.extend(
        stand_ins
            .values()
            .filter(|r| st.known.get(&r.name) != Some(&r.version) || resend(st, &r.name))
            .cloned(),
    );
    let removed: Vec<Arc<str>> = gone
        .into_iter()
        .filter(|name| !stand_ins.contains_key(*name))
        .cloned()
        .collect();
    if !st.resend.is_empty() {
        for r in &resources {
            st.resend.remove(&r.name);
        }
    }
    if resources.is_empty() && removed.is_empty() && !st.owed {
        return None;
    }
    st.owed = false;
    let nonce = nonces.next();
    let mut changes: Vec<Change> = resources
        .iter()
        .map(|r| (Arc::clone(&r.name), Some(Arc::clone(&r.version))))
        .chain(removed.iter().map(|n| (Arc::clone(n), None)))
        .collect();
    // Sent and removed names are distinct; the stand-ins and removals follow the snapshot's.
    changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    st.last_nonce = Some(nonce.clone());
    st.in_flight = Some(InFlight {
        system_version: Arc::clone(typed.shared_version()),
        changes,
    });
    Some(DeltaResponse {
        kind,
        system_version: typed.version().to_owned(),
        nonce,
        resources,
        removed: removed.iter().map(|n| n.to_string()).collect(),
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
        let a_version = s.of_type(CDS).resources()["a"].version.to_string();
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
            .map(|(n, r)| (n.to_string(), r.version.to_string()))
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

    #[test]
    fn what_the_proxy_holds_is_the_snapshots_strings_not_copies() {
        let s1 = mk_snapshot(EDS, &[("a", "1"), ("b", "1"), ("c", "1")]);
        let shared = |s: &Snapshot, name: &str| {
            let r = &s.of_type(EDS).resources()[name];
            (Arc::clone(&r.name), Arc::clone(&r.version))
        };
        let same = |held: &(Arc<str>, Arc<str>), expected: &(Arc<str>, Arc<str>)| {
            Arc::ptr_eq(&held.0, &expected.0) && Arc::ptr_eq(&held.1, &expected.1)
        };
        let mut st = DeltaState::default();
        // "zz" is not in the snapshot: the stream keeps a string of its own for it.
        let r1 = st
            .on_request(&mk_req(EDS, &["a", "b", "zz"], ""), Some(&s1))
            .response
            .unwrap();
        st.on_request(&ack(&r1), Some(&s1));
        let held = st.held(EDS);
        assert_eq!(held.len(), 2);
        assert!(same(&held[0], &shared(&s1, "a")));
        assert!(same(&held[1], &shared(&s1, "b")));
        let types = &st.types[&EDS];
        let subscribed: Vec<&Arc<str>> = types.names.iter().collect();
        assert_eq!(subscribed.len(), 3);
        assert!(Arc::ptr_eq(subscribed[0], &shared(&s1, "a").0));
        assert!(!Arc::ptr_eq(subscribed[2], &shared(&s1, "b").0));
        assert_eq!(&**subscribed[2], "zz");
        assert!(Arc::ptr_eq(
            types.acked.as_ref().unwrap(),
            s1.of_type(EDS).shared_version()
        ));

        // "a" changes and "zz" appears: after the ACK the stream points into the new
        // snapshot for them, and still into the old one for "b", which did not change.
        let s2 = mk_snapshot(EDS, &[("a", "2"), ("b", "1"), ("zz", "1")]);
        let r2 = st.on_snapshot(&s2).remove(0);
        assert_eq!(names(&r2), ["a", "zz"]);
        st.on_request(&ack(&r2), Some(&s2));
        let held = st.held(EDS);
        assert_eq!(held.len(), 3);
        assert!(same(&held[0], &shared(&s2, "a")));
        assert!(same(&held[1], &shared(&s1, "b")));
        assert!(same(&held[2], &shared(&s2, "zz")));

        // A reconnecting proxy's reported versions share the snapshot's where they match.
        let mut st = DeltaState::default();
        let req = DeltaRequest {
            initial_resource_versions: [
                (
                    "a".to_string(),
                    s2.of_type(EDS).resources()["a"].version.to_string(),
                ),
                ("b".to_string(), "old".to_string()),
                ("gone".to_string(), "x".to_string()),
            ]
            .into(),
            ..mk_req(EDS, &["a", "b", "gone"], "")
        };
        let r = st.on_request(&req, Some(&s2)).response.unwrap();
        assert_eq!(
            (names(&r), r.removed.clone()),
            (vec!["b"], vec!["gone".to_string()])
        );
        let held = st.held(EDS);
        assert!(same(&held[0], &shared(&s2, "a")));
        assert!(Arc::ptr_eq(&held[1].0, &shared(&s2, "b").0));
        assert_eq!(
            (&*held[1].1, &*held[2].0, &*held[2].1),
            ("old", "gone", "x")
        );
        st.on_request(&ack(&r), Some(&s2));
        let held = st.held(EDS);
        assert_eq!(held.len(), 2);
        assert!(same(&held[1], &shared(&s2, "b")));
    }

    fn subscribe_versions_only(req: &DeltaRequest) -> DeltaRequest {
        DeltaRequest {
            subscribe: vec!["layer-0".into()],
            initial_resource_versions: req.initial_resource_versions.clone(),
            ..req.clone()
        }
    }
}
