//! The rules of one proxy, switched on and off by a test while its components run: end every
//! open watch, answer the next requests with an error code (optionally only one client's),
//! delay the requests for one resource, hold the requests to a path until released, never
//! answer some requests at all (a connection that died silently), refuse a path until allowed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// Which requests a queued error applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultScope {
    /// Any resource request (discovery, `/api`, `/apis/<group>/<version>`, `/version`, is
    /// never failed).
    Any,
    /// Only watch requests; a 410 is then sent inside the stream, as the API server does for
    /// a resource version it no longer has.
    Watch,
    /// Only writes (create, update, patch, delete), where the API server answers 409 Conflict.
    Write,
}

/// What a queued error is matched against: the request being proxied.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FaultedRequest<'a> {
    pub is_watch: bool,
    pub is_write: bool,
    /// The client's name: the endpoint it came through ([`crate::FaultProxy::endpoint`]).
    pub user: &'a str,
}

#[derive(Debug)]
struct QueuedError {
    scope: FaultScope,
    code: u16,
    /// Only requests of a user whose name starts with this.
    user_prefix: Option<String>,
}

impl QueuedError {
    fn matches(&self, req: &FaultedRequest<'_>) -> bool {
        let scoped = match self.scope {
            FaultScope::Any => true,
            FaultScope::Watch => req.is_watch,
            FaultScope::Write => req.is_write,
        };
        scoped
            && self
                .user_prefix
                .as_deref()
                .is_none_or(|prefix| req.user.starts_with(prefix))
    }
}

/// Most errors that may wait in the queue, and most paths in each list: a test that queues
/// more has a bug, and a proxy must not grow without bound.
const MAX_RULES: usize = 10_000;

#[derive(Debug, Default)]
struct State {
    errors: VecDeque<QueuedError>,
    /// Injected errors served so far, by code.
    served: BTreeMap<u16, u64>,
    /// Requests for these resources (plural names, e.g. `leases`) answer only after a delay.
    request_delays: Vec<(String, Duration)>,
    /// Requests whose path starts with one of these answer this HTTP code, until allowed.
    denied: Vec<(String, u16)>,
    /// How many of the next requests to each path are never answered.
    unanswered: BTreeMap<String, usize>,
    /// Requests left unanswered so far.
    swallowed: u64,
}

/// The fault switches of one proxy.
#[derive(Debug)]
pub struct Faults {
    state: Mutex<State>,
    drop_watches: watch::Sender<u64>,
    /// Paths whose requests wait (unanswered) until released, each for every user or only
    /// for users whose name starts with a prefix.
    held: watch::Sender<Vec<(String, Option<String>)>>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            drop_watches: watch::Sender::new(0),
            held: watch::Sender::new(Vec::new()),
        }
    }
}

impl Faults {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every watch stream open now: its client sees the response end, as when the API
    /// server closes a watch, and watches again.
    pub fn drop_watches(&self) {
        self.drop_watches.send_modify(|g| *g += 1);
    }

    pub(crate) fn watch_generation(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// Answers the next `n` resource requests in `scope` with HTTP `code` (409, 410, 500...).
    pub fn fail_next(&self, n: usize, code: u16, scope: FaultScope) {
        self.queue(n, code, scope, None);
    }

    /// As [`Self::fail_next`], but only for requests of users whose name starts with
    /// `user_prefix`: the other clients are served normally.
    pub fn fail_next_for(&self, n: usize, code: u16, scope: FaultScope, user_prefix: &str) {
        self.queue(n, code, scope, Some(user_prefix));
    }

    fn queue(&self, n: usize, code: u16, scope: FaultScope, user_prefix: Option<&str>) {
        let mut state = self.state();
        let room = MAX_RULES.saturating_sub(state.errors.len());
        for _ in 0..n.min(room) {
            state.errors.push_back(QueuedError {
                scope,
                code,
                user_prefix: user_prefix.map(str::to_owned),
            });
        }
    }

    /// How many queued errors no request has taken yet.
    pub fn pending(&self) -> usize {
        self.state().errors.len()
    }

    /// How many injected errors were served, by HTTP code.
    pub fn served(&self) -> BTreeMap<u16, u64> {
        self.state().served.clone()
    }

    /// Takes the first error queued for this request, if any, and counts it as served.
    pub(crate) fn take(&self, req: &FaultedRequest<'_>) -> Option<u16> {
        let mut state = self.state();
        let pos = state.errors.iter().position(|e| e.matches(req))?;
        let code = state.errors.remove(pos)?.code;
        *state.served.entry(code).or_default() += 1;
        Some(code)
    }

    /// Holds every request whose path is exactly `path` (e.g.
    /// `/api/v1/namespaces/a/secrets/web`) until [`Self::release`]: the client sees a slow
    /// API server, and the request is then served normally.
    pub fn hold(&self, path: &str) {
        self.held.send_modify(|h| {
            if h.len() < MAX_RULES {
                h.push((path.to_owned(), None));
            }
        });
    }

    /// As [`Self::hold`], for the requests of users whose name starts with `user_prefix`
    /// only: e.g. one client's watch of a resource stalls (its cache goes stale) while every
    /// other client is served.
    pub fn hold_for(&self, path: &str, user_prefix: &str) {
        self.held.send_modify(|h| {
            if h.len() < MAX_RULES {
                h.push((path.to_owned(), Some(user_prefix.to_owned())));
            }
        });
    }

    /// Lets the requests held for `path` through, and the ones after them.
    pub fn release(&self, path: &str) {
        self.held.send_modify(|h| h.retain(|(p, _)| p != path));
    }

    /// Waits while `path` is held for `user`, or for good when the request is one never to
    /// answer (until the client drops the connection).
    pub(crate) async fn wait_if_held(&self, path: &str, user: &str) {
        if self.swallow(path) {
            std::future::pending::<()>().await;
        }
        let mut rx = self.held.subscribe();
        let _ = rx
            .wait_for(|held| {
                !held.iter().any(|(p, prefix)| {
                    p == path && prefix.as_deref().is_none_or(|pre| user.starts_with(pre))
                })
            })
            .await;
    }

    /// Never answers the next `n` requests whose path is exactly `path`: each waits until its
    /// client gives up, as on a connection whose peer vanished without a reset. The requests
    /// after them are served normally.
    pub fn never_answer(&self, path: &str, n: usize) {
        let mut state = self.state();
        if state.unanswered.len() < MAX_RULES || state.unanswered.contains_key(path) {
            *state.unanswered.entry(path.to_owned()).or_default() += n;
        }
    }

    /// How many requests [`Self::never_answer`] has left unanswered.
    pub fn swallowed(&self) -> u64 {
        self.state().swallowed
    }

    /// Whether this request to `path` is one never to answer (and counts it).
    fn swallow(&self, path: &str) -> bool {
        let mut state = self.state();
        let Some(left) = state.unanswered.get_mut(path).filter(|n| **n > 0) else {
            return false;
        };
        *left -= 1;
        state.swallowed += 1;
        true
    }

    /// Holds every request for `resource` (a plural name such as `leases`) for `delay` before
    /// passing it on, as a hung or overloaded API server would (`None` to stop). Requests
    /// already held keep their delay.
    pub fn delay_requests(&self, resource: &str, delay: Option<Duration>) {
        let mut state = self.state();
        state.request_delays.retain(|(r, _)| r != resource);
        if let Some(delay) = delay
            && state.request_delays.len() < MAX_RULES
        {
            state.request_delays.push((resource.to_owned(), delay));
        }
    }

    pub(crate) fn request_delay(&self, resource: &str) -> Option<Duration> {
        let state = self.state();
        state
            .request_delays
            .iter()
            .find_map(|(r, d)| (r == resource).then_some(*d))
    }

    /// Answers every request whose path starts with `prefix` (e.g.
    /// `/api/v1/namespaces/a/secrets`) with HTTP `code` until [`Self::allow`]: a resource the
    /// client may not read yet (403, before its RoleBinding exists) for as long as a test
    /// needs. Counted in [`Self::served`].
    pub fn deny(&self, prefix: &str, code: u16) {
        let mut state = self.state();
        if state.denied.len() < MAX_RULES {
            state.denied.push((prefix.to_owned(), code));
        }
    }

    /// Serves the requests [`Self::deny`] refused for `prefix` again.
    pub fn allow(&self, prefix: &str) {
        self.state().denied.retain(|(p, _)| p != prefix);
    }

    /// The code to answer `path` with, when it is denied (and counts it as served).
    pub(crate) fn denied(&self, path: &str) -> Option<u16> {
        let mut state = self.state();
        let code = state
            .denied
            .iter()
            .find_map(|(prefix, code)| path.starts_with(prefix.as_str()).then_some(*code))?;
        *state.served.entry(code).or_default() += 1;
        Some(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(is_watch: bool, is_write: bool, user: &str) -> FaultedRequest<'_> {
        FaultedRequest {
            is_watch,
            is_write,
            user,
        }
    }

    #[test]
    fn errors_are_taken_in_order_by_the_requests_they_match() {
        let faults = Faults::default();
        faults.fail_next(1, 410, FaultScope::Watch);
        faults.fail_next(1, 409, FaultScope::Write);
        faults.fail_next(1, 500, FaultScope::Any);
        // A read skips the watch and write errors and takes the one for any request.
        assert_eq!(faults.take(&req(false, false, "admin")), Some(500));
        assert_eq!(faults.take(&req(false, false, "admin")), None);
        assert_eq!(faults.take(&req(false, true, "admin")), Some(409));
        assert_eq!(faults.take(&req(true, false, "admin")), Some(410));
        assert_eq!(faults.pending(), 0);
        assert_eq!(
            faults.served(),
            BTreeMap::from([(409, 1), (410, 1), (500, 1)])
        );
    }

    #[test]
    fn the_queue_is_bounded() {
        let faults = Faults::default();
        faults.fail_next(usize::MAX, 500, FaultScope::Any);
        faults.fail_next(5, 500, FaultScope::Any);
        assert_eq!(faults.pending(), MAX_RULES);
    }

    #[test]
    fn a_denied_prefix_answers_its_code_until_allowed() {
        let faults = Faults::default();
        faults.deny("/api/v1/namespaces/a/secrets", 403);
        assert_eq!(faults.denied("/api/v1/namespaces/a/secrets"), Some(403));
        assert_eq!(faults.denied("/api/v1/namespaces/a/secrets/web"), Some(403));
        assert_eq!(faults.denied("/api/v1/namespaces/b/secrets"), None);
        assert_eq!(faults.served(), BTreeMap::from([(403, 2)]));
        faults.allow("/api/v1/namespaces/a/secrets");
        assert_eq!(faults.denied("/api/v1/namespaces/a/secrets"), None);
    }

    #[tokio::test]
    async fn a_path_held_for_one_user_holds_only_that_users_requests() {
        let faults = std::sync::Arc::new(Faults::default());
        let path = "/apis/g/v1/things";
        faults.hold_for(path, "system:serviceaccount:a:");
        let quick = std::time::Duration::from_millis(200);
        // Another user, and another path, pass at once.
        tokio::time::timeout(quick, faults.wait_if_held(path, "admin"))
            .await
            .unwrap();
        tokio::time::timeout(
            quick,
            faults.wait_if_held("/other", "system:serviceaccount:a:x"),
        )
        .await
        .unwrap();
        // That user waits until the path is released.
        let held = tokio::spawn({
            let faults = faults.clone();
            async move { faults.wait_if_held(path, "system:serviceaccount:a:x").await }
        });
        tokio::time::sleep(quick).await;
        assert!(!held.is_finished());
        faults.release(path);
        tokio::time::timeout(quick, held).await.unwrap().unwrap();
    }

    #[test]
    fn only_the_next_n_requests_to_a_path_are_swallowed() {
        let faults = Faults::default();
        faults.never_answer("/api/v1/namespaces/a/secrets/web", 1);
        assert!(!faults.swallow("/api/v1/namespaces/a/secrets"));
        assert!(faults.swallow("/api/v1/namespaces/a/secrets/web"));
        assert!(!faults.swallow("/api/v1/namespaces/a/secrets/web"));
        assert_eq!(faults.swallowed(), 1);
    }

    #[test]
    fn errors_for_a_user_prefix_spare_every_other_client() {
        let faults = Faults::default();
        let ops = "system:serviceaccount:marin3r-system:";
        faults.fail_next_for(2, 500, FaultScope::Any, ops);
        assert_eq!(faults.take(&req(false, false, "admin")), None);
        assert_eq!(
            faults.take(&req(true, false, "system:serviceaccount:demo:default")),
            None
        );
        assert_eq!(faults.pending(), 2);
        let operator = "system:serviceaccount:marin3r-system:marin3r-operator";
        assert_eq!(faults.take(&req(true, false, operator)), Some(500));
        assert_eq!(faults.take(&req(false, true, operator)), Some(500));
        assert_eq!(faults.take(&req(false, true, operator)), None);
        assert_eq!(faults.served(), BTreeMap::from([(500, 2)]));
    }
}
