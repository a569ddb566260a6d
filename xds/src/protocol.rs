//! What the pure per-stream state machines ([`super::sotw`], [`super::delta`]) report back to
//! the I/O loop, and the bits of bookkeeping both share.

use std::collections::VecDeque;

use crate::limits::Limit;
use crate::resource::ResourceType;

/// Envoy accepted a version of a type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub kind: ResourceType,
    pub version: String,
}

/// Envoy rejected a version of a type, with its error message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: ResourceType,
    pub version: String,
    pub message: String,
    /// Whether the proxy now counts as rejecting the version: it rejected it as many times as
    /// the snapshot's NACK threshold. Below it, the version is sent to the proxy again.
    pub counts: bool,
}

/// What one request did: at most one of ack/nack, and maybe a response to send.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome<R> {
    pub ack: Option<Ack>,
    pub nack: Option<Rejection>,
    pub response: Option<R>,
    /// Responses of other types the request's response calls for, sent right after it
    /// (endpoints after clusters: a re-created cluster needs its endpoints again).
    pub also: Vec<R>,
    /// The request was for a type URL marin3r does not serve, or named a stale nonce.
    pub ignored: Option<Ignored>,
    /// The request went over a limit and was not applied: the stream is to be closed.
    pub exceeded: Option<Limit>,
}

impl<R> Default for Outcome<R> {
    fn default() -> Self {
        Self {
            ack: None,
            nack: None,
            response: None,
            also: Vec::new(),
            ignored: None,
            exceeded: None,
        }
    }
}

impl<R> Outcome<R> {
    /// Settles the response in flight (`version` of `kind`) with the request that answers
    /// it: a NACK (`error`) is counted, and once the version has been rejected
    /// `nack_threshold` times it is never sent to this stream again; anything else is an ACK.
    /// True for an ACK.
    pub fn settle(
        &mut self,
        kind: ResourceType,
        version: &str,
        error: Option<&str>,
        rejected: &mut RejectedVersions,
        nack_threshold: u8,
    ) -> bool {
        let version = version.to_owned();
        match error {
            Some(message) => {
                rejected.insert(version.clone());
                self.nack = Some(Rejection {
                    counts: rejected.blocks(&version, nack_threshold),
                    kind,
                    version,
                    message: message.to_owned(),
                });
                false
            }
            None => {
                self.ack = Some(Ack { kind, version });
                true
            }
        }
    }
}

/// Why a request ends before it touches its type's state (see [`admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unadmitted {
    Ignored(Ignored),
    Exceeded(Limit),
}

impl<R> From<Unadmitted> for Outcome<R> {
    fn from(why: Unadmitted) -> Self {
        match why {
            Unadmitted::Ignored(ignored) => Self {
                ignored: Some(ignored),
                ..Self::default()
            },
            Unadmitted::Exceeded(limit) => Self {
                exceeded: Some(limit),
                ..Self::default()
            },
        }
    }
}

/// What one stream's subscription of one type may hold: the parts of [`crate::Limits`] the
/// pure protocol state checks itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Names a request may carry, and the subscription may hold.
    pub max_names: usize,
    /// The longest name (or reported version) a request may carry, in bytes.
    pub max_name_bytes: usize,
    /// The bytes of names (and reported versions) the subscription may hold.
    pub max_bytes: usize,
}

impl Bounds {
    pub fn of(limits: &crate::Limits) -> Self {
        Self {
            max_names: limits.max_names_per_type,
            max_name_bytes: limits.max_name_bytes,
            max_bytes: limits.max_subscription_bytes_per_type,
        }
    }

    /// The default limits, with another name count.
    #[cfg(test)]
    pub fn with_max_names(max_names: usize) -> Self {
        Self {
            max_names,
            ..Self::of(&crate::Limits::default())
        }
    }

    /// Whether a subscription holding `bytes` is over the bytes bound.
    pub fn check_bytes(&self, bytes: usize) -> Result<(), Limit> {
        if bytes > self.max_bytes {
            return Err(Limit::SubscriptionBytesPerType);
        }
        Ok(())
    }
}

/// The prologue both protocols run on a request before they touch its type's state: the
/// type it is about, or why the request ends there. A type marin3r does not serve is
/// ignored; a request carrying more than `max_names` names (`names`: its longest list), or a
/// string longer than `max_name_bytes` (`strings`: its names and versions), is over a limit,
/// checked before any work since it may carry hundreds of thousands.
pub fn admit<'a>(
    type_url: &str,
    names: usize,
    mut strings: impl Iterator<Item = &'a str>,
    bounds: &Bounds,
) -> Result<ResourceType, Unadmitted> {
    let Some(kind) = ResourceType::from_type_url(type_url) else {
        return Err(Unadmitted::Ignored(Ignored::UnknownType(
            type_url.to_owned(),
        )));
    };
    if names > bounds.max_names {
        return Err(Unadmitted::Exceeded(Limit::NamesPerType));
    }
    if strings.any(|s| s.len() > bounds.max_name_bytes) {
        return Err(Unadmitted::Exceeded(Limit::NameSize));
    }
    Ok(kind)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ignored {
    UnknownType(String),
    StaleNonce,
}

/// Versions a stream has rejected for one type, with how many times; one rejected as many
/// times as the NACK threshold is never sent to that stream again. Bounded so a proxy that
/// rejects everything for days cannot grow it without limit.
#[derive(Debug, Default, Clone)]
pub struct RejectedVersions(VecDeque<(String, u8)>);

impl RejectedVersions {
    const LIMIT: usize = 32;

    /// Counts one more rejection of `version`.
    pub fn insert(&mut self, version: String) {
        if let Some((_, times)) = self.0.iter_mut().find(|(v, _)| *v == version) {
            *times = times.saturating_add(1);
            return;
        }
        if self.0.len() == Self::LIMIT {
            self.0.pop_front();
        }
        self.0.push_back((version, 1));
    }

    /// Whether `version` was rejected at least `threshold` times (at least once when
    /// `threshold` is 0): it is not to be sent again.
    pub fn blocks(&self, version: &str, threshold: u8) -> bool {
        self.0
            .iter()
            .any(|(v, times)| v == version && *times >= threshold.max(1))
    }
}

/// Nonces unique within a stream, which is all the protocol asks of them.
#[derive(Debug, Default)]
pub struct Nonces(u64);

impl Nonces {
    pub fn next(&mut self) -> String {
        self.0 += 1;
        self.0.to_string()
    }
}

/// The order in which types changed by one snapshot are pushed: clusters (and their
/// endpoints and secrets) before the listeners and routes that refer to them, as Envoy's
/// make-before-break guidance asks.
pub const PUSH_ORDER: [ResourceType; 8] = [
    ResourceType::Secret,
    ResourceType::Cluster,
    ResourceType::Endpoint,
    ResourceType::ExtensionConfig,
    ResourceType::Listener,
    ResourceType::Route,
    ResourceType::ScopedRoute,
    ResourceType::Runtime,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejected_versions_are_bounded_and_deduplicated() {
        let mut r = RejectedVersions::default();
        for i in 0..40 {
            r.insert(format!("v{i}"));
            r.insert(format!("v{i}"));
        }
        assert_eq!(r.0.len(), RejectedVersions::LIMIT);
        assert!(!r.blocks("v0", 1));
        assert!(r.blocks("v39", 2));
        assert!(!r.blocks("v39", 3));
    }

    #[test]
    fn a_version_is_blocked_once_rejected_as_often_as_the_threshold() {
        let mut r = RejectedVersions::default();
        assert!(!r.blocks("v", 0) && !r.blocks("v", 1));
        r.insert("v".into());
        assert!(r.blocks("v", 0) && r.blocks("v", 1) && !r.blocks("v", 3));
        r.insert("v".into());
        assert!(!r.blocks("v", 3));
        r.insert("v".into());
        assert!(r.blocks("v", 3));
        for _ in 0..300 {
            r.insert("v".into());
        }
        assert!(r.blocks("v", u8::MAX));
    }

    #[test]
    fn push_order_covers_every_type_once() {
        let mut seen = PUSH_ORDER.to_vec();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), ResourceType::ALL.len());
    }
}
