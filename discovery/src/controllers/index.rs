//! One watch per kind. Each kind the discovery service's controllers read cluster-wide
//! (EnvoyConfigRevisions, EnvoyConfigs and, when namespaces are chosen by label, Namespaces)
//! is watched once, into one store that every consumer reads; the loader, the taint decider
//! and the EnvoyConfig controller are triggered from it instead of opening watches of their
//! own. The root of each watch also runs the work that needs every event (deleted revisions
//! stop being served, served namespaces get their Secret and EndpointSlice watches).
//!
//! Consumers are told of changes on a bounded broadcast channel: one that falls behind is not
//! waited for (the watch never stalls on a slow controller); it is given every object again,
//! which reconciles what it missed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt, stream};
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use marin3r_controller::Watched;
use tokio::sync::broadcast;
use tracing::warn;

/// How many changes a consumer may be behind before it is resynced from the store.
const BACKLOG: usize = 1024;

/// The store of one kind and the changes to it, fed by one watch ([`Index::run`]).
pub(crate) struct Index<K: Watched> {
    store: Store<K>,
    writer: Mutex<Option<reflector::store::Writer<K>>>,
    changes: broadcast::Sender<Arc<K>>,
}

impl<K: Watched> Default for Index<K> {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            changes: broadcast::channel(BACKLOG).0,
        }
    }
}

impl<K: Watched> Index<K> {
    /// What the watch has seen; ready once it has listed every object.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Watches `api` into the store until the task is aborted, telling the consumers of every
    /// change and `root` of every event after the store has applied it. Runs once: a second
    /// call returns at once.
    pub async fn run(&self, api: Api<K>, what: &'static str, mut root: impl FnMut(&Event<K>)) {
        let Some(mut writer) = self.writer.lock().ok().and_then(|mut w| w.take()) else {
            return;
        };
        // Backed off: a watch the API refuses (403 before a Role is granted) is retried slowly.
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    warn!(error = %e, kind = what, "watch failed; retrying with a backoff");
                    continue;
                }
            };
            writer.apply_watcher_event(&event);
            root(&event);
            match &event {
                Event::Apply(obj) => {
                    let stored = self.store.get(&ObjectRef::from_obj(obj));
                    let _ = self
                        .changes
                        .send(stored.unwrap_or_else(|| Arc::new(obj.clone())));
                }
                Event::Delete(obj) => {
                    let _ = self.changes.send(Arc::new(obj.clone()));
                }
                // A (re)list: everything may have changed while the watch was down.
                Event::InitDone => {
                    for obj in self.store.state() {
                        let _ = self.changes.send(obj);
                    }
                }
                Event::Init | Event::InitApply(_) => {}
            }
        }
    }

    /// Feeds `events` to the index as its watch would (for the tests of its consumers).
    #[cfg(test)]
    #[allow(clippy::unwrap_used)] // test code
    pub fn feed(&self, events: Vec<Event<K>>) {
        let mut guard = self.writer.lock().unwrap();
        let writer = guard.as_mut().unwrap();
        for event in events {
            writer.apply_watcher_event(&event);
            match &event {
                Event::Apply(o) | Event::Delete(o) => {
                    let _ = self.changes.send(Arc::new(o.clone()));
                }
                Event::InitDone => {
                    for o in self.store.state() {
                        let _ = self.changes.send(o);
                    }
                }
                _ => {}
            }
        }
    }

    /// Ends the watch as an aborted one does: the writer goes (for the tests of its consumers).
    #[cfg(test)]
    pub fn close(&self) {
        if let Ok(mut writer) = self.writer.lock() {
            writer.take();
        }
    }

    /// The objects to reconcile, for one consumer: every object once the store has listed
    /// them, then each one that changes (deleted ones included, for owner triggers). A consumer
    /// that falls more than [`BACKLOG`] changes behind gets every object again.
    pub fn changes(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        // Subscribed before looking at the store, so no change falls between the two.
        let rx = self.changes.subscribe();
        let store = self.store.clone();
        // Not listed yet: the list's end sends every object to the subscribers.
        let listed =
            futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok());
        let pending: VecDeque<Arc<K>> = match listed {
            true => store.state().into(),
            false => VecDeque::new(),
        };
        stream::unfold(
            (rx, pending, store),
            |(mut rx, mut pending, store)| async move {
                loop {
                    if let Some(obj) = pending.pop_front() {
                        return Some((obj, (rx, pending, store)));
                    }
                    match rx.recv().await {
                        Ok(obj) => return Some((obj, (rx, pending, store))),
                        Err(broadcast::error::RecvError::Lagged(missed)) => {
                            warn!(missed, "a controller fell behind its watch; resyncing it");
                            pending.extend(store.state());
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(name: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "n"}}))
            .unwrap()
    }

    fn names(objs: &[Arc<ConfigMap>]) -> Vec<String> {
        objs.iter()
            .map(|o| o.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    fn feed(index: &Index<ConfigMap>, events: Vec<Event<ConfigMap>>) {
        index.feed(events);
    }

    #[tokio::test]
    async fn a_consumer_sees_the_list_then_changes_and_one_that_lags_is_resynced() {
        let index = Index::<ConfigMap>::default();
        let early = index.changes();
        feed(
            &index,
            vec![Event::Init, Event::InitApply(cm("a")), Event::InitDone],
        );
        let seen: Vec<_> = early.take(1).collect().await;
        assert_eq!(names(&seen), ["a"]);
        // A consumer that starts after the list gets the store first, then changes.
        let late = index.changes();
        feed(&index, vec![Event::Apply(cm("b")), Event::Delete(cm("a"))]);
        let seen: Vec<_> = late.take(3).collect().await;
        assert_eq!(names(&seen), ["a", "b", "a"]);
        // Behind by more than the backlog: every object again, then live changes.
        let lagging = index.changes();
        for _ in 0..=BACKLOG {
            feed(&index, vec![Event::Apply(cm("b"))]);
        }
        feed(&index, vec![Event::Apply(cm("c"))]);
        let mut seen: Vec<_> = lagging.take(3).collect().await;
        seen.sort_by_key(|o| o.metadata.name.clone());
        assert_eq!(names(&seen), ["b", "b", "c"]);
    }
}
