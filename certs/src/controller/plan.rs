//! The certificate controller's decisions, pure: from what was observed (the certificate,
//! its CA Secret, its Secret, the clock) to what to do and what to report. Issuing itself
//! draws a new key, so it is the one step between [`decide`] and [`report`].

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use marin3r_controller::{Note, set_condition};
use time::OffsetDateTime;

use super::decide::{
    IssueReason, Readiness, TlsFiles, needs_issue, next_wakeup, readiness, renewal_due_at,
};
use crate::api::{
    DiscoveryServiceCertificate, DiscoveryServiceCertificateStatus, READY_CONDITION,
    RENEW_ANNOTATION, ValidSpec,
};
use crate::{CertificateAuthority, CertificateInfo};

/// How long to wait before looking again for a CA Secret that is missing or unusable.
const DEPENDENCY_RETRY: Duration = Duration::from_secs(15);
/// The shortest wait before a wake-up at the renewal instant.
const MIN_WAKEUP: Duration = Duration::from_millis(200);

marin3r_controller::reasons! {
    /// The reasons of the Ready condition and of the certificate's Events.
    pub enum Reason {
        InvalidSpec,
        CrossNamespaceReference,
        CASecretNotFound,
        CASecretInvalid,
        IssuanceFailed,
        Issued,
        NotYetValid,
        Expired,
    }
}

/// Why a certificate is not ready, as the Ready condition's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    pub reason: Reason,
    pub message: String,
    /// Look again after this long (a dependency may appear); None: wait for a change.
    pub retry: Option<Duration>,
}

impl NotReady {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            retry: None,
        }
    }

    fn retry(mut self) -> Self {
        self.retry = Some(DEPENDENCY_RETRY);
        self
    }
}

/// What the controller read for one certificate.
pub struct Observed<'a> {
    pub dsc: &'a DiscoveryServiceCertificate,
    /// The checked spec, or why it cannot be served ([`check_spec`]).
    pub spec: Result<ValidSpec, NotReady>,
    /// The CA Secret, when the spec names one (read only for a valid spec).
    pub ca_secret: Option<Secret>,
    /// The certificate's Secret (read only for a valid spec).
    pub secret: Option<Secret>,
    pub now: OffsetDateTime,
    /// Time-based renewal waits at least this long after issuance.
    pub min_renewal_interval: Duration,
}

/// What to do about one certificate.
pub enum Plan {
    /// Report why it is not ready.
    NotReady(NotReady),
    /// Issue a new certificate (signed by `ca`, or self-signed) into the Secret, recording
    /// the renewal request it answers.
    Issue {
        ca: Option<Box<CertificateAuthority>>,
        reason: IssueReason,
        renew_request: Option<String>,
    },
    /// The Secret's certificate stays; report on it.
    Keep { cert_pem: String },
}

/// What to write after acting: the status, the Events, when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: DiscoveryServiceCertificateStatus,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

/// Checks the spec and that it names Secrets only where this certificate may. Observing
/// reads the Secrets of a spec that passes.
pub fn check_spec(dsc: &DiscoveryServiceCertificate, trusted: bool) -> Result<ValidSpec, NotReady> {
    let ns = dsc.namespace().unwrap_or_default();
    let valid = dsc
        .spec
        .validate(&ns)
        .map_err(|message| NotReady::new(Reason::InvalidSpec, message))?;
    if !trusted && let Some(message) = forbidden_reference(&ns, &valid) {
        return Err(NotReady::new(Reason::CrossNamespaceReference, message));
    }
    Ok(valid)
}

fn forbidden_reference(ns: &str, valid: &ValidSpec) -> Option<String> {
    let refs = [
        Some(("secretRef", &valid.secret)),
        valid
            .ca_secret
            .as_ref()
            .map(|c| ("signer.caSigned.caSecretRef", c)),
    ];
    refs.into_iter().flatten().find(|(_, (other, _))| other != ns).map(|(field, (other, name))| {
        format!(
            "spec.{field} names Secret {other}/{name} in another namespace; only certificates in the operator's namespaces may do that"
        )
    })
}

/// The three files of a `kubernetes.io/tls` Secret, as text.
pub fn tls_files(secret: &Secret) -> TlsFiles {
    let text = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    TlsFiles {
        cert: text("tls.crt"),
        key: text("tls.key"),
        ca: text("ca.crt"),
    }
}

/// Decides whether to issue.
pub fn decide(obs: &Observed<'_>) -> Plan {
    let valid = match &obs.spec {
        Ok(valid) => valid,
        Err(not_ready) => return Plan::NotReady(not_ready.clone()),
    };
    let ca = match usable_ca(valid, obs.ca_secret.as_ref()) {
        Ok(ca) => ca,
        Err(not_ready) => return Plan::NotReady(not_ready),
    };
    let files = obs.secret.as_ref().map(tls_files).unwrap_or_default();
    let renew_request = obs.dsc.annotations().get(RENEW_ANNOTATION).cloned();
    // The Secret records the renewal request it was issued for. It is read fresh from the API,
    // unlike the certificate, which may come from a cache that has not seen our last status
    // write yet (deciding from the status would then renew twice).
    let handled = obs
        .secret
        .as_ref()
        .and_then(|s| s.annotations().get(RENEW_ANNOTATION).cloned());
    let manual = renew_request.is_some() && renew_request != handled;
    let issuer_pem = ca.as_ref().map(|ca| ca.cert_pem());
    let min_renewal = obs.min_renewal_interval;
    match needs_issue(valid, &files, issuer_pem, manual, obs.now, min_renewal) {
        None => Plan::Keep {
            cert_pem: files.cert.unwrap_or_default(),
        },
        Some(reason) => Plan::Issue {
            ca: ca.map(Box::new),
            reason,
            renew_request,
        },
    }
}

/// The CA of a CA-signed spec, from its Secret.
fn usable_ca(
    valid: &ValidSpec,
    secret: Option<&Secret>,
) -> Result<Option<CertificateAuthority>, NotReady> {
    let Some((ca_ns, ca_name)) = &valid.ca_secret else {
        return Ok(None);
    };
    let Some(secret) = secret else {
        let msg = format!("CA Secret {ca_ns}/{ca_name} not found");
        return Err(NotReady::new(Reason::CASecretNotFound, msg).retry());
    };
    let files = tls_files(secret);
    let (Some(cert), Some(key)) = (files.cert, files.key) else {
        let msg = format!("CA Secret {ca_ns}/{ca_name} lacks tls.crt or tls.key");
        return Err(NotReady::new(Reason::CASecretInvalid, msg).retry());
    };
    CertificateAuthority::from_pem(&cert, &key)
        .map(Some)
        .map_err(|e| {
            let msg = format!("CA Secret {ca_ns}/{ca_name} is not a usable CA: {e}");
            NotReady::new(Reason::CASecretInvalid, msg).retry()
        })
}

/// The status, Events and wake-up for the certificate now in the Secret (`issued`: why it
/// was just issued).
pub fn report(
    obs: &Observed<'_>,
    valid: &ValidSpec,
    cert_pem: &str,
    issued: Option<&IssueReason>,
) -> Outcome {
    let info = match CertificateInfo::from_pem(cert_pem) {
        Ok(info) => info,
        Err(e) => return not_ready(obs, NotReady::new(Reason::IssuanceFailed, e.to_string())),
    };
    let dsc = obs.dsc;
    let mut status = dsc.status.clone().unwrap_or_default();
    status.not_before = Some(to_time(info.not_before));
    status.not_after = Some(to_time(info.not_after));
    status.renewal_time = valid
        .renewal_enabled
        .then(|| to_time(renewal_due_at(&info, obs.min_renewal_interval)));
    status.certificate_hash = Some(info.hash());
    status.last_renewal_request = dsc.annotations().get(RENEW_ANNOTATION).cloned();
    let (secret_ns, secret_name) = &valid.secret;
    let secret_ref = format!("{secret_ns}/{secret_name}");
    let (ready, reason, message) = match readiness(&info, obs.now) {
        Readiness::Ready => (
            true,
            Reason::Issued,
            format!("certificate is valid and stored in Secret {secret_ref}"),
        ),
        Readiness::NotYetValid => (
            false,
            Reason::NotYetValid,
            "certificate is not valid yet".to_owned(),
        ),
        Readiness::Expired => (
            false,
            Reason::Expired,
            "certificate expired and renewal is disabled".to_owned(),
        ),
    };
    status.ready = Some(ready);
    set_ready_condition(&mut status, obs, ready, reason, &message);
    let was_ready = dsc.status.as_ref().and_then(|s| s.ready) == Some(true);
    let events = match issued {
        Some(because) => vec![Note::normal(
            Reason::Issued,
            format!("issued into Secret {secret_ref}: {because}"),
        )],
        None if reason == Reason::Expired && was_ready => {
            vec![Note::warning(Reason::Expired, message)]
        }
        None => Vec::new(),
    };
    let requeue = next_wakeup(
        &info,
        valid.renewal_enabled,
        obs.now,
        obs.min_renewal_interval,
    )
    .map(|wait| wait.max(MIN_WAKEUP));
    Outcome {
        status,
        events,
        requeue,
    }
}

/// The status of a certificate that is not ready; a Warning when the problem is new.
pub fn not_ready(obs: &Observed<'_>, not_ready: NotReady) -> Outcome {
    let mut status = obs.dsc.status.clone().unwrap_or_default();
    status.ready = Some(false);
    let changed = set_ready_condition(
        &mut status,
        obs,
        false,
        not_ready.reason,
        &not_ready.message,
    );
    // One Warning per new problem, not one per retry.
    let events = if changed {
        vec![Note::warning(not_ready.reason, not_ready.message)]
    } else {
        Vec::new()
    };
    Outcome {
        status,
        events,
        requeue: not_ready.retry,
    }
}

fn set_ready_condition(
    status: &mut DiscoveryServiceCertificateStatus,
    obs: &Observed<'_>,
    ready: bool,
    reason: Reason,
    message: &str,
) -> bool {
    let generation = obs.dsc.metadata.generation;
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        READY_CONDITION,
        ready,
        reason,
        message,
        generation,
        &to_time(obs.now),
    )
}

pub fn to_time(t: OffsetDateTime) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Time(ts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
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
        let outcome = super::not_ready(&obs, not_ready.clone());
        assert_eq!(outcome.status.ready, Some(false));
        assert_eq!(outcome.status.conditions[0].reason, "CASecretNotFound");
        assert_eq!(outcome.status.observed_generation, Some(3));
        assert_eq!(outcome.events.len(), 1);
        assert_eq!(outcome.events[0].reason, Reason::CASecretNotFound.as_str());
        // The same problem again: no second Warning.
        let mut seen = dsc.clone();
        seen.status = Some(outcome.status);
        let again = super::not_ready(&observe(&seen, None), not_ready);
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
        let data = [
            ("tls.crt", &issued.cert_pem),
            ("tls.key", &issued.key_pem),
            ("ca.crt", &issued.ca_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
        let secret = Secret {
            data: Some(data),
            ..Default::default()
        };
        let obs = observe(&dsc, Some(secret));
        let Plan::Keep { cert_pem } = decide(&obs) else {
            panic!("a good certificate must be kept")
        };
        let outcome = report(&obs, valid, &cert_pem, None);
        assert_eq!(outcome.status.ready, Some(true));
        assert_eq!(outcome.status.conditions[0].reason, "Issued");
        assert!(outcome.events.is_empty());
        let wait = outcome.requeue.unwrap();
        assert!(
            wait > Duration::from_secs(60_000) && wait <= Duration::from_secs(69_120),
            "{wait:?}"
        );
        let issued_now = report(&obs, valid, &cert_pem, Some(&IssueReason::SecretMissing));
        assert_eq!(issued_now.events.len(), 1);
        assert_eq!(issued_now.events[0].reason, "Issued");
    }
}
