//! The state-of-the-world protocol of one ADS stream as a pure state machine: which request
//! is an ACK, a NACK or stale, and when a type gets a response (Istio's `ShouldRespond`).
//! A type has at most one response in flight; changes made meanwhile are sent, newest only,
//! once Envoy answers, so a slow proxy never gets a backlog.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use sha2::{Digest, Sha256};

use crate::resource::{Resource, ResourceType};

use super::cache::Snapshot;
use super::frame::key_part;
use super::protocol::{Ack, Bounds, Ignored, Nonces, Outcome, PUSH_ORDER, RejectedVersions, admit};

/// The parts of a `DiscoveryRequest` the protocol looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SotwRequest {
    pub type_url: String,
    pub version_info: String,
    pub resource_names: Vec<String>,
    pub response_nonce: String,
    /// `error_detail.message` when the request is a NACK.
    pub error: Option<String>,
}

/// A response to send. It names what it holds (every resource of the type, or those of the
/// names subscribed) rather than holding it: its resources are taken from the snapshot it was
/// decided on only when no stream of that snapshot has had the same response encoded yet, so a
/// push to many proxies that subscribe alike costs one lookup per proxy, not one per resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SotwResponse {
    pub kind: ResourceType,
    pub version: String,
    pub nonce: String,
    selection: Arc<Subscription>,
}

impl SotwResponse {
    /// The resources it holds of `snapshot` (the one it was decided on), in name order.
    pub fn resources(&self, snapshot: &Snapshot) -> Vec<Resource> {
        if self.selection.wildcard {
            return snapshot
                .of_type(self.kind)
                .resources()
                .values()
                .map(|r| r.resource.clone())
                .collect();
        }
        self.selection
            .names
            .iter()
            .filter_map(|n| snapshot.requested(self.kind, n).map(|r| r.resource.clone()))
            .collect()
    }

    /// Whether some of its resources are stand-ins the snapshot lacks (empty runtime layers
    /// made for names the proxy asked for): such a response is the stream's own and is not
    /// remembered with the snapshot.
    pub fn has_stand_ins(&self, snapshot: &Snapshot) -> bool {
        !self.selection.wildcard
            && self
                .selection
                .names
                .iter()
                .any(|n| snapshot.stands_in(self.kind, n))
    }

    /// A digest of what it selects (the wildcard, or the names): with the type and the
    /// version, it says exactly what the response holds within one snapshot.
    pub fn selection(&self) -> &[u8; 32] {
        &self.selection.digest
    }
}

/// What a proxy asked for of one type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
    /// SHA-256 of the two above (names as memo key parts); computed once per subscription.
    digest: [u8; 32],
}

#[derive(Debug, Default)]
struct TypeState {
    subscription: Arc<Subscription>,
    last_nonce: Option<String>,
    /// The version of the response Envoy has not answered yet.
    in_flight: Option<String>,
    /// Counts changes of `subscription`, so that what a response was built from is cheap
    /// to remember.
    generation: u64,
    /// What the last response was built from (version, subscription generation), to tell
    /// whether a new one is needed.
    sent: Option<(String, u64)>,
    acked: Option<String>,
    rejected: RejectedVersions,
    /// Answer the next request (or snapshot) even if nothing changed: set on endpoints when
    /// clusters are sent, because Envoy re-creates a changed cluster and it waits (warming)
    /// for its endpoints, re-requesting the version it already has (Istio's AlwaysRespond).
    always_respond: bool,
    /// The bytes of the subscription's names.
    bytes: usize,
}

impl TypeState {
    /// An ACK repeats the subscription: a new one is built only when it differs.
    fn resubscribe(&mut self, names: &[String], first: bool) {
        let may_be_legacy_wildcard = first || self.subscription.wildcard;
        if !self.subscription.is(names, may_be_legacy_wildcard) {
            self.subscription = shared(subscription(names, may_be_legacy_wildcard));
            self.generation = self.generation.wrapping_add(1);
            self.bytes = self.subscription.names.iter().map(String::len).sum();
        }
    }
}

/// One SotW stream's protocol state.
#[derive(Debug)]
pub struct SotwState {
    types: HashMap<ResourceType, TypeState>,
    nonces: Nonces,
    /// What a request may carry, and the subscription may hold, per type.
    bounds: Bounds,
}

impl Default for SotwState {
    fn default() -> Self {
        Self::with_bounds(Bounds::of(&crate::limits::Limits::default()))
    }
}

impl SotwState {
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

    /// The bytes of names the stream's subscriptions hold, every type together.
    pub fn held_bytes(&self) -> usize {
        self.types.values().map(|st| st.bytes).sum()
    }

    /// Handles one request against the current snapshot (if any).
    pub fn on_request(
        &mut self,
        req: &SotwRequest,
        snapshot: Option<&Snapshot>,
    ) -> Outcome<SotwResponse> {
        let names = req.resource_names.len();
        let strings = req.resource_names.iter().map(String::as_str);
        let kind = match admit(&req.type_url, names, strings, &self.bounds) {
            Ok(kind) => kind,
            Err(why) => return why.into(),
        };
        let mut out = Outcome::default();
        let first = !self.types.contains_key(&kind);
        let st = self.types.entry(kind).or_default();
        // A nonce from an earlier response (or from before a reconnect, when the type is new
        // to this stream) is stale: Envoy already has, or will get, a newer response.
        if !first && !req.response_nonce.is_empty() {
            if st.last_nonce.as_deref() != Some(req.response_nonce.as_str()) {
                out.ignored = Some(Ignored::StaleNonce);
                return out;
            }
            let threshold = snapshot.map_or(1, Snapshot::nack_threshold);
            if let Some(version) = st.in_flight.take()
                && out.settle(
                    kind,
                    &version,
                    req.error.as_deref(),
                    &mut st.rejected,
                    threshold,
                )
            {
                st.acked = Some(version);
            }
            // Rejected fewer times than the threshold: the same version goes again.
            if out.nack.as_ref().is_some_and(|n| !n.counts) {
                st.always_respond = true;
            }
        }
        st.resubscribe(&req.resource_names, first);
        if let Err(limit) = self.bounds.check_bytes(st.bytes) {
            out.exceeded = Some(limit);
            return out;
        }
        // A proxy back from a broken stream (to this replica or another: versions are
        // content hashes, the same on every replica) that already has the current version of
        // a wildcard type gets no response: it holds exactly what one would carry. It is
        // recorded as acked. Named types are answered all the same: a subscription change in
        // flight when the old stream broke may never have reached the proxy.
        let version = snapshot.map(|s| s.version(kind));
        if first
            && st.subscription.wildcard
            && !req.version_info.is_empty()
            && version == Some(req.version_info.as_str())
        {
            st.sent = Some((req.version_info.clone(), st.generation));
            st.acked = Some(req.version_info.clone());
            out.ack = Some(Ack {
                kind,
                version: req.version_info.clone(),
            });
            return out;
        }
        // Otherwise the first request of a type always gets the current state (it may be the
        // only answer that completes the proxy's initialisation).
        out.response = respond(st, kind, snapshot, first, &mut self.nonces);
        if out.response.is_some() && kind == ResourceType::Cluster {
            out.also.extend(self.endpoints_after_clusters(snapshot));
        }
        out
    }

    fn endpoints_after_clusters(&mut self, snapshot: Option<&Snapshot>) -> Option<SotwResponse> {
        let eds = self.types.get_mut(&ResourceType::Endpoint)?;
        eds.always_respond = true;
        respond(
            eds,
            ResourceType::Endpoint,
            snapshot,
            false,
            &mut self.nonces,
        )
    }

    /// Responses a new snapshot calls for, in push order.
    pub fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<SotwResponse> {
        let mut out = Vec::new();
        for kind in PUSH_ORDER {
            let Some(st) = self.types.get_mut(&kind) else {
                continue;
            };
            if let Some(r) = respond(st, kind, Some(snapshot), false, &mut self.nonces) {
                out.push(r);
                if kind == ResourceType::Cluster
                    && let Some(eds) = self.types.get_mut(&ResourceType::Endpoint)
                {
                    // Endpoints come later in the push order and pick this up.
                    eds.always_respond = true;
                }
            }
        }
        out
    }

    /// The version Envoy last accepted for a type.
    #[cfg(test)]
    pub fn acked(&self, kind: ResourceType) -> Option<&str> {
        self.types.get(&kind)?.acked.as_deref()
    }
}

/// `*` subscribes to everything; so does an empty list on a type's first request (the legacy
/// wildcard of LDS/CDS) and for as long as the list stays empty after that.
fn subscription(names: &[String], may_be_legacy_wildcard: bool) -> Subscription {
    let wildcard = is_wildcard(names, may_be_legacy_wildcard);
    let names: BTreeSet<String> = names.iter().filter(|n| *n != "*").cloned().collect();
    let mut key = vec![u8::from(wildcard)];
    for name in &names {
        key_part(&mut key, name);
    }
    Subscription {
        wildcard,
        names,
        digest: Sha256::digest(&key).into(),
    }
}

/// How many distinct subscriptions the streams of the process share at most; past it, a new
/// one is its stream's own.
const MAX_SHARED_SUBSCRIPTIONS: usize = 4096;

/// The subscriptions streams hold, by digest: the replicas of a Deployment ask for the same
/// names, and each of their streams holding its own copy cost kilobytes per stream.
#[derive(Default)]
struct SharedSubscriptions {
    by_digest: HashMap<[u8; 32], Weak<Subscription>>,
    /// New subscriptions since the gone ones were last swept out; a full table is swept at
    /// most once every quarter of its size, so that a full table of live ones costs a
    /// stream changing its subscription no more than a few entries' look.
    since_sweep: usize,
}

fn subscriptions() -> &'static Mutex<SharedSubscriptions> {
    static SHARED: OnceLock<Mutex<SharedSubscriptions>> = OnceLock::new();
    SHARED.get_or_init(Mutex::default)
}

/// `sub`, or the equal subscription another stream holds.
fn shared(sub: Subscription) -> Arc<Subscription> {
    let mut shared = subscriptions().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(held) = shared.by_digest.get(&sub.digest).and_then(Weak::upgrade)
        && *held == sub
    {
        return held;
    }
    let sub = Arc::new(sub);
    shared.since_sweep = shared.since_sweep.saturating_add(1);
    if shared.by_digest.len() >= MAX_SHARED_SUBSCRIPTIONS
        && shared.since_sweep >= MAX_SHARED_SUBSCRIPTIONS / 4
    {
        shared.by_digest.retain(|_, held| held.strong_count() > 0);
        shared.since_sweep = 0;
    }
    if shared.by_digest.len() < MAX_SHARED_SUBSCRIPTIONS {
        shared.by_digest.insert(sub.digest, Arc::downgrade(&sub));
    }
    sub
}

fn is_wildcard(names: &[String], may_be_legacy_wildcard: bool) -> bool {
    names.iter().any(|n| n == "*") || (names.is_empty() && may_be_legacy_wildcard)
}

impl Subscription {
    /// Whether `subscription(names, may_be_legacy_wildcard)` would equal this one.
    /// Compares without copying a name: the request's names sorted and deduplicated (a
    /// request may repeat a name) against the set, which is sorted.
    fn is(&self, names: &[String], may_be_legacy_wildcard: bool) -> bool {
        if self.wildcard != is_wildcard(names, may_be_legacy_wildcard) {
            return false;
        }
        let mut named: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != "*")
            .collect();
        named.sort_unstable();
        named.dedup();
        named.len() == self.names.len()
            && named.iter().zip(&self.names).all(|(a, b)| *a == b.as_str())
    }
}

fn respond(
    st: &mut TypeState,
    kind: ResourceType,
    snapshot: Option<&Snapshot>,
    force: bool,
    nonces: &mut Nonces,
) -> Option<SotwResponse> {
    let snapshot = snapshot?;
    if st.in_flight.is_some() {
        return None;
    }
    let typed = snapshot.of_type(kind);
    let version = typed.version();
    if st.rejected.blocks(version, snapshot.nack_threshold()) {
        return None;
    }
    let unchanged = st
        .sent
        .as_ref()
        .is_some_and(|(v, generation)| v == version && *generation == st.generation);
    if unchanged && !force && !st.always_respond {
        return None;
    }
    st.always_respond = false;
    let nonce = nonces.next();
    st.last_nonce = Some(nonce.clone());
    st.in_flight = Some(version.to_owned());
    st.sent = Some((version.to_owned(), st.generation));
    Some(SotwResponse {
        kind,
        version: version.to_owned(),
        nonce,
        selection: Arc::clone(&st.subscription),
    })
}

#[cfg(test)]
#[path = "sotw_tests.rs"]
mod tests;
