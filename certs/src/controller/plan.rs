//! The certificate controller's decisions, pure: from what was observed (the certificate,
//! its CA Secret, its Secret, the clock) to what to do and what to report. Issuing itself
//! draws a new key, so it is the one step between [`decide`] and [`super::report::report`].

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use marin3r_controller::Note;
use time::OffsetDateTime;

use super::bundle::{self, Cert, SecretUpdate};
use super::rotation::{self, Ca, CaState, Step};
use super::triggers::{IssueReason, TlsFiles, needs_issue, until};
use crate::CertificateAuthority;
use crate::api::{DiscoveryServiceCertificate, RENEW_ANNOTATION, ValidSpec};

/// How long to wait before looking again for a CA Secret that is missing or unusable.
const DEPENDENCY_RETRY: Duration = Duration::from_secs(15);
/// The shortest wait before a wake-up at the renewal instant.
pub(super) const MIN_WAKEUP: Duration = Duration::from_millis(200);
/// How often a CA rotation waiting on the certificates it signs looks again (a change to
/// their Secrets wakes it sooner).
const ROTATION_POLL: Duration = Duration::from_secs(5);
/// The longest a CA rotation sleeps, whatever it waits for.
const ROTATION_MAX_WAIT: Duration = Duration::from_secs(30);

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
        NextCAIssued,
        NextCASigning,
        PreviousCADropped,
        /// A CA rotation waits for, or went on without, certificates that do not trust
        /// the next CA (the `RotationBlocked` condition and a Warning Event name them).
        RotationBlocked,
        /// Nothing holds the CA rotation (the `RotationBlocked` condition is False).
        RotationProceeding,
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
    /// For a self-signed CA in a rotation: the Secrets of the certificates it signs, by
    /// `namespace/name` (those that exist).
    pub dependents: Vec<(String, TlsFiles)>,
    /// How long a changed Secret may take to reach every reader (see [`rotation`]).
    pub trust_propagation: Duration,
}

/// What to do about one certificate.
pub enum Plan {
    /// Report why it is not ready.
    NotReady(NotReady),
    /// Issue a new certificate (signed by `ca`, or self-signed) into the Secret, recording
    /// the renewal request it answers. `trust_pem` is the `ca.crt` to write with it (the
    /// CA's trust bundle); None: the issuer's certificate.
    Issue {
        ca: Option<Box<CertificateAuthority>>,
        reason: IssueReason,
        renew_request: Option<String>,
        trust_pem: Option<String>,
    },
    /// A CA rotation begins: issue the next CA (self-signed, from the spec) and write it
    /// beside the current one with [`bundle::start`].
    StartRotation {
        state: Box<CaState<Cert>>,
        reason: IssueReason,
        renew_request: Option<String>,
    },
    /// Change the Secret without issuing (the trust bundle, a rotation step), then report.
    Update { update: SecretUpdate, then: Current },
    /// The Secret stays; report on it.
    Keep(Current),
}

/// The certificate in the Secret, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    pub cert_pem: String,
    /// Its `ca.crt` (the trust bundle).
    pub ca_pem: Option<String>,
    /// Where a CA rotation is, when one is under way or a step was just taken.
    pub rotation: Option<RotationNote>,
}

impl Current {
    fn plain(cert_pem: String, ca_pem: Option<String>) -> Self {
        Self {
            cert_pem,
            ca_pem,
            rotation: None,
        }
    }
}

/// A CA rotation's step, for the status, the Events and the wake-up.
#[derive(Debug, Clone, PartialEq)]
pub struct RotationNote {
    /// `status.rotation`; None once the rotation is over.
    pub message: Option<String>,
    pub event: Option<Note>,
    pub requeue: Duration,
    /// What holds the rotation (the `RotationBlocked` condition's message); None: nothing.
    pub blocked: Option<String>,
}

impl RotationNote {
    fn new(message: Option<String>, event: Option<Note>, requeue: Duration) -> Self {
        Self {
            message,
            event,
            requeue,
            blocked: None,
        }
    }
}

/// The Secret of `dsc` when the CA Secret `ca` signs it: a certificate whose spec the checks
/// refuse (a cross-namespace reference from an untrusted namespace) is no dependent, or anyone
/// allowed to create one could point it at the CA and hold its rotation.
pub fn dependent(
    dsc: &DiscoveryServiceCertificate,
    ca: &(String, String),
    trusted_namespaces: &std::collections::BTreeSet<String>,
) -> Option<(String, String)> {
    let ns = dsc.namespace().unwrap_or_default();
    let valid = check_spec(dsc, trusted_namespaces.contains(&ns)).ok()?;
    (valid.ca_secret.as_ref() == Some(ca)).then_some(valid.secret)
}

/// Checks the spec and that it names Secrets only where this certificate may. Observing
/// reads the Secrets of a spec that passes.
pub fn check_spec(dsc: &DiscoveryServiceCertificate, trusted: bool) -> Result<ValidSpec, NotReady> {
    let ns = dsc.namespace().unwrap_or_default();
    let valid = dsc
        .spec
        .validate(&ns)
        .map_err(|e| NotReady::new(Reason::InvalidSpec, marin3r_controller::chain(&e)))?;
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
    let reason = needs_issue(valid, &files, issuer_pem, manual, obs.now, min_renewal);
    // A self-signed CA with a CA in its Secret rotates with an overlap; a missing or
    // unusable one has nothing anyone could still trust, so it is issued at once.
    let usable = !matches!(
        reason,
        Some(IssueReason::SecretMissing | IssueReason::SecretInvalid(_))
    );
    if usable
        && valid.request.is_ca
        && valid.ca_secret.is_none()
        && let Some(secret) = &obs.secret
        && let Some(state) = bundle::ca_state(secret, &files)
    {
        return rotate(obs, secret, state, &files, reason, renew_request);
    }
    // What a certificate signed from the CA Secret trusts: the CA's bundle.
    let trust_pem = obs
        .ca_secret
        .as_ref()
        .map(tls_files)
        .and_then(|f| bundle::trust_bundle(&f));
    match reason {
        None => keep(files, trust_pem),
        Some(reason) => Plan::Issue {
            ca: ca.map(Box::new),
            reason,
            renew_request,
            trust_pem,
        },
    }
}

/// A certificate that stays: its `ca.crt` is rewritten when the CA's bundle differs (during
/// a CA rotation it changes twice while the certificate stays).
fn keep(files: TlsFiles, trust_pem: Option<String>) -> Plan {
    let cert_pem = files.cert.unwrap_or_default();
    match trust_pem {
        Some(trust)
            if !files
                .ca
                .as_deref()
                .is_some_and(|ca| bundle::same_certificates(ca, &trust)) =>
        {
            Plan::Update {
                update: bundle::trust(&trust),
                then: Current::plain(cert_pem, Some(trust)),
            }
        }
        _ => Plan::Keep(Current::plain(cert_pem, files.ca)),
    }
}

/// The next step of a self-signed CA's rotation (see [`rotation`]), as a plan.
fn rotate(
    obs: &Observed<'_>,
    secret: &Secret,
    state: CaState<Cert>,
    files: &TlsFiles,
    reason: Option<IssueReason>,
    renew_request: Option<String>,
) -> Plan {
    let leaves: Vec<_> = obs
        .dependents
        .iter()
        .map(|(name, files)| bundle::leaf(name.clone(), files, &state))
        .collect();
    let cert_pem = state.signer.id.pem.clone();
    let trusted_pem = bundle::to_pem(&state.trusted);
    let blocked = rotation::left_behind(&state, &leaves);
    let step = rotation::step(
        &state,
        &leaves,
        reason.is_some(),
        obs.now,
        obs.trust_propagation,
    );
    match step {
        Step::Idle => Plan::Keep(Current::plain(
            files.cert.clone().unwrap_or_default(),
            files.ca.clone(),
        )),
        Step::Start => match reason {
            Some(reason) => Plan::StartRotation {
                state: Box::new(state),
                reason,
                renew_request,
            },
            None => Plan::Keep(Current::plain(cert_pem, Some(trusted_pem))),
        },
        Step::MarkDistributed => mark_distributed(obs, cert_pem, trusted_pem, &blocked),
        Step::Promote => promote(&state, secret, cert_pem, trusted_pem, &blocked),
        Step::Trust(cas) => trust(&state, &cas, cert_pem),
        Step::Wait { at, why } => {
            // Polled at least this often: the instant may be years away (the previous CA's
            // expiry), and a reissue may happen any time.
            let requeue = at.map_or(ROTATION_POLL, |at| {
                until(obs.now, at).clamp(MIN_WAKEUP, ROTATION_MAX_WAIT)
            });
            Plan::Keep(Current {
                cert_pem,
                ca_pem: Some(trusted_pem),
                rotation: Some(waiting(obs, why, requeue, &blocked)),
            })
        }
    }
}

/// A rotation that waits: when certificates hold it, a Warning Event each time what holds
/// it changes (not at every look), and the `RotationBlocked` condition.
fn waiting(obs: &Observed<'_>, why: String, requeue: Duration, blocked: &[String]) -> RotationNote {
    if blocked.is_empty() {
        return RotationNote::new(Some(why), None, requeue);
    }
    let before = obs.dsc.status.as_ref().and_then(|s| s.rotation.as_ref());
    let event = (before != Some(&why)).then(|| Note::warning(Reason::RotationBlocked, &why));
    RotationNote {
        blocked: Some(why.clone()),
        ..RotationNote::new(Some(why), event, requeue)
    }
}

/// Rotation step: every signed certificate trusts the next CA; it signs after the
/// propagation time.
fn mark_distributed(
    obs: &Observed<'_>,
    cert_pem: String,
    trusted_pem: String,
    blocked: &[String],
) -> Plan {
    let at = rotation_deadline(obs.now, obs.trust_propagation);
    let requeue = obs.trust_propagation.clamp(MIN_WAKEUP, ROTATION_MAX_WAIT);
    let note = if blocked.is_empty() {
        let message =
            format!("every certificate the CA signs trusts the next CA; it signs from {at}");
        RotationNote::new(Some(message), None, requeue)
    } else {
        let message = format!(
            "the next CA signs from {at}, without the certificates of {}, which never took it",
            blocked.join(", ")
        );
        waiting(obs, message, requeue, blocked)
    };
    Plan::Update {
        update: bundle::mark_distributed(obs.now),
        then: Current {
            cert_pem,
            ca_pem: Some(trusted_pem),
            rotation: Some(note),
        },
    }
}

/// Rotation step: the next CA becomes the signer; the previous one stays trusted. Past
/// [`rotation::give_up_at`] it does so without the certificates in `blocked`, and says so.
fn promote(
    state: &CaState<Cert>,
    secret: &Secret,
    cert_pem: String,
    trusted_pem: String,
    blocked: &[String],
) -> Plan {
    let Some((update, bundle_pem)) = bundle::promote(state, secret) else {
        return Plan::Keep(Current::plain(cert_pem, Some(trusted_pem)));
    };
    let cert_pem = state.next.as_ref().map_or(cert_pem, |n| n.id.pem.clone());
    let message = "the new CA signs; the previous CA stays trusted until every certificate it signed is reissued";
    let mut note = RotationNote::new(
        Some(message.into()),
        Some(Note::normal(Reason::NextCASigning, message)),
        ROTATION_POLL,
    );
    if !blocked.is_empty() {
        let text = format!(
            "the new CA signs without the certificates of {}, which never took the next CA (an immutable Secret, or one nobody may write?): they stop trusting the discovery service until their Secrets are fixed",
            blocked.join(", ")
        );
        note.event = Some(Note::warning(Reason::RotationBlocked, &text));
        note.message = Some(text.clone());
        note.blocked = Some(text);
    }
    Plan::Update {
        update,
        then: Current {
            cert_pem,
            ca_pem: Some(bundle_pem),
            rotation: Some(note),
        },
    }
}

/// Rotation step: the trust bundle becomes `cas`; with the previous CA gone, the rotation is
/// over.
fn trust(state: &CaState<Cert>, cas: &[Ca<Cert>], cert_pem: String) -> Plan {
    let pem = bundle::to_pem(cas);
    let over = cas.len() == 1 && state.next.is_none();
    let dropped = state.trusted.len().saturating_sub(cas.len());
    let (message, event) = if over {
        let text = "the previous CA is no longer trusted: the rotation is complete";
        (None, Some(Note::normal(Reason::PreviousCADropped, text)))
    } else {
        let text = format!("the trust bundle now holds {} CAs", cas.len());
        let event = (dropped > 0).then(|| Note::normal(Reason::PreviousCADropped, &text));
        (Some(text), event)
    };
    Plan::Update {
        update: bundle::trust(&pem),
        then: Current {
            cert_pem,
            ca_pem: Some(pem),
            rotation: Some(RotationNote::new(message, event, ROTATION_POLL)),
        },
    }
}

fn rotation_deadline(now: OffsetDateTime, propagation: Duration) -> String {
    let at = time::Duration::try_from(propagation)
        .ok()
        .and_then(|d| now.checked_add(d));
    at.and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
    .unwrap_or_else(|| "never".into())
}

/// The note of a rotation that was just started.
pub fn started(reason: &IssueReason, bundle_pem: String, cert_pem: String) -> Current {
    let message = format!(
        "issued the next CA ({reason}); it is trusted beside the current CA and signs once every certificate trusts it"
    );
    Current {
        cert_pem,
        ca_pem: Some(bundle_pem),
        rotation: Some(RotationNote::new(
            Some(message.clone()),
            Some(Note::normal(Reason::NextCAIssued, message)),
            ROTATION_POLL,
        )),
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
            let e = marin3r_controller::chain(&e);
            let msg = format!("CA Secret {ca_ns}/{ca_name} is not a usable CA: {e}");
            NotReady::new(Reason::CASecretInvalid, msg).retry()
        })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "plan_rotation_tests.rs"]
mod rotation_tests;
