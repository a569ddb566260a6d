//! The certificate controller's reissue triggers (SPEC §2.1) and its clock: whether what is in
//! the Secret must be issued again and why, when time-based renewal is due, readiness, and the
//! next wake-up. Pure; [`super::plan::decide`] is the one decider that uses them.
//!
//! Times here come from certificates anyone may write into a Secret (up to 9999-12-31) and
//! from the clock, and a panic would take the operator down: no arithmetic may overflow.
#![deny(clippy::arithmetic_side_effects)]

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use time::OffsetDateTime;

use crate::api::ValidSpec;
use crate::{CertificateInfo, KeyAlgorithm, SubjectAltName, Usage};

/// The three files of a `kubernetes.io/tls` Secret, as text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub ca: Option<String>,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print private keys, not even in debug logs.
        f.debug_struct("TlsFiles")
            .field("cert", &self.cert)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca)
            .finish()
    }
}

/// A `validFor: 1` certificate is reissued once a minute, not five times a second: the
/// default floor of time-based renewal after issuance (see [`renewal_due_at`]).
pub const DEFAULT_MIN_RENEWAL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// `at` moved by `by`, or `None` past the representable range.
fn shifted(at: OffsetDateTime, by: std::time::Duration) -> Option<OffsetDateTime> {
    at.checked_add(time::Duration::try_from(by).ok()?)
}

/// When time-based renewal is due: at 80% of the validity, but never sooner than
/// `min_renewal_interval` after issuance, so a tiny `validFor` cannot make the operator issue a
/// key, write a Secret and record an Event several times a second, forever.
pub fn renewal_due_at(
    info: &CertificateInfo,
    min_renewal_interval: std::time::Duration,
) -> OffsetDateTime {
    let at_80 = info.renewal_time();
    // Past the end of time nothing is due; `not_after` stands in for "never".
    let floor = shifted(info.not_before, min_renewal_interval).unwrap_or(info.not_after.max(at_80));
    at_80.max(floor)
}

/// `later - earlier` as a `std` duration, zero when `later` is not later.
pub fn until(earlier: OffsetDateTime, later: OffsetDateTime) -> std::time::Duration {
    let nanos = later
        .unix_timestamp_nanos()
        .checked_sub(earlier.unix_timestamp_nanos())
        .unwrap_or(0)
        .max(0);
    let secs = u64::try_from(nanos.div_euclid(1_000_000_000)).unwrap_or(u64::MAX);
    let sub = u32::try_from(nanos.rem_euclid(1_000_000_000)).unwrap_or(0);
    std::time::Duration::new(secs, sub)
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
/// CA-signed spec (None when self-signed). Time-based renewal is skipped when disabled, and
/// waits at least `min_renewal_interval` after issuance; every other trigger still applies (a
/// missing or wrong certificate is never left in place).
pub fn needs_issue(
    spec: &ValidSpec,
    secret: &TlsFiles,
    issuer_pem: Option<&str>,
    manual_renewal: bool,
    now: OffsetDateTime,
    min_renewal_interval: std::time::Duration,
) -> Option<IssueReason> {
    let (Some(cert), Some(key)) = (&secret.cert, &secret.key) else {
        return Some(IssueReason::SecretMissing);
    };
    let info = match CertificateInfo::from_pem(cert) {
        Ok(info) => info,
        Err(e) => {
            let e = marin3r_controller::chain(&e);
            return Some(IssueReason::SecretInvalid(format!("tls.crt: {e}")));
        }
    };
    if let Err(e) = crate::key_matches(cert, key) {
        let e = marin3r_controller::chain(&e);
        return Some(IssueReason::SecretInvalid(format!("tls.key: {e}")));
    }
    if let Some(what) = spec_mismatch(spec, &info) {
        return Some(IssueReason::SpecChanged(what));
    }
    match issuer_pem {
        Some(ca) => {
            // A `ca.crt` that differs is rewritten without a reissue (`plan::decide`): during
            // a CA rotation it changes twice while the certificate stays.
            if crate::verify_signed_by(cert, ca).is_err() {
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
    if spec.renewal_enabled && now >= renewal_due_at(&info, min_renewal_interval) {
        return Some(IssueReason::RenewalDue);
    }
    None
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
    let lifetime = info
        .not_after
        .unix_timestamp()
        .checked_sub(info.not_before.unix_timestamp())
        .unwrap_or(-1);
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

/// When to look at the certificate next: the renewal instant when renewal is enabled (see
/// [`needs_issue`]), else just after expiry (to report it not ready); None once nothing more
/// will happen.
pub fn next_wakeup(
    info: &CertificateInfo,
    renewal_enabled: bool,
    now: OffsetDateTime,
    min_renewal_interval: std::time::Duration,
) -> Option<std::time::Duration> {
    let at = if renewal_enabled {
        renewal_due_at(info, min_renewal_interval)
    } else if !info.is_expired_at(now) {
        // A certificate expiring in the last second of year 9999 never expires for us.
        info.not_after
            .checked_add(time::Duration::seconds(1))
            .unwrap_or(info.not_after)
    } else {
        return None;
    };
    Some(until(now, at))
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // test code
#[path = "triggers_tests.rs"]
mod tests;
