//! EndpointSlices for `generateFromEndpointSlices`: read when a revision loads, and watched
//! (per served namespace, like Secrets) so that a change reloads every published revision
//! whose selector matches the slice, before or after the change. The endpoints are not part
//! of the revision: they change with the cluster, not with the spec.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tracing::warn;

use crate::controllers::{Context, Error};
use marin3r_api::EnvoyConfigRevision;
use marin3r_envoyconfig::convert;

/// The slices each `generateFromEndpointSlices` of the revision selects, in spec order. A
/// selector that is not valid selects nothing here: validation refuses the revision anyway.
pub(super) async fn observe(
    r: &EnvoyConfigRevision,
    ctx: &Context,
) -> Result<Vec<Vec<EndpointSlice>>, Error> {
    let api: Api<EndpointSlice> =
        Api::namespaced(ctx.client.clone(), &r.namespace().unwrap_or_default());
    let mut out = Vec::new();
    for source in convert::endpoint_sources(&r.spec.resources) {
        let Ok(query) = source.selector.to_query() else {
            out.push(Vec::new());
            continue;
        };
        out.push(api.list(&ListParams::default().labels(&query)).await?.items);
    }
    Ok(out)
}

/// One EndpointSlice watch: every change reloads the published revisions of the slice's
/// namespace that select it now or selected it before the change (a relabelled slice must
/// leave the cluster it was in).
pub(super) async fn watch(
    store: Store<EnvoyConfigRevision>,
    triggers: mpsc::Sender<ObjectRef<EnvoyConfigRevision>>,
    api: Api<EndpointSlice>,
) {
    // Backed off: a namespace whose Role is not granted yet answers 403 to every retry.
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    // The labels each slice had when last seen, by namespace/name.
    let mut last: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    while let Some(event) = events.next().await {
        let (slice, deleted) = match event {
            Ok(Event::Apply(slice) | Event::InitApply(slice)) => (slice, false),
            Ok(Event::Delete(slice)) => (slice, true),
            Ok(Event::Init | Event::InitDone) => continue,
            Err(e) => {
                warn!(error = %e, "EndpointSlice watch failed; retrying with a backoff");
                continue;
            }
        };
        let ns = slice.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", slice.name_any());
        let labels = slice.labels().clone();
        let before = if deleted {
            last.remove(&key)
        } else {
            last.insert(key, labels.clone())
        };
        for r in store.state() {
            if !r.is_published() || r.namespace().as_deref() != Some(ns.as_str()) {
                continue;
            }
            let selects = convert::endpoint_sources(&r.spec.resources)
                .iter()
                .any(|s| {
                    s.selector.matches(&labels)
                        || before.as_ref().is_some_and(|b| s.selector.matches(b))
                });
            if selects && triggers.send(ObjectRef::from_obj(&*r)).await.is_err() {
                return;
            }
        }
    }
}
