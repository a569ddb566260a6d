//! The `EnvoyConfigRevision` controller: loads a published revision, with the Secrets it
//! references served by SDS and the endpoints it generates from EndpointSlices, into the xDS
//! cache under (its namespace, its node id), and stops serving it when it is unpublished or
//! deleted. A change to a referenced Secret or a selected EndpointSlice reloads the
//! revisions that use it, so Envoy gets the new certificate or endpoints with no config
//! change.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use marin3r_controller::{patch_status, status_patch};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

mod endpoint_slices;
mod load;
mod watch;

pub(super) use watch::Deletions;

use super::{Context, Error};
use load::{load_status, snapshot_for};
use marin3r_api::EnvoyConfigRevision;
use marin3r_envoyconfig::{convert, rules};
use marin3r_xds::NodeKey;

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
    let revisions = &ctx.index.revisions;
    let store = revisions.store();
    let controller =
        kube::runtime::Controller::for_shared_stream(revisions.changes(), store.clone());
    let (triggers_tx, triggers) = mpsc::channel(256);
    let secrets = tokio::spawn(watch::watch_secrets(
        Arc::clone(&ctx),
        store.clone(),
        triggers_tx,
    ));
    tokio::spawn(watch::mark_loaded(Arc::clone(&ctx), store, ready));
    let controller = ctx.watch_namespaces(controller);
    // Secret changes reach the controller through `triggers` (see `watch_secrets`).
    let controller = controller.reconcile_on(ReceiverStream::new(triggers));
    // A retired revision still served hands its node back to the published one.
    let (reloads_tx, reloads) = mpsc::channel(256);
    let controller = controller.reconcile_on(ReceiverStream::new(reloads));
    let reconcile = move |r, ctx| reconcile(r, ctx, reloads_tx.clone());
    let (metrics, deadline) = (ctx.metrics.reconciles.clone(), ctx.reconcile_timeout());
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
    secrets.abort();
}

pub(super) fn key_of(r: &EnvoyConfigRevision) -> NodeKey {
    NodeKey::new(r.namespace().unwrap_or_default(), r.spec.node_id.clone())
}

async fn reconcile(
    r: Arc<EnvoyConfigRevision>,
    ctx: Arc<Context>,
    reloads: Reloads,
) -> Result<Action, Error> {
    let key = key_of(&r);
    let name = r.name_any();
    let uid = r.uid().unwrap_or_default();
    if r.metadata.deletion_timestamp.is_some() {
        if ctx.publisher.unload(&key, &uid) {
            info!(revision = %name, node = %key, "being deleted; no longer served");
        }
        return Ok(Action::await_change());
    }
    if let Some((step, cutoff)) = r.canary() {
        return load_canary(&r, &ctx, step, cutoff).await;
    }
    // Tainted, or its rollout ended without it: its canaries get the stable revision back.
    // Published, it stays the canary until it loads as the stable one (`Publisher::load`):
    // ending it first would give its canaries the old version for as long as the load takes.
    if !r.is_published() && ctx.publisher.end_canary(&key, &uid) {
        info!(revision = %name, node = %key, "no longer a canary; its proxies get the stable revision");
    }
    if !r.is_published() {
        if ctx.publisher.retire(&key, &uid) {
            info!(revision = %name, node = %key, "unpublished; served until its successor loads");
            reload_successors(&r, &ctx, &reloads).await;
        }
        clear_in_sync(&r, &ctx).await?;
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
        Err(e) => {
            // What was served stays served: a missing Secret must not take a proxy's
            // configuration away.
            let error = marin3r_controller::chain(e);
            warn!(revision = %name, %error, "cannot load revision");
            Action::requeue(LOAD_RETRY)
        }
    };
    let (status, failure) = load_status(&r, &loaded);
    if r.status.as_ref() != Some(&status) {
        let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let patch = status_patch(&status, &[], r.metadata.resource_version.as_deref())?;
        patch_status(&api, &name, patch, crate::controllers::FIELD_MANAGER).await?;
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

/// Serves a revision in a canary step to the proxies of its node that `cutoff` picks, with
/// its Secrets and EndpointSlice endpoints, as a published one is served to all. A canary
/// that cannot be built is not served (its proxies keep the stable revision) and is tried
/// again; its status is the published revision's to describe, not this one's.
async fn load_canary(
    r: &EnvoyConfigRevision,
    ctx: &Context,
    step: u32,
    cutoff: u64,
) -> Result<Action, Error> {
    let (key, name, uid) = (key_of(r), r.name_any(), r.uid().unwrap_or_default());
    if !ctx.serves(&key.namespace).await? {
        ctx.publisher.end_canary(&key, &uid);
        ctx.mark_attempted(&uid);
        return Ok(Action::await_change());
    }
    let secrets = observe_secrets(r, ctx).await?;
    let slices = endpoint_slices::observe(r, ctx).await?;
    let loaded = snapshot_for(
        r,
        &secrets,
        &slices,
        ctx.config.allow_cross_namespace_secrets,
    );
    ctx.mark_attempted(&uid);
    match loaded {
        Ok((snapshot, _)) => {
            if ctx
                .publisher
                .load_canary(&key, &name, &uid, &r.spec.version, snapshot, cutoff)
            {
                info!(revision = %name, node = %key, step, cutoff = %format!("{cutoff:016x}"), "serving the canary step");
            }
            // Another replica saw a canary's NACK: add this replica's count.
            super::nacks::answer(r, ctx).await?;
            Ok(Action::await_change())
        }
        Err(e) => {
            ctx.publisher.end_canary(&key, &uid);
            let error = marin3r_controller::chain(&e);
            warn!(revision = %name, %error, "cannot serve the canary; its proxies keep the stable revision");
            Ok(Action::requeue(LOAD_RETRY))
        }
    }
}

/// Where a reconcile asks for other revisions to be reconciled again.
type Reloads = mpsc::Sender<ObjectRef<EnvoyConfigRevision>>;

/// `r` is unpublished but is still what its node is served: reconciles the published
/// revisions of its node again, which load over it. Usually the successor has not loaded
/// yet and this is one reconcile more; but `r` may have loaded after its successor, while
/// both were published for a moment (a Secret or EndpointSlice of `r` changed, or this
/// replica started, between the successor's publication and `r`'s unpublication), and
/// nothing else would reconcile the successor again: `r` would stay served while the
/// status names the successor.
async fn reload_successors(r: &EnvoyConfigRevision, ctx: &Context, reloads: &Reloads) {
    let (ns, uid) = (r.namespace(), r.uid());
    let successors = ctx.index.revisions.store().state().into_iter().filter(|s| {
        s.namespace() == ns
            && s.uid() != uid
            && s.spec.node_id == r.spec.node_id
            && s.is_published()
            && s.metadata.deletion_timestamp.is_none()
    });
    for s in successors {
        debug!(revision = %s.name_any(), retired = %r.name_any(), "reloading the published revision over the retired one");
        // Closed only when the controller has stopped: nothing left to reload.
        let _ = reloads.send(ObjectRef::from_obj(&*s)).await;
    }
}

/// Takes `ResourcesInSync` off a revision that is no longer published: as in the original
/// HEAD, only the published revision says whether its resources are in the cache.
async fn clear_in_sync(r: &EnvoyConfigRevision, ctx: &Context) -> Result<(), Error> {
    let Some(mut status) = r.status.clone() else {
        return Ok(());
    };
    if !status.clear_resources_in_sync() {
        return Ok(());
    }
    let api: Api<EnvoyConfigRevision> =
        Api::namespaced(ctx.client.clone(), &r.namespace().unwrap_or_default());
    // `conditions` is written even when empty; the resource version fails a stale write.
    let rv = r.metadata.resource_version.as_deref();
    let patch = status_patch(&status, &["conditions"], rv)?;
    patch_status(
        &api,
        &r.name_any(),
        patch,
        crate::controllers::FIELD_MANAGER,
    )
    .await?;
    Ok(())
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

/// Reads every Secret the revision references and may reference (None: not found, or one
/// the cross-namespace rule forbids, which `snapshot_for` then refuses).
async fn observe_secrets(
    r: &EnvoyConfigRevision,
    ctx: &Context,
) -> Result<Vec<Option<Secret>>, Error> {
    let own = r.namespace().unwrap_or_default();
    let mut secrets = Vec::new();
    for source in convert::secret_sources(&r.spec.envoy_resources, &r.spec.resources) {
        let allowed =
            rules::foreign_secret(&source, &own, ctx.config.allow_cross_namespace_secrets)
                .is_none();
        let ns = source.namespace.as_deref().unwrap_or(&own);
        let secret = match allowed {
            true => {
                Api::<Secret>::namespaced(ctx.client.clone(), ns)
                    .get_opt(&source.secret_name)
                    .await?
            }
            false => None,
        };
        secrets.push(secret);
    }
    Ok(secrets)
}
