//! The CA rotation machine step by step, and by property: no party ever presents a
//! certificate another does not trust.
#![allow(clippy::arithmetic_side_effects, clippy::indexing_slicing)] // test code

use super::*;
use proptest::prelude::*;

const D: Duration = Duration::from_secs(10);

fn at(secs: i64) -> OffsetDateTime {
    OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(secs)
}

fn ca(id: u32) -> Ca<u32> {
    Ca {
        id,
        not_before: at(0),
        not_after: at(1_000_000),
    }
}

fn state(signer: u32, next: Option<u32>, trusted: &[u32]) -> CaState<u32> {
    CaState {
        signer: ca(signer),
        next: next.map(ca),
        trusted: trusted.iter().copied().map(ca).collect(),
        distributed_at: None,
    }
}

fn leaf(name: &str, issuer: u32, trusts: &[u32], not_before: i64) -> Leaf<u32> {
    Leaf {
        name: name.into(),
        issuer: Some(issuer),
        trusts: trusts.to_vec(),
        not_before: at(not_before),
    }
}

#[test]
fn nothing_happens_until_a_renewal_is_due() {
    let ca = state(1, None, &[1]);
    let leaves = [leaf("ns/server", 1, &[1], 0)];
    assert_eq!(step(&ca, &leaves, false, at(100), D), Step::Idle);
    assert_eq!(step(&ca, &leaves, true, at(100), D), Step::Start);
    assert_eq!(leaf_trust(&[1], &ca), None);
}

/// The order of a whole rotation: trust first, sign second, drop last, each a full
/// propagation after the step before reached everyone.
#[test]
fn a_rotation_trusts_then_signs_then_drops() {
    // Step 1 started at t=100: CA 2 is next, both trusted, CA 1 still signs.
    let mut ca = state(1, Some(2), &[1, 2]);
    let old = [leaf("ns/client", 1, &[1], 0), leaf("ns/server", 1, &[1], 0)];
    // A leaf still trusting only the signer waits, by name; a renewal does not restart it.
    let Step::Wait {
        at: Some(give_up),
        why,
    } = step(&ca, &old, true, at(100), D)
    else {
        panic!("must wait for the leaves")
    };
    assert!(why.contains("ns/client, ns/server"), "{why}");
    assert_eq!(give_up, at(900_000), "90% of the signer's life");
    // Each leaf's ca.crt becomes the bundle; nothing is reissued (still signed by 1).
    assert_eq!(leaf_trust(&[1], &ca), Some(vec![1, 2]));
    let updated = [
        leaf("ns/client", 1, &[2, 1], 0),
        leaf("ns/server", 1, &[1, 2], 0),
    ];
    assert_eq!(leaf_trust(&[2, 1], &ca), None, "order does not matter");
    assert_eq!(
        step(&ca, &updated, false, at(101), D),
        Step::MarkDistributed
    );
    ca.distributed_at = Some(at(101));
    assert_eq!(
        step(&ca, &updated, false, at(110), D),
        Step::Wait {
            at: Some(at(111)),
            why: "waiting for the bundle with the next CA to reach every reader".into()
        }
    );
    assert_eq!(step(&ca, &updated, false, at(111), D), Step::Promote);

    // Step 2 at t=111: CA 2 signs, CA 1 stays trusted.
    let ca = state(2, None, &[2, 1]);
    let Step::Wait { at: Some(end), why } = step(&ca, &updated, false, at(111), D) else {
        panic!("must wait for the reissue")
    };
    assert_eq!(end, at(1_000_001), "at the latest when CA 1 expires");
    assert!(why.contains("reissued by the new CA"), "{why}");
    let reissued = [
        leaf("ns/client", 2, &[2, 1], 112),
        leaf("ns/server", 2, &[2, 1], 115),
    ];
    assert_eq!(
        step(&ca, &reissued, false, at(116), D),
        Step::Wait {
            at: Some(at(125)),
            why: "waiting for the certificates reissued by the new CA to reach every reader".into()
        }
    );
    // Step 3: the last reissue has reached everyone: CA 1 goes.
    assert_eq!(
        step(&ca, &reissued, false, at(125), D),
        Step::Trust(vec![ca.signer.clone()])
    );
    let done = state(2, None, &[2]);
    assert_eq!(leaf_trust(&[2, 1], &done), Some(vec![2]));
    assert_eq!(step(&done, &reissued, false, at(126), D), Step::Idle);
}

/// A leaf that never takes the bundle holds step 1 until 90% of the signer's
/// life only; then the rotation goes on without it, and promotes a propagation later.
#[test]
fn a_leaf_that_never_takes_the_bundle_holds_step_one_until_nine_tenths_of_the_life() {
    let mut ca = state(1, Some(2), &[1, 2]);
    let stuck = [
        leaf("ns/immutable", 1, &[1], 0),
        leaf("ns/ok", 1, &[1, 2], 0),
    ];
    assert!(matches!(
        step(&ca, &stuck, false, at(899_999), D),
        Step::Wait { .. }
    ));
    assert_eq!(left_behind(&ca, &stuck), ["ns/immutable"]);
    assert_eq!(
        step(&ca, &stuck, false, at(900_000), D),
        Step::MarkDistributed
    );
    ca.distributed_at = Some(at(900_000));
    let Step::Wait { at: Some(t), why } = step(&ca, &stuck, false, at(900_001), D) else {
        panic!()
    };
    assert_eq!(t, at(900_010));
    assert!(
        why.contains("without the certificates of ns/immutable"),
        "{why}"
    );
    assert_eq!(step(&ca, &stuck, false, at(900_010), D), Step::Promote);
    // A rotation started after 90% still gives the cooperative leaves a propagation.
    let mut late = state(1, Some(2), &[1, 2]);
    late.next.as_mut().unwrap().not_before = at(950_000);
    assert_eq!(
        give_up_at(&late, late.next.as_ref().unwrap(), D),
        Some(at(950_010))
    );
    assert!(matches!(
        step(&late, &stuck, false, at(950_009), D),
        Step::Wait { .. }
    ));
    // With no next CA, nothing is left behind.
    assert!(left_behind(&state(2, None, &[2, 1]), &stuck).is_empty());
}

#[test]
fn an_expired_previous_ca_is_dropped_even_with_leaves_left_behind() {
    let mut ca = state(2, None, &[2, 1, 3]);
    ca.trusted[1].not_after = at(50);
    let stuck = [leaf("ns/broken", 1, &[1], 0)];
    assert_eq!(
        step(&ca, &stuck, false, at(51), D),
        Step::Trust(vec![ca.signer.clone(), ca.trusted[2].clone()])
    );
    // Before expiry the stuck leaf holds the overlap open until then.
    let Step::Wait { at: Some(t), .. } = step(&ca, &stuck, false, at(49), D) else {
        panic!()
    };
    assert_eq!(t, at(51));
}

#[test]
fn no_leaves_means_no_one_to_wait_for() {
    let mut ca = state(1, Some(2), &[1, 2]);
    assert_eq!(step(&ca, &[], false, at(0), D), Step::MarkDistributed);
    ca.distributed_at = Some(at(0));
    assert_eq!(step(&ca, &[], false, at(10), D), Step::Promote);
    let ca = state(2, None, &[2, 1]);
    assert_eq!(
        step(&ca, &[], false, at(10), D),
        Step::Trust(vec![ca.signer.clone()])
    );
}

#[test]
fn a_bundle_edited_by_hand_is_repaired_first() {
    // The next CA fell out of ca.crt: publish both again before anything else.
    let ca = state(1, Some(2), &[1]);
    assert_eq!(
        step(&ca, &[], false, at(0), D),
        Step::Trust(vec![ca.signer.clone(), ca.next.clone().unwrap()])
    );
    // The signer is not in ca.crt: trust it.
    let ca = state(2, None, &[3]);
    assert_eq!(
        step(&ca, &[], false, at(0), D).clone(),
        Step::Trust(vec![ca.signer.clone(), ca.trusted[0].clone()])
    );
    let ca = state(2, None, &[]);
    assert_eq!(
        step(&ca, &[], false, at(0), D),
        Step::Trust(vec![ca.signer.clone()])
    );
}

#[test]
fn certificates_are_split_out_of_a_bundle() {
    let a = "-----BEGIN CERTIFICATE-----\nAAAA\nBBBB\n-----END CERTIFICATE-----\n";
    let b = "-----BEGIN CERTIFICATE-----\nCCCC\n-----END CERTIFICATE-----\n";
    let key = "-----BEGIN PRIVATE KEY-----\nKKKK\n-----END PRIVATE KEY-----\n";
    let text = format!("junk\n{a}\n{key}  {}", b.replace('\n', "\r\n"));
    assert_eq!(split_certificates(&text), vec![a.to_owned(), b.to_owned()]);
    assert!(split_certificates("-----BEGIN CERTIFICATE-----\nAAAA\n").is_empty());
}

/// A world of one CA, a server and clients, where every Secret reaches its reader late (up
/// to the propagation bound) and the controller reconciles each certificate only now and
/// then: at every instant each party's certificate is trusted by every party it talks to,
/// and the rotation ends with the new CA alone.
mod never_untrusted {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct LeafSecret {
        issuer: u32,
        trusts: Vec<u32>,
        not_before: i64,
    }

    #[derive(Debug, Clone)]
    struct World {
        ca: CaState<u32>,
        /// Every version of each leaf Secret, with the second it was written; leaf 0 is the
        /// server.
        leaves: Vec<Vec<(i64, LeafSecret)>>,
        /// Every version of the CA Secret's ca.crt (the webhook's caBundle).
        bundles: Vec<(i64, Vec<u32>)>,
        next_id: u32,
    }

    impl World {
        fn new(clients: usize) -> Self {
            let first = LeafSecret {
                issuer: 1,
                trusts: vec![1],
                not_before: 0,
            };
            Self {
                ca: state(1, None, &[1]),
                leaves: vec![vec![(0, first)]; clients + 1],
                bundles: vec![(0, vec![1])],
                next_id: 2,
            }
        }

        fn current(&self, i: usize) -> &LeafSecret {
            &self.leaves[i].last().unwrap().1
        }

        /// What a reader lagging `lag` seconds sees of leaf `i` at `t`.
        fn seen(&self, i: usize, t: i64, lag: i64) -> &LeafSecret {
            let versions = &self.leaves[i];
            &versions
                .iter()
                .rev()
                .find(|(w, _)| *w <= t - lag)
                .unwrap_or(&versions[0])
                .1
        }

        fn seen_bundle(&self, t: i64, lag: i64) -> &[u32] {
            &self
                .bundles
                .iter()
                .rev()
                .find(|(w, _)| *w <= t - lag)
                .unwrap_or(&self.bundles[0])
                .1
        }

        fn bundle(&self) -> Vec<u32> {
            self.ca.trusted.iter().map(|c| c.id).collect()
        }

        fn reconcile_ca(&mut self, t: i64, renew: bool) {
            let leaves: Vec<Leaf<u32>> = (0..self.leaves.len())
                .map(|i| {
                    let s = self.current(i);
                    leaf(&format!("l{i}"), s.issuer, &s.trusts, s.not_before)
                })
                .collect();
            match step(&self.ca, &leaves, renew, at(t), D) {
                Step::Idle | Step::Wait { .. } => {}
                Step::Start => {
                    let next = ca(self.next_id);
                    self.next_id += 1;
                    self.ca.trusted = vec![self.ca.signer.clone(), next.clone()];
                    self.ca.next = Some(next);
                    self.ca.distributed_at = None;
                }
                Step::MarkDistributed => self.ca.distributed_at = Some(at(t)),
                Step::Promote => {
                    let next = self.ca.next.take().unwrap();
                    self.ca.trusted = vec![next.clone(), self.ca.signer.clone()];
                    self.ca.signer = next;
                    self.ca.distributed_at = None;
                }
                Step::Trust(trusted) => self.ca.trusted = trusted,
            }
            if self.bundles.last().unwrap().1 != self.bundle() {
                self.bundles.push((t, self.bundle()));
            }
        }

        /// The leaf half of the certificate controller: reissued when not signed by the
        /// signer (`needs_issue`'s IssuerChanged), else its ca.crt follows the bundle.
        fn reconcile_leaf(&mut self, i: usize, t: i64) {
            let s = self.current(i).clone();
            let new = if s.issuer != self.ca.signer.id {
                LeafSecret {
                    issuer: self.ca.signer.id,
                    trusts: self.bundle(),
                    not_before: t,
                }
            } else if let Some(trusts) = leaf_trust(&s.trusts, &self.ca) {
                LeafSecret {
                    trusts,
                    ..s.clone()
                }
            } else {
                return;
            };
            if new != s {
                self.leaves[i].push((t, new));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn no_party_ever_presents_a_certificate_another_does_not_trust(
            lags in proptest::collection::vec(0i64..=10, 2..6),
            api_lag in 0i64..=10,
            renew_at in 1i64..20,
            // Which certificate the controller gets to in each second (a slow or failing
            // controller skips some).
            schedule in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 6), 200),
        ) {
            let clients = lags.len() - 1;
            let mut world = World::new(clients);
            let mut renewed = false;
            for t in 1..200i64 {
                let runs = &schedule[usize::try_from(t).unwrap()];
                if runs[0] {
                    let renew = t >= renew_at && !renewed;
                    let before = world.ca.next.clone();
                    world.reconcile_ca(t, renew);
                    renewed |= renew && world.ca.next.is_some() && before.is_none();
                }
                for i in 0..=clients {
                    if runs[1 + i % 5] {
                        world.reconcile_leaf(i, t);
                    }
                }
                // mTLS both ways between the server (leaf 0) and each client, and the API
                // server (caBundle) calling the webhook (the server's certificate).
                let server = world.seen(0, t, lags[0]);
                for (c, lag) in lags.iter().enumerate().skip(1) {
                    let client = world.seen(c, t, *lag);
                    prop_assert!(
                        client.trusts.contains(&server.issuer),
                        "t={t}: client {c} trusts {:?}, the server presents a certificate of CA {}",
                        client.trusts, server.issuer
                    );
                    prop_assert!(
                        server.trusts.contains(&client.issuer),
                        "t={t}: the server trusts {:?}, client {c} presents a certificate of CA {}",
                        server.trusts, client.issuer
                    );
                }
                let bundle = world.seen_bundle(t, api_lag);
                prop_assert!(
                    bundle.contains(&server.issuer),
                    "t={t}: caBundle {bundle:?}, the webhook presents a certificate of CA {}",
                    server.issuer
                );
            }
            // With every reconcile eventually run, the rotation finishes.
            for t in 200..260i64 {
                world.reconcile_ca(t, false);
                for i in 0..=clients {
                    world.reconcile_leaf(i, t);
                }
            }
            prop_assert!(renewed || world.ca.next.is_some() || world.ca.signer.id == 1);
            if renewed {
                prop_assert_eq!(world.ca.signer.id, 2);
                prop_assert_eq!(world.bundle(), vec![2]);
                for i in 0..=clients {
                    prop_assert_eq!(world.current(i).issuer, 2);
                    prop_assert_eq!(&world.current(i).trusts, &vec![2]);
                }
            }
        }

        /// Any instants and any propagation: never a panic (no overflow at the end of time).
        #[test]
        fn step_is_total(
            now in any::<i64>(),
            since in any::<i64>(),
            expiry in any::<i64>(),
            nb in any::<i64>(),
            propagation in any::<u64>(),
            shape in 0u8..4,
            renew in any::<bool>(),
        ) {
            let t = |s: i64| {
                OffsetDateTime::from_unix_timestamp(s.rem_euclid(253_402_300_799))
                    .unwrap_or(OffsetDateTime::UNIX_EPOCH)
            };
            let mut ca = match shape {
                0 => state(1, Some(2), &[1, 2]),
                1 => state(2, None, &[2, 1]),
                2 => state(1, None, &[1]),
                _ => state(2, Some(3), &[2, 3, 1]),
            };
            ca.distributed_at = Some(t(since));
            for c in &mut ca.trusted {
                c.not_after = t(expiry);
            }
            let leaves = [
                Leaf { name: "a".into(), issuer: Some(1), trusts: vec![1, 2], not_before: t(nb) },
                Leaf { name: "b".into(), issuer: Some(2), trusts: vec![2, 1], not_before: t(nb) },
            ];
            let _ = step(&ca, &leaves, renew, t(now), Duration::from_secs(propagation));
            let _ = step(&ca, &leaves[1..], renew, t(now), Duration::MAX);
        }
    }
}
