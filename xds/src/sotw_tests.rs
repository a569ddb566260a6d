//! The state-of-the-world machine: ACKs, NACKs, stale nonces, subscriptions, push order, warming and limits.

use bytes::Bytes;

use super::*;
use crate::limits::Limit;
use crate::protocol::Rejection;

const LDS: ResourceType = ResourceType::Listener;
const RDS: ResourceType = ResourceType::Route;

#[test]
fn a_subscription_is_the_same_only_for_the_same_set_of_names() {
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let bcd = subscription(&names(&["d", "c", "b"]), false);
    assert!(bcd.is(&names(&["b", "c", "d"]), false));
    assert!(bcd.is(&names(&["b", "d", "c", "c"]), false));
    // Found by the protocol fuzz: as many names, but repeats of one.
    assert!(!bcd.is(&names(&["b", "b", "b"]), false));
    assert!(!bcd.is(&names(&["b", "c"]), false));
    assert!(!bcd.is(&names(&["b", "c", "d", "*"]), false));
    let wildcard = subscription(&[], true);
    assert!(wildcard.is(&[], true));
    assert!(!wildcard.is(&[], false));
}

#[test]
fn streams_asking_for_the_same_names_share_one_subscription() {
    // Names no other test asks for: the subscriptions are the process's.
    let snapshot = mk_snapshot("l", &["shared-a", "shared-b"]);
    let selection = |names: &[&str]| {
        let mut st = SotwState::default();
        let resp = st
            .on_request(&mk_req(RDS, names, ""), Some(&snapshot))
            .response
            .unwrap();
        Arc::clone(&resp.selection)
    };
    let first = selection(&["shared-a", "shared-b"]);
    // The same set in another order, repeated: the same subscription, not a copy.
    assert!(Arc::ptr_eq(
        &first,
        &selection(&["shared-b", "shared-a", "shared-b"])
    ));
    assert!(!Arc::ptr_eq(&first, &selection(&["shared-a"])));
    // Once no stream holds it, it goes; a later stream builds it again.
    let digest = first.digest;
    drop(first);
    assert!(
        subscriptions()
            .lock()
            .unwrap()
            .by_digest
            .get(&digest)
            .is_none_or(|held| held.upgrade().is_none())
    );
}

fn mk_snapshot(listener_body: &str, routes: &[&str]) -> Snapshot {
    let mut resources = vec![
        Resource {
            kind: LDS,
            name: "http".into(),
            body: Bytes::from(listener_body.to_owned()),
        },
        Resource {
            kind: ResourceType::Cluster,
            name: "backend".into(),
            body: Bytes::from_static(b"cluster"),
        },
    ];
    resources.extend(routes.iter().map(|r| Resource {
        kind: RDS,
        name: (*r).into(),
        body: Bytes::from(format!("route {r}")),
    }));
    Snapshot::new(resources).unwrap()
}

fn mk_req(kind: ResourceType, names: &[&str], nonce: &str) -> SotwRequest {
    SotwRequest {
        type_url: kind.type_url().into(),
        resource_names: names.iter().map(|s| (*s).into()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn ack(resp: &SotwResponse, names: &[&str]) -> SotwRequest {
    SotwRequest {
        version_info: resp.version.clone(),
        ..mk_req(resp.kind, names, &resp.nonce)
    }
}

fn nack(resp: &SotwResponse, message: &str) -> SotwRequest {
    SotwRequest {
        error: Some(message.into()),
        ..mk_req(resp.kind, &[], &resp.nonce)
    }
}

fn names(resp: &SotwResponse, snapshot: &Snapshot) -> Vec<String> {
    resp.resources(snapshot)
        .into_iter()
        .map(|r| r.name)
        .collect()
}

#[test]
fn first_request_gets_the_current_state_and_waits_for_a_snapshot() {
    let mut st = SotwState::default();
    let out = st.on_request(&mk_req(LDS, &[], ""), None);
    assert_eq!(out.response, None, "no snapshot yet: the request waits");
    let snap = mk_snapshot("v1", &[]);
    let pushed = st.on_snapshot(&snap);
    assert_eq!(pushed.len(), 1);
    assert_eq!(pushed[0].kind, LDS);
    assert_eq!(pushed[0].version, snap.version(LDS));
    assert_eq!(names(&pushed[0], &snap), ["http"]);

    // With a snapshot already there the first request is answered at once...
    let mut st = SotwState::default();
    let out = st.on_request(&mk_req(LDS, &[], ""), Some(&snap));
    assert_eq!(out.response.unwrap().version, snap.version(LDS));
    // ...also when Envoy comes back (after a reconnect) with an older version.
    let mut st = SotwState::default();
    let req = SotwRequest {
        version_info: mk_snapshot("v0", &[]).version(LDS).into(),
        response_nonce: "from-the-old-stream".into(),
        ..mk_req(LDS, &[], "")
    };
    let out = st.on_request(&req, Some(&snap));
    assert_eq!(out.ignored, None);
    assert_eq!(out.response.unwrap().version, snap.version(LDS));
}

#[test]
fn a_proxy_back_with_the_current_version_of_a_wildcard_type_gets_no_resend() {
    let snap = mk_snapshot("v1", &["r1"]);
    let mut st = SotwState::default();
    let req = SotwRequest {
        version_info: snap.version(LDS).into(),
        response_nonce: "from-the-old-stream".into(),
        ..mk_req(LDS, &[], "")
    };
    let out = st.on_request(&req, Some(&snap));
    assert_eq!(out.response, None, "it has exactly that");
    assert_eq!(
        out.ack,
        Some(Ack {
            kind: LDS,
            version: snap.version(LDS).into()
        })
    );
    assert_eq!(st.acked(LDS), Some(snap.version(LDS)));
    // The same snapshot again sends nothing; a new one is pushed.
    assert!(st.on_snapshot(&snap).is_empty());
    let next = mk_snapshot("v2", &["r1"]);
    let pushed = st.on_snapshot(&next);
    assert_eq!(pushed.len(), 1);
    assert_eq!(pushed[0].version, next.version(LDS));
    // A named type is answered even at the same version: the names it holds may not
    // be the ones it asks for now.
    let req = SotwRequest {
        version_info: snap.version(RDS).into(),
        ..mk_req(RDS, &["r1"], "")
    };
    let out = st.on_request(&req, Some(&snap));
    assert_eq!(names(&out.response.unwrap(), &snap), ["r1"]);
}

#[test]
fn ack_is_recorded_and_nothing_is_resent_for_the_same_version() {
    let snap = mk_snapshot("v1", &[]);
    let mut st = SotwState::default();
    let resp = st
        .on_request(&mk_req(LDS, &[], ""), Some(&snap))
        .response
        .unwrap();
    let out = st.on_request(&ack(&resp, &[]), Some(&snap));
    assert_eq!(
        out.ack,
        Some(Ack {
            kind: LDS,
            version: resp.version.clone()
        })
    );
    assert_eq!(out.response, None);
    assert_eq!(st.acked(LDS), Some(resp.version.as_str()));
    assert!(st.on_snapshot(&snap).is_empty());
}

#[test]
fn stale_nonces_are_ignored() {
    let snap1 = mk_snapshot("v1", &[]);
    let snap2 = mk_snapshot("v2", &[]);
    let mut st = SotwState::default();
    let r1 = st
        .on_request(&mk_req(LDS, &[], ""), Some(&snap1))
        .response
        .unwrap();
    st.on_request(&ack(&r1, &[]), Some(&snap1));
    let r2 = st.on_snapshot(&snap2).remove(0);
    // A late request bearing the first nonce neither ACKs nor NACKs r2.
    let out = st.on_request(&nack(&r1, "late"), Some(&snap2));
    assert_eq!(out.ignored, Some(Ignored::StaleNonce));
    assert_eq!((out.ack, out.nack, out.response), (None, None, None));
    let out = st.on_request(&ack(&r2, &[]), Some(&snap2));
    assert_eq!(out.ack.unwrap().version, snap2.version(LDS));
}

#[test]
fn nack_is_recorded_and_the_rejected_version_never_resent() {
    let good = mk_snapshot("good", &[]);
    let bad = mk_snapshot("bad", &[]);
    let mut st = SotwState::default();
    let r1 = st
        .on_request(&mk_req(LDS, &[], ""), Some(&good))
        .response
        .unwrap();
    st.on_request(&ack(&r1, &[]), Some(&good));
    let r2 = st.on_snapshot(&bad).remove(0);
    let out = st.on_request(&nack(&r2, "port out of range"), Some(&bad));
    assert_eq!(
        out.nack,
        Some(Rejection {
            kind: LDS,
            version: bad.version(LDS).into(),
            message: "port out of range".into(),
            counts: true,
        })
    );
    assert_eq!(out.response, None);
    assert_eq!(st.acked(LDS), Some(good.version(LDS)));
    // The same bad version set again (e.g. re-applied) is not sent to this stream.
    assert!(st.on_snapshot(&bad).is_empty());
    // Rolling back to the good version is sent (Envoy accepts a version going back).
    let back = st.on_snapshot(&good);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].version, good.version(LDS));
    st.on_request(&ack(&back[0], &[]), Some(&good));
    assert!(st.on_snapshot(&bad).is_empty());
}

#[test]
fn below_the_nack_threshold_the_rejected_version_is_sent_again() {
    let good = mk_snapshot("good", &[]);
    let bad = mk_snapshot("bad", &[]).with_nack_threshold(3);
    let mut st = SotwState::default();
    let r1 = st
        .on_request(&mk_req(LDS, &[], ""), Some(&good))
        .response
        .unwrap();
    st.on_request(&ack(&r1, &[]), Some(&good));
    let mut resp = st.on_snapshot(&bad).remove(0);
    for attempt in 1..=3u8 {
        let out = st.on_request(&nack(&resp, "bad"), Some(&bad));
        let nack = out.nack.unwrap();
        assert_eq!(nack.counts, attempt == 3, "NACK {attempt}");
        match out.response {
            Some(again) => {
                assert!(attempt < 3, "sent a fourth time");
                assert_eq!(again.version, bad.version(LDS));
                resp = again;
            }
            None => assert_eq!(attempt, 3, "not sent again after NACK {attempt}"),
        }
    }
    assert!(st.on_snapshot(&bad).is_empty());
    assert_eq!(st.acked(LDS), Some(good.version(LDS)));
}

#[test]
fn a_new_version_is_sent_after_a_nack_if_it_arrived_meanwhile() {
    let good = mk_snapshot("good", &[]);
    let bad = mk_snapshot("bad", &[]);
    let fixed = mk_snapshot("fixed", &[]);
    let mut st = SotwState::default();
    let r1 = st
        .on_request(&mk_req(LDS, &[], ""), Some(&good))
        .response
        .unwrap();
    st.on_request(&ack(&r1, &[]), Some(&good));
    let r2 = st.on_snapshot(&bad).remove(0);
    // While r2 is in flight, nothing else is sent.
    assert!(st.on_snapshot(&fixed).is_empty());
    let out = st.on_request(&nack(&r2, "bad"), Some(&fixed));
    assert!(out.nack.is_some());
    assert_eq!(out.response.unwrap().version, fixed.version(LDS));
}

#[test]
fn only_the_newest_of_several_snapshots_is_sent_after_the_ack() {
    let snaps: Vec<Snapshot> = (0..5).map(|i| mk_snapshot(&format!("v{i}"), &[])).collect();
    let mut st = SotwState::default();
    let r0 = st
        .on_request(&mk_req(LDS, &[], ""), Some(&snaps[0]))
        .response
        .unwrap();
    for s in &snaps[1..] {
        assert!(st.on_snapshot(s).is_empty(), "r0 is still in flight");
    }
    let out = st.on_request(&ack(&r0, &[]), Some(&snaps[4]));
    assert_eq!(out.response.unwrap().version, snaps[4].version(LDS));
}

#[test]
fn resource_names_are_honoured_and_changes_answered() {
    let snap = mk_snapshot("v1", &["a", "b", "c"]);
    let mut st = SotwState::default();
    let r1 = st
        .on_request(&mk_req(RDS, &["a", "zz"], ""), Some(&snap))
        .response
        .unwrap();
    assert_eq!(names(&r1, &snap), ["a"], "only requested names that exist");
    // An ACK that adds a name gets the added resource at the same version.
    let out = st.on_request(&ack(&r1, &["a", "b"]), Some(&snap));
    assert!(out.ack.is_some());
    let r2 = out.response.unwrap();
    assert_eq!(
        (names(&r2, &snap), &r2.version),
        (vec!["a".to_owned(), "b".to_owned()], &r1.version)
    );
    // An ACK with the same names gets nothing.
    let out = st.on_request(&ack(&r2, &["a", "b"]), Some(&snap));
    assert_eq!(out.response, None);
    // Route names do not become a wildcard when emptied later: nothing is subscribed.
    let r3 = st.on_request(&ack(&r2, &[]), Some(&snap)).response.unwrap();
    assert!(names(&r3, &snap).is_empty());
}

#[test]
fn wildcard_and_explicit_star() {
    let snap = mk_snapshot("v1", &["a", "b"]);
    let mut st = SotwState::default();
    let r = st
        .on_request(&mk_req(RDS, &["*"], ""), Some(&snap))
        .response
        .unwrap();
    assert_eq!(names(&r, &snap), ["a", "b"]);
    let mut st = SotwState::default();
    let r = st
        .on_request(&mk_req(RDS, &[], ""), Some(&snap))
        .response
        .unwrap();
    assert_eq!(
        names(&r, &snap),
        ["a", "b"],
        "legacy wildcard on the first request"
    );
    // Naming resources leaves the wildcard.
    let r2 = st
        .on_request(&ack(&r, &["b"]), Some(&snap))
        .response
        .unwrap();
    assert_eq!(names(&r2, &snap), ["b"]);
    // After that, an empty list is an empty subscription, not a wildcard.
    let r3 = st.on_request(&ack(&r2, &[]), Some(&snap)).response.unwrap();
    assert!(names(&r3, &snap).is_empty());
}

#[test]
fn types_are_independent_and_pushed_in_order() {
    let s1 = mk_snapshot("v1", &["a"]);
    let mut st = SotwState::default();
    let mut pending = Vec::new();
    for kind in [LDS, ResourceType::Cluster] {
        pending.push(
            st.on_request(&mk_req(kind, &[], ""), Some(&s1))
                .response
                .unwrap(),
        );
    }
    pending.push(
        st.on_request(&mk_req(RDS, &["a"], ""), Some(&s1))
            .response
            .unwrap(),
    );
    for r in &pending {
        let names: Vec<&str> = if r.kind == RDS { vec!["a"] } else { vec![] };
        assert!(st.on_request(&ack(r, &names), Some(&s1)).ack.is_some());
    }
    // Change only listeners and routes: clusters are not resent; listeners go before routes.
    let mut s2 = vec![];
    s2.extend([
        Resource {
            kind: LDS,
            name: "http".into(),
            body: Bytes::from_static(b"v2"),
        },
        Resource {
            kind: ResourceType::Cluster,
            name: "backend".into(),
            body: Bytes::from_static(b"cluster"),
        },
        Resource {
            kind: RDS,
            name: "a".into(),
            body: Bytes::from_static(b"new route"),
        },
    ]);
    let s2 = Snapshot::new(s2).unwrap();
    let kinds: Vec<ResourceType> = st.on_snapshot(&s2).iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [LDS, RDS]);
}

#[test]
fn endpoints_are_resent_after_clusters_for_warming() {
    let eds = ResourceType::Endpoint;
    let cds = ResourceType::Cluster;
    let with_cluster = |body: &'static str| {
        Snapshot::new([
            Resource {
                kind: cds,
                name: "backend".into(),
                body: Bytes::from_static(body.as_bytes()),
            },
            Resource {
                kind: eds,
                name: "backend".into(),
                body: Bytes::from_static(b"endpoints"),
            },
        ])
        .unwrap()
    };
    let s1 = with_cluster("c1");
    let mut st = SotwState::default();
    let c1 = st
        .on_request(&mk_req(cds, &[], ""), Some(&s1))
        .response
        .unwrap();
    st.on_request(&ack(&c1, &[]), Some(&s1));
    let e1 = st
        .on_request(&mk_req(eds, &["backend"], ""), Some(&s1))
        .response
        .unwrap();
    st.on_request(&ack(&e1, &["backend"]), Some(&s1));
    // Only the cluster changes: endpoints (same version) follow it.
    let s2 = with_cluster("c2");
    let pushed = st.on_snapshot(&s2);
    let kinds: Vec<ResourceType> = pushed.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [cds, eds]);
    assert_eq!(pushed[1].version, e1.version);
    // Envoy's warming re-request with the old nonce is stale and ignored...
    let out = st.on_request(&ack(&e1, &["backend"]), Some(&s2));
    assert_eq!(out.ignored, Some(Ignored::StaleNonce));
    // ...and the ACKs end the exchange.
    assert!(
        st.on_request(&ack(&pushed[0], &[]), Some(&s2))
            .also
            .is_empty()
    );
    assert!(
        st.on_request(&ack(&pushed[1], &["backend"]), Some(&s2))
            .response
            .is_none()
    );

    // Clusters unblocked by an ACK bring endpoints along in the same outcome.
    let s3 = with_cluster("c3");
    let s4 = with_cluster("c4");
    let c3 = st.on_snapshot(&s3);
    assert_eq!(c3.len(), 2);
    st.on_request(&ack(&c3[1], &["backend"]), Some(&s3));
    let out = st.on_request(&ack(&c3[0], &[]), Some(&s4));
    assert_eq!(out.response.unwrap().version, s4.version(cds));
    assert_eq!(out.also.len(), 1);
    assert_eq!(out.also[0].kind, eds);
}

#[test]
fn unknown_types_are_ignored() {
    let mut st = SotwState::default();
    let req = SotwRequest {
        type_url: "type.googleapis.com/envoy.api.v2.Listener".into(),
        ..Default::default()
    };
    let out = st.on_request(&req, Some(&Snapshot::empty()));
    assert!(matches!(out.ignored, Some(Ignored::UnknownType(_))));
    assert!(out.response.is_none());
}

#[test]
fn a_request_naming_too_many_resources_is_refused() {
    let s = mk_snapshot("listener", &["a"]);
    let mut st = SotwState::with_max_names(3);
    let asked = ["a", "b", "c", "d"];
    let out = st.on_request(&mk_req(RDS, &asked, ""), Some(&s));
    assert_eq!(out.exceeded, Some(Limit::NamesPerType));
    assert_eq!(out.response, None);
    let out = st.on_request(&mk_req(RDS, &asked[..3], ""), Some(&s));
    assert_eq!(out.exceeded, None);
    assert_eq!(names(&out.response.unwrap(), &s), ["a"]);
}

#[test]
fn a_subscription_is_bounded_in_bytes_and_names_in_length() {
    let s = mk_snapshot("listener", &["a"]);
    let bounds = Bounds {
        max_names: 1000,
        max_name_bytes: 100,
        max_bytes: 1000,
    };
    let name = |i: usize| format!("{i:03}-{}", "x".repeat(96));
    let ten: Vec<String> = (0..10).map(name).collect();
    let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
    let mut st = SotwState::with_bounds(bounds);
    let out = st.on_request(&mk_req(RDS, &ten, ""), Some(&s));
    assert_eq!(out.exceeded, None);
    assert_eq!(st.held_bytes(), 1000);
    let eleven = name(10);
    let more: Vec<&str> = ten.iter().copied().chain([eleven.as_str()]).collect();
    let mut st = SotwState::with_bounds(bounds);
    let out = st.on_request(&mk_req(RDS, &more, ""), Some(&s));
    assert_eq!(out.exceeded, Some(Limit::SubscriptionBytesPerType));
    assert_eq!(out.response, None);
    let long = format!("{}y", name(0));
    let out = SotwState::with_bounds(bounds).on_request(&mk_req(RDS, &[&long], ""), Some(&s));
    assert_eq!(out.exceeded, Some(Limit::NameSize));
}
