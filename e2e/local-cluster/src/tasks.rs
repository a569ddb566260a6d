//! Background tasks the local cluster's controllers share: tasks that stop when their owner
//! is dropped, and watches that keep a store current and wake a reconcile loop.

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A spawned task, aborted when this is dropped.
pub struct AbortOnDrop(pub JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches every `K` into a store, waking `trigger` on each change; the watch runs until the
/// returned task guard (pushed on `tasks`) is dropped. `who` names the watcher in logs.
pub fn watch_into_store<K>(
    api: Api<K>,
    trigger: Arc<Notify>,
    tasks: &mut Vec<AbortOnDrop>,
    who: &'static str,
) -> Store<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
        .default_backoff();
    tasks.push(AbortOnDrop(tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => trigger.notify_one(),
                Err(e) => tracing::warn!("{who} watch: {e}"),
            }
        }
    })));
    reader
}
