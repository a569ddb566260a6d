//! What the certificate controller reports, pure: the status, Ready condition, Events and
//! wake-up of a certificate after [`super::plan::decide`] (and any issuance) ran.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use marin3r_controller::{Note, set_condition};
use time::OffsetDateTime;

use super::plan::{Current, MIN_WAKEUP, NotReady, Observed, Reason};
use super::triggers::{IssueReason, Readiness, next_wakeup, readiness, renewal_due_at};
use crate::CertificateInfo;
use crate::api::{DiscoveryServiceCertificateStatus, READY_CONDITION, RENEW_ANNOTATION, ValidSpec};

/// The condition a CA sets while certificates it signs do not take the next CA.
pub const ROTATION_BLOCKED_CONDITION: &str = "RotationBlocked";

/// What to write after acting: the status, the Events, when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: DiscoveryServiceCertificateStatus,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

/// The status, Events and wake-up for the certificate now in the Secret (`issued`: why it
/// was just issued).
pub fn report(
    obs: &Observed<'_>,
    valid: &ValidSpec,
    current: &Current,
    issued: Option<&IssueReason>,
) -> Outcome {
    let info = match CertificateInfo::from_pem(&current.cert_pem) {
        Ok(info) => info,
        Err(e) => {
            return not_ready(
                obs,
                NotReady::new(Reason::IssuanceFailed, marin3r_controller::chain(&e)),
            );
        }
    };
    let dsc = obs.dsc;
    let mut status = dsc.status.clone().unwrap_or_default();
    status.not_before = Some(to_time(info.not_before));
    status.not_after = Some(to_time(info.not_after));
    status.renewal_time = valid
        .renewal_enabled
        .then(|| to_time(renewal_due_at(&info, obs.min_renewal_interval)));
    status.certificate_hash = Some(info.hash());
    status.trust_bundle_hash = current
        .ca_pem
        .as_deref()
        .and_then(|pem| crate::certificate_hash(pem).ok());
    status.rotation = current.rotation.as_ref().and_then(|r| r.message.clone());
    status.last_renewal_request = dsc.annotations().get(RENEW_ANNOTATION).cloned();
    let (secret_ns, secret_name) = &valid.secret;
    let secret_ref = format!("{secret_ns}/{secret_name}");
    let renewal_off = dsc.spec.renewal_disabled_by();
    let expiry = to_time(info.not_after).0;
    let (ready, reason, message) =
        ready_condition(readiness(&info, obs.now), &secret_ref, renewal_off, expiry);
    status.ready = Some(ready);
    set_ready_condition(&mut status, obs, ready, reason, &message);
    let blocked = current.rotation.as_ref().and_then(|r| r.blocked.as_deref());
    set_rotation_blocked(&mut status, obs, blocked);
    let was_ready = dsc.status.as_ref().and_then(|s| s.ready) == Some(true);
    let mut events = match issued {
        Some(because) => vec![Note::normal(
            Reason::Issued,
            match renewal_off {
                None => format!("issued into Secret {secret_ref}: {because}"),
                Some(field) => format!(
                    "issued into Secret {secret_ref}: {because}; renewal is off ({field}: false)"
                ),
            },
        )],
        None if reason == Reason::Expired && was_ready => {
            vec![Note::warning(Reason::Expired, message)]
        }
        None => Vec::new(),
    };
    let requeue = match &current.rotation {
        // Mid-rotation the certificate is past its renewal instant: the rotation says when.
        Some(rotation) => {
            events.extend(rotation.event.clone());
            Some(rotation.requeue)
        }
        None => next_wakeup(
            &info,
            valid.renewal_enabled,
            obs.now,
            obs.min_renewal_interval,
        )
        .map(|wait| wait.max(MIN_WAKEUP)),
    };
    Outcome {
        status,
        events,
        requeue,
    }
}

/// The Ready condition of an issued certificate: whether, its reason and its message, which
/// says when renewal is off (`renewal_off`: the field that turned it off) and so when the
/// certificate will expire for good.
fn ready_condition(
    readiness: Readiness,
    secret_ref: &str,
    renewal_off: Option<&str>,
    expiry: k8s_openapi::jiff::Timestamp,
) -> (bool, Reason, String) {
    match (readiness, renewal_off) {
        (Readiness::Ready, None) => (
            true,
            Reason::Issued,
            format!("certificate is valid and stored in Secret {secret_ref}"),
        ),
        (Readiness::Ready, Some(field)) => (
            true,
            Reason::Issued,
            format!(
                "certificate is valid and stored in Secret {secret_ref}; renewal is off \
                 ({field}: false), so it expires at {expiry} unless renewed by hand \
                 (marin3r certs renew)"
            ),
        ),
        (Readiness::NotYetValid, _) => (
            false,
            Reason::NotYetValid,
            "certificate is not valid yet".to_owned(),
        ),
        (Readiness::Expired, field) => (
            false,
            Reason::Expired,
            format!(
                "certificate expired at {expiry} and renewal is off ({}: false); renew it by \
                 hand (marin3r certs renew) or turn renewal on",
                field.unwrap_or("spec.certificateRenewal.enabled")
            ),
        ),
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

/// `RotationBlocked` True with what holds the rotation; False once nothing does (absent on a
/// CA never held up).
fn set_rotation_blocked(
    status: &mut DiscoveryServiceCertificateStatus,
    obs: &Observed<'_>,
    blocked: Option<&str>,
) {
    let had = status
        .conditions
        .iter()
        .any(|c| c.type_ == ROTATION_BLOCKED_CONDITION);
    let (value, reason, message) = match blocked {
        Some(why) => (true, Reason::RotationBlocked, why),
        None if had => (
            false,
            Reason::RotationProceeding,
            "nothing holds a CA rotation",
        ),
        None => return,
    };
    let now = to_time(obs.now);
    let generation = obs.dsc.metadata.generation;
    set_condition(
        &mut status.conditions,
        ROTATION_BLOCKED_CONDITION,
        value,
        reason,
        message,
        generation,
        &now,
    );
}

pub fn to_time(t: OffsetDateTime) -> Time {
    let ts = k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Time(ts)
}
