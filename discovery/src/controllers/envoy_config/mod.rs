//! The `EnvoyConfig` controller: validates the spec (with Envoy as the last judge, when the
//! discovery pod has one, before a new version gets its revision), keeps one owned
//! `EnvoyConfigRevision` per version (at most ten), runs the revision algorithm
//! (`revisions::plan`) with the revisions Envoy tainted, marks the chosen one published and
//! writes the status.

pub mod analysis;
pub mod gate;
pub mod plan;
mod reason;
pub mod revisions;
pub mod rollout;
pub mod steps;
pub mod verdicts;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kube::api::{ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use marin3r_controller::{delete_ignoring_missing, patch_status, status_patch};
use tracing::info;

use super::{Context, Error};
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_config_revision::{RevisionCanary, RevisionReason};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};
use plan::{Observed, Outcome, Plan, Publish};

pub const CACHE_OUT_OF_SYNC: &str = "CacheOutOfSync";
/// `CacheOutOfSync` the other way round: True when the desired version is what proxies get.
pub const READY: &str = "Ready";
pub const ROLLBACK_FAILED: &str = "RollbackFailed";
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "envoyconfig";

pub(crate) async fn run(
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (configs, revisions) = (&ctx.index.configs, &ctx.index.revisions);
    let store = configs.store();
    let controller = kube::runtime::Controller::for_shared_stream(configs.changes(), store.clone())
        .owns_shared_stream(revisions.changes());
    tokio::spawn(super::mark_ready(store.clone(), ready));
    // A config refused because another one serves its node id gets its turn when that one
    // goes away or changes its node id: any change wakes the others of the same node id.
    let same_node = store;
    let controller =
        controller.watches_shared_stream(configs.changes(), move |changed: Arc<EnvoyConfig>| {
            same_node
                .state()
                .into_iter()
                .filter(|other| {
                    other.namespace() == changed.namespace()
                        && other.spec.node_id == changed.spec.node_id
                        && other.name_any() != changed.name_any()
                })
                .map(|other| kube::runtime::reflector::ObjectRef::from_obj(&*other))
                .collect::<Vec<_>>()
        });
    let controller = ctx.watch_namespaces(controller);
    let (metrics, deadline) = (ctx.metrics.reconciles.clone(), ctx.reconcile_timeout());
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
}

/// The name of the revision of `node_id` at `version`.
pub fn revision_name(node_id: &str, version: &str) -> String {
    format!("{node_id}-{version}")
}

async fn reconcile(cached: Arc<EnvoyConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = cached.namespace().unwrap_or_default();
    if cached.meta().deletion_timestamp.is_some() || !ctx.writes_for(&ns).await {
        ctx.verdicts.forget(&cached.uid().unwrap_or_default());
        return Ok(Action::await_change());
    }
    // Decide from a fresh read, never from the cache: a cached spec can be older than the
    // revisions (a watch that lags, or stalls under API errors, while the revisions' watch
    // does not; another discovery pod acting on newer data during a rollout), and deciding
    // from it would publish an old revision over the newest one, sending every proxy back.
    let api: Api<EnvoyConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(ec) = api.get_opt(&cached.name_any()).await? else {
        ctx.verdicts.forget(&cached.uid().unwrap_or_default());
        return Ok(Action::await_change());
    };
    if ec.uid() != cached.uid() || ec.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let obs = observe(&ec, &ctx).await?;
    let (outcome, failed) = match plan::decide(&obs) {
        Plan::Invalid(outcome) => (*outcome, None),
        Plan::Publish(plan) => publish(&ctx, &obs, *plan).await?,
    };
    // The status write fails on a stale read, so Events follow only a real change.
    write_status(&ctx, &ec, &outcome.status).await?;
    // Tainted only once the status says why: a taint written first and a status write
    // refused after it would leave the next run a tainted version and no analysis to show.
    if let Some(failed) = failed {
        fail_analysis(&ctx, &ns, &failed).await?;
    }
    if let Some(state) = outcome.state_change {
        report_state(&ctx, &ec, &outcome, state);
    }
    ctx.events.publish_all(&ec, &outcome.events).await;
    Ok(outcome
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

/// Reads the revisions the config owns and the other configs of its node id, and asks Envoy
/// about a version that has no revision yet.
async fn observe<'a>(ec: &'a EnvoyConfig, ctx: &Context) -> Result<Observed<'a>, Error> {
    let ns = ec.namespace().unwrap_or_default();
    let configs: Api<EnvoyConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let node_served_by = configs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|other| other.spec.node_id == ec.spec.node_id && plan::comes_first(other, ec))
        .map(|other| other.name_any())
        .min();
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = ec.uid().unwrap_or_default();
    let revisions: Vec<EnvoyConfigRevision> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .collect();
    let envoy_refusal = envoy_refusal(ec, ctx, node_served_by.is_some(), &revisions).await;
    Ok(Observed {
        ec,
        node_served_by,
        allow_cross_namespace_secrets: ctx.config.allow_cross_namespace_secrets,
        revisions,
        envoy_refusal,
        now: super::now(),
    })
}

/// Envoy's reasons for refusing the desired version, asked only when the discovery pod has
/// an Envoy and the version would get its revision now: none yet, our own checks pass, and
/// the node is this config's. A config can get here without the webhook's verdict (created
/// before the webhook was registered, or while it was removed).
async fn envoy_refusal(
    ec: &EnvoyConfig,
    ctx: &Context,
    node_taken: bool,
    revisions: &[EnvoyConfigRevision],
) -> Vec<String> {
    let Some(judge) = &ctx.config.judge else {
        return Vec::new();
    };
    let version = ec.spec.version();
    let exists = revisions
        .iter()
        .any(|r| r.spec.node_id == ec.spec.node_id && r.spec.version == version);
    let ns = ec.namespace().unwrap_or_default();
    let allow = ctx.config.allow_cross_namespace_secrets;
    if node_taken
        || exists
        || !marin3r_envoyconfig::rules::problems(&ec.spec, &ns, allow).is_empty()
    {
        return Vec::new();
    }
    ctx.verdicts.refusal(judge, ec, &version).await
}

/// Deletes stale revisions, creates the desired one, unpublishes the others before
/// publishing the chosen one, deletes the ones over the limit, and reports; with the desired
/// revision to taint when its canaries failed the health analysis.
async fn publish(
    ctx: &Context,
    obs: &Observed<'_>,
    plan: Publish,
) -> Result<(Outcome, Option<Failed>), Error> {
    let api: Api<EnvoyConfigRevision> =
        Api::namespaced(ctx.client.clone(), &obs.ec.namespace().unwrap_or_default());
    for name in &plan.stale {
        delete(&api, name).await?;
    }
    let mut mine = plan.mine;
    if let Some(revision) = &plan.create {
        mine.push(create_revision(&api, revision).await?);
    }
    let algorithm = &plan.algorithm;
    let published = mine.iter().filter(|r| r.spec.version == algorithm.publish);
    let unpublished = mine.iter().filter(|r| {
        r.spec.version != algorithm.publish && !algorithm.delete.contains(&r.spec.version)
    });
    // The others first: a publication is several writes, and if one fails, one revision
    // published at a time or none, never two. With two, any reload of the older (a relisted
    // watch, a changed Secret, a replica starting) would serve it over the newer. With none,
    // every replica keeps serving what it served until the retry publishes the chosen one.
    for (revision, value) in unpublished
        .map(|r| (r, false))
        .chain(published.map(|r| (r, true)))
    {
        if let Some(status) = plan::publication(revision, value, &obs.now) {
            let patch = status_patch(&status, &[], revision.metadata.resource_version.as_deref())?;
            patch_status(&api, &revision.name_any(), patch, super::FIELD_MANAGER).await?;
        }
    }
    for version in &algorithm.delete {
        // By the name it has: the original MARIN3R names revisions `<nodeID>-v3-<version>`.
        let name = mine
            .iter()
            .find(|r| &r.spec.version == version)
            .map_or_else(
                || revision_name(&obs.ec.spec.node_id, version),
                ResourceExt::name_any,
            );
        delete(&api, &name).await?;
    }
    let version = obs.ec.spec.version();
    mark_canary(
        &api,
        &mine,
        &algorithm.delete,
        &version,
        plan.rollout.canary(),
    )
    .await?;
    let failed = plan.rollout.failed().and_then(|why| {
        let desired = mine
            .iter()
            .find(|r| r.spec.version == version && !r.is_tainted())?;
        Some(Failed {
            name: desired.name_any(),
            why,
        })
    });
    Ok((plan::report(obs, algorithm, &mine, &plan.rollout), failed))
}

/// The desired revision whose canaries failed the health analysis, and why.
struct Failed {
    name: String,
    why: String,
}

/// Taints `failed` as read now (the canary mark was taken off it): the next run rolls it
/// back as it does a version Envoy rejected, and it is not published again until the spec
/// changes.
async fn fail_analysis(ctx: &Context, ns: &str, failed: &Failed) -> Result<(), Error> {
    let api: Api<EnvoyConfigRevision> = Api::namespaced(ctx.client.clone(), ns);
    let revision = api.get(&failed.name).await?;
    if revision.is_tainted() {
        return Ok(());
    }
    super::nacks::taint(ctx, &revision, RevisionReason::FailedAnalysis, &failed.why).await
}

/// Writes `status.canary` on the desired revision (`version`) while it is in a canary step,
/// and takes it off every other revision: every replica's loader serves a canary revision to
/// the proxies its cutoff picks. Only the leader writes the field, so the write needs no
/// resourceVersion (the publication writes before it may have changed the revision's).
async fn mark_canary(
    api: &Api<EnvoyConfigRevision>,
    mine: &[EnvoyConfigRevision],
    deleted: &[String],
    version: &str,
    canary: Option<&RevisionCanary>,
) -> Result<(), Error> {
    for r in mine.iter().filter(|r| !deleted.contains(&r.spec.version)) {
        let want = canary.filter(|_| r.spec.version == version);
        let have = r.status.as_ref().and_then(|s| s.canary.as_ref());
        if have == want {
            continue;
        }
        let patch = serde_json::json!({ "status": { "canary": want } });
        patch_status(api, &r.name_any(), patch, super::FIELD_MANAGER).await?;
        match want {
            Some(c) => {
                info!(revision = %r.name_any(), step = c.step, cutoff = %c.cutoff, "canary step")
            }
            None => info!(revision = %r.name_any(), "no longer a canary"),
        }
    }
    Ok(())
}

fn report_state(ctx: &Context, ec: &EnvoyConfig, outcome: &Outcome, state: CacheState) {
    let published = outcome
        .status
        .published_version
        .as_deref()
        .unwrap_or_default();
    info!(envoyconfig = %ec.name_any(), namespace = ?ec.namespace(), %published, state = state.as_str(), "cache state changed");
    ctx.metrics
        .cache_state_changes
        .get_or_create(&super::metrics::StateLabels {
            state: state.label(),
        })
        .inc();
}

async fn create_revision(
    api: &Api<EnvoyConfigRevision>,
    revision: &EnvoyConfigRevision,
) -> Result<EnvoyConfigRevision, Error> {
    let name = revision.name_any();
    match api.create(&PostParams::default(), revision).await {
        Ok(created) => {
            info!(revision = %name, "created revision");
            Ok(created)
        }
        // Left over by a config of the same name deleted a moment ago, or made by hand.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(api.get(&name).await?),
        Err(e) => Err(e.into()),
    }
}

async fn delete(api: &Api<EnvoyConfigRevision>, name: &str) -> Result<(), Error> {
    if delete_ignoring_missing(api, name).await? {
        info!(revision = %name, "deleted revision");
    }
    Ok(())
}

async fn write_status(
    ctx: &Context,
    ec: &EnvoyConfig,
    status: &marin3r_api::EnvoyConfigStatus,
) -> Result<(), Error> {
    if ec.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api: Api<EnvoyConfig> =
        Api::namespaced(ctx.client.clone(), &ec.namespace().unwrap_or_default());
    let patch = status_patch(
        status,
        &[
            "cacheState",
            "publishedVersion",
            "lastNackMessage",
            "rollout",
        ],
        ec.metadata.resource_version.as_deref(),
    )?;
    patch_status(&api, &ec.name_any(), patch, super::FIELD_MANAGER).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_api::EnvoyConfigSpec;

    #[test]
    fn the_cache_condition_says_what_is_served_and_why() {
        use plan::cache_condition;
        let (out, reason, msg) = cache_condition(CacheState::InSync, "b", "b", None, false);
        assert_eq!(
            (out, reason.to_string().as_str(), msg.as_str()),
            (false, "InSync", "version b is published")
        );
        let (out, reason, msg) = cache_condition(
            CacheState::Rollback,
            "b",
            "a",
            Some("router must be last"),
            false,
        );
        assert_eq!((out, reason.to_string().as_str()), (true, "Rollback"));
        assert_eq!(
            msg,
            "Envoy rejected version b; rolled back to version a: router must be last"
        );
        let (out, reason, msg) =
            cache_condition(CacheState::RollbackFailed, "b", "b", Some("x"), false);
        assert_eq!((out, reason.to_string().as_str()), (true, "RollbackFailed"));
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
        a.envoy_resources
            .listeners
            .push(marin3r_api::EnvoyResource {
                name: None,
                value: "{}".into(),
            });
        assert_ne!(a.envoy_resources.version(), b.envoy_resources.version());
        assert_eq!(a.envoy_resources.version().len(), 10);
        // The spec's version is that of `envoyResources` until `resources` is used.
        assert_eq!(a.version(), a.envoy_resources.version());
        let mut c = b.clone();
        c.resources.push(marin3r_api::Resource {
            kind: marin3r_api::ResourceKind::Listener,
            value: Some(serde_json::json!({"name": "l"})),
            generate_from_tls_secret: None,
            generate_from_opaque_secret: None,
            generate_from_endpoint_slices: None,
            blueprint: None,
        });
        assert_ne!(c.version(), b.version());
        assert_eq!(c.version().len(), 10);
        let mut d = c.clone();
        d.node_id = "elsewhere".into();
        assert_eq!(c.version(), d.version());
    }

    /// A revision the original MARIN3R made (`<nodeID>-v3-<version>`, with its envoy-api
    /// label) is found by its version and referenced by its own name; ours get that label.
    #[test]
    fn revisions_named_as_the_original_names_them_are_taken_as_they_are() {
        use marin3r_api::EnvoyConfigRevisionSpec;
        let mut ec = EnvoyConfig::new(
            "edge",
            serde_json::from_value(serde_json::json!({
                "nodeID": "edge",
                "resources": [{"type": "cluster", "value": {"name": "c"}}],
            }))
            .unwrap(),
        );
        ec.metadata.namespace = Some("team-a".into());
        ec.metadata.uid = Some("uid-ec".into());
        let version = ec.spec.version();
        let mut theirs = EnvoyConfigRevision::new(
            &format!("edge-v3-{version}"),
            EnvoyConfigRevisionSpec::of(&ec.spec, &version),
        );
        theirs.metadata.uid = Some("uid-theirs".into());
        let obs = plan::Observed {
            ec: &ec,
            node_served_by: None,
            allow_cross_namespace_secrets: false,
            revisions: vec![theirs],
            envoy_refusal: Vec::new(),
            now: super::super::now(),
        };
        let Plan::Publish(publish) = plan::decide(&obs) else {
            panic!("a valid spec is published");
        };
        assert!(publish.create.is_none(), "its revision exists already");
        let outcome = plan::report(&obs, &publish.algorithm, &publish.mine, &publish.rollout);
        let refs = &outcome.status.revisions;
        assert_eq!(refs.len(), 1);
        assert_eq!(
            refs[0].revision_ref.name.as_deref(),
            Some(format!("edge-v3-{version}").as_str())
        );
        assert_eq!(refs[0].revision_ref.uid.as_deref(), Some("uid-theirs"));

        // A new version gets a revision of ours, labelled as the original labels them.
        let revisions = obs.revisions;
        let mut ec = ec.clone();
        ec.spec.resources[0].value = Some(serde_json::json!({"name": "d"}));
        let obs = plan::Observed {
            ec: &ec,
            node_served_by: None,
            allow_cross_namespace_secrets: false,
            revisions,
            envoy_refusal: Vec::new(),
            now: super::super::now(),
        };
        let Plan::Publish(publish) = plan::decide(&obs) else {
            panic!("a valid spec is published");
        };
        let created = publish.create.unwrap();
        let labels = created.metadata.labels.unwrap();
        assert_eq!(labels["marin3r.3scale.net/envoy-api"], "v3");
        assert_eq!(labels["marin3r.3scale.net/node-id"], "edge");
        assert_eq!(
            labels["marin3r.3scale.net/config-version"],
            ec.spec.version()
        );
    }

    /// An empty spec where the node is served is refused, and nothing is created or
    /// unpublished; with nothing served, an empty spec is published as any other.
    #[test]
    fn an_empty_spec_never_replaces_a_served_one() {
        use marin3r_api::EnvoyConfigRevisionSpec;
        use marin3r_api::envoy_config_revision::EnvoyConfigRevisionStatus;
        let served_spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
            "nodeID": "edge",
            "resources": [{"type": "cluster", "value": {"name": "c"}}],
        }))
        .unwrap();
        let mut served =
            EnvoyConfigRevision::new("edge-abc", EnvoyConfigRevisionSpec::of(&served_spec, "abc"));
        served.status = Some(EnvoyConfigRevisionStatus {
            published: Some(true),
            ..Default::default()
        });
        let mut ec = EnvoyConfig::new(
            "edge",
            serde_json::from_value(serde_json::json!({"nodeID": "edge"})).unwrap(),
        );
        ec.metadata.namespace = Some("team-a".into());
        let obs = plan::Observed {
            ec: &ec,
            node_served_by: None,
            allow_cross_namespace_secrets: false,
            revisions: vec![served.clone()],
            envoy_refusal: Vec::new(),
            now: super::super::now(),
        };
        let Plan::Invalid(outcome) = plan::decide(&obs) else {
            panic!("an empty spec over a served one is refused");
        };
        let condition = outcome
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == CACHE_OUT_OF_SYNC)
            .unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("True", "EmptyConfigRefused")
        );
        assert!(
            condition
                .message
                .contains("would remove every resource that version abc serves"),
            "{}",
            condition.message
        );
        // Ready says the same the other way round.
        let ready = outcome
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str(), &ready.message),
            ("False", "EmptyConfigRefused", &condition.message)
        );
        assert_eq!(outcome.events.len(), 1);
        // Nothing served: an empty spec is a configuration like any other.
        let obs = plan::Observed {
            revisions: vec![],
            ..obs
        };
        assert!(matches!(plan::decide(&obs), Plan::Publish(_)));
    }
}
