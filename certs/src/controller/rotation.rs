//! Rotating a self-signed CA without a hard cutover, pure. The CA Secret's `ca.crt` is the
//! trust bundle every certificate it signs copies into its own `ca.crt` (and the operator
//! into the webhook's `caBundle`); `tls.crt`/`tls.key` is the CA that signs now.
//!
//! A rotation has three steps, each taken only once the previous one has reached every party
//! (a Secret volume, a file reloader, the API server's `caBundle`; `propagation` bounds how
//! long that takes):
//! 1. **Start**: the next CA is issued into `next.crt`/`next.key` and added to the bundle;
//!    the current CA keeps signing. Every certificate's `ca.crt` is rewritten to the bundle
//!    (its key and certificate stay). Once all of them hold it, the time is recorded; a
//!    certificate whose Secret never takes it holds the rotation only until [`give_up_at`]
//!    (90% of the current CA's life), after which the rotation goes on without it.
//! 2. **Promote**, `propagation` after that: the next CA signs; the previous one stays in the
//!    bundle, so certificates not yet reissued (or not yet reloaded) are still trusted.
//! 3. **Drop**: once every certificate is signed by the new CA and the last one was issued
//!    `propagation` ago, or once the previous CA expired, the bundle holds the new CA alone.
//!
//! At no instant does a party present a certificate another party does not trust: a
//! certificate signed by the next CA exists only after every party trusts it, and the
//! previous CA is dropped only after no party presents a certificate it signed.
#![deny(clippy::arithmetic_side_effects)]

use std::time::Duration;

use time::OffsetDateTime;

/// The CA Secret's keys for the next CA while its trust spreads (step 1).
pub const NEXT_CERT_KEY: &str = "next.crt";
pub const NEXT_KEY_KEY: &str = "next.key";
/// On the CA Secret: when every certificate it signs was first seen trusting the next CA.
pub const DISTRIBUTED_ANNOTATION: &str = "marin3r.3scale.net/trust-distributed-at";
/// How long a changed Secret may take to reach everyone who reads it: kubelet's sync period
/// and cache (about a minute each by default) plus the discovery pod's file reload (10 s).
pub const DEFAULT_TRUST_PROPAGATION: Duration = Duration::from_secs(180);

/// A CA certificate as the rotation sees it; `id` names it exactly (its DER, in the
/// controller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ca<C> {
    pub id: C,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// What the CA Secret holds.
#[derive(Debug, Clone)]
pub struct CaState<C> {
    /// `tls.crt`: the CA that signs.
    pub signer: Ca<C>,
    /// `next.crt` (with a usable key): the CA that will sign once everyone trusts it.
    pub next: Option<Ca<C>>,
    /// `ca.crt`: the bundle, the signer among them.
    pub trusted: Vec<Ca<C>>,
    /// When every certificate it signs was seen trusting the bundle with `next`.
    pub distributed_at: Option<OffsetDateTime>,
}

/// A certificate the CA signs, as its Secret holds it.
#[derive(Debug, Clone)]
pub struct Leaf<C> {
    /// Names it in messages (`namespace/name` of its Secret).
    pub name: String,
    /// The CA of the bundle whose signature `tls.crt` carries; None for none of them.
    pub issuer: Option<C>,
    /// `ca.crt`, each certificate of it.
    pub trusts: Vec<C>,
    pub not_before: OffsetDateTime,
}

/// What the rotation asks of the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<C> {
    /// No rotation under way and none asked for: the usual decision applies.
    Idle,
    /// Issue the next CA into the Secret and add it to the bundle (step 1).
    Start,
    /// Record `now` as the instant every certificate trusted the bundle.
    MarkDistributed,
    /// The next CA signs from now on; the bundle keeps the previous one (step 2).
    Promote,
    /// The bundle becomes exactly these (step 3, or an expired CA dropped).
    Trust(Vec<Ca<C>>),
    /// Nothing to do yet. Look again at `at`, or when a certificate's Secret changes.
    Wait {
        at: Option<OffsetDateTime>,
        why: String,
    },
}

/// `at` moved by `by`, or `None` past the representable range.
fn shifted(at: OffsetDateTime, by: Duration) -> Option<OffsetDateTime> {
    at.checked_add(time::Duration::try_from(by).ok()?)
}

fn same_set<C: PartialEq>(a: &[C], b: &[C]) -> bool {
    a.iter().all(|x| b.contains(x)) && b.iter().all(|x| a.contains(x))
}

fn names<C>(leaves: &[&Leaf<C>]) -> String {
    let mut names: Vec<&str> = leaves.iter().map(|l| l.name.as_str()).collect();
    names.sort_unstable();
    names.join(", ")
}

/// The next step of the CA's rotation. `renew` says a renewal is due or asked for (time,
/// annotation or spec change); it starts a rotation when none is under way and is ignored
/// while one is (the rotation ends with a new CA anyway). `leaves` are the Secrets of every
/// certificate the CA signs that exist.
pub fn step<C: Clone + PartialEq>(
    ca: &CaState<C>,
    leaves: &[Leaf<C>],
    renew: bool,
    now: OffsetDateTime,
    propagation: Duration,
) -> Step<C> {
    let bundle: Vec<C> = ca.trusted.iter().map(|c| c.id.clone()).collect();
    if let Some(next) = &ca.next {
        return spread_next(ca, next, &bundle, leaves, now, propagation);
    }
    let previous: Vec<&Ca<C>> = ca.trusted.iter().filter(|c| c.id != ca.signer.id).collect();
    if previous.is_empty() {
        if !bundle.contains(&ca.signer.id) {
            return Step::Trust(vec![ca.signer.clone()]);
        }
        return if renew { Step::Start } else { Step::Idle };
    }
    drop_previous(ca, &previous, &bundle, leaves, now, propagation)
}

/// Steps 1 and 2: the next CA must be trusted everywhere before it signs anything.
fn spread_next<C: Clone + PartialEq>(
    ca: &CaState<C>,
    next: &Ca<C>,
    bundle: &[C],
    leaves: &[Leaf<C>],
    now: OffsetDateTime,
    propagation: Duration,
) -> Step<C> {
    if !bundle.contains(&next.id) || !bundle.contains(&ca.signer.id) {
        // The bundle lost one of them (edited by hand): publish both again.
        let mut trusted = vec![ca.signer.clone(), next.clone()];
        trusted.extend(
            ca.trusted
                .iter()
                .filter(|c| c.id != ca.signer.id && c.id != next.id)
                .cloned(),
        );
        return Step::Trust(trusted);
    }
    let pending: Vec<&Leaf<C>> = leaves
        .iter()
        .filter(|l| !same_set(&l.trusts, bundle))
        .collect();
    let give_up = give_up_at(ca, next, propagation);
    if !pending.is_empty() && give_up.is_none_or(|at| now < at) {
        let when = give_up
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| "never".into());
        return Step::Wait {
            at: give_up,
            why: format!(
                "waiting for the certificates of {} to trust the next CA; from {when} it signs without them",
                names(&pending)
            ),
        };
    }
    // Past `give_up` the certificates still pending are left behind (see `left_behind`).
    let Some(since) = ca.distributed_at else {
        return Step::MarkDistributed;
    };
    let without = match pending.is_empty() {
        true => String::new(),
        false => format!(
            ", going on without the certificates of {}, which never took it",
            names(&pending)
        ),
    };
    match shifted(since, propagation) {
        Some(at) if now >= at => Step::Promote,
        at => Step::Wait {
            at,
            why: format!("waiting for the bundle with the next CA to reach every reader{without}"),
        },
    }
}

/// When step 1 stops waiting for certificates that do not take the bundle (an immutable
/// Secret, one nobody may write): at 90% of the signing CA's life, so the rotation ends well
/// before that CA expires, taking every other party with it; but not before the next CA has
/// had a propagation to reach the cooperative ones, for a rotation started later than that.
pub fn give_up_at<C>(
    ca: &CaState<C>,
    next: &Ca<C>,
    propagation: Duration,
) -> Option<OffsetDateTime> {
    let (start, end) = (
        ca.signer.not_before.unix_timestamp(),
        ca.signer.not_after.unix_timestamp(),
    );
    let nine_tenths = end.checked_sub(start)?.checked_div(10)?.checked_mul(9)?;
    let late = OffsetDateTime::from_unix_timestamp(start.checked_add(nine_tenths)?).ok()?;
    let spread = shifted(next.not_before, propagation)?;
    Some(late.max(spread))
}

/// The certificates that do not trust the bundle with the next CA: those step 1 waits for,
/// and, past [`give_up_at`], those the rotation goes on without.
pub fn left_behind<C: Clone + PartialEq>(ca: &CaState<C>, leaves: &[Leaf<C>]) -> Vec<String> {
    if ca.next.is_none() {
        return Vec::new();
    }
    let bundle: Vec<C> = ca.trusted.iter().map(|c| c.id.clone()).collect();
    let mut names: Vec<String> = leaves
        .iter()
        .filter(|l| !same_set(&l.trusts, &bundle))
        .map(|l| l.name.clone())
        .collect();
    names.sort_unstable();
    names
}

/// Step 3: the `previous` CAs leave the bundle once nothing presents a certificate they
/// signed. An expired CA vouches for nothing: it is dropped at once.
fn drop_previous<C: Clone + PartialEq>(
    ca: &CaState<C>,
    previous: &[&Ca<C>],
    bundle: &[C],
    leaves: &[Leaf<C>],
    now: OffsetDateTime,
    propagation: Duration,
) -> Step<C> {
    let live: Vec<&Ca<C>> = previous
        .iter()
        .copied()
        .filter(|c| now <= c.not_after)
        .collect();
    if live.len() < previous.len() || !bundle.contains(&ca.signer.id) {
        let signer_first =
            std::iter::once(ca.signer.clone()).chain(live.iter().map(|c| (*c).clone()));
        return Step::Trust(signer_first.collect());
    }
    let pending: Vec<&Leaf<C>> = leaves
        .iter()
        .filter(|l| l.issuer.as_ref() != Some(&ca.signer.id))
        .collect();
    // The previous CA's expiry ends the overlap whatever happens.
    let expiry = live
        .iter()
        .map(|c| c.not_after)
        .min()
        .and_then(|t| t.checked_add(time::Duration::seconds(1)));
    if !pending.is_empty() {
        return Step::Wait {
            at: expiry,
            why: format!(
                "waiting for the certificates of {} to be reissued by the new CA",
                names(&pending)
            ),
        };
    }
    let last = leaves.iter().map(|l| l.not_before).max();
    match last.map(|t| shifted(t, propagation)) {
        None => Step::Trust(vec![ca.signer.clone()]),
        Some(Some(at)) if now >= at => Step::Trust(vec![ca.signer.clone()]),
        Some(at) => Step::Wait {
            at: at.or(expiry),
            why: "waiting for the certificates reissued by the new CA to reach every reader".into(),
        },
    }
}

/// The `ca.crt` a certificate signed by this CA must hold, when it holds something else.
pub fn leaf_trust<C: Clone + PartialEq>(leaf_trusts: &[C], ca: &CaState<C>) -> Option<Vec<C>> {
    let bundle: Vec<C> = ca.trusted.iter().map(|c| c.id.clone()).collect();
    (!same_set(leaf_trusts, &bundle)).then_some(bundle)
}

/// Each `CERTIFICATE` block of a PEM text, as its own PEM text (newline-terminated). Other
/// blocks and text between blocks are left out.
pub fn split_certificates(pem: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in pem.lines() {
        let line = line.trim();
        if line == BEGIN {
            current = Some(format!("{BEGIN}\n"));
        } else if let Some(mut block) = current.take() {
            block.push_str(line);
            block.push('\n');
            if line == END {
                out.push(block);
            } else {
                current = Some(block);
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "rotation_tests.rs"]
mod tests;
