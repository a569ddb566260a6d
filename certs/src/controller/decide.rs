//! The pure half of the certificate controller: given the spec, what is in the Secret, the
//! issuer and the clock, decide whether to issue and what status to report.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use time::OffsetDateTime;

use crate::api::ValidSpec;
use crate::{CertificateInfo, KeyAlgorithm, SubjectAltName, Usage};

/// The three files of a `kubernetes.io/tls` Secret, as text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub ca: Option<String>,
}

/// Why a certificate is (re)issued; also the Event's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IssueReason {
    SecretMissing,
    SecretInvalid(String),
    SpecChanged(String),
    IssuerChanged,
    ManualRenewal,
    RenewalDue,
}

impl fmt::Display for IssueReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SecretMissing => {
                f.write_str("the Secret does not exist or lacks tls.crt/tls.key")
            }
            Self::SecretInvalid(why) => write!(f, "the Secret's certificate is unusable: {why}"),
            Self::SpecChanged(what) => write!(f, "the spec changed: {what}"),
            Self::IssuerChanged => f.write_str("the issuing CA changed"),
            Self::ManualRenewal => f.write_str("a renewal was requested"),
            Self::RenewalDue => f.write_str("80% of the validity has passed"),
        }
    }
}

/// Decides whether the Secret must be (re)issued. `issuer_pem` is the CA's certificate for a
/// CA-signed spec (None when self-signed). Time-based renewal is skipped when disabled; every
/// other trigger still applies (a missing or wrong certificate is never left in place).
pub fn needs_issue(
    spec: &ValidSpec,
    secret: &TlsFiles,
    issuer_pem: Option<&str>,
    manual_renewal: bool,
    now: OffsetDateTime,
) -> Option<IssueReason> {
    let (Some(cert), Some(key)) = (&secret.cert, &secret.key) else {
        return Some(IssueReason::SecretMissing);
    };
    let info = match CertificateInfo::from_pem(cert) {
        Ok(info) => info,
        Err(e) => return Some(IssueReason::SecretInvalid(format!("tls.crt: {e}"))),
    };
    if let Err(e) = crate::key_matches(cert, key) {
        return Some(IssueReason::SecretInvalid(format!("tls.key: {e}")));
    }
    if let Some(what) = spec_mismatch(spec, &info) {
        return Some(IssueReason::SpecChanged(what));
    }
    match issuer_pem {
        Some(ca) => {
            if crate::verify_signed_by(cert, ca).is_err()
                || !same_certificates(secret.ca.as_deref(), ca)
            {
                return Some(IssueReason::IssuerChanged);
            }
        }
        None => {
            if crate::verify_self_signed(cert).is_err() {
                return Some(IssueReason::SpecChanged("signer is now selfSigned".into()));
            }
        }
    }
    if manual_renewal {
        return Some(IssueReason::ManualRenewal);
    }
    if spec.renewal_enabled && now >= info.renewal_time() {
        return Some(IssueReason::RenewalDue);
    }
    None
}

fn same_certificates(a: Option<&str>, b: &str) -> bool {
    match (a.map(crate::certificate_hash), crate::certificate_hash(b)) {
        (Some(Ok(a)), Ok(b)) => a == b,
        _ => false,
    }
}

/// What differs between the spec and the issued certificate, if anything.
fn spec_mismatch(spec: &ValidSpec, info: &CertificateInfo) -> Option<String> {
    let req = &spec.request;
    let cn = format!("CN={}", req.common_name);
    if info.subject != cn {
        return Some(format!("commonName ({} -> {cn})", info.subject));
    }
    let want: BTreeSet<String> = req
        .effective_hosts()
        .map(|h| expected_san(h).to_string())
        .collect();
    let have: BTreeSet<String> = info.sans.iter().map(ToString::to_string).collect();
    if want != have {
        return Some(format!("hosts ({} -> {})", join(&have), join(&want)));
    }
    if info.is_ca != req.is_ca {
        return Some("isCA".into());
    }
    if !req.is_ca {
        let usage_ok = match req.usage {
            Usage::Server => info.server_auth,
            Usage::Client => info.client_auth && !info.server_auth,
        };
        if !usage_ok {
            return Some("server".into());
        }
    }
    let lifetime = (info.not_after - info.not_before).whole_seconds();
    if u64::try_from(lifetime).ok() != Some(req.valid_for.as_secs()) {
        return Some(format!(
            "validFor ({lifetime}s -> {}s)",
            req.valid_for.as_secs()
        ));
    }
    let alg = match req.key_algorithm {
        KeyAlgorithm::EcdsaP256 => "ECDSA P-256",
        KeyAlgorithm::Rsa2048 => "RSA 2048",
        KeyAlgorithm::Rsa4096 => "RSA 4096",
    };
    if info.key_algorithm != alg {
        return Some(format!("keyAlgorithm ({} -> {alg})", info.key_algorithm));
    }
    None
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().cloned().collect::<Vec<_>>().join(", ")
}

fn expected_san(host: &str) -> SubjectAltName {
    if let Ok(ip) = host.parse::<IpAddr>() {
        SubjectAltName::Ip(ip)
    } else if host.contains("://") {
        SubjectAltName::Uri(host.to_owned())
    } else {
        SubjectAltName::Dns(host.to_owned())
    }
}

/// Readiness of an issued certificate at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotYetValid,
    Expired,
}

pub fn readiness(info: &CertificateInfo, now: OffsetDateTime) -> Readiness {
    if now < info.not_before {
        Readiness::NotYetValid
    } else if info.is_expired_at(now) {
        Readiness::Expired
    } else {
        Readiness::Ready
    }
}

/// When to look at the certificate next: the renewal instant when renewal is enabled, else
/// just after expiry (to report it not ready); None once nothing more will happen.
pub fn next_wakeup(
    info: &CertificateInfo,
    renewal_enabled: bool,
    now: OffsetDateTime,
) -> Option<std::time::Duration> {
    let at = if renewal_enabled {
        info.renewal_time()
    } else if !info.is_expired_at(now) {
        info.not_after + time::Duration::seconds(1)
    } else {
        return None;
    };
    let wait = (at - now).max(time::Duration::ZERO);
    Some(std::time::Duration::try_from(wait).unwrap_or_default())
}

#[cfg(test)]
mod tests {
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
            needs_issue(&spec, &files, Some(&ca_files.cert_pem), false, now()),
            None
        );
        // Hosts in another order are the same certificate.
        let mut reordered = spec.clone();
        reordered.request.hosts.reverse();
        assert_eq!(
            needs_issue(&reordered, &files, Some(&ca_files.cert_pem), false, now()),
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
            needs_issue(spec, files, ca, manual, at)
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
        // The Secret's ca.crt is stale even though the signature still verifies.
        let stale_bundle = TlsFiles {
            ca: Some(new_ca_files.cert_pem.clone()),
            ..files.clone()
        };
        assert_eq!(
            check(&spec, &stale_bundle, ca_pem, false, now()),
            Some(IssueReason::IssuerChanged)
        );
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
                needs_issue(&spec, &files, None, false, now()),
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
            next_wakeup(&info, true, t + time::Duration::seconds(30)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(
            next_wakeup(&info, true, t + time::Duration::seconds(90)),
            Some(Duration::ZERO)
        );
        // Disabled: wake just after expiry, then never.
        assert_eq!(
            next_wakeup(&info, false, t + time::Duration::seconds(30)),
            Some(Duration::from_secs(71))
        );
        assert_eq!(
            next_wakeup(&info, false, t + time::Duration::seconds(200)),
            None
        );
    }
}
