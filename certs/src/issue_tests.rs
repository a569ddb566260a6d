//! Issuing: validity windows, SANs and usages, key types, serials, and the requests refused.

use super::*;
use crate::inspect::{CertificateInfo, SubjectAltName};

fn day() -> Duration {
    Duration::from_secs(86_400)
}

#[test]
fn self_signed_ca_is_its_own_issuer() {
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca", day())).unwrap();
    assert_eq!(ca.cert_pem, ca.ca_pem);
    let info = CertificateInfo::from_pem(&ca.cert_pem).unwrap();
    assert!(info.is_ca);
    assert_eq!(info.subject, "CN=marin3r-ca");
    assert_eq!(info.issuer, "CN=marin3r-ca");
    assert_eq!(info.key_algorithm, "ECDSA P-256");
    assert_eq!(info.not_after - info.not_before, time::Duration::days(1));
}

/// A peer whose clock is a little behind must not see a brand-new
/// certificate as not valid yet. The validity still lasts exactly what was asked.
#[test]
fn validity_starts_a_minute_early_or_a_tenth_of_a_short_one() {
    for (valid_for, backdate) in [(86_400, 60), (300, 30), (5, 0)] {
        let now = OffsetDateTime::now_utc();
        let req = CertificateRequest::ca("ca", Duration::from_secs(valid_for));
        let info = CertificateInfo::from_pem(&issue_self_signed(&req).unwrap().cert_pem).unwrap();
        let early = now.replace_nanosecond(0).unwrap() - info.not_before;
        assert!(
            early >= time::Duration::seconds(backdate)
                && early <= time::Duration::seconds(backdate + 1),
            "validFor {valid_for}s: starts {early} early"
        );
        assert_eq!(
            info.not_after - info.not_before,
            time::Duration::seconds(valid_for as i64)
        );
    }
}

#[test]
fn server_certificate_has_every_san_type_and_server_usage() {
    let ca = issue_self_signed(&CertificateRequest::ca("ca", day())).unwrap();
    let ca = CertificateAuthority::from_issued(&ca).unwrap();
    let req = CertificateRequest::new("xds", Usage::Server, day()).with_hosts([
        "marin3r-instance",
        "marin3r-instance.default.svc",
        "127.0.0.1",
        "::1",
        "spiffe://cluster.local/ns/default",
    ]);
    let cert = ca.issue(&req).unwrap();
    assert_eq!(cert.ca_pem, ca.cert_pem());
    let info = CertificateInfo::from_pem(&cert.cert_pem).unwrap();
    assert!(!info.is_ca);
    assert!(info.server_auth && !info.client_auth);
    assert_eq!(
        info.sans,
        vec![
            SubjectAltName::Dns("marin3r-instance".into()),
            SubjectAltName::Dns("marin3r-instance.default.svc".into()),
            SubjectAltName::Ip("127.0.0.1".parse().unwrap()),
            SubjectAltName::Ip("::1".parse().unwrap()),
            SubjectAltName::Uri("spiffe://cluster.local/ns/default".into()),
        ]
    );
    assert_eq!(info.issuer, "CN=ca");
}

#[test]
fn hosts_default_to_common_name_and_client_usage_is_client_auth() {
    let ca = issue_self_signed(&CertificateRequest::ca("ca", day())).unwrap();
    let ca = CertificateAuthority::from_issued(&ca).unwrap();
    let cert = ca
        .issue(&CertificateRequest::new("envoy", Usage::Client, day()))
        .unwrap();
    let info = CertificateInfo::from_pem(&cert.cert_pem).unwrap();
    assert_eq!(info.sans, vec![SubjectAltName::Dns("envoy".into())]);
    assert!(info.client_auth && !info.server_auth);
}

#[test]
fn rsa_keys_on_request() {
    let req = CertificateRequest::ca("rsa-ca", day()).with_key_algorithm(KeyAlgorithm::Rsa2048);
    let ca = issue_self_signed(&req).unwrap();
    assert_eq!(
        CertificateInfo::from_pem(&ca.cert_pem)
            .unwrap()
            .key_algorithm,
        "RSA 2048"
    );
    // An RSA CA signs an ECDSA leaf and the other way round.
    let rsa_ca = CertificateAuthority::from_issued(&ca).unwrap();
    let leaf = rsa_ca
        .issue(&CertificateRequest::new("leaf", Usage::Server, day()))
        .unwrap();
    crate::verify::verify_signed_by(&leaf.cert_pem, &ca.cert_pem).unwrap();
    let ec_ca = CertificateAuthority::from_issued(
        &issue_self_signed(&CertificateRequest::ca("ec", day())).unwrap(),
    )
    .unwrap();
    let rsa_leaf = ec_ca
        .issue(
            &CertificateRequest::new("leaf", Usage::Client, day())
                .with_key_algorithm(KeyAlgorithm::Rsa2048),
        )
        .unwrap();
    crate::verify::verify_signed_by(&rsa_leaf.cert_pem, ec_ca.cert_pem()).unwrap();
    crate::keys::key_matches(&rsa_leaf.cert_pem, &rsa_leaf.key_pem).unwrap();
}

#[test]
fn serials_are_random_and_positive() {
    let req = CertificateRequest::ca("ca", day());
    let a = CertificateInfo::from_pem(&issue_self_signed(&req).unwrap().cert_pem).unwrap();
    let b = CertificateInfo::from_pem(&issue_self_signed(&req).unwrap().cert_pem).unwrap();
    assert_ne!(a.serial, b.serial);
    assert!(!a.serial.starts_with("00"));
}

#[test]
fn key_algorithm_names_round_trip() {
    for alg in KeyAlgorithm::ALL {
        assert_eq!(alg.as_str().parse::<KeyAlgorithm>().unwrap(), alg);
    }
    assert_eq!(
        "RSA_4096".parse::<KeyAlgorithm>().unwrap(),
        KeyAlgorithm::Rsa4096
    );
    let err = "dsa".parse::<KeyAlgorithm>().unwrap_err().to_string();
    assert!(err.contains("\"dsa\""), "{err}");
}

#[test]
fn bad_requests_are_refused_with_the_reason() {
    let zero = CertificateRequest::ca("ca", Duration::ZERO);
    assert!(
        issue_self_signed(&zero)
            .unwrap_err()
            .to_string()
            .contains("at least one second")
    );
    let empty = CertificateRequest::ca(" ", day());
    assert!(
        issue_self_signed(&empty)
            .unwrap_err()
            .to_string()
            .contains("common name")
    );
    let huge = CertificateRequest::ca("ca", Duration::from_secs(u64::MAX));
    assert!(
        issue_self_signed(&huge)
            .unwrap_err()
            .to_string()
            .contains("too long")
    );
}

#[test]
fn hosts_are_checked() {
    for (host, want) in [
        ("bad host", "not a DNS name"),
        ("-lead.example", "start or end"),
        ("a..b", "empty label"),
        ("1http://x", "URI scheme"),
        ("spiffe://", "nothing after the scheme"),
        ("", "empty name"),
    ] {
        let err = subject_alt_name(host).unwrap_err().to_string();
        assert!(err.contains(want), "{host:?}: {err}");
        assert!(err.contains(&format!("{host:?}")), "{err}");
    }
    for host in [
        "*.example.com",
        "svc.ns.svc.cluster.local.",
        "xn--bcher-kva.example",
    ] {
        subject_alt_name(host).unwrap();
    }
}

#[test]
fn issuer_must_be_a_ca_with_its_own_key() {
    let ca = issue_self_signed(&CertificateRequest::ca("ca", day())).unwrap();
    let leaf = CertificateAuthority::from_issued(&ca)
        .unwrap()
        .issue(&CertificateRequest::new("leaf", Usage::Server, day()))
        .unwrap();
    assert!(matches!(
        CertificateAuthority::from_pem(&leaf.cert_pem, &leaf.key_pem),
        Err(CertError::IssuerNotCa)
    ));
    let other = issue_self_signed(&CertificateRequest::ca("other", day())).unwrap();
    assert!(matches!(
        CertificateAuthority::from_pem(&ca.cert_pem, &other.key_pem),
        Err(CertError::KeyMismatch)
    ));
}

#[test]
fn debug_never_prints_the_key() {
    let ca = issue_self_signed(&CertificateRequest::ca("ca", day())).unwrap();
    assert!(!format!("{ca:?}").contains("PRIVATE KEY"));
}
