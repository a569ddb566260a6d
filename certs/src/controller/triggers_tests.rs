//! The reissue triggers, the renewal instant and the wake-ups, at the edges of time too.

use super::*;
use crate::api::ValidSpec;
use crate::{
    CertificateAuthority, CertificateRequest, IssuedCertificate, issue::issue_self_signed_at,
    issue_self_signed,
};
use std::time::Duration;

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn mk_spec(request: CertificateRequest, ca: bool) -> ValidSpec {
    ValidSpec {
        request,
        ca_secret: ca.then(|| ("ns".into(), "ca".into())),
        secret: ("ns".into(), "cert".into()),
        renewal_enabled: true,
    }
}

fn mk_files(issued: &IssuedCertificate) -> TlsFiles {
    TlsFiles {
        cert: Some(issued.cert_pem.clone()),
        key: Some(issued.key_pem.clone()),
        ca: Some(issued.ca_pem.clone()),
    }
}

fn leaf_request() -> CertificateRequest {
    CertificateRequest::new("envoy", Usage::Client, Duration::from_secs(1000)).with_hosts([
        "spiffe://cluster.local/ns/a",
        "envoy.a.svc",
        "10.0.0.1",
    ])
}

fn mk_ca() -> (IssuedCertificate, CertificateAuthority) {
    let issued =
        issue_self_signed(&CertificateRequest::ca("ca", Duration::from_secs(86_400))).unwrap();
    let ca = CertificateAuthority::from_issued(&issued).unwrap();
    (issued, ca)
}

#[test]
fn a_fresh_matching_certificate_is_left_alone() {
    let (ca_files, ca) = mk_ca();
    let spec = mk_spec(leaf_request(), true);
    let files = mk_files(&ca.issue(&spec.request).unwrap());
    assert_eq!(
        needs_issue(
            &spec,
            &files,
            Some(&ca_files.cert_pem),
            false,
            now(),
            Duration::ZERO
        ),
        None
    );
    // Hosts in another order are the same certificate.
    let mut reordered = spec.clone();
    reordered.request.hosts.reverse();
    assert_eq!(
        needs_issue(
            &reordered,
            &files,
            Some(&ca_files.cert_pem),
            false,
            now(),
            Duration::ZERO
        ),
        None
    );
}

#[test]
fn every_trigger_is_detected() {
    let (ca_files, ca) = mk_ca();
    let spec = mk_spec(leaf_request(), true);
    let issued = ca.issue(&spec.request).unwrap();
    let files = mk_files(&issued);
    let ca_pem = Some(ca_files.cert_pem.as_str());
    let check = |spec: &ValidSpec, files: &TlsFiles, ca: Option<&str>, manual, at| {
        needs_issue(spec, files, ca, manual, at, Duration::ZERO)
    };

    assert_eq!(
        check(&spec, &TlsFiles::default(), ca_pem, false, now()),
        Some(IssueReason::SecretMissing)
    );
    let garbled = TlsFiles {
        cert: Some("garbage".into()),
        ..files.clone()
    };
    assert!(matches!(
        check(&spec, &garbled, ca_pem, false, now()),
        Some(IssueReason::SecretInvalid(m)) if m.starts_with("tls.crt")
    ));
    let other = ca.issue(&spec.request).unwrap();
    let swapped = TlsFiles {
        key: Some(other.key_pem),
        ..files.clone()
    };
    assert!(matches!(
        check(&spec, &swapped, ca_pem, false, now()),
        Some(IssueReason::SecretInvalid(m)) if m.starts_with("tls.key")
    ));

    for (mutate, want) in [
        (
            (|s: &mut ValidSpec| s.request.common_name = "other".into()) as fn(&mut ValidSpec),
            "commonName",
        ),
        (|s| s.request.hosts.pop().map(drop).unwrap_or(()), "hosts"),
        (|s| s.request.usage = Usage::Server, "server"),
        (|s| s.request.is_ca = true, "isCA"),
        (
            |s| s.request.valid_for = Duration::from_secs(999),
            "validFor",
        ),
        (
            |s| s.request.key_algorithm = KeyAlgorithm::Rsa2048,
            "keyAlgorithm",
        ),
    ] {
        let mut changed = spec.clone();
        mutate(&mut changed);
        assert!(
            matches!(check(&changed, &files, ca_pem, false, now()), Some(IssueReason::SpecChanged(m)) if m.starts_with(want)),
            "{want}"
        );
    }

    let (new_ca_files, _) = mk_ca();
    assert_eq!(
        check(&spec, &files, Some(&new_ca_files.cert_pem), false, now()),
        Some(IssueReason::IssuerChanged)
    );
    // A stale ca.crt whose certificate still verifies is no reason to reissue: only
    // ca.crt is rewritten (plan::decide), as during a CA rotation.
    let stale_bundle = TlsFiles {
        ca: Some(new_ca_files.cert_pem.clone()),
        ..files.clone()
    };
    assert_eq!(check(&spec, &stale_bundle, ca_pem, false, now()), None);
    // Switching to self-signed.
    assert!(matches!(
        check(&spec, &files, None, false, now()),
        Some(IssueReason::SpecChanged(m)) if m.contains("selfSigned")
    ));

    assert_eq!(
        check(&spec, &files, ca_pem, true, now()),
        Some(IssueReason::ManualRenewal)
    );
    let info = CertificateInfo::from_pem(&issued.cert_pem).unwrap();
    let due = info.renewal_time();
    assert_eq!(
        check(
            &spec,
            &files,
            ca_pem,
            false,
            due - time::Duration::seconds(1)
        ),
        None
    );
    assert_eq!(
        check(&spec, &files, ca_pem, false, due),
        Some(IssueReason::RenewalDue)
    );
    let mut disabled = spec.clone();
    disabled.renewal_enabled = false;
    assert_eq!(
        check(
            &disabled,
            &files,
            ca_pem,
            false,
            info.not_after + time::Duration::days(1)
        ),
        None
    );
}

#[test]
fn self_signed_certificates_are_checked_against_themselves() {
    // A CA and a plain (non-CA) self-signed certificate are both left alone.
    for req in [
        CertificateRequest::ca("ca", Duration::from_secs(100)),
        CertificateRequest::new("plain", Usage::Server, Duration::from_secs(100)),
    ] {
        let spec = mk_spec(req.clone(), false);
        let files = mk_files(&issue_self_signed(&req).unwrap());
        assert_eq!(
            needs_issue(&spec, &files, None, false, now(), Duration::ZERO),
            None,
            "{req:?}"
        );
    }
}

#[test]
fn readiness_and_wakeups_follow_the_validity_window() {
    let start = now() - time::Duration::seconds(50);
    let issued = issue_self_signed_at(
        &CertificateRequest::ca("ca", Duration::from_secs(100)),
        start,
    )
    .unwrap();
    let info = CertificateInfo::from_pem(&issued.cert_pem).unwrap();
    let t = info.not_before;
    assert_eq!(
        readiness(&info, t - time::Duration::seconds(1)),
        Readiness::NotYetValid
    );
    assert_eq!(readiness(&info, t), Readiness::Ready);
    assert_eq!(readiness(&info, info.not_after), Readiness::Ready);
    assert_eq!(
        readiness(&info, info.not_after + time::Duration::seconds(1)),
        Readiness::Expired
    );

    // Renewal enabled: wake at 80% (t + 80s).
    assert_eq!(
        next_wakeup(&info, true, t + time::Duration::seconds(30), Duration::ZERO),
        Some(Duration::from_secs(50))
    );
    assert_eq!(
        next_wakeup(&info, true, t + time::Duration::seconds(90), Duration::ZERO),
        Some(Duration::ZERO)
    );
    // Disabled: wake just after expiry, then never.
    assert_eq!(
        next_wakeup(
            &info,
            false,
            t + time::Duration::seconds(30),
            Duration::ZERO
        ),
        Some(Duration::from_secs(71))
    );
    assert_eq!(
        next_wakeup(
            &info,
            false,
            t + time::Duration::seconds(200),
            Duration::ZERO
        ),
        None
    );
}

fn end_of_time() -> OffsetDateTime {
    time::macros::datetime!(9999-12-31 23:59:59 UTC)
}

/// RFC 5280's "no well-defined expiration", with renewal disabled: F5 crashed the operator
/// on `not_after + 1s`.
#[test]
fn a_certificate_expiring_at_the_end_of_time_does_not_panic() {
    let valid_for = Duration::from_secs(86_400);
    let req = CertificateRequest::ca("forever", valid_for);
    // Issued a day minus the minute its validity starts early before the end of time.
    let start = end_of_time() - time::Duration::seconds(86_400 - 60);
    let issued = issue_self_signed_at(&req, start).unwrap();
    let info = CertificateInfo::from_pem(&issued.cert_pem).unwrap();
    assert_eq!(info.not_after, end_of_time());
    let start = info.not_before;
    for now in [
        start,
        end_of_time() - time::Duration::seconds(1),
        end_of_time(),
    ] {
        let wait = next_wakeup(&info, false, now, Duration::ZERO).unwrap();
        assert!(wait <= valid_for, "{wait:?}");
        assert!(next_wakeup(&info, true, now, Duration::from_secs(u64::MAX)).is_some());
    }
    let mut spec = mk_spec(req, false);
    spec.renewal_enabled = false;
    let files = mk_files(&issued);
    assert_eq!(
        needs_issue(&spec, &files, None, false, end_of_time(), Duration::ZERO),
        None
    );
    spec.renewal_enabled = true;
    assert_eq!(
        needs_issue(
            &spec,
            &files,
            None,
            false,
            end_of_time(),
            Duration::from_secs(u64::MAX)
        ),
        Some(IssueReason::RenewalDue),
        "at the end of time an unrepresentable floor means no later than expiry"
    );
}

/// `validFor: 1` made the controller reissue every ~200 ms, forever.
#[test]
fn renewal_waits_for_the_minimum_interval_after_issuance() {
    let req = CertificateRequest::new("tiny", Usage::Server, Duration::from_secs(1));
    let issued = issue_self_signed(&req).unwrap();
    let info = CertificateInfo::from_pem(&issued.cert_pem).unwrap();
    let spec = mk_spec(req, false);
    let files = mk_files(&issued);
    let minute = Duration::from_secs(60);
    let t = info.not_before;
    for after in [1, 2, 59] {
        let at = t + time::Duration::seconds(after);
        assert_eq!(needs_issue(&spec, &files, None, false, at, minute), None);
        assert_eq!(
            next_wakeup(&info, true, at, minute),
            Some(Duration::from_secs(60 - after.unsigned_abs()))
        );
    }
    let at = t + time::Duration::seconds(60);
    assert_eq!(
        needs_issue(&spec, &files, None, false, at, minute),
        Some(IssueReason::RenewalDue)
    );
    assert_eq!(next_wakeup(&info, true, at, minute), Some(Duration::ZERO));
    // Other triggers are not held back by the floor.
    assert_eq!(
        needs_issue(&spec, &files, None, true, t, minute),
        Some(IssueReason::ManualRenewal)
    );
}

#[test]
fn tls_files_never_print_the_private_key() {
    let issued = issue_self_signed(&leaf_request()).unwrap();
    let shown = format!("{:?}", mk_files(&issued));
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    assert!(shown.contains("BEGIN CERTIFICATE"), "{shown}");
}

mod never_panics {
    use proptest::prelude::*;

    use super::*;

    /// Any instant `time` can hold (years -9999..=9999), biased towards the extremes and
    /// the present.
    fn instant() -> impl Strategy<Value = OffsetDateTime> {
        let min = OffsetDateTime::new_utc(time::Date::MIN, time::Time::MIDNIGHT);
        let max = end_of_time();
        let (lo, hi) = (min.unix_timestamp(), max.unix_timestamp());
        let now = OffsetDateTime::now_utc().unix_timestamp();
        prop_oneof![
            Just(lo),
            Just(hi),
            (hi - 1_000)..=hi,
            lo..=(lo + 1_000),
            (now - 1_000_000)..(now + 1_000_000),
            lo..=hi,
        ]
        .prop_flat_map(|secs| (Just(secs), 0u32..1_000_000_000))
        .prop_map(move |(secs, nanos)| {
            let t = OffsetDateTime::from_unix_timestamp(secs).unwrap_or(max);
            t.replace_nanosecond(nanos).unwrap_or(t)
        })
    }

    fn interval() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            Just(Duration::from_secs(u64::MAX)),
            any::<u64>().prop_map(Duration::from_secs),
            (0u64..1_000_000).prop_map(Duration::from_secs),
        ]
    }

    fn info(not_before: OffsetDateTime, not_after: OffsetDateTime) -> CertificateInfo {
        CertificateInfo {
            subject: "CN=x".into(),
            issuer: "CN=x".into(),
            sans: vec![],
            serial: "01".into(),
            key_algorithm: "ECDSA P-256".into(),
            not_before,
            not_after,
            is_ca: false,
            server_auth: true,
            client_auth: false,
            der: vec![],
        }
    }

    fn at(now: OffsetDateTime, wait: Duration) -> Option<OffsetDateTime> {
        now.checked_add(time::Duration::try_from(wait).ok()?)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn wakeups_readiness_and_renewal_are_total_and_consistent(
            not_before in instant(),
            not_after in instant(),
            now in instant(),
            floor in interval(),
        ) {
            let info = info(not_before, not_after);
            let ready = readiness(&info, now);
            prop_assert_eq!(
                ready == Readiness::Ready,
                not_before <= now && now <= not_after
            );
            let due = renewal_due_at(&info, floor);
            // Never before 80% of the validity, never before the floor when it is
            // representable.
            prop_assert!(due >= info.renewal_time());
            if let Some(floor_at) = at(not_before, floor) {
                prop_assert!(due >= floor_at);
            }

            let renewing = next_wakeup(&info, true, now, floor);
            let wait = renewing.unwrap_or(Duration::MAX);
            prop_assert!(renewing.is_some());
            // Waking after the wait, renewal is due (or the instant is past the end of time).
            if let Some(wake) = at(now, wait) {
                prop_assert!(wake >= due, "woke at {wake} before {due}");
            }
            if now >= due {
                prop_assert_eq!(wait, Duration::ZERO);
            }

            match next_wakeup(&info, false, now, floor) {
                None => prop_assert!(info.is_expired_at(now)),
                Some(wait) => {
                    prop_assert!(!info.is_expired_at(now));
                    if let Some(wake) = at(now, wait) {
                        prop_assert!(wake >= not_after);
                    }
                }
            }
            prop_assert_eq!(until(now, now), Duration::ZERO);
            prop_assert_eq!(until(not_after.max(now), not_after.min(now)), Duration::ZERO);
        }
    }

    /// `needs_issue` on real certificates issued at the edges of time, at any instant.
    #[test]
    fn needs_issue_is_total_at_the_edges_of_time() {
        let req = CertificateRequest::new("edge", Usage::Client, Duration::from_secs(3_600));
        let min = OffsetDateTime::new_utc(time::Date::MIN, time::Time::MIDNIGHT);
        let starts = [
            end_of_time() - time::Duration::seconds(3_600),
            OffsetDateTime::UNIX_EPOCH,
            now(),
        ];
        let issued: Vec<IssuedCertificate> = starts
            .iter()
            .map(|s| issue_self_signed_at(&req, *s).unwrap())
            .collect();
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(300));
        runner
            .run(
                &(
                    0..issued.len(),
                    instant(),
                    interval(),
                    any::<bool>(),
                    any::<bool>(),
                ),
                |(i, now, floor, renew, manual)| {
                    let mut spec = mk_spec(req.clone(), false);
                    spec.renewal_enabled = renew;
                    let files = mk_files(&issued[i]);
                    let reason = needs_issue(&spec, &files, None, manual, now, floor);
                    let info = CertificateInfo::from_pem(&issued[i].cert_pem).unwrap();
                    match reason {
                        None => prop_assert!(!manual),
                        Some(IssueReason::ManualRenewal) => prop_assert!(manual),
                        Some(IssueReason::RenewalDue) => {
                            prop_assert!(renew && !manual);
                            prop_assert!(now >= renewal_due_at(&info, floor));
                        }
                        Some(other) => prop_assert!(false, "unexpected {other:?}"),
                    }
                    Ok(())
                },
            )
            .unwrap();
        let _ = min;
    }
}
