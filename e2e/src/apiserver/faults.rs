//! Fault injection, switched on through a handle on a running server: end every open watch,
//! answer the next requests with an error code, hang the requests for one resource, delay or
//! fail webhook calls.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// Which requests a queued error applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultScope {
    /// Any resource request (discovery is never failed).
    Any,
    /// Only watch requests; a 410 is then sent inside the stream, as a real server does.
    Watch,
}

#[derive(Debug, Default)]
struct State {
    errors: VecDeque<(FaultScope, u16)>,
    webhook_delay: Option<Duration>,
    webhook_fail: bool,
    /// Requests for these resources (plural names, e.g. `leases`) answer only after a delay.
    request_delays: Vec<(String, Duration)>,
}

/// The fault switches of one API server.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    drop_watches: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            drop_watches: watch::Sender::new(0),
        }
    }
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every watch stream open now (clients see the connection close and re-watch).
    pub fn drop_watches(&self) {
        self.drop_watches.send_modify(|g| *g += 1);
    }

    pub(super) fn watch_generation(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// Answers the next `n` resource requests in `scope` with HTTP `code` (409, 410, 500...).
    pub fn fail_next(&self, n: usize, code: u16, scope: FaultScope) {
        let mut state = self.state();
        for _ in 0..n {
            state.errors.push_back((scope, code));
        }
    }

    /// Takes the error for this request, if one is queued for its kind.
    pub(super) fn take(&self, is_watch: bool) -> Option<u16> {
        let mut state = self.state();
        let pos = state
            .errors
            .iter()
            .position(|(scope, _)| *scope == FaultScope::Any || is_watch)?;
        state.errors.remove(pos).map(|(_, code)| code)
    }

    /// Holds every request for `resource` (a plural name such as `leases`) for `delay` before
    /// answering it, as a hung or overloaded API server would (`None` to stop). Requests
    /// already held keep their delay.
    pub fn delay_requests(&self, resource: &str, delay: Option<Duration>) {
        let mut state = self.state();
        state.request_delays.retain(|(r, _)| r != resource);
        if let Some(delay) = delay {
            state.request_delays.push((resource.to_owned(), delay));
        }
    }

    pub(super) fn request_delay(&self, resource: &str) -> Option<Duration> {
        let state = self.state();
        state
            .request_delays
            .iter()
            .find_map(|(r, d)| (r == resource).then_some(*d))
    }

    /// Delays every webhook call by `delay` (`None` to stop).
    pub fn delay_webhooks(&self, delay: Option<Duration>) {
        self.state().webhook_delay = delay;
    }

    /// Makes every webhook call fail as if the webhook were unreachable.
    pub fn fail_webhooks(&self, fail: bool) {
        self.state().webhook_fail = fail;
    }

    pub(super) fn webhook_faults(&self) -> (Option<Duration>, bool) {
        let state = self.state();
        (state.webhook_delay, state.webhook_fail)
    }
}
