//! The plan of a certificate without a rotation: a missing CA, a missing Secret, a good one kept.

use super::*;
use crate::controller::report::{report, to_time};
use marin3r_controller::Reason as _;

fn dsc(signer: serde_json::Value) -> DiscoveryServiceCertificate {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": "c", "namespace": "ns", "generation": 3},
        "spec": {"commonName": "c", "validFor": 86400, "signer": signer,
                 "secretRef": {"name": "c-tls"}},
    }))
    .unwrap()
}

fn observe(dsc: &DiscoveryServiceCertificate, secret: Option<Secret>) -> Observed<'_> {
    Observed {
        dsc,
        spec: check_spec(dsc, false),
        ca_secret: None,
        secret,
        now: OffsetDateTime::now_utc(),
        min_renewal_interval: Duration::from_secs(60),
        dependents: Vec::new(),
        trust_propagation: Duration::from_secs(10),
    }
}

#[test]
fn a_missing_ca_is_not_ready_and_looked_for_again_with_one_warning() {
    let dsc = dsc(serde_json::json!({"caSigned": {"caSecretRef": {"name": "ca"}}}));
    let obs = observe(&dsc, None);
    let Plan::NotReady(not_ready) = decide(&obs) else {
        panic!("a missing CA must not issue")
    };
    assert_eq!(not_ready.reason, Reason::CASecretNotFound);
    assert_eq!(not_ready.retry, Some(DEPENDENCY_RETRY));
    let outcome = crate::controller::report::not_ready(&obs, not_ready.clone());
    assert_eq!(outcome.status.ready, Some(false));
    assert_eq!(outcome.status.conditions[0].reason, "CASecretNotFound");
    assert_eq!(outcome.status.observed_generation, Some(3));
    assert_eq!(outcome.events.len(), 1);
    assert_eq!(outcome.events[0].reason, Reason::CASecretNotFound.as_str());
    // The same problem again: no second Warning.
    let mut seen = dsc.clone();
    seen.status = Some(outcome.status);
    let again = crate::controller::report::not_ready(&observe(&seen, None), not_ready);
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn a_missing_secret_is_issued_and_a_good_one_kept_until_renewal() {
    let dsc = dsc(serde_json::json!({"selfSigned": {}}));
    let obs = observe(&dsc, None);
    let Plan::Issue { ca, reason, .. } = decide(&obs) else {
        panic!("a missing Secret must be issued")
    };
    assert!(ca.is_none());
    assert_eq!(reason, IssueReason::SecretMissing);
    let Ok(valid) = &obs.spec else { panic!() };
    let issued = crate::issue_self_signed(&valid.request).unwrap();
    let data = bundle::secret_data([
        ("tls.crt", issued.cert_pem.as_str()),
        ("tls.key", &issued.key_pem),
        ("ca.crt", &issued.ca_pem),
    ]);
    let secret = Secret {
        data: Some(data),
        ..Default::default()
    };
    let obs = observe(&dsc, Some(secret));
    let Plan::Keep(current) = decide(&obs) else {
        panic!("a good certificate must be kept")
    };
    let outcome = report(&obs, valid, &current, None);
    assert_eq!(outcome.status.ready, Some(true));
    assert_eq!(outcome.status.conditions[0].reason, "Issued");
    assert!(outcome.events.is_empty());
    let wait = outcome.requeue.unwrap();
    assert!(
        wait > Duration::from_secs(60_000) && wait <= Duration::from_secs(69_120),
        "{wait:?}"
    );
    let issued_now = report(&obs, valid, &current, Some(&IssueReason::SecretMissing));
    assert_eq!(issued_now.events.len(), 1);
    assert_eq!(issued_now.events[0].reason, "Issued");
}

/// A v0.6 manifest with `certificateRenewalNotification: {enabled: false}`: past 80% of its
/// validity the certificate is kept (not renewed), its status says renewal is off and when
/// it expires, and after expiry it is not ready with one Warning. `{enabled: true}` renews.
#[test]
fn the_v0_6_renewal_switch_keeps_the_certificate_until_it_expires() {
    let v06 = |enabled: bool| {
        let mut dsc = dsc(serde_json::json!({"selfSigned": {}}));
        dsc.spec.certificate_renewal_notification =
            Some(crate::api::CertificateRenewal { enabled });
        dsc
    };
    let off = v06(false);
    let valid = check_spec(&off, false).unwrap();
    let start = OffsetDateTime::now_utc() - time::Duration::hours(23);
    let issued = crate::issue::issue_self_signed_at(&valid.request, start).unwrap();
    let info = crate::CertificateInfo::from_pem(&issued.cert_pem).unwrap();
    let secret = Secret {
        data: Some(bundle::secret_data([
            ("tls.crt", issued.cert_pem.as_str()),
            ("tls.key", &issued.key_pem),
            ("ca.crt", &issued.ca_pem),
        ])),
        ..Default::default()
    };
    fn at<'a>(
        dsc: &'a DiscoveryServiceCertificate,
        secret: &Secret,
        now: OffsetDateTime,
    ) -> (Plan, Observed<'a>) {
        let mut obs = observe(dsc, Some(secret.clone()));
        obs.now = now;
        (decide(&obs), obs)
    }
    // 23 of 24 hours in: due for renewal, and renewed when the switch is on.
    let now = OffsetDateTime::now_utc();
    let Plan::Issue { reason, .. } = at(&v06(true), &secret, now).0 else {
        panic!("renewal on: a certificate past 80% is reissued")
    };
    assert_eq!(reason, IssueReason::RenewalDue);

    let (plan, obs) = at(&off, &secret, now);
    let Plan::Keep(current) = plan else {
        panic!("renewal off: the certificate is kept")
    };
    let outcome = report(&obs, &valid, &current, None);
    assert_eq!(outcome.status.ready, Some(true));
    assert_eq!(outcome.status.renewal_time, None, "no renewal is scheduled");
    let ready = &outcome.status.conditions[0];
    let expiry = to_time(info.not_after).0.to_string();
    assert!(
        ready
            .message
            .contains("renewal is off (spec.certificateRenewalNotification.enabled: false)")
            && ready.message.contains(&expiry),
        "{}",
        ready.message
    );
    // The next look is just after expiry, to report it.
    let wait = outcome.requeue.unwrap();
    assert!(
        wait > Duration::from_secs(3_500) && wait <= Duration::from_secs(3_602),
        "{wait:?}"
    );
    let issued_event = report(&obs, &valid, &current, Some(&IssueReason::SecretMissing));
    assert!(
        issued_event.events[0].message.contains("renewal is off"),
        "{:?}",
        issued_event.events
    );

    // After expiry: still not reissued, not ready, and one Warning says why.
    let mut seen = off.clone();
    seen.status = Some(outcome.status);
    let later = info.not_after + time::Duration::minutes(1);
    let (plan, obs) = at(&seen, &secret, later);
    let Plan::Keep(current) = plan else {
        panic!("renewal off: an expired certificate is not reissued")
    };
    let expired = report(&obs, &valid, &current, None);
    assert_eq!(expired.status.ready, Some(false));
    let ready = &expired.status.conditions[0];
    assert_eq!(ready.reason, "Expired");
    assert!(
        ready.message.contains("certificateRenewalNotification"),
        "{}",
        ready.message
    );
    assert_eq!(expired.events.len(), 1);
    assert_eq!(expired.events[0].reason, "Expired");
    assert_eq!(expired.requeue, None, "nothing more will happen by itself");
}
