//! Whose EnvoyConfig validation is judged when. Judging may run Envoy for seconds, and every
//! admission comes from the API server's one address, so the client address cannot tell
//! tenants apart: what the AdmissionReview says can. Each namespace (as seen from one client
//! address) gets a few validations judged at once and a short queue; all namespaces together
//! get a bounded number judged and queued. A validation that finds its namespace's queue full,
//! or waits longer than the wait for its turn, is refused at once: the tenant that floods its
//! own writes gets its own writes refused, and pod injections, which never take a turn here,
//! do not wait behind any of it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many validations may wait for their turn, per validation judged at once: in a
/// namespace, and in total.
pub const QUEUED_PER_TURN: usize = 8;

/// The limits on validations, from the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidationLimits {
    /// Validations judged at once, every namespace together.
    pub at_once: usize,
    /// Validations of one namespace (from one client address) judged at once.
    pub per_namespace: usize,
    /// How long a validation waits for its turn before it is refused.
    pub wait: Duration,
}

impl Default for ValidationLimits {
    fn default() -> Self {
        Self {
            at_once: DEFAULT_MAX_VALIDATIONS,
            per_namespace: DEFAULT_MAX_VALIDATIONS_PER_NAMESPACE,
            wait: Duration::from_millis(DEFAULT_VALIDATION_WAIT_MS),
        }
    }
}

/// As many as the Envoy judge runs processes at once: a validation that has its turn does
/// not then wait for an Envoy.
pub const DEFAULT_MAX_VALIDATIONS: usize = 4;
/// One: kubectl, Helm and GitOps tools write a namespace's objects one after another, and a
/// namespace flooding slow configs holds a quarter of the judge at most.
pub const DEFAULT_MAX_VALIDATIONS_PER_NAMESPACE: usize = 1;
/// With the judge's 6 s, well inside the API server's 10 s timeout for the webhook.
pub const DEFAULT_VALIDATION_WAIT_MS: u64 = 2_000;

/// Why a validation did not get its turn; its message is the denial's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "too many EnvoyConfig validations of namespace {namespace:?} at once ({judged} judged, {queued} waiting; the webhook's limit --webhook-max-validations-per-namespace); retry later"
    )]
    Namespace {
        namespace: String,
        judged: usize,
        queued: usize,
    },
    #[error(
        "too many EnvoyConfig validations at once in every namespace together ({judged} judged, {queued} waiting; the webhook's limit --webhook-max-validations); retry later"
    )]
    Everyone { judged: usize, queued: usize },
    #[error(
        "this EnvoyConfig validation waited {waited:?} for its turn (the webhook's limit --webhook-validation-wait-ms); retry later"
    )]
    Waited { waited: Duration },
}

/// The validations judged and waiting, by namespace and client address.
#[derive(Debug)]
pub(crate) struct Turns {
    limits: ValidationLimits,
    at_once: Arc<Semaphore>,
    state: Mutex<State>,
}

/// A namespace as seen from one client address: a client that is not the API server cannot
/// fill a tenant's queue by writing its name.
type Key = (IpAddr, String);

#[derive(Debug, Default)]
struct State {
    /// Only namespaces with a validation judged or waiting: at most the total held.
    namespaces: HashMap<Key, Namespace>,
    /// Validations judged or waiting, every namespace together.
    held: usize,
}

#[derive(Debug)]
struct Namespace {
    turns: Arc<Semaphore>,
    /// Its validations judged or waiting.
    held: usize,
}

/// A validation's turn: judge while it is held.
#[derive(Debug)]
pub(crate) struct Turn {
    _namespace: OwnedSemaphorePermit,
    _at_once: OwnedSemaphorePermit,
    _held: Held,
}

/// A validation's place among those judged or waiting, given back on drop.
#[derive(Debug)]
struct Held {
    turns: Arc<Turns>,
    key: Key,
}

impl Turns {
    pub(crate) fn new(limits: ValidationLimits) -> Self {
        let limits = ValidationLimits {
            at_once: limits.at_once.max(1),
            per_namespace: limits.per_namespace.max(1),
            wait: limits.wait,
        };
        Self {
            limits,
            at_once: Arc::new(Semaphore::new(limits.at_once)),
            state: Mutex::default(),
        }
    }

    /// Waits (at most the configured wait) for the turn of a validation of `namespace` sent
    /// from `addr`; refuses it at once when its namespace, or everyone, has as many waiting as
    /// may wait.
    pub(crate) async fn take(
        self: &Arc<Self>,
        addr: IpAddr,
        namespace: &str,
    ) -> Result<Turn, Refused> {
        let (held, turns) = self.hold(addr.to_canonical(), namespace)?;
        let limits = self.limits;
        let wait = async {
            let namespace = turns.acquire_owned().await.ok()?;
            let at_once = Arc::clone(&self.at_once).acquire_owned().await.ok()?;
            Some((namespace, at_once))
        };
        match tokio::time::timeout(limits.wait, wait).await {
            Ok(Some((namespace, at_once))) => Ok(Turn {
                _namespace: namespace,
                _at_once: at_once,
                _held: held,
            }),
            _ => Err(Refused::Waited {
                waited: limits.wait,
            }),
        }
    }

    /// A place among the validations held, or why there is none.
    fn hold(
        self: &Arc<Self>,
        addr: IpAddr,
        namespace: &str,
    ) -> Result<(Held, Arc<Semaphore>), Refused> {
        let limits = self.limits;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let everyone = limits.at_once.saturating_mul(1 + QUEUED_PER_TURN);
        if state.held >= everyone {
            return Err(Refused::Everyone {
                judged: limits.at_once,
                queued: state.held - limits.at_once.min(state.held),
            });
        }
        let key = (addr, namespace.to_owned());
        let per_namespace = limits.per_namespace.saturating_mul(1 + QUEUED_PER_TURN);
        let entry = state
            .namespaces
            .entry(key.clone())
            .or_insert_with(|| Namespace {
                turns: Arc::new(Semaphore::new(limits.per_namespace)),
                held: 0,
            });
        if entry.held >= per_namespace {
            let judged = limits.per_namespace.min(entry.held);
            return Err(Refused::Namespace {
                namespace: shown(namespace),
                judged,
                queued: entry.held - judged,
            });
        }
        entry.held += 1;
        let turns = Arc::clone(&entry.turns);
        state.held += 1;
        let held = Held {
            turns: Arc::clone(self),
            key,
        };
        Ok((held, turns))
    }

    #[cfg(test)]
    fn namespaces(&self) -> usize {
        self.state.lock().map(|s| s.namespaces.len()).unwrap_or(0)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut state = self.turns.state.lock().unwrap_or_else(|e| e.into_inner());
        state.held = state.held.saturating_sub(1);
        if let Some(namespace) = state.namespaces.get_mut(&self.key) {
            namespace.held = namespace.held.saturating_sub(1);
            if namespace.held == 0 {
                state.namespaces.remove(&self.key);
            }
        }
    }
}

/// A namespace for a message: a real one is a DNS label (at most 63 bytes); anything longer
/// comes from a client that is not the API server, and is cut.
fn shown(namespace: &str) -> String {
    namespace.chars().take(63).collect()
}

#[cfg(test)]
#[path = "validate_turns_tests.rs"]
mod tests;
