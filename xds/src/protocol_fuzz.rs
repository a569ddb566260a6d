//! Arbitrary request and snapshot sequences through both protocol state machines: they never
//! panic, and they keep the protocol's invariants (one response in flight per type, nonces
//! never reused, a rejected version never sent again to the stream that rejected it, only
//! subscribed resources sent, subscriptions bounded).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use proptest::prelude::*;

use crate::resource::{Resource, ResourceType};

use super::cache::Snapshot;
use super::delta::{DeltaRequest, DeltaResponse, DeltaState};
use super::limits::Limit;
use super::protocol::Outcome;
use super::sotw::{SotwRequest, SotwResponse, SotwState};

const MAX_NAMES: usize = 6;

/// Three snapshots over a few names of every type, with bodies that change between them.
fn snapshots() -> Vec<Snapshot> {
    (0..3)
        .map(|generation| {
            let resources = ResourceType::ALL.into_iter().flat_map(move |kind| {
                ["a", "b", "c"]
                    .into_iter()
                    .take(1 + (generation + kind as usize) % 3)
                    .map(move |name| Resource {
                        kind,
                        name: name.into(),
                        body: Bytes::from(format!("{kind:?}/{name}/{}", generation % 2)),
                    })
            });
            Snapshot::new(resources).unwrap()
        })
        .collect()
}

fn type_url() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(ResourceType::ALL.to_vec()).prop_map(|k| k.type_url().to_owned()),
        1 => Just("type.googleapis.com/unknown".to_owned()),
        1 => "[ -~]{0,12}",
    ]
}

fn names() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(vec!["a", "b", "c", "d", "*"]).prop_map(String::from),
            1 => "[a-z*]{0,3}",
        ],
        0..(MAX_NAMES + 3),
    )
}

/// Which nonce a request answers: the last one sent for its type (a real ACK or NACK), an
/// older one, none, or garbage.
#[derive(Debug, Clone)]
enum NonceChoice {
    Last,
    Earlier(usize),
    Empty,
    Garbage(String),
}

fn nonce_choice() -> impl Strategy<Value = NonceChoice> {
    prop_oneof![
        6 => Just(NonceChoice::Last),
        1 => any::<usize>().prop_map(NonceChoice::Earlier),
        2 => Just(NonceChoice::Empty),
        1 => "[0-9]{0,3}".prop_map(NonceChoice::Garbage),
    ]
}

#[derive(Debug, Clone)]
enum Event {
    Request {
        type_url: String,
        names: Vec<String>,
        unsubscribe: Vec<String>,
        initial: Vec<(String, String)>,
        nonce: NonceChoice,
        nack: bool,
    },
    Snapshot(usize),
    NoSnapshot,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (
            type_url(),
            names(),
            names(),
            prop::collection::vec(("[a-d]", "[0-9a-f]{0,4}"), 0..4),
            nonce_choice(),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(type_url, names, unsubscribe, initial, nonce, nack)| Event::Request {
                type_url,
                names,
                unsubscribe,
                initial,
                nonce,
                nack,
            }),
        2 => (0usize..3).prop_map(Event::Snapshot),
        1 => Just(Event::NoSnapshot),
    ]
}

/// What the test knows of one type on the stream, from the responses it saw.
#[derive(Default)]
struct Seen {
    nonces: Vec<String>,
    in_flight: Option<(String, String)>,
    rejected: BTreeSet<String>,
}

impl Seen {
    fn nonce(&self, choice: &NonceChoice) -> String {
        match choice {
            NonceChoice::Last => self.nonces.last().cloned().unwrap_or_default(),
            NonceChoice::Earlier(i) if !self.nonces.is_empty() => {
                self.nonces[i % self.nonces.len()].clone()
            }
            NonceChoice::Earlier(_) | NonceChoice::Empty => String::new(),
            NonceChoice::Garbage(g) => g.clone(),
        }
    }
}

/// Checks one response against everything seen before, then records it.
fn check_response(
    seen: &mut HashMap<ResourceType, Seen>,
    all_nonces: &mut BTreeSet<String>,
    kind: ResourceType,
    version: &str,
    nonce: &str,
) -> Result<(), TestCaseError> {
    let st = seen.entry(kind).or_default();
    prop_assert!(
        st.in_flight.is_none(),
        "a second {kind:?} response while {:?} is in flight",
        st.in_flight
    );
    prop_assert!(
        !st.rejected.contains(version),
        "{kind:?} version {version} sent again after it was rejected"
    );
    prop_assert!(all_nonces.insert(nonce.to_owned()), "nonce {nonce} reused");
    st.nonces.push(nonce.to_owned());
    st.in_flight = Some((nonce.to_owned(), version.to_owned()));
    Ok(())
}

/// Checks what a request did to the in-flight bookkeeping.
fn check_outcome<R>(
    seen: &mut HashMap<ResourceType, Seen>,
    kind: Option<ResourceType>,
    nonce: &str,
    nack: bool,
    out: &Outcome<R>,
) -> Result<(), TestCaseError> {
    prop_assert!(out.ack.is_none() || out.nack.is_none());
    let Some(kind) = kind else {
        prop_assert!(out.ack.is_none() && out.nack.is_none());
        return Ok(());
    };
    let st = seen.entry(kind).or_default();
    let answered = st.in_flight.as_ref().filter(|(n, _)| n == nonce).cloned();
    match (&out.ack, &out.nack) {
        (Some(ack), None) => {
            let (_, version) = answered.clone().ok_or_else(|| {
                TestCaseError::fail(format!("ACK of {kind:?} with no response in flight"))
            })?;
            prop_assert!(!nack);
            prop_assert_eq!(&ack.version, &version);
        }
        (None, Some(rejection)) => {
            let (_, version) = answered.clone().ok_or_else(|| {
                TestCaseError::fail(format!("NACK of {kind:?} with no response in flight"))
            })?;
            prop_assert!(nack);
            prop_assert_eq!(&rejection.version, &version);
            st.rejected.insert(version);
        }
        _ => {}
    }
    if (out.ack.is_some() || out.nack.is_some()) && answered.is_some() {
        st.in_flight = None;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn sotw_sequences_keep_the_protocol_invariants(events in prop::collection::vec(event(), 1..40)) {
        let snaps = snapshots();
        let mut state = SotwState::with_max_names(MAX_NAMES);
        let mut snapshot: Option<&Snapshot> = None;
        let mut seen: HashMap<ResourceType, Seen> = HashMap::new();
        let mut nonces = BTreeSet::new();
        let mut subscribed: HashMap<ResourceType, Vec<String>> = HashMap::new();
        let record = |seen: &mut HashMap<ResourceType, Seen>,
                      nonces: &mut BTreeSet<String>,
                      subscribed: &HashMap<ResourceType, Vec<String>>,
                      r: &SotwResponse,
                      snapshot: Option<&Snapshot>|
         -> Result<(), TestCaseError> {
            check_response(seen, nonces, r.kind, &r.version, &r.nonce)?;
            let names = subscribed.get(&r.kind).cloned().unwrap_or_default();
            let wildcard = names.is_empty() || names.iter().any(|n| n == "*");
            prop_assert!(snapshot.is_some(), "a response without a snapshot");
            for res in snapshot.map(|s| r.resources(s)).unwrap_or_default() {
                prop_assert_eq!(res.kind, r.kind);
                prop_assert!(wildcard || names.contains(&res.name), "{} not subscribed", res.name);
            }
            Ok(())
        };
        for event in events {
            match event {
                Event::Snapshot(i) => {
                    snapshot = Some(&snaps[i]);
                    for r in state.on_snapshot(&snaps[i]) {
                        record(&mut seen, &mut nonces, &subscribed, &r, snapshot)?;
                    }
                }
                Event::NoSnapshot => snapshot = None,
                Event::Request { type_url, names, nonce, nack, .. } => {
                    let kind = ResourceType::from_type_url(&type_url);
                    let nonce = kind
                        .map(|k| seen.entry(k).or_default().nonce(&nonce))
                        .unwrap_or_default();
                    let req = SotwRequest {
                        type_url,
                        version_info: String::new(),
                        resource_names: names.clone(),
                        response_nonce: nonce.clone(),
                        error: nack.then(|| "rejected".to_owned()),
                    };
                    let out = state.on_request(&req, snapshot);
                    if names.len() > MAX_NAMES && kind.is_some() {
                        prop_assert_eq!(out.exceeded, Some(Limit::NamesPerType));
                        prop_assert!(out.response.is_none() && out.also.is_empty());
                        continue;
                    }
                    prop_assert_eq!(out.exceeded, None);
                    check_outcome(&mut seen, kind, &nonce, nack, &out)?;
                    if let Some(k) = kind
                        && out.ignored.is_none()
                    {
                        subscribed.insert(k, names);
                    }
                    for r in out.response.iter().chain(&out.also) {
                        record(&mut seen, &mut nonces, &subscribed, r, snapshot)?;
                    }
                }
            }
        }
    }

    #[test]
    fn delta_sequences_keep_the_protocol_invariants(events in prop::collection::vec(event(), 1..40)) {
        let snaps = snapshots();
        let mut state = DeltaState::with_max_names(MAX_NAMES);
        let mut snapshot: Option<&Snapshot> = None;
        let mut seen: HashMap<ResourceType, Seen> = HashMap::new();
        let mut nonces = BTreeSet::new();
        let record = |seen: &mut HashMap<ResourceType, Seen>,
                      nonces: &mut BTreeSet<String>,
                      r: &DeltaResponse|
         -> Result<(), TestCaseError> {
            check_response(seen, nonces, r.kind, &r.system_version, &r.nonce)?;
            let sent: BTreeSet<&str> = r.resources.iter().map(|v| v.resource.name.as_str()).collect();
            prop_assert_eq!(sent.len(), r.resources.len(), "a resource sent twice");
            for name in &r.removed {
                prop_assert!(!sent.contains(name.as_str()), "{} sent and removed", name);
            }
            for v in &r.resources {
                prop_assert_eq!(v.resource.kind, r.kind);
            }
            Ok(())
        };
        for event in events {
            match event {
                Event::Snapshot(i) => {
                    snapshot = Some(&snaps[i]);
                    for r in state.on_snapshot(&snaps[i]) {
                        record(&mut seen, &mut nonces, &r)?;
                    }
                }
                Event::NoSnapshot => snapshot = None,
                Event::Request { type_url, names, unsubscribe, initial, nonce, nack } => {
                    let kind = ResourceType::from_type_url(&type_url);
                    let nonce = kind
                        .map(|k| seen.entry(k).or_default().nonce(&nonce))
                        .unwrap_or_default();
                    let req = DeltaRequest {
                        type_url,
                        subscribe: names.clone(),
                        unsubscribe,
                        initial_resource_versions: initial.into_iter().collect::<BTreeMap<_, _>>(),
                        response_nonce: nonce.clone(),
                        error: nack.then(|| "rejected".to_owned()),
                    };
                    let out = state.on_request(&req, snapshot);
                    if out.exceeded.is_some() {
                        // Refused: the stream is closed, nothing more happens on it.
                        prop_assert_eq!(out.exceeded, Some(Limit::NamesPerType));
                        prop_assert!(out.response.is_none() && out.also.is_empty());
                        prop_assert!(kind.is_some());
                        return Ok(());
                    }
                    prop_assert!(names.len() <= MAX_NAMES || kind.is_none());
                    check_outcome(&mut seen, kind, &nonce, nack, &out)?;
                    for r in out.response.iter().chain(&out.also) {
                        record(&mut seen, &mut nonces, r)?;
                    }
                }
            }
        }
    }
}
