//! The `EnvoyDeployment` controller: keeps a gateway's children in shape (client
//! certificate, bootstrap, Deployment, autoscaler, PodDisruptionBudget) and reports its
//! readiness. What to build is decided in `plan` (with `build`); this module only reads and
//! writes the API. Every child is owned (same namespace), so no finalizer: deleting the
//! EnvoyDeployment deletes them.

pub mod build;
pub mod plan;

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_controller::{
    DEFAULT_RECONCILE_TIMEOUT, ReconcileMetrics, delete_ignoring_missing, patch_status,
    status_patch,
};

use marin3r_api::EnvoyConfig;
use marin3r_api::discovery_service::DiscoveryService;
use marin3r_api::envoy_deployment::EnvoyDeployment;
use plan::{Children, NotReady, Observed, Outcome};

const FIELD_MANAGER: &str = "marin3r-operator";
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "envoydeployment";

pub use marin3r_controller::Error;

/// What the controller needs to know about the operator it runs in.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The operator's own image: the shutdown manager's unless the spec names one, and the
    /// image a DiscoveryService without one runs (for resolving its spec).
    pub marin3r_image: String,
    /// The operator logs JSON (`--log-format json`): so do the shutdown managers it runs.
    pub json_logs: bool,
    pub metrics: ReconcileMetrics,
    /// How long one reconcile may take before it is abandoned and retried.
    pub reconcile_timeout: Option<std::time::Duration>,
}

type Context = marin3r_controller::Context<Config>;

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let metrics = config.metrics.clone();
    let deadline = config
        .reconcile_timeout
        .unwrap_or(DEFAULT_RECONCILE_TIMEOUT);
    let ctx = Context::new(client.clone(), FIELD_MANAGER, config);
    let controller = marin3r_controller::watch_all::<EnvoyDeployment>(&client);
    let store = controller.store();
    let owned = || watcher::Config::default().labels(build::CHILDREN_SELECTOR);
    let by_config = store.clone();
    // Every child is watched: one deleted or edited by hand is put back at once, not at the
    // next resync.
    let controller = controller
        .owns(Api::<Deployment>::all(client.clone()), owned())
        .owns(
            Api::<DiscoveryServiceCertificate>::all(client.clone()),
            owned(),
        )
        .owns(Api::<ConfigMap>::all(client.clone()), owned())
        .owns(Api::<HorizontalPodAutoscaler>::all(client.clone()), owned())
        .owns(Api::<PodDisruptionBudget>::all(client.clone()), owned())
        // The gateways naming a config or a discovery service look again when it changes
        // (its node id, its address or CA) or appears.
        .watches(
            Api::<EnvoyConfig>::all(client.clone()),
            watcher::Config::default(),
            move |ec| referring(&by_config, &ec, |ed| &ed.spec.envoy_config_ref),
        )
        .watches(
            Api::<DiscoveryService>::all(client),
            watcher::Config::default(),
            move |ds| referring(&store, &ds, |ed| &ed.spec.discovery_service_ref),
        );
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
}

/// The gateways of `obj`'s namespace whose `field` names it.
fn referring<K: Resource>(
    store: &Store<EnvoyDeployment>,
    obj: &K,
    field: impl Fn(&EnvoyDeployment) -> &String,
) -> Vec<ObjectRef<EnvoyDeployment>> {
    let (ns, name) = (obj.namespace(), obj.name_any());
    store
        .state()
        .iter()
        .filter(|ed| ed.namespace() == ns && *field(ed) == name)
        .map(|ed| ObjectRef::from_obj(&**ed))
        .collect()
}

async fn reconcile(ed: Arc<EnvoyDeployment>, ctx: Arc<Context>) -> Result<Action, Error> {
    let obs = observe(&ed, &ctx).await?;
    let outcome = match plan::decide(&obs, marin3r_webhook::sidecar::shutdown_token) {
        Err(not_ready) => plan::not_ready(&obs, not_ready),
        Ok(children) => {
            ctx.events.publish_all(&*ed, &children.events).await;
            match apply(&ed, &ctx, &children).await? {
                Ok((certificate, deployment)) => {
                    plan::report(&obs, &certificate, deployment.as_ref())
                }
                Err(refused) => plan::not_ready(&obs, refused),
            }
        }
    };
    write_outcome(&ctx, &ed, outcome).await
}

/// Reads the spec's references and the current Deployment.
async fn observe<'a>(ed: &'a EnvoyDeployment, ctx: &Context) -> Result<Observed<'a>, Error> {
    let ns = ed.namespace().unwrap_or_default();
    let client = &ctx.client;
    let spec = ed.resolve();
    let (mut discovery_service, mut envoy_config) = (None, None);
    if let Ok(spec) = &spec {
        discovery_service = Api::<DiscoveryService>::namespaced(client.clone(), &ns)
            .get_opt(&spec.discovery_service)
            .await?;
        envoy_config = Api::<EnvoyConfig>::namespaced(client.clone(), &ns)
            .get_opt(&spec.envoy_config)
            .await?;
    }
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get_opt(&ed.owned_name())
        .await?
        .filter(|d| owned_by(d, ed));
    Ok(Observed {
        ed,
        spec,
        discovery_service,
        envoy_config,
        deployment,
        marin3r_image: ctx.config.marin3r_image.clone(),
        json_logs: ctx.config.json_logs,
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    })
}

fn owned_by<K: Resource>(obj: &K, ed: &EnvoyDeployment) -> bool {
    let uid = ed.uid();
    obj.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Applies the children, the Deployment last and only once its certificate is issued (or
/// when it already runs), and removes the autoscaler or budget the spec no longer asks for.
/// A child the API server refuses as invalid stops there: the Deployment is never applied
/// half-way, and what ran before keeps running.
async fn apply(
    ed: &EnvoyDeployment,
    ctx: &Context,
    children: &Children,
) -> Result<Result<(DiscoveryServiceCertificate, Option<Deployment>), NotReady>, Error> {
    let client = &ctx.client;
    let ns = ed.namespace().unwrap_or_default();
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), &ns);
    let certificate = apply_object(&dscs, &children.certificate).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    apply_object(&config_maps, &children.bootstrap).await?;
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    if let Err(refused) = apply_or_remove(
        &hpas,
        ed,
        children.autoscaler.as_ref(),
        "spec.replicas.dynamic: the HorizontalPodAutoscaler was refused",
    )
    .await?
    {
        return Ok(Err(refused));
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    if let Err(refused) = apply_or_remove(
        &pdbs,
        ed,
        children.pod_disruption_budget.as_ref(),
        "spec.podDisruptionBudget: the PodDisruptionBudget was refused",
    )
    .await?
    {
        return Ok(Err(refused));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let live = deployments.get_opt(&children.deployment.name_any()).await?;
    if !crate::plan::certificate_ready(&certificate) && live.is_none() {
        return Ok(Ok((certificate, None)));
    }
    // Dynamic replicas: the count the Deployment has stays (see `REPLICAS_HANDOVER_MANAGER`).
    if children.deployment.spec.replicas.is_none()
        && let Some(handover) = live
            .as_ref()
            .and_then(|d| build::replicas_handover(d, FIELD_MANAGER))
    {
        let params = PatchParams::apply(build::REPLICAS_HANDOVER_MANAGER).force();
        deployments
            .patch(
                &children.deployment.name_any(),
                &params,
                &Patch::Apply(handover),
            )
            .await?;
    }
    match invalid_as_not_ready(
        apply_object(&deployments, &children.deployment).await,
        "the Deployment was refused",
    )? {
        Ok(deployment) => Ok(Ok((certificate, Some(deployment)))),
        Err(refused) => Ok(Err(refused)),
    }
}

/// Creates or updates `obj` with server-side apply.
async fn apply_object<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    marin3r_controller::apply(api, obj, FIELD_MANAGER).await
}

/// Applies `want`, or deletes this gateway's object of that name when the spec asks for none.
async fn apply_or_remove<K>(
    api: &Api<K>,
    ed: &EnvoyDeployment,
    want: Option<&K>,
    refused: &str,
) -> Result<Result<(), NotReady>, Error>
where
    K: Resource<DynamicType = ()>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    match want {
        Some(obj) => Ok(invalid_as_not_ready(apply_object(api, obj).await, refused)?.map(|_| ())),
        None => {
            if let Some(obj) = api.get_opt(&ed.owned_name()).await?
                && owned_by(&obj, ed)
            {
                delete_ignoring_missing(api, &obj.name_any()).await?;
            }
            Ok(Ok(()))
        }
    }
}

/// A 422 Invalid from the API server is a spec the user must fix: a condition, not a retry.
fn invalid_as_not_ready<K>(
    result: Result<K, Error>,
    what: &str,
) -> Result<Result<K, NotReady>, Error> {
    match result {
        Ok(obj) => Ok(Ok(obj)),
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 422 => {
            Ok(Err(NotReady::invalid(format!("{what}: {}", e.message))))
        }
        Err(e) => Err(e),
    }
}

/// Publishes the outcome's Events and writes its status.
async fn write_outcome(
    ctx: &Context,
    ed: &EnvoyDeployment,
    outcome: Outcome,
) -> Result<Action, Error> {
    ctx.events.publish_all(ed, &outcome.events).await;
    if ed.status.as_ref() != Some(&outcome.status) {
        let api: Api<EnvoyDeployment> =
            Api::namespaced(ctx.client.clone(), &ed.namespace().unwrap_or_default());
        let patch = status_patch(
            &outcome.status,
            &["deploymentName", "deploymentStatus"],
            None,
        )?;
        patch_status(&api, &ed.name_any(), patch, FIELD_MANAGER).await?;
    }
    Ok(outcome
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}
