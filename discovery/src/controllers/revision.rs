//! The `EnvoyConfigRevision` controller: loads a published revision, with the Secrets it
//! references served by SDS and the endpoints it generates from EndpointSlices, into the xDS
//! cache under (its namespace, its node id), and stops serving it when it is unpublished or
//! deleted. A change to a referenced Secret or a selected EndpointSlice reloads the
//! revisions that use it, so Envoy gets the new certificate or endpoints with no config
//! change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use marin3r_controller::{Note, patch_status, set_condition, status_patch};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use super::{Context, Error, endpoint_slices};
use crate::api::EnvoyConfigRevision;
use crate::api::discovery_service::DISCOVERY_SERVICE_LABEL;
use crate::api::envoy_config_revision::{
    EnvoyConfigRevisionStatus, RESOURCES_OUT_OF_SYNC, RevisionReason, VersionTracker,
};
use crate::convert;
use crate::resource::ResourceType;
use crate::xds::{NodeKey, Snapshot};

/// How long to wait before loading a revision again whose Secret is missing or unusable (a
/// Secret created later also triggers it at once, through the Secret watch).
const LOAD_RETRY: Duration = Duration::from_secs(15);
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "revision";

pub(crate) async fn run(
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = kube::runtime::Controller::new(
        ctx.api::<EnvoyConfigRevision>(),
        watcher::Config::default(),
    );
    let store = controller.store();
    let deletions = tokio::spawn(watch_deletions(Arc::clone(&ctx)));
    let (triggers_tx, triggers) = mpsc::channel(256);
    let secrets = tokio::spawn(watch_secrets(Arc::clone(&ctx), store.clone(), triggers_tx));
    tokio::spawn(mark_loaded(Arc::clone(&ctx), store.clone(), ready));
    let controller = ctx.watch_namespaces(controller);
    // Secret changes reach the controller through `triggers` (see `watch_secrets`).
    let controller = controller.reconcile_on(ReceiverStream::new(triggers));
    let metrics = ctx.metrics.reconciles.clone();
    marin3r_controller::run(controller, CONTROLLER, metrics, reconcile, ctx, shutdown).await;
    deletions.abort();
    secrets.abort();
}

/// Sets `ready` once every revision published when the store was first listed has been
/// loaded, or has failed to load and says why in its status: a new discovery pod gets
/// traffic only once it serves what the old one did. A revision that fails stays failed on
/// the next try too, so waiting for a success would keep the pod out of service forever.
async fn mark_loaded(
    ctx: Arc<Context>,
    store: kube::runtime::reflector::Store<EnvoyConfigRevision>,
    ready: Arc<AtomicBool>,
) {
    let flag = Arc::new(AtomicBool::new(false));
    super::mark_ready(store.clone(), flag.clone()).await;
    if !flag.load(Ordering::SeqCst) {
        return;
    }
    let mut pending: BTreeSet<String> = BTreeSet::new();
    for r in store.state() {
        let ns = r.namespace().unwrap_or_default();
        // A failed lookup counts as served: waiting for it is the safe side.
        if r.is_published() && ctx.serves(&ns).await.unwrap_or(true) {
            pending.insert(r.uid().unwrap_or_default());
        }
    }
    loop {
        let current: BTreeSet<String> = store
            .state()
            .iter()
            .filter(|r| r.is_published())
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
async fn watch_secrets(
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
    let selector = format!("{DISCOVERY_SERVICE_LABEL}={name}");
    let mut namespaces = watcher::watcher(
        Api::<Namespace>::all(ctx.client.clone()),
        watcher::Config::default().labels(&selector),
    )
    .default_backoff()
    .boxed();
    let mut watches: BTreeMap<String, tokio::task::JoinHandle<()>> = BTreeMap::new();
    let mut listed: BTreeSet<String> = BTreeSet::new();
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
    while let Some(event) = namespaces.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(ns)) => {
                listed.insert(ns.name_any());
            }
            Ok(Event::InitDone) => {
                watches.retain(|ns, task| {
                    let keep = listed.contains(ns);
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for ns in &listed {
                    if !watches.contains_key(ns) {
                        watches.insert(ns.clone(), start(ns));
                    }
                }
            }
            Ok(Event::Apply(ns)) => {
                let ns = ns.name_any();
                if !watches.contains_key(&ns) {
                    watches.insert(ns.clone(), start(&ns));
                }
            }
            Ok(Event::Delete(ns)) => {
                if let Some(task) = watches.remove(&ns.name_any()) {
                    debug!(namespace = %ns.name_any(), "no longer served; its Secrets are not watched");
                    task.abort();
                }
            }
            Err(e) => {
                // The watcher backs off by itself (`default_backoff`).
                warn!(error = %e, "namespace watch failed; retrying with a backoff");
            }
        }
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
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
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
        for r in store.state() {
            if !r.is_published() || !secret_refs(&r).any(|(rns, rname)| rns == ns && rname == name)
            {
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
    set_condition(
        &mut status.conditions,
        RESOURCES_OUT_OF_SYNC,
        true,
        RevisionReason::SecretChanged,
        message,
        fresh.metadata.generation,
        &super::now(),
    );
    let patch = status_patch(&status, &[], fresh.metadata.resource_version.as_deref())?;
    patch_status(&api, &fresh.name_any(), patch, super::FIELD_MANAGER).await?;
    Ok(())
}

/// The (namespace, name) of every Secret a revision references.
fn secret_refs(r: &EnvoyConfigRevision) -> impl Iterator<Item = (String, String)> + '_ {
    let own = r.namespace().unwrap_or_default();
    convert::secret_sources(&r.spec.config())
        .into_iter()
        .map(move |s| (s.namespace.unwrap_or_else(|| own.clone()), s.secret_name))
}

fn key_of(r: &EnvoyConfigRevision) -> NodeKey {
    NodeKey::new(r.namespace().unwrap_or_default(), r.spec.node_id.clone())
}

async fn reconcile(r: Arc<EnvoyConfigRevision>, ctx: Arc<Context>) -> Result<Action, Error> {
    let key = key_of(&r);
    let name = r.name_any();
    let uid = r.uid().unwrap_or_default();
    if r.metadata.deletion_timestamp.is_some() {
        if ctx.publisher.unload(&key, &uid) {
            info!(revision = %name, node = %key, "being deleted; no longer served");
        }
        return Ok(Action::await_change());
    }
    if !r.is_published() {
        if ctx.publisher.retire(&key, &uid) {
            info!(revision = %name, node = %key, "unpublished; served until its successor loads");
        }
        return Ok(Action::await_change());
    }
    if !ctx.serves(&key.namespace).await? {
        ctx.publisher.unload(&key, &uid);
        ctx.mark_attempted(&uid);
        return Ok(Action::await_change());
    }
    let secrets = observe_secrets(&r, &ctx).await?;
    let slices = endpoint_slices::observe(&r, &ctx).await?;
    let loaded = snapshot_for(
        &r,
        &secrets,
        &slices,
        ctx.config.allow_cross_namespace_secrets,
    );
    // Not in the status: every replica writes the same status, and only a replica that
    // started after the failure falls back.
    if loaded.is_err() && ctx.publisher.current(&key).is_none() {
        load_fallback(&r, &ctx).await?;
    }
    let action = match &loaded {
        Ok((snapshot, secrets_version)) => {
            if !still_published(&r, &ctx).await? {
                debug!(revision = %name, "no longer published; not loaded");
                return Ok(Action::await_change());
            }
            if ctx
                .publisher
                .load(&key, &name, &uid, &r.spec.version, snapshot.clone())
            {
                info!(revision = %name, node = %key, secrets = %secrets_version, "loaded into the xDS cache");
            }
            Action::await_change()
        }
        Err(message) => {
            // What was served stays served: a missing Secret must not take a proxy's
            // configuration away.
            warn!(revision = %name, %message, "cannot load revision");
            Action::requeue(LOAD_RETRY)
        }
    };
    let (status, failure) = load_status(&r, &loaded);
    if r.status.as_ref() != Some(&status) {
        let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let patch = status_patch(&status, &[], r.metadata.resource_version.as_deref())?;
        patch_status(&api, &name, patch, super::FIELD_MANAGER).await?;
    }
    // Loaded, or its status says why not (the write above succeeded).
    ctx.mark_attempted(&uid);
    // Another replica saw a NACK of it: add this replica's count of the node's proxies.
    super::nacks::answer(&r, &ctx).await?;
    // After the write, which fails on a stale read: one event per new problem.
    if let Some(note) = failure {
        ctx.events.publish(&*r, &note).await;
    }
    Ok(action)
}

/// When the published revision `r` cannot load and nothing is served to its node (this
/// process just started: a restart, a new replica), loads the newest earlier revision of
/// the same config that is untainted and loads: what a process that was running all along
/// still serves, since a running process keeps serving a revision until its successor
/// loads. The published revision replaces it once it loads (its reconcile is requeued).
async fn load_fallback(r: &EnvoyConfigRevision, ctx: &Context) -> Result<(), Error> {
    let key = key_of(r);
    let owner = |x: &EnvoyConfigRevision| {
        x.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone())
    };
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let mut candidates: Vec<EnvoyConfigRevision> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| {
            c.uid() != r.uid()
                && c.spec.node_id == r.spec.node_id
                && owner(c).is_some()
                && owner(c) == owner(r)
                && !c.is_tainted()
                && c.metadata.deletion_timestamp.is_none()
        })
        .collect();
    // Newest publication first; never published last.
    candidates.sort_by(|a, b| {
        let at = |x: &EnvoyConfigRevision| {
            x.status
                .as_ref()
                .and_then(|s| s.last_published_at.as_ref())
                .map(|t| t.0)
        };
        at(b).cmp(&at(a))
    });
    for c in candidates {
        let secrets = observe_secrets(&c, ctx).await?;
        let slices = endpoint_slices::observe(&c, ctx).await?;
        let Ok((snapshot, _)) = snapshot_for(
            &c,
            &secrets,
            &slices,
            ctx.config.allow_cross_namespace_secrets,
        ) else {
            continue;
        };
        let name = c.name_any();
        // Another reconcile may have loaded something meanwhile: that one stands.
        if ctx.publisher.current(&key).is_some() {
            return Ok(());
        }
        ctx.publisher.load(
            &key,
            &name,
            &c.uid().unwrap_or_default(),
            &c.spec.version,
            snapshot,
        );
        warn!(revision = %r.name_any(), fallback = %name, node = %key, "published revision cannot load; serving the newest earlier one that does");
        return Ok(());
    }
    Ok(())
}

/// Whether the revision is still published, read fresh. The cached object may be stale: a
/// rollback unpublishes this revision and publishes another in two writes, and reconciles of
/// the two run concurrently. Loading a revision that is no longer published would replace
/// its successor.
async fn still_published(r: &EnvoyConfigRevision, ctx: &Context) -> Result<bool, Error> {
    let api: Api<EnvoyConfigRevision> =
        Api::namespaced(ctx.client.clone(), &r.namespace().unwrap_or_default());
    let fresh = api.get_opt(&r.name_any()).await?;
    Ok(fresh.is_some_and(|f| {
        f.uid() == r.uid() && f.is_published() && f.metadata.deletion_timestamp.is_none()
    }))
}

/// The `ResourcesOutOfSync` condition after a load, and a Warning when the problem is new.
fn load_status(
    r: &EnvoyConfigRevision,
    loaded: &Result<(Snapshot, String), String>,
) -> (EnvoyConfigRevisionStatus, Option<Note>) {
    let mut status = r.status.clone().unwrap_or_default();
    if let Ok((snapshot, _)) = loaded {
        status.provides_versions = Some(provided_versions(snapshot));
    }
    let (out_of_sync, reason, message) = match loaded {
        Ok((_, secrets_version)) => (
            false,
            RevisionReason::ResourcesLoaded,
            format!(
                "served to node {} (secrets version {secrets_version})",
                r.spec.node_id
            ),
        ),
        Err(message) => (true, RevisionReason::LoadFailed, message.clone()),
    };
    let changed = set_condition(
        &mut status.conditions,
        RESOURCES_OUT_OF_SYNC,
        out_of_sync,
        reason,
        &message,
        r.metadata.generation,
        &super::now(),
    );
    let failure = (changed && out_of_sync).then(|| Note::warning(reason, message));
    (status, failure)
}

/// The version Envoy is sent of each resource type the snapshot holds.
fn provided_versions(snapshot: &Snapshot) -> VersionTracker {
    let version = |kind: ResourceType| {
        let of_type = snapshot.of_type(kind);
        (!of_type.resources().is_empty()).then(|| of_type.version().to_owned())
    };
    VersionTracker {
        endpoints: version(ResourceType::Endpoint),
        clusters: version(ResourceType::Cluster),
        routes: version(ResourceType::Route),
        scoped_routes: version(ResourceType::ScopedRoute),
        listeners: version(ResourceType::Listener),
        secrets: version(ResourceType::Secret),
        runtimes: version(ResourceType::Runtime),
        extension_configs: version(ResourceType::ExtensionConfig),
    }
}

/// Reads every Secret the revision references and may reference (None: not found).
async fn observe_secrets(
    r: &EnvoyConfigRevision,
    ctx: &Context,
) -> Result<Vec<Option<Secret>>, Error> {
    let own = r.namespace().unwrap_or_default();
    let mut secrets = Vec::new();
    for (ns, name) in secret_refs(r) {
        let allowed = ns == own || ctx.config.allow_cross_namespace_secrets;
        let secret = match allowed {
            true => {
                Api::<Secret>::namespaced(ctx.client.clone(), &ns)
                    .get_opt(&name)
                    .await?
            }
            false => None,
        };
        secrets.push(secret);
    }
    Ok(secrets)
}

/// The revision's snapshot and its secrets version (`<version>-<hash of the loaded
/// secrets>`), or why it cannot be served. `secrets` are the referenced Secrets, in order.
fn snapshot_for(
    r: &EnvoyConfigRevision,
    secrets: &[Option<Secret>],
    slices: &[Vec<EndpointSlice>],
    allow_cross_namespace_secrets: bool,
) -> Result<(Snapshot, String), String> {
    let mut resources = convert::validate_config(&r.spec.config()).map_err(|errors| {
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        format!("invalid resources: {}", all.join("; "))
    })?;
    let own = r.namespace().unwrap_or_default();
    let mut hasher = Sha256::new();
    let sources = convert::secret_sources(&r.spec.config());
    for (source, secret) in sources.iter().zip(secrets) {
        let path = &source.path;
        let ns = source.namespace.as_deref().unwrap_or(&own);
        let secret_name = &source.secret_name;
        if ns != own && !allow_cross_namespace_secrets {
            return Err(format!(
                "{path}: Secret {ns}/{secret_name} is in another namespace; only Secrets of namespace {own} may be referenced"
            ));
        }
        let Some(secret) = secret else {
            return Err(format!("{path}: Secret {ns}/{secret_name} not found"));
        };
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        let resource = convert::secret_resource(source, secret.type_.as_deref(), &data)
            .map_err(|e| format!("{path}: Secret {ns}/{secret_name} {e}"))?;
        hasher.update(&resource.body);
        resources.push(resource);
    }
    for (source, slices) in convert::endpoint_sources(&r.spec.config())
        .iter()
        .zip(slices)
    {
        let resource = convert::endpoints_from_slices(source, slices)
            .map_err(|e| format!("{}: {e}", source.path))?;
        resources.push(resource);
    }
    let secrets_hash: String = hasher
        .finalize()
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect();
    let secrets_version = format!("{}-{secrets_hash}", r.spec.version);
    // Envoy sees the SDS version as `<revision>-<hash of the secrets>` (SPEC §2.4): it
    // changes with the revision and whenever a referenced Secret does.
    let snapshot = Snapshot::new(resources).map_err(|e| e.to_string())?;
    Ok((
        snapshot.with_version(ResourceType::Secret, secrets_version.clone()),
        secrets_version,
    ))
}

/// Deleted revisions are not reconciled by the controller (it only sees objects that exist),
/// so deletions are watched here: a deleted revision stops being served. After every
/// (re)list, keys served by revisions that no longer exist are cleared too, so a deletion
/// missed while the watch was down is not served forever.
async fn watch_deletions(ctx: Arc<Context>) {
    let api = ctx.api::<EnvoyConfigRevision>();
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listed: BTreeSet<(String, String)> = BTreeSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Delete(r)) => {
                let key = key_of(&r);
                if ctx.publisher.unload(&key, &r.uid().unwrap_or_default()) {
                    info!(revision = %r.name_any(), node = %key, "deleted; no longer served");
                }
            }
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(r)) => {
                listed.insert((
                    r.namespace().unwrap_or_default(),
                    r.uid().unwrap_or_default(),
                ));
            }
            Ok(Event::InitDone) => {
                for (key, uid) in ctx.publisher.served() {
                    if !listed.contains(&(key.namespace.clone(), uid.clone())) {
                        ctx.publisher.unload(&key, &uid);
                        info!(%uid, node = %key, "revision gone; no longer served");
                    }
                }
            }
            Ok(Event::Apply(_)) => {}
            Err(e) => warn!(error = %e, "revision watch failed; retrying with a backoff"),
        }
    }
}
