//! The delta machine: what the proxy holds, subscriptions, NACKs, nonces, warming, stand-ins, limits and shared strings.

use bytes::Bytes;

use super::*;
use crate::protocol::Rejection;
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
fn a_name_unsubscribed_while_its_response_is_in_flight_is_forgotten_at_the_ack() {
    let s = mk_snapshot(EDS, &[("a", "1"), ("b", "1")]);
    let mut st = DeltaState::default();
    let r1 = st
        .on_request(&mk_req(EDS, &["a", "b"], ""), Some(&s))
        .response
        .unwrap();
    assert_eq!(names(&r1), ["a", "b"]);
    // The proxy drops "a" before it acknowledges the response that carried it.
    let unsub = DeltaRequest {
        unsubscribe: vec!["a".into()],
        ..mk_req(EDS, &[], "")
    };
    assert_eq!(st.on_request(&unsub, Some(&s)).response, None);
    assert!(st.on_request(&ack(&r1), Some(&s)).ack.is_some());
    assert_eq!(
        st.held(EDS)
            .iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // A change to "a" is not sent, one to "b" is; and the next ACK keeps "a" away.
    let s2 = mk_snapshot(EDS, &[("a", "2"), ("b", "2")]);
    let r2 = st.on_snapshot(&s2).remove(0);
    assert_eq!(names(&r2), ["b"]);
    assert!(r2.removed.is_empty());
    st.on_request(&ack(&r2), Some(&s2));
    let s3 = mk_snapshot(EDS, &[("a", "3"), ("b", "2")]);
    assert!(st.on_snapshot(&s3).is_empty());
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
            message: "bad cluster".into(),
            counts: true,
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
fn below_the_nack_threshold_the_rejected_resources_are_sent_again() {
    let good = mk_snapshot(CDS, &[("a", "good")]);
    let bad = mk_snapshot(CDS, &[("a", "bad"), ("b", "bad")]).with_nack_threshold(2);
    let mut st = DeltaState::default();
    let r1 = st
        .on_request(&mk_req(CDS, &[], ""), Some(&good))
        .response
        .unwrap();
    st.on_request(&ack(&r1), Some(&good));
    let r2 = st.on_snapshot(&bad).remove(0);
    let nack = |r: &DeltaResponse| DeltaRequest {
        error: Some("bad cluster".into()),
        ..ack(r)
    };
    let out = st.on_request(&nack(&r2), Some(&bad));
    assert!(!out.nack.unwrap().counts);
    let again = out.response.expect("sent again below the threshold");
    assert_eq!(names(&again), ["a", "b"]);
    assert_eq!(again.system_version, bad.version(CDS));
    let out = st.on_request(&nack(&again), Some(&bad));
    assert!(out.nack.unwrap().counts);
    assert_eq!(out.response, None);
    assert!(st.on_snapshot(&bad).is_empty());
    assert_eq!(st.acked(CDS), Some(good.version(CDS)));
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

#[test]
fn subscriptions_are_bounded_in_bytes_and_names_in_length() {
    let empty = mk_snapshot(CDS, &[]);
    let bounds = Bounds {
        max_names: 1000,
        max_name_bytes: 100,
        max_bytes: 1000,
    };
    let name = |i: usize| format!("{i:03}-{}", "x".repeat(96));
    let mut st = DeltaState::with_bounds(bounds);
    let mut last = st.on_request(&mk_req(CDS, &[], ""), Some(&empty)).response;
    // Ten names of 100 bytes fill the budget; unsubscribing gives bytes back.
    for i in 0..10 {
        let req = DeltaRequest {
            subscribe: vec![name(i)],
            ..last.as_ref().map(ack).unwrap_or_default()
        };
        let out = st.on_request(&req, Some(&empty));
        assert_eq!(out.exceeded, None, "name {i}");
        last = out.response.or(last);
    }
    assert_eq!(st.held_bytes(), 1000);
    let req = DeltaRequest {
        type_url: CDS.type_url().into(),
        unsubscribe: vec![name(0)],
        subscribe: vec![name(10)],
        ..Default::default()
    };
    assert_eq!(st.on_request(&req, Some(&empty)).exceeded, None);
    let over = mk_req(CDS, &[&name(11)], "");
    assert_eq!(
        st.on_request(&over, Some(&empty)).exceeded,
        Some(Limit::SubscriptionBytesPerType)
    );
    // What a proxy reports holding counts too, and so does each string's length.
    let mut st = DeltaState::with_bounds(bounds);
    let reported = DeltaRequest {
        type_url: CDS.type_url().into(),
        initial_resource_versions: (0..11).map(|i| (name(i), "v".into())).collect(),
        ..Default::default()
    };
    let out = st.on_request(&reported, Some(&empty));
    assert_eq!(out.exceeded, Some(Limit::SubscriptionBytesPerType));
    let long = mk_req(CDS, &[&format!("{}y", name(0))], "");
    let out = DeltaState::with_bounds(bounds).on_request(&long, Some(&empty));
    assert_eq!(out.exceeded, Some(Limit::NameSize));
    assert_eq!(out.response, None);
}

#[test]
fn a_stand_in_the_proxy_holds_shares_its_subscribed_name() {
    let rtds = ResourceType::Runtime;
    let empty = mk_snapshot(CDS, &[]);
    let mut st = DeltaState::default();
    let r = st
        .on_request(&mk_req(rtds, &["layer"], ""), Some(&empty))
        .response
        .unwrap();
    assert!(r.stand_ins, "an empty layer stands in for the name");
    st.on_request(&ack(&r), Some(&empty));
    let held = st.held(rtds);
    let subscribed = st.types[&rtds].names.first().unwrap();
    // The name bytes are counted once (in the subscription), so they are kept once.
    assert!(Arc::ptr_eq(&held[0].0, subscribed));
}

#[test]
fn an_acknowledged_push_of_new_versions_only_is_set_in_place_and_any_other_is_merged() {
    let s = |v: &str| -> Arc<str> { Arc::from(v) };
    let (a, b, c) = (s("a"), s("b"), s("c"));
    let mut held = Held(vec![
        (Arc::clone(&a), s("1")),
        (Arc::clone(&b), s("1")),
        (Arc::clone(&c), s("1")),
    ]);
    let before = held.0.as_ptr();
    held.apply(vec![
        (Arc::clone(&a), Some(s("2"))),
        (Arc::clone(&c), Some(s("2"))),
    ]);
    assert_eq!(
        held.0.as_ptr(),
        before,
        "a new vector for new versions only"
    );
    let versions = |h: &Held| {
        h.iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(versions(&held), ["a=2", "b=1", "c=2"]);
    // A name added, one removed: merged, and nothing half-applied.
    held.apply(vec![
        (s("a"), None),
        (s("ab"), Some(s("1"))),
        (s("c"), Some(s("3"))),
    ]);
    assert_eq!(versions(&held), ["ab=1", "b=1", "c=3"]);
    // A removal alone, and a name the proxy does not hold: merged as well.
    held.apply(vec![(s("b"), None)]);
    held.apply(vec![(s("c"), Some(s("4"))), (s("d"), Some(s("1")))]);
    assert_eq!(versions(&held), ["ab=1", "c=4", "d=1"]);
}
