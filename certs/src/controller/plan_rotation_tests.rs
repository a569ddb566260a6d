//! A whole CA rotation through the controller's pure decisions with real certificates: the
//! act steps are played on Secrets held in memory.
#![allow(clippy::arithmetic_side_effects)] // test code

use super::*;
use crate::controller::report::{Outcome, ROTATION_BLOCKED_CONDITION, report};
use crate::issue_self_signed;
use k8s_openapi::ByteString;
use marin3r_controller::Reason as _;

const D: Duration = Duration::from_secs(10);

fn dsc(name: &str, signer: serde_json::Value, is_ca: bool) -> DiscoveryServiceCertificate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": name, "namespace": "ns", "generation": 1},
        "spec": {"commonName": name, "validFor": 86400, "signer": signer, "isCA": is_ca,
                 "server": !is_ca, "secretRef": {"name": name}},
    }))
    .unwrap()
}

fn secret(files: [(&str, &str); 3]) -> Secret {
    Secret {
        data: Some(bundle::secret_data(files)),
        ..Default::default()
    }
}

fn apply(secret: &mut Secret, update: &SecretUpdate) {
    let data = secret.data.get_or_insert_default();
    for (k, v) in &update.data {
        match v {
            Some(v) => data.insert(k.clone(), ByteString(v.as_bytes().to_vec())),
            None => data.remove(k),
        };
    }
    let annotations = secret.metadata.annotations.get_or_insert_default();
    for (k, v) in &update.annotations {
        match v {
            Some(v) => annotations.insert(k.clone(), v.clone()),
            None => annotations.remove(k),
        };
    }
}

fn text(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

struct World {
    ca: DiscoveryServiceCertificate,
    leaf: DiscoveryServiceCertificate,
    ca_secret: Secret,
    leaf_secret: Secret,
}

impl World {
    fn new() -> Self {
        let ca = dsc("ca", serde_json::json!({"selfSigned": {}}), true);
        let leaf = dsc(
            "server",
            serde_json::json!({"caSigned": {"caSecretRef": {"name": "ca"}}}),
            false,
        );
        let Ok(ca_spec) = check_spec(&ca, false) else {
            panic!()
        };
        let issued = issue_self_signed(&ca_spec.request).unwrap();
        let Ok(leaf_spec) = check_spec(&leaf, false) else {
            panic!()
        };
        let signed = CertificateAuthority::from_issued(&issued)
            .unwrap()
            .issue(&leaf_spec.request)
            .unwrap();
        Self {
            ca,
            leaf,
            ca_secret: secret([
                ("tls.crt", &issued.cert_pem),
                ("tls.key", &issued.key_pem),
                ("ca.crt", &issued.ca_pem),
            ]),
            leaf_secret: secret([
                ("tls.crt", &signed.cert_pem),
                ("tls.key", &signed.key_pem),
                ("ca.crt", &signed.ca_pem),
            ]),
        }
    }

    fn observe_ca(&self, now: OffsetDateTime) -> Observed<'_> {
        Observed {
            dsc: &self.ca,
            spec: check_spec(&self.ca, false),
            ca_secret: None,
            secret: Some(self.ca_secret.clone()),
            now,
            min_renewal_interval: Duration::from_secs(60),
            dependents: vec![("ns/server".into(), tls_files(&self.leaf_secret))],
            trust_propagation: D,
        }
    }

    fn observe_leaf(&self) -> Observed<'_> {
        Observed {
            dsc: &self.leaf,
            spec: check_spec(&self.leaf, false),
            ca_secret: Some(self.ca_secret.clone()),
            secret: Some(self.leaf_secret.clone()),
            now: OffsetDateTime::now_utc(),
            min_renewal_interval: Duration::from_secs(60),
            dependents: Vec::new(),
            trust_propagation: D,
        }
    }

    /// The CA's step at `now`, played on its Secret; the reported outcome.
    fn ca_step(&mut self, now: OffsetDateTime) -> (&'static str, Outcome) {
        let obs = self.observe_ca(now);
        let Ok(valid) = obs.spec.clone() else {
            panic!()
        };
        match decide(&obs) {
            Plan::StartRotation {
                state,
                reason,
                renew_request,
            } => {
                let next = issue_self_signed(&valid.request).unwrap();
                let update = bundle::start(&state, &next, renew_request.as_deref());
                let current = started(
                    &reason,
                    update.data["ca.crt"].clone().unwrap(),
                    state.signer.id.pem.clone(),
                );
                let outcome = report(&obs, &valid, &current, None);
                apply(&mut self.ca_secret, &update);
                ("start", outcome)
            }
            Plan::Update { update, then } => {
                let outcome = report(&obs, &valid, &then, None);
                apply(&mut self.ca_secret, &update);
                ("update", outcome)
            }
            Plan::Keep(current) => ("keep", report(&obs, &valid, &current, None)),
            Plan::Issue { reason, .. } => panic!("the CA was reissued outright: {reason}"),
            Plan::NotReady(n) => panic!("{n:?}"),
        }
    }

    /// The leaf's step, played on its Secret.
    fn leaf_step(&mut self) -> &'static str {
        let obs = self.observe_leaf();
        let Ok(valid) = obs.spec.clone() else {
            panic!()
        };
        match decide(&obs) {
            Plan::Keep(_) => "keep",
            Plan::Update { update, .. } => {
                assert_eq!(update.data.keys().collect::<Vec<_>>(), ["ca.crt"]);
                apply(&mut self.leaf_secret, &update);
                "trust"
            }
            Plan::Issue {
                ca,
                trust_pem,
                reason,
                ..
            } => {
                assert_eq!(reason, IssueReason::IssuerChanged);
                let issued = ca.unwrap().issue(&valid.request).unwrap();
                self.leaf_secret = secret([
                    ("tls.crt", &issued.cert_pem),
                    ("tls.key", &issued.key_pem),
                    ("ca.crt", &trust_pem.unwrap()),
                ]);
                "reissue"
            }
            _ => panic!("unexpected plan for a leaf"),
        }
    }
}

fn certs_in(pem: &str) -> Vec<String> {
    rotation::split_certificates(pem)
}

#[test]
fn a_ca_renewal_overlaps_old_and_new_and_never_reissues_before_everyone_trusts() {
    let mut w = World::new();
    let old_ca = text(&w.ca_secret, "tls.crt");
    let old_leaf = text(&w.leaf_secret, "tls.crt");
    let t0 = OffsetDateTime::now_utc();
    assert_eq!(w.ca_step(t0).0, "keep");
    assert_eq!(w.leaf_step(), "keep");

    // A renewal asked for: the next CA is issued beside the current one, which keeps signing.
    w.ca.metadata.annotations = Some([(RENEW_ANNOTATION.to_owned(), "now".to_owned())].into());
    let (step, outcome) = w.ca_step(t0);
    assert_eq!(step, "start");
    assert_eq!(outcome.events[0].reason, Reason::NextCAIssued.as_str());
    assert!(outcome.status.rotation.is_some());
    assert_eq!(
        text(&w.ca_secret, "tls.crt"),
        old_ca,
        "the current CA still signs"
    );
    let bundle = text(&w.ca_secret, "ca.crt");
    let next_ca = text(&w.ca_secret, rotation::NEXT_CERT_KEY);
    assert_eq!(certs_in(&bundle), [old_ca.clone(), next_ca.clone()]);
    // Asking again changes nothing: the renewal was recorded on the Secret.
    assert_eq!(w.ca_step(t0).0, "keep");

    // The leaf's ca.crt becomes the bundle; it is not reissued (before the overlap, the new
    // CA reissued it at once, trusted by no one yet).
    assert_eq!(w.leaf_step(), "trust");
    assert_eq!(text(&w.leaf_secret, "tls.crt"), old_leaf);
    assert!(bundle::same_certificates(
        &text(&w.leaf_secret, "ca.crt"),
        &bundle
    ));
    assert_eq!(w.leaf_step(), "keep");

    // Everyone holds the bundle: recorded, then the next CA signs a propagation later.
    let (step, outcome) = w.ca_step(t0);
    assert_eq!(step, "update");
    assert_eq!(outcome.requeue, Some(D));
    assert!(
        w.ca_secret
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(rotation::DISTRIBUTED_ANNOTATION)
    );
    let (step, outcome) = w.ca_step(t0 + time::Duration::seconds(9));
    assert_eq!(step, "keep");
    assert_eq!(text(&w.ca_secret, "tls.crt"), old_ca);
    assert!(outcome.requeue.unwrap() <= Duration::from_secs(1));
    assert_eq!(w.leaf_step(), "keep");
    let t1 = t0 + time::Duration::seconds(11);
    let (step, outcome) = w.ca_step(t1);
    assert_eq!(step, "update");
    assert_eq!(outcome.events[0].reason, Reason::NextCASigning.as_str());
    assert_eq!(text(&w.ca_secret, "tls.crt"), next_ca);
    assert_eq!(
        certs_in(&text(&w.ca_secret, "ca.crt")),
        [next_ca.clone(), old_ca.clone()]
    );
    assert!(
        !w.ca_secret
            .data
            .as_ref()
            .unwrap()
            .contains_key(rotation::NEXT_KEY_KEY)
    );
    assert_eq!(
        outcome.status.certificate_hash,
        Some(crate::certificate_hash(&next_ca).unwrap())
    );

    // Now the leaf is reissued by the new CA and still trusts both.
    assert_eq!(w.leaf_step(), "reissue");
    crate::verify_signed_by(&text(&w.leaf_secret, "tls.crt"), &next_ca).unwrap();
    assert_eq!(certs_in(&text(&w.leaf_secret, "ca.crt")).len(), 2);
    assert_eq!(w.leaf_step(), "keep");

    // The old CA goes once the reissued leaf has had a propagation to arrive.
    let info = crate::CertificateInfo::from_pem(&text(&w.leaf_secret, "tls.crt")).unwrap();
    // notBefore is backdated: the wait counts from when it was issued.
    let issued_at = crate::latest_issuance(info.not_before, info.not_after).unwrap()
        - time::Duration::seconds(1);
    // (notBefore is truncated to the second: the wait counts from a second after it.)
    let (step, outcome) = w.ca_step(issued_at + time::Duration::seconds(10));
    assert_eq!(step, "keep");
    assert!(
        outcome
            .status
            .rotation
            .unwrap()
            .contains("reach every reader")
    );
    let (step, outcome) = w.ca_step(issued_at + time::Duration::seconds(11));
    assert_eq!(step, "update");
    assert_eq!(outcome.events[0].reason, Reason::PreviousCADropped.as_str());
    assert_eq!(outcome.status.rotation, None);
    assert_eq!(
        certs_in(&text(&w.ca_secret, "ca.crt")),
        vec![next_ca.clone()]
    );
    assert_eq!(w.leaf_step(), "trust");
    assert_eq!(
        certs_in(&text(&w.leaf_secret, "ca.crt")),
        vec![next_ca.clone()]
    );
    assert_eq!(w.leaf_step(), "keep");
    let (step, outcome) = w.ca_step(issued_at + time::Duration::seconds(12));
    assert_eq!(step, "keep");
    assert_eq!(outcome.status.rotation, None);
    assert_eq!(
        outcome.status.trust_bundle_hash,
        Some(crate::certificate_hash(&next_ca).unwrap())
    );
}

#[test]
fn a_ca_secret_without_a_usable_ca_is_issued_at_once() {
    let mut w = World::new();
    let data = w.ca_secret.data.as_mut().unwrap();
    data.insert("tls.key".into(), ByteString(b"garbage".to_vec()));
    data.insert(
        rotation::NEXT_CERT_KEY.into(),
        ByteString(b"stale".to_vec()),
    );
    let obs = w.observe_ca(OffsetDateTime::now_utc());
    let Plan::Issue { reason, .. } = decide(&obs) else {
        panic!("nothing to overlap with: issue")
    };
    assert!(matches!(reason, IssueReason::SecretInvalid(_)), "{reason}");
    // And what an earlier rotation left is removed with it.
    let forget = bundle::forget_rotation(&w.ca_secret).unwrap();
    assert_eq!(forget.data[rotation::NEXT_CERT_KEY], None);
    assert_eq!(
        forget.merge_patch()["metadata"]["annotations"][rotation::DISTRIBUTED_ANNOTATION],
        serde_json::Value::Null
    );
}

#[test]
fn an_intermediate_ca_secret_is_trusted_as_itself() {
    let w = World::new();
    let leaf = text(&w.leaf_secret, "tls.crt");
    let ca = text(&w.ca_secret, "tls.crt");
    // A CA Secret whose ca.crt is its issuer (not itself): what it signs trusts it alone.
    let files = TlsFiles {
        cert: Some(leaf.clone()),
        key: None,
        ca: Some(ca.clone()),
    };
    assert_eq!(
        bundle::trust_bundle(&files),
        Some(certs_in(&leaf)[0].clone())
    );
    let files = TlsFiles {
        cert: Some(ca.clone()),
        key: None,
        ca: Some(format!("{ca}{leaf}")),
    };
    assert_eq!(certs_in(&bundle::trust_bundle(&files).unwrap()).len(), 2);
}

/// A certificate whose Secret never takes the bundle (immutable, or one nobody
/// may write) holds step 1 only until 90% of the CA's life: the next CA then signs, well
/// before the current one expires, and the CA says which certificate held it and was left
/// behind (status, the RotationBlocked condition, Warning Events).
#[test]
fn a_leaf_that_never_takes_the_bundle_holds_the_rotation_only_until_nine_tenths_of_the_ca_life() {
    let mut w = World::new();
    let info = crate::CertificateInfo::from_pem(&text(&w.ca_secret, "tls.crt")).unwrap();
    let t0 = OffsetDateTime::now_utc();
    w.ca.metadata.annotations = Some([(RENEW_ANNOTATION.to_owned(), "now".to_owned())].into());
    assert_eq!(w.ca_step(t0).0, "start");
    let next_ca = text(&w.ca_secret, rotation::NEXT_CERT_KEY);
    // The leaf's Secret never changes: no `leaf_step` from here on.
    let (step, waiting) = w.ca_step(t0 + time::Duration::minutes(10));
    assert_eq!(step, "keep");
    // Said once: the next look, with that status written, adds no Event.
    w.ca.status = Some(waiting.status.clone());
    assert!(
        w.ca_step(t0 + time::Duration::minutes(11))
            .1
            .events
            .is_empty()
    );

    let life = info.not_after - info.not_before;
    let nine_tenths = info.not_before + life * 9 / 10;
    let mut t = nine_tenths - time::Duration::seconds(1);
    assert_eq!(w.ca_step(t).0, "keep", "still waiting just before");
    let mut promoted = None;
    for _ in 0..5 {
        t += D + time::Duration::seconds(1);
        let (_, outcome) = w.ca_step(t);
        if text(&w.ca_secret, "tls.crt") == next_ca {
            promoted = Some((t, outcome));
            break;
        }
    }
    let (when, outcome) = promoted.expect("the rotation never promoted the next CA");
    assert!(
        when < info.not_after - life / 20,
        "promoted too late: {when}"
    );
    // Said when it gave up, by name, as a Warning.
    let left = outcome.status.rotation.unwrap();
    assert!(
        left.contains("signs without the certificates of ns/server"),
        "{left}"
    );
    assert_eq!(outcome.events[0].reason, Reason::RotationBlocked.as_str());

    // While it waited, what held it was said, by name.
    let blocked = waiting
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == ROTATION_BLOCKED_CONDITION)
        .unwrap();
    assert_eq!(blocked.status, "True");
    assert!(blocked.message.contains("ns/server"), "{}", blocked.message);
    assert_eq!(waiting.events[0].reason, Reason::RotationBlocked.as_str());
    assert_eq!(
        waiting.events[0].type_,
        kube::runtime::events::EventType::Warning
    );
}

/// A certificate anyone may create elsewhere, pointed at the CA by a
/// cross-namespace reference its namespace may not make, is refused, and so does not hold
/// the CA's rotation; the old filter (`spec.validate`, no namespace check) counted it.
#[test]
fn a_refused_certificate_is_no_dependent_of_the_ca() {
    let ca = ("ns".to_owned(), "ca".to_owned());
    let none = std::collections::BTreeSet::new();
    let w = World::new();
    assert_eq!(
        dependent(&w.leaf, &ca, &none),
        Some(("ns".into(), "server".into()))
    );
    let mut evil = dsc(
        "evil",
        serde_json::json!({"caSigned": {"caSecretRef": {"name": "ca", "namespace": "ns"}}}),
        false,
    );
    evil.metadata.namespace = Some("tenant".into());
    assert!(
        evil.spec.validate("tenant").is_ok(),
        "what the old filter used"
    );
    assert_eq!(dependent(&evil, &ca, &none), None);
    let trusted = std::collections::BTreeSet::from(["tenant".to_owned()]);
    assert_eq!(
        dependent(&evil, &ca, &trusted),
        Some(("tenant".into(), "evil".into()))
    );
    // Not signed by this CA: not a dependent either.
    assert_eq!(dependent(&w.ca, &ca, &none), None);
}
