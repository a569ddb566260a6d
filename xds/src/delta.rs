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
use super::protocol::{Bounds, Ignored, Nonces, Outcome, PUSH_ORDER, RejectedVersions, admit};

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
    pub resources: Vec<Arc<VersionedResource>>,
    pub removed: Vec<String>,
    /// Some resources are stand-ins made for names the snapshot lacks (empty runtime
    /// layers): the response is the stream's own and is not remembered with the snapshot.
    pub stand_ins: bool,
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
    /// where they are the same; and the bytes of the strings that are the stream's own.
    fn reported(
        versions: &BTreeMap<String, String>,
        typed: Option<&TypeSnapshot>,
    ) -> (Self, usize) {
        let mut own = 0usize;
        let held = versions
            .iter()
            .map(
                |(name, version)| match typed.and_then(|t| t.resources().get(name.as_str())) {
                    Some(r) if *r.version == **version => {
                        (Arc::clone(&r.name), Arc::clone(&r.version))
                    }
                    Some(r) => {
                        own = own.saturating_add(version.len());
                        (Arc::clone(&r.name), Arc::from(version.as_str()))
                    }
                    None => {
                        own = own.saturating_add(name.len() + version.len());
                        (Arc::from(name.as_str()), Arc::from(version.as_str()))
                    }
                },
            )
            .collect();
        // A BTreeMap iterates in name order: the vector is sorted already.
        (Self(held), own)
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
        if self.replace_versions(&changes) {
            return;
        }
        let mut merged = Vec::with_capacity(self.0.len() + changes.len());
        let mut old = std::mem::take(&mut self.0).into_iter().peekable();
        for (name, version) in changes {
            while let Some(kept) = old.next_if(|(k, _)| by_name(k, &name).is_lt()) {
                merged.push(kept);
            }
            // The old version of a changed or removed resource is dropped.
            old.next_if(|(k, _)| by_name(k, &name).is_eq());
            if let Some(version) = version {
                merged.push((name, version));
            }
        }
        merged.extend(old);
        merged.shrink_to_fit();
        self.0 = merged;
    }

    /// What most pushes do: new versions of names the proxy holds, nothing added or removed.
    /// Those are set in place (no new vector per ACK); false, changing nothing, otherwise.
    fn replace_versions(&mut self, changes: &[Change]) -> bool {
        let mut from = 0;
        for (name, version) in changes {
            match (version, position(&self.0, from, name)) {
                (Some(_), Some(at)) => from = at + 1,
                _ => return false,
            }
        }
        let mut from = 0;
        for (name, version) in changes {
            if let (Some(version), Some(at)) = (version, position(&self.0, from, name)) {
                self.0[at].1 = Arc::clone(version);
                from = at + 1;
            }
        }
        true
    }
}

/// Where `name` is in `held` (sorted by name), looking from `from` on.
fn position(held: &[(Arc<str>, Arc<str>)], from: usize, name: &Arc<str>) -> Option<usize> {
    let rest = held.get(from..)?;
    let at = from
        + rest
            .iter()
            .take_while(|(k, _)| by_name(k, name).is_lt())
            .count();
    held.get(at)
        .is_some_and(|(k, _)| by_name(k, name).is_eq())
        .then_some(at)
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
    /// The bytes of what the stream keeps of its own for this type: the subscribed names, and
    /// the names and versions reported at the start that the snapshot did not share (counted
    /// until the stream ends, though they may be dropped earlier).
    bytes: usize,
    /// The proxy may hold names it is no longer subscribed to: it reported them at the start,
    /// unsubscribed since, or is about to acknowledge them after unsubscribing. Until they are
    /// forgotten, every name held is one subscribed to, which [`differences`] relies on.
    narrowed: bool,
}

impl TypeState {
    fn subscribed(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// The first request of the type on this stream.
    fn start(&mut self, req: &DeltaRequest, typed: Option<&TypeSnapshot>) {
        // What the proxy kept from an earlier stream (or server) is what it holds now.
        let (known, reported) = Held::reported(&req.initial_resource_versions, typed);
        self.known = known;
        self.bytes = reported;
        // The legacy wildcard: a first request naming nothing subscribes to everything.
        self.wildcard = req.subscribe.is_empty();
        self.owed = true;
        self.narrowed = true;
    }

    /// Settles the response in flight, if any: on an ACK the proxy holds what it carried.
    /// A NACK below the threshold leaves what the proxy holds as it was: the next response
    /// carries the rejected resources again.
    fn settle(
        &mut self,
        kind: ResourceType,
        error: Option<&str>,
        nack_threshold: u8,
        out: &mut Outcome<DeltaResponse>,
    ) {
        if let Some(flight) = self.in_flight.take()
            && out.settle(
                kind,
                &flight.system_version,
                error,
                &mut self.rejected,
                nack_threshold,
            )
        {
            self.known.apply(flight.changes);
            self.acked = Some(flight.system_version);
        }
    }

    /// Applies the request's subscribes and unsubscribes; a name the proxy does not hold
    /// (or a wildcard it did not have) is owed a response.
    fn change_subscription(&mut self, req: &DeltaRequest, typed: Option<&TypeSnapshot>) {
        for name in &req.subscribe {
            if name == "*" {
                self.owed |= !self.wildcard;
                self.wildcard = true;
            } else if !self.names.contains(name.as_str()) {
                self.names.insert(shared_name(name, typed));
                self.bytes = self.bytes.saturating_add(name.len());
                if !self.known.contains(name) {
                    self.owed = true;
                }
            }
        }
        for name in &req.unsubscribe {
            if name == "*" {
                self.narrowed |= self.wildcard;
                self.wildcard = false;
            } else if self.names.remove(name.as_str()) {
                self.bytes = self.bytes.saturating_sub(name.len());
                self.narrowed = true;
            }
        }
    }

    /// The proxy drops what it unsubscribed from; forget it so a later subscribe resends.
    /// (Only after the subscription narrowed: looking every held name up on every ACK showed
    /// in profiles of 2,000 streams.)
    fn forget_unsubscribed(&mut self) {
        if !self.narrowed {
            return;
        }
        let Self {
            known,
            wildcard,
            names,
            ..
        } = self;
        known.retain(|name| *wildcard || names.contains(name));
        // A response in flight may still carry a name unsubscribed since it was sent: its
        // ACK adds that name, to be forgotten then.
        self.narrowed = self.in_flight.is_some();
    }
}

/// The order of two names, without reading them when they are the same string.
fn by_name(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
    if Arc::ptr_eq(a, b) {
        std::cmp::Ordering::Equal
    } else {
        a.cmp(b)
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
    /// What a request may carry, and the subscription may hold, per type.
    bounds: Bounds,
}

impl Default for DeltaState {
    fn default() -> Self {
        Self::with_bounds(Bounds::of(&crate::limits::Limits::default()))
    }
}

impl DeltaState {
    pub fn with_bounds(bounds: Bounds) -> Self {
        Self {
            types: HashMap::new(),
            nonces: Nonces::default(),
            bounds,
        }
    }

    #[cfg(test)]
    pub fn with_max_names(max_names: usize) -> Self {
        Self::with_bounds(Bounds::with_max_names(max_names))
    }

    /// The bytes the stream keeps of its own, every type together.
    pub fn held_bytes(&self) -> usize {
        self.types.values().map(|st| st.bytes).sum()
    }

    /// Handles one request against the current snapshot (if any).
    pub fn on_request(
        &mut self,
        req: &DeltaRequest,
        snapshot: Option<&Snapshot>,
    ) -> Outcome<DeltaResponse> {
        let names = req.subscribe.len().max(req.initial_resource_versions.len());
        let strings = req.subscribe.iter().map(String::as_str).chain(
            req.initial_resource_versions
                .iter()
                .flat_map(|(n, v)| [n.as_str(), v.as_str()]),
        );
        let kind = match admit(&req.type_url, names, strings, &self.bounds) {
            Ok(kind) => kind,
            Err(why) => return why.into(),
        };
        let mut out = Outcome::default();
        let typed = snapshot.map(|s| s.of_type(kind));
        let first = !self.types.contains_key(&kind);
        let st = self.types.entry(kind).or_default();
        if first {
            st.start(req, typed);
        } else if !req.response_nonce.is_empty() {
            if st.last_nonce.as_deref() == Some(req.response_nonce.as_str()) {
                let threshold = snapshot.map_or(1, Snapshot::nack_threshold);
                st.settle(kind, req.error.as_deref(), threshold, &mut out);
            } else if req.subscribe.is_empty() && req.unsubscribe.is_empty() {
                out.ignored = Some(Ignored::StaleNonce);
                return out;
            }
            // A stale nonce does not void the subscription changes the request carries.
        }
        st.change_subscription(req, typed);
        // The subscription grows across requests; it is bounded as a whole.
        if st.names.len() > self.bounds.max_names {
            out.exceeded = Some(Limit::NamesPerType);
            return out;
        }
        if let Err(limit) = self.bounds.check_bytes(st.bytes) {
            out.exceeded = Some(limit);
            return out;
        }
        st.forget_unsubscribed();
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
    if st
        .rejected
        .blocks(typed.version(), snapshot.nack_threshold())
    {
        return None;
    }
    let (resources, removed, stand_ins) = differences(st, kind, snapshot, typed);
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
    // Sent and removed names are distinct. The snapshot's come in name order; the stand-ins
    // and removals follow them, each in name order, so only then is there sorting to do.
    if stand_ins || !removed.is_empty() {
        changes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    }
    debug_assert!(changes.is_sorted_by(|a, b| a.0 < b.0));
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
        stand_ins,
    })
}

/// What a response of `kind` carries: the subscribed resources the proxy lacks, holds at
/// another version or is to be sent again, and the names it holds that are gone; and
/// whether any resource sent is a stand-in.
fn differences(
    st: &TypeState,
    kind: ResourceType,
    snapshot: &Snapshot,
    typed: &TypeSnapshot,
) -> (Vec<Arc<VersionedResource>>, Vec<Arc<str>>, bool) {
    let resend = |st: &TypeState, name: &str| !st.resend.is_empty() && st.resend.contains(name);
    // One pass over the snapshot and what the proxy holds, both sorted by name: what it
    // lacks or holds at another version, and what it holds that the snapshot no longer has.
    // (Looking every name up in the other map showed in profiles of 1,000 streams.)
    // Names and versions the proxy got from a snapshot are that snapshot's strings: the same
    // pointer is the same string, and only strings from different places are compared.
    let mut resources: Vec<Arc<VersionedResource>> = Vec::new();
    let mut gone: Vec<&Arc<str>> = Vec::new();
    let mut held = st.known.iter().peekable();
    for (name, r) in typed.resources() {
        while let Some((k, _)) = held.next_if(|(k, _)| by_name(k, name).is_lt()) {
            gone.push(k);
        }
        let send = match held.next_if(|(k, _)| by_name(k, name).is_eq()) {
            // Every name held is one subscribed to, unless the subscription narrowed and the
            // held names are yet to be forgotten.
            Some((_, version)) => {
                (!st.narrowed || st.subscribed(name)) && (*version != r.version || resend(st, name))
            }
            None => st.subscribed(name),
        };
        if send {
            resources.push(Arc::clone(r));
        }
    }
    gone.extend(held.map(|(k, _)| k));
    // Names asked for that the snapshot lacks but still serves (an empty runtime layer).
    // (Asking only where a stand-in can be: a lookup per subscribed name per push showed in
    // profiles of 2,000 streams.)
    let stand_ins: BTreeMap<Arc<str>, Arc<VersionedResource>> = st
        .names
        .iter()
        .filter(|n| snapshot.stands_in(kind, n))
        .filter_map(|n| snapshot.requested_shared(kind, n))
        .map(|r| (Arc::clone(&r.name), r))
        .collect();
    let sent = resources.len();
    resources.extend(
        stand_ins
            .values()
            .filter(|r| st.known.get(&r.name) != Some(&r.version) || resend(st, &r.name))
            .cloned(),
    );
    let sends_stand_ins = resources.len() > sent;
    let removed: Vec<Arc<str>> = gone
        .into_iter()
        .filter(|name| !stand_ins.contains_key(*name))
        .cloned()
        .collect();
    (resources, removed, sends_stand_ins)
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
