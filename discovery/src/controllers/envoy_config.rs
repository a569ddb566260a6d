//! The `EnvoyConfig` controller: validates the spec, keeps one owned `EnvoyConfigRevision`
//! per version (at most ten), runs the revision algorithm (`crate::revisions::plan`) with the
//! revisions Envoy tainted, marks the chosen one published and writes the status.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::{Context, Error, set_condition, status_patch};
use crate::api::envoy_config_revision::{NODE_ID_LABEL, REVISION_PUBLISHED, VERSION_LABEL};
use crate::api::{
    ConfigRevisionRef, EnvoyConfig, EnvoyConfigRevision, EnvoyConfigRevisionSpec, EnvoyConfigSpec,
    EnvoyConfigStatus,
};
use crate::revisions::{self, CacheState, MAX_REVISIONS};

pub const CACHE_OUT_OF_SYNC: &str = "CacheOutOfSync";
pub const ROLLBACK_FAILED: &str = "RollbackFailed";

pub(crate) async fn run(
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let controller = Controller::new(
        Api::<EnvoyConfig>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<EnvoyConfigRevision>::all(client),
        watcher::Config::default(),
    );
    let store = controller.store();
    tokio::spawn(super::mark_ready(store.clone(), ready));
    let controller = ctx.watch_namespaces(controller);
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|result| {
            ctx.metrics.reconciled("envoyconfig", result.is_ok());
            async move {
                match result {
                    Ok((obj, _)) => debug!(envoyconfig = %obj, "reconciled"),
                    Err(err) => debug!(error = %err, "reconcile failed"),
                }
            }
        })
        .await;
}

fn error_policy(ec: Arc<EnvoyConfig>, err: &Error, _: Arc<Context>) -> Action {
    if err.is_conflict() {
        debug!(envoyconfig = %ec.name_any(), error = %err, "write conflict; retrying");
    } else {
        warn!(envoyconfig = %ec.name_any(), namespace = ?ec.namespace(), error = %err, "reconcile failed; retrying");
    }
    Action::requeue(super::retry_after(err))
}

/// Why a spec cannot be published: every problem, each naming its field path.
pub fn problems(spec: &EnvoyConfigSpec, namespace: &str, cross_namespace: bool) -> Vec<String> {
    let mut out: Vec<String> = match crate::convert::validate_config(spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    for (i, secret) in spec.envoy_resources.secrets.iter().enumerate() {
        if let Some(ns) = secret.secret_namespace()
            && ns != namespace
            && !cross_namespace
        {
            out.push(format!(
                "spec.envoyResources.secrets[{i}].ref.namespace: Secret {ns}/{} is in another \
                 namespace; only Secrets of namespace {namespace} may be referenced",
                secret.secret_name()
            ));
        }
    }
    out
}

/// The name of the revision of `node_id` at `version`.
pub fn revision_name(node_id: &str, version: &str) -> String {
    format!("{node_id}-{version}")
}

async fn reconcile(ec: Arc<EnvoyConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = ec.namespace().unwrap_or_default();
    if ec.meta().deletion_timestamp.is_some() || !ctx.serves(&ns).await? {
        return Ok(Action::await_change());
    }
    let generation = ec.metadata.generation;
    let version = ec.spec.envoy_resources.version();
    let mut status = ec.status.clone().unwrap_or_default();
    status.desired_version = Some(version.clone());

    let problems = problems(&ec.spec, &ns, ctx.config.allow_cross_namespace_secrets);
    if !problems.is_empty() {
        let message = format!(
            "version {version} is invalid and was not published: {}",
            problems.join("; ")
        );
        let changed = set_condition(
            &mut status.conditions,
            CACHE_OUT_OF_SYNC,
            true,
            "InvalidSpec",
            &message,
            generation,
        );
        // The status write fails on a stale read, so an event follows only a real change.
        write_status(&ctx, &ec, status).await?;
        if changed {
            ctx.publish(&*ec, EventType::Warning, "InvalidSpec", &message)
                .await;
        }
        return Ok(Action::await_change());
    }

    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = ec.uid().unwrap_or_default();
    let owned: Vec<EnvoyConfigRevision> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .collect();
    // Revisions of a node id the config no longer has are not served to anyone.
    let (mut mine, stale): (Vec<_>, Vec<_>) = owned
        .into_iter()
        .partition(|r| r.spec.node_id == ec.spec.node_id);
    for r in stale {
        delete(&api, &r.name_any()).await?;
    }
    let existing: BTreeSet<String> = mine.iter().map(|r| r.spec.version.clone()).collect();
    let tainted: BTreeSet<String> = mine
        .iter()
        .filter(|r| r.is_tainted())
        .map(|r| r.spec.version.clone())
        .collect();
    let current: Vec<String> = status.revisions.iter().map(|r| r.version.clone()).collect();
    let plan = revisions::plan(&current, &existing, &version, &tainted, MAX_REVISIONS);

    if plan.create {
        mine.push(create_revision(&api, &ec, &version).await?);
    }
    // Publish before unpublishing, so the node is never left without a revision.
    for r in mine.iter().filter(|r| r.spec.version == plan.publish) {
        set_published(&api, r, true).await?;
    }
    for r in mine
        .iter()
        .filter(|r| r.spec.version != plan.publish && !plan.delete.contains(&r.spec.version))
    {
        set_published(&api, r, false).await?;
    }
    for v in &plan.delete {
        delete(&api, &revision_name(&ec.spec.node_id, v)).await?;
    }

    let previous_state = status.cache_state.clone();
    status.revisions = plan
        .revisions
        .iter()
        .map(|v| ConfigRevisionRef {
            version: v.clone(),
            revision_ref: revision_ref(&ec, &mine, v),
        })
        .collect();
    status.published_version = Some(plan.publish.clone());
    status.cache_state = Some(plan.cache_state.as_str().to_owned());
    let nack = mine
        .iter()
        .find(|r| r.spec.version == version)
        .and_then(|r| r.taint_message().map(str::to_owned));
    let (mut out_of_sync, mut reason, mut message) =
        cache_condition(plan.cache_state, &version, &plan.publish, nack.as_deref());
    // A published revision whose Secrets cannot be loaded is not what proxies get either.
    if let Some(why) = mine
        .iter()
        .find(|r| r.spec.version == plan.publish)
        .and_then(|r| r.load_failure())
    {
        (out_of_sync, reason) = (true, "ResourcesOutOfSync");
        message = format!(
            "version {} is published but cannot be served: {why}",
            plan.publish
        );
    }
    set_condition(
        &mut status.conditions,
        CACHE_OUT_OF_SYNC,
        out_of_sync,
        reason,
        &message,
        generation,
    );
    let failed = plan.cache_state == CacheState::RollbackFailed;
    set_condition(
        &mut status.conditions,
        ROLLBACK_FAILED,
        failed,
        if failed {
            "AllRevisionsTainted"
        } else {
            "UntaintedRevisionPublished"
        },
        &if failed {
            "every revision was rejected by Envoy".to_owned()
        } else {
            format!("version {} is untainted", plan.publish)
        },
        generation,
    );
    status.last_nack_message = nack;
    let state = plan.cache_state.as_str();
    write_status(&ctx, &ec, status).await?;
    if previous_state.as_deref() != Some(state) {
        let type_ = if plan.cache_state == CacheState::InSync {
            EventType::Normal
        } else {
            EventType::Warning
        };
        info!(envoyconfig = %ec.name_any(), namespace = %ns, published = %plan.publish, %state, "cache state changed");
        ctx.metrics
            .cache_state_changes
            .get_or_create(&super::metrics::StateLabels { state })
            .inc();
        ctx.publish(&*ec, type_, state, &message).await;
    }
    Ok(Action::await_change())
}

/// The `CacheOutOfSync` condition (status, reason, message) for a cache state: why the
/// desired version is not what proxies get, with Envoy's words when it rejected it.
pub fn cache_condition(
    state: CacheState,
    desired: &str,
    published: &str,
    nack: Option<&str>,
) -> (bool, &'static str, String) {
    let why = nack.map(|m| format!(": {m}")).unwrap_or_default();
    match state {
        CacheState::InSync => (false, "InSync", format!("version {desired} is published")),
        CacheState::Rollback => (
            true,
            "Rollback",
            format!("Envoy rejected version {desired}; rolled back to version {published}{why}"),
        ),
        CacheState::RollbackFailed => (
            true,
            "RollbackFailed",
            format!(
                "Envoy rejected version {desired} and no earlier revision is untainted; it stays \
                 published until the spec is fixed{why}"
            ),
        ),
    }
}

fn revision_ref(
    ec: &EnvoyConfig,
    revisions: &[EnvoyConfigRevision],
    version: &str,
) -> ObjectReference {
    let found = revisions.iter().find(|r| r.spec.version == version);
    ObjectReference {
        api_version: Some(EnvoyConfigRevision::api_version(&()).into_owned()),
        kind: Some(EnvoyConfigRevision::kind(&()).into_owned()),
        name: Some(revision_name(&ec.spec.node_id, version)),
        namespace: ec.namespace(),
        uid: found.and_then(|r| r.uid()),
        ..Default::default()
    }
}

async fn create_revision(
    api: &Api<EnvoyConfigRevision>,
    ec: &EnvoyConfig,
    version: &str,
) -> Result<EnvoyConfigRevision, Error> {
    let name = revision_name(&ec.spec.node_id, version);
    let mut revision =
        EnvoyConfigRevision::new(&name, EnvoyConfigRevisionSpec::of(&ec.spec, version));
    revision.metadata.namespace = ec.namespace();
    revision.metadata.labels = Some(
        [
            (NODE_ID_LABEL.to_owned(), ec.spec.node_id.clone()),
            (VERSION_LABEL.to_owned(), version.to_owned()),
        ]
        .into(),
    );
    revision.metadata.owner_references = ec.controller_owner_ref(&()).map(|o| vec![o]);
    match api.create(&PostParams::default(), &revision).await {
        Ok(created) => {
            info!(revision = %name, "created revision");
            Ok(created)
        }
        // Left over by a config of the same name deleted a moment ago, or made by hand.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(api.get(&name).await?),
        Err(e) => Err(e.into()),
    }
}

async fn set_published(
    api: &Api<EnvoyConfigRevision>,
    revision: &EnvoyConfigRevision,
    published: bool,
) -> Result<(), Error> {
    let mut status = revision.status.clone().unwrap_or_default();
    let has_condition = status.conditions.iter().any(|c| {
        c.type_ == REVISION_PUBLISHED && c.status == if published { "True" } else { "False" }
    });
    if status.published == Some(published) && has_condition {
        return Ok(());
    }
    status.published = Some(published);
    if published {
        status.last_published_at = Some(super::now());
    }
    let (reason, message) = if published {
        ("Published", "this revision is served to its node")
    } else {
        ("Unpublished", "another revision is served to its node")
    };
    set_condition(
        &mut status.conditions,
        REVISION_PUBLISHED,
        published,
        reason,
        message,
        revision.metadata.generation,
    );
    let patch = status_patch(&status, &[], revision.metadata.resource_version.as_deref())?;
    api.patch_status(
        &revision.name_any(),
        &PatchParams::apply(super::FIELD_MANAGER),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

async fn delete(api: &Api<EnvoyConfigRevision>, name: &str) -> Result<(), Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            info!(revision = %name, "deleted revision");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn write_status(
    ctx: &Context,
    ec: &EnvoyConfig,
    status: EnvoyConfigStatus,
) -> Result<(), Error> {
    if ec.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<EnvoyConfig> =
        Api::namespaced(ctx.client.clone(), &ec.namespace().unwrap_or_default());
    let patch = status_patch(
        &status,
        &["cacheState", "publishedVersion", "lastNackMessage"],
        ec.metadata.resource_version.as_deref(),
    )?;
    api.patch_status(
        &ec.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvoySecretResource, SecretReference};

    #[test]
    fn cross_namespace_secrets_are_refused_unless_allowed() {
        let mut spec = EnvoyConfigSpec {
            node_id: "n".into(),
            ..Default::default()
        };
        spec.envoy_resources.secrets.push(EnvoySecretResource {
            name: "cert".into(),
            secret_ref: Some(SecretReference {
                name: "s".into(),
                namespace: Some("other".into()),
            }),
        });
        let p = problems(&spec, "mine", false);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("spec.envoyResources.secrets[0].ref.namespace:"),
            "{p:?}"
        );
        assert!(problems(&spec, "mine", true).is_empty());
        spec.envoy_resources.secrets[0]
            .secret_ref
            .as_mut()
            .unwrap()
            .namespace = Some("mine".into());
        assert!(problems(&spec, "mine", false).is_empty());
    }

    #[test]
    fn the_cache_condition_says_what_is_served_and_why() {
        let (out, reason, msg) = cache_condition(CacheState::InSync, "b", "b", None);
        assert_eq!(
            (out, reason, msg.as_str()),
            (false, "InSync", "version b is published")
        );
        let (out, reason, msg) =
            cache_condition(CacheState::Rollback, "b", "a", Some("router must be last"));
        assert_eq!((out, reason), (true, "Rollback"));
        assert_eq!(
            msg,
            "Envoy rejected version b; rolled back to version a: router must be last"
        );
        let (out, reason, msg) = cache_condition(CacheState::RollbackFailed, "b", "b", Some("x"));
        assert_eq!((out, reason), (true, "RollbackFailed"));
        assert!(msg.ends_with("until the spec is fixed: x"), "{msg}");
    }

    #[test]
    fn versions_follow_the_resources_only() {
        let mut a = EnvoyConfigSpec::default();
        let b = EnvoyConfigSpec {
            node_id: "other".into(),
            ..Default::default()
        };
        assert_eq!(a.envoy_resources.version(), b.envoy_resources.version());
        a.envoy_resources.listeners.push(crate::api::EnvoyResource {
            name: None,
            value: "{}".into(),
        });
        assert_ne!(a.envoy_resources.version(), b.envoy_resources.version());
        assert_eq!(a.envoy_resources.version().len(), 10);
    }
}
