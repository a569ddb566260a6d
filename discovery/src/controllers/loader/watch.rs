//! What the loader watches besides revisions: the Secrets and EndpointSlices of the served
//! namespaces (a change reloads the revisions that use them), deleted revisions (no longer
//! served), and when everything published at start has loaded (readiness).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use marin3r_controller::{Note, patch_status, status_patch};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{endpoint_slices, key_of};
use crate::controllers::Publisher;
use crate::controllers::{Context, Error};
use marin3r_api::EnvoyConfigRevision;
use marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL;
use marin3r_api::envoy_config_revision::RevisionReason;
use marin3r_envoyconfig::convert;

/// Sets `ready` once every revision published when the store was first listed has been
/// loaded, or has failed to load and says why in its status: a new discovery pod gets
/// traffic only once it serves what the old one did. A revision that fails stays failed on
/// the next try too, so waiting for a success would keep the pod out of service forever.
pub(super) async fn mark_loaded(
    ctx: Arc<Context>,
    store: kube::runtime::reflector::Store<EnvoyConfigRevision>,
    ready: Arc<AtomicBool>,
) {
    let flag = Arc::new(AtomicBool::new(false));
    crate::controllers::mark_ready(store.clone(), flag.clone()).await;
    if !flag.load(Ordering::SeqCst) {
        return;
    }
    let mut pending: BTreeSet<String> = BTreeSet::new();
    for r in store.state() {
        let ns = r.namespace().unwrap_or_default();
        // A failed lookup counts as served: waiting for it is the safe side.
        // A canary too: a replica that starts mid-rollout serves each proxy its track.
        if (r.is_published() || r.canary().is_some()) && ctx.serves(&ns).await.unwrap_or(true) {
            pending.insert(r.uid().unwrap_or_default());
        }
    }
    loop {
        let current: BTreeSet<String> = store
            .state()
            .iter()
            .filter(|r| r.is_published() || r.canary().is_some())
            .filter_map(|r| r.uid())
            .collect();
        let attempted = ctx.attempted.lock().map(|a| a.clone()).unwrap_or_default();
        // Gone or unpublished since: nothing left to wait for.
        pending.retain(|uid| current.contains(uid) && !attempted.contains(uid));
        if pending.is_empty() {
            ready.store(true, Ordering::SeqCst);
            info!("every published revision loaded");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Watches the Secrets and EndpointSlices of the namespaces served, and only those: one
/// namespaced watch of each per served namespace, started when it joins and stopped when it
/// leaves, so the discovery pod needs no cluster-wide access to them (the operator grants it
/// per namespace). With `--watch-namespace` only that namespace is watched; without it or
/// `--discovery-service-name` every namespace is served, and cluster-wide watches are used.
pub(super) async fn watch_secrets(
    ctx: Arc<Context>,
    store: kube::runtime::reflector::Store<EnvoyConfigRevision>,
    triggers: mpsc::Sender<ObjectRef<EnvoyConfigRevision>>,
) {
    let Some(name) = ctx
        .config
        .discovery_service
        .clone()
        .filter(|_| ctx.config.watch_namespace.is_none())
    else {
        // Every namespace, or only the one watched.
        let secrets = ctx.api::<Secret>();
        let slices = ctx.api::<EndpointSlice>();
        tokio::join!(
            watch_secrets_in(ctx, store.clone(), triggers.clone(), secrets),
            endpoint_slices::watch(store, triggers, slices),
        );
        return;
    };
    let Some(namespaces) = &ctx.index.namespaces else {
        return;
    };
    let (labelled, mut changes) = (namespaces.store(), namespaces.changes().boxed());
    let start = |ns: &str| {
        debug!(namespace = %ns, "watching its Secrets and EndpointSlices");
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), ns);
        let slices = Api::<EndpointSlice>::namespaced(ctx.client.clone(), ns);
        let (ctx, store, triggers) = (Arc::clone(&ctx), store.clone(), triggers.clone());
        tokio::spawn(async move {
            tokio::join!(
                watch_secrets_in(ctx, store.clone(), triggers.clone(), secrets),
                endpoint_slices::watch(store, triggers, slices),
            );
        })
    };
    let served = |ns: &str| {
        labelled
            .get(&ObjectRef::new(ns))
            .is_some_and(|ns| ns.labels().get(DISCOVERY_SERVICE_LABEL) == Some(&name))
    };
    let mut watches: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    while let Some(changed) = changes.next().await {
        let changed = changed.name_any();
        if served(&changed) && !watches.contains_key(&changed) {
            watches.insert(changed.clone(), start(&changed));
        }
        // Every namespace watched is checked: one deleted while the watch was down sends
        // no change of its own.
        watches.retain(|ns, task| {
            let keep = served(ns);
            if !keep {
                debug!(namespace = %ns, "no longer served; its Secrets are not watched");
                task.abort();
            }
            keep
        });
    }
    for task in watches.into_values() {
        task.abort();
    }
}

/// One Secret watch. A Secret change reloads every published revision that references it,
/// and one that changes after the initial list first marks them `ResourcesOutOfSync`
/// (reason `SecretChanged`, SPEC §2.4) so `kubectl describe` shows why they reload; the mark
/// comes before the reload, so the reload's own status write is the last word.
async fn watch_secrets_in(
    ctx: Arc<Context>,
    store: kube::runtime::reflector::Store<EnvoyConfigRevision>,
    triggers: mpsc::Sender<ObjectRef<EnvoyConfigRevision>>,
    api: Api<Secret>,
) {
    // Backed off: a namespace whose Role is not granted yet answers 403 to every retry.
    let config = watcher::Config::default().fields(SECRET_FIELD_SELECTOR);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let cross_namespace = ctx.config.allow_cross_namespace_secrets;
    while let Some(event) = events.next().await {
        let (secret, changed) = match event {
            Ok(Event::Apply(secret) | Event::Delete(secret)) => (secret, true),
            Ok(Event::InitApply(secret)) => (secret, false),
            Ok(Event::Init | Event::InitDone) => continue,
            Err(e) => {
                warn!(error = %e, "Secret watch failed; retrying with a backoff");
                continue;
            }
        };
        let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
        let candidates = store.state_filter(|r| may_reference(r, &ns, cross_namespace));
        for r in candidates {
            if !references(&r, &ns, &name) {
                continue;
            }
            if changed {
                let message = format!("Secret {ns}/{name} changed; reloading");
                if let Err(e) = mark_out_of_sync(&ctx, &r, &message).await {
                    debug!(revision = %r.name_any(), error = %e, "could not mark the revision out of sync");
                }
                let note = Note::normal(RevisionReason::SecretChanged, message);
                ctx.events.publish(&*r, &note).await;
            }
            if triggers.send(ObjectRef::from_obj(&*r)).await.is_err() {
                return;
            }
        }
    }
}

async fn mark_out_of_sync(
    ctx: &Context,
    r: &EnvoyConfigRevision,
    message: &str,
) -> Result<(), Error> {
    let api: Api<EnvoyConfigRevision> =
        Api::namespaced(ctx.client.clone(), &r.namespace().unwrap_or_default());
    // A fresh read: the patch replaces the conditions list and carries its resource version.
    let Some(fresh) = api.get_opt(&r.name_any()).await? else {
        return Ok(());
    };
    let mut status = fresh.status.clone().unwrap_or_default();
    status.set_resources_sync(
        false,
        RevisionReason::SecretChanged,
        message,
        fresh.metadata.generation,
        &crate::controllers::now(),
    );
    let patch = status_patch(&status, &[], fresh.metadata.resource_version.as_deref())?;
    patch_status(
        &api,
        &fresh.name_any(),
        patch,
        crate::controllers::FIELD_MANAGER,
    )
    .await?;
    Ok(())
}

/// Deleted revisions are not reconciled by the controller (it only sees objects that exist),
/// so the revision watch's root tells this of every event: a deleted revision stops being
/// served. After every (re)list, keys served by revisions that no longer exist are cleared
/// too, so a deletion missed while the watch was down is not served forever.
#[derive(Debug, Default)]
pub(crate) struct Deletions {
    listed: BTreeSet<(String, String)>,
}

impl Deletions {
    pub fn on_event(&mut self, publisher: &Publisher, event: &Event<EnvoyConfigRevision>) {
        match event {
            Event::Delete(r) => {
                let key = key_of(r);
                if publisher.unload(&key, &r.uid().unwrap_or_default()) {
                    info!(revision = %r.name_any(), node = %key, "deleted; no longer served");
                }
            }
            Event::Init => self.listed.clear(),
            Event::InitApply(r) => {
                self.listed.insert((
                    r.namespace().unwrap_or_default(),
                    r.uid().unwrap_or_default(),
                ));
            }
            Event::InitDone => {
                for (key, uid) in publisher.served() {
                    if !self.listed.contains(&(key.namespace.clone(), uid.clone())) {
                        publisher.unload(&key, &uid);
                        info!(%uid, node = %key, "revision gone; no longer served");
                    }
                }
            }
            Event::Apply(_) => {}
        }
    }
}

/// The Secret types no revision is served from, left out by the API server (Istio's
/// selector): Helm keeps every release of every chart in one, each ServiceAccount may have a
/// token, and namespaces full of them would be listed, decoded and watched for nothing.
pub(crate) const SECRET_FIELD_SELECTOR: &str =
    "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";

/// Whether the published revision `r` may reference a Secret of namespace `ns`, decided from
/// its metadata alone: reading its Secrets clones its spec, which every Secret event would
/// otherwise do for every published revision of the cluster. A revision references Secrets of
/// its own namespace only, unless `cross_namespace` Secrets are allowed.
fn may_reference(r: &EnvoyConfigRevision, ns: &str, cross_namespace: bool) -> bool {
    r.is_published() && (cross_namespace || r.metadata.namespace.as_deref() == Some(ns))
}

/// Whether `r` references the Secret `ns/name`.
fn references(r: &EnvoyConfigRevision, ns: &str, name: &str) -> bool {
    secret_refs(r).any(|(rns, rname)| rns == ns && rname == name)
}

/// The (namespace, name) of every Secret a revision references.
fn secret_refs(r: &EnvoyConfigRevision) -> impl Iterator<Item = (String, String)> + '_ {
    let own = r.namespace().unwrap_or_default();
    convert::secret_sources(&r.spec.envoy_resources, &r.spec.resources)
        .into_iter()
        .map(move |s| (s.namespace.unwrap_or_else(|| own.clone()), s.secret_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_api::EnvoyConfigRevisionSpec;
    use marin3r_api::envoy_config_revision::EnvoyConfigRevisionStatus;

    /// A published revision in `ns` serving the Secret `secret` (of its own namespace).
    fn mk_revision(ns: &str, secret: &str) -> EnvoyConfigRevision {
        let spec = serde_json::from_value(serde_json::json!({
            "nodeID": "gw",
            "envoyResources": {"secrets": [{"name": secret}]},
        }))
        .unwrap();
        let mut r = EnvoyConfigRevision::new("gw-abc", EnvoyConfigRevisionSpec::of(&spec, "abc"));
        r.metadata.namespace = Some(ns.into());
        r.status = Some(EnvoyConfigRevisionStatus {
            published: Some(true),
            ..Default::default()
        });
        r
    }

    /// A Secret event looks at the revisions of its own namespace only (their
    /// specs are not even read elsewhere), unless cross-namespace Secrets are allowed.
    #[test]
    fn a_secret_event_concerns_the_published_revisions_of_its_namespace() {
        let mine = mk_revision("team-a", "web-cert");
        let theirs = mk_revision("team-b", "web-cert");
        assert!(may_reference(&mine, "team-a", false));
        assert!(!may_reference(&theirs, "team-a", false));
        assert!(may_reference(&theirs, "team-a", true));
        let mut unpublished = mine.clone();
        unpublished.status = None;
        assert!(!may_reference(&unpublished, "team-a", false));
        assert!(references(&mine, "team-a", "web-cert"));
        assert!(!references(&mine, "team-a", "other"));
        assert!(!references(&theirs, "team-a", "web-cert"));
    }

    #[test]
    fn the_secret_watch_leaves_out_helm_releases_and_service_account_tokens() {
        let excluded: Vec<&str> = SECRET_FIELD_SELECTOR
            .split(',')
            .filter_map(|req| req.strip_prefix("type!="))
            .collect();
        assert_eq!(
            excluded,
            ["helm.sh/release.v1", "kubernetes.io/service-account-token"]
        );
    }
}
