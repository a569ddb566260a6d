//! marin3r's operator: the `DiscoveryService` controller (this module, with `build`,
//! `namespaces` and `plan`) and the `EnvoyDeployment` controller (`envoy_deployment`), which
//! `marin3r operator` runs together.
//!
//! The `DiscoveryService` controller keeps every child of a discovery service in shape (PKI,
//! RBAC, Service, Deployment, injection and validation webhooks, per-namespace client certificate and
//! bootstrap) and reports readiness. What to build is decided in `build` and `namespaces`;
//! this module only reads and writes the API. A finalizer removes what ownerReferences
//! cannot reach: cluster-scoped objects and objects in the served namespaces.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod build;
pub mod envoy_deployment;
pub mod namespaces;
pub mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_controller::{
    DEFAULT_RECONCILE_TIMEOUT, ReconcileMetrics, delete_ignoring_missing, patch_status,
    status_patch,
};
use tracing::info;

use build::{CLIENT_NAMESPACE_LABEL, Children, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL, Scope};
use marin3r_api::discovery_service::DiscoveryService;
use plan::{Applied, Apply, Observed, Outcome, Plan};

const FIELD_MANAGER: &str = "marin3r-operator";
const FINALIZER: &str = "operator.marin3r.3scale.net/discoveryservice";
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "discoveryservice";

pub use marin3r_controller::Error;

/// What the controller needs to know about the operator it runs in.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The discovery pod's image when a `DiscoveryService` names none.
    pub default_image: String,
    /// The operator logs JSON (`--log-format json`): so do the discovery pods it runs (and
    /// they pass it on to the shutdown managers they inject).
    pub json_logs: bool,
    /// Namespaces whose certificates may write Secrets elsewhere (see the certificate
    /// controller); a `DiscoveryService` in one serves other namespaces too, one anywhere
    /// else serves its own namespace only (`plan::scope`).
    pub trusted_namespaces: BTreeSet<String>,
    /// Where reconciles are counted.
    pub metrics: ReconcileMetrics,
    /// How long one reconcile may take before it is abandoned and retried (`None`:
    /// [`marin3r_controller::DEFAULT_RECONCILE_TIMEOUT`]).
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
    let scopes = config.clone();
    let ctx = Context::new(client.clone(), FIELD_MANAGER, config);
    let controller = marin3r_controller::watch_all::<DiscoveryService>(&client);
    let store = controller.store();
    let owned = || watcher::Config::default().labels(OWNER_NAME_LABEL);
    let controller = controller
        .owns(Api::<Deployment>::all(client.clone()), owned())
        .owns(
            Api::<DiscoveryServiceCertificate>::all(client.clone()),
            owned(),
        )
        // A namespace labelled or unlabelled by a user changes what the discovery services
        // it concerns serve, and only those.
        .watches(
            Api::<Namespace>::all(client),
            watcher::Config::default(),
            move |ns| {
                store
                    .state()
                    .iter()
                    .filter(|ds| namespaces::concerns(ds, plan::scope(ds, &scopes), &ns))
                    .map(|ds| ObjectRef::from_obj(&**ds))
                    .collect::<Vec<_>>()
            },
        );
    marin3r_controller::run(
        controller, CONTROLLER, deadline, metrics, reconcile, ctx, shutdown,
    )
    .await;
}

async fn reconcile(ds: Arc<DiscoveryService>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<DiscoveryService> =
        Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    finalizer(&api, FINALIZER, ds, |event| async {
        match event {
            Finalize::Apply(ds) => apply(&ds, &ctx).await,
            Finalize::Cleanup(ds) => cleanup(&ds, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
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

/// Reads what the children depend on: the Namespaces and the client certificates, for a
/// spec that passes the checks.
async fn observe<'a>(ds: &'a DiscoveryService, ctx: &Context) -> Result<Observed<'a>, Error> {
    let scope = plan::scope(ds, &ctx.config);
    let mut spec = plan::check(ds, &ctx.config);
    let ns = ds.namespace().unwrap_or_default();
    if spec.is_ok() && scope == Scope::Namespace {
        let others = Api::<DiscoveryService>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items;
        if let Err(refused) = plan::first_in_namespace(ds, scope, &others) {
            spec = Err(refused);
        }
    }
    let (mut namespaces, mut clients) = (Vec::new(), Vec::new());
    if spec.is_ok() {
        namespaces = Api::<Namespace>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let selector = build::owner_selector(&ds.name_any(), &ns);
        clients = Api::<DiscoveryServiceCertificate>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
    }
    Ok(Observed {
        ds,
        spec,
        scope,
        namespaces,
        clients,
        now: Time(k8s_openapi::jiff::Timestamp::now()),
    })
}

/// Observes, decides, applies the plan and writes the outcome.
async fn apply(ds: &DiscoveryService, ctx: &Context) -> Result<Action, Error> {
    let obs = observe(ds, ctx).await?;
    let outcome = match plan::decide(&obs) {
        Plan::NotReady(not_ready) => plan::not_ready(&obs, not_ready),
        Plan::Apply(plan) => {
            let applied = apply_children(ctx, &plan).await?;
            let deployment = apply_dependents(ctx, &plan, &applied).await?;
            plan::report(&obs, &plan, &applied, deployment.as_ref())
        }
    };
    write_outcome(ctx, ds, outcome).await
}

/// Applies the children that depend only on the spec; patches, enters and leaves
/// namespaces.
async fn apply_children(ctx: &Context, plan: &Apply<'_>) -> Result<Applied, Error> {
    let client = &ctx.client;
    let ns = plan.children.namespace();
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), ns);
    let ca = apply_object(&dscs, &plan.ca).await?;
    let server = apply_object(&dscs, &plan.server).await?;
    apply_object(&Api::namespaced(client.clone(), ns), &plan.service_account).await?;
    let own: Api<Role> = Api::namespaced(client.clone(), ns);
    apply_object(&own, &plan.children.replicas_role()).await?;
    let own: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    apply_object(&own, &plan.children.replicas_role_binding()).await?;
    let roles = Api::<ClusterRole>::all(client.clone());
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    match &plan.cluster_rbac {
        Some((role, binding)) => {
            apply_object(&roles, role).await?;
            apply_object(&bindings, binding).await?;
        }
        None => {
            // Namespace-scoped now: what it had as a trusted one goes.
            let name = plan.children.cluster_name();
            delete_if_ours(&bindings, &name, &plan.children).await?;
            delete_if_ours(&roles, &name, &plan.children).await?;
        }
    }
    apply_object(&Api::namespaced(client.clone(), ns), &plan.service).await?;
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for (name, patch) in &plan.namespace_patches {
        ns_api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let mut clients_ready = std::collections::BTreeMap::new();
    for (target, certificate, config_map) in &plan.clients {
        let dsc = apply_object(&dscs, certificate).await?;
        clients_ready.insert(target.clone(), plan::certificate_ready(&dsc));
        apply_object(&Api::namespaced(client.clone(), target), config_map).await?;
        // The discovery pod reads Secrets only in the namespaces it serves.
        let role = plan.children.secret_reader_role(target);
        apply_object(&Api::namespaced(client.clone(), target), &role).await?;
        let binding = plan.children.secret_reader_binding(target);
        apply_object(&Api::namespaced(client.clone(), target), &binding).await?;
    }
    for target in &plan.leaving {
        leave_namespace(ctx, &plan.children, target).await?;
    }
    let ca_pem = ca_certificate_pem(client, ns, plan.children.ca_name()).await?;
    Ok(Applied {
        ca,
        server,
        clients_ready,
        ca_pem,
    })
}

/// Applies the webhook configuration and the Deployment once their inputs exist; returns the
/// Deployment as it is now.
async fn apply_dependents(
    ctx: &Context,
    plan: &Apply<'_>,
    applied: &Applied,
) -> Result<Option<Deployment>, Error> {
    let (webhooks, deployment) = plan::dependents(plan, applied);
    let mutating = Api::<MutatingWebhookConfiguration>::all(ctx.client.clone());
    let validating = Api::<ValidatingWebhookConfiguration>::all(ctx.client.clone());
    if let Some((mutating_webhook, validating_webhook)) = &webhooks {
        apply_object(&mutating, mutating_webhook).await?;
        apply_object(&validating, validating_webhook).await?;
    }
    // The configuration named for the other scope, left from before the operator's trusted
    // namespaces changed.
    let children = &plan.children;
    let other = match children.scope() {
        Scope::Cluster => Scope::Namespace,
        Scope::Namespace => Scope::Cluster,
    };
    let old = children.webhook_configuration_name_in(other);
    delete_if_ours(&mutating, &old, children).await?;
    delete_if_ours(&validating, &old, children).await?;
    let deployments: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), plan.children.namespace());
    let deployment = match &deployment {
        Some(deployment) => Some(apply_object(&deployments, deployment).await?),
        None => deployments.get_opt(&plan.children.owned_name()).await?,
    };
    apply_object(
        &Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), plan.children.namespace()),
        &plan.children.pod_disruption_budget(),
    )
    .await?;
    Ok(deployment)
}

/// Publishes the outcome's Events and writes its status.
async fn write_outcome(
    ctx: &Context,
    ds: &DiscoveryService,
    outcome: Outcome,
) -> Result<Action, Error> {
    ctx.events.publish_all(ds, &outcome.events).await;
    if ds.status.as_ref() != Some(&outcome.status) {
        let api: Api<DiscoveryService> =
            Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
        let patch = status_patch(&outcome.status, &[], None)?;
        patch_status(&api, &ds.name_any(), patch, FIELD_MANAGER).await?;
    }
    Ok(outcome
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

/// Removes the client certificate (its controller removes the Secret), the bootstrap and the
/// discovery pod's Secret access of a namespace that is no longer served; the Namespace's
/// labels were already patched.
async fn leave_namespace(
    ctx: &Context,
    children: &Children<'_>,
    target: &str,
) -> Result<(), Error> {
    let client = &ctx.client;
    let dscs: Api<DiscoveryServiceCertificate> =
        Api::namespaced(client.clone(), children.namespace());
    delete_ignoring_missing(&dscs, &children.client_certificate_name(target)).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), target);
    if let Some(cm) = config_maps
        .get_opt(marin3r_webhook::config::DEFAULT_BOOTSTRAP_CONFIG_MAP)
        .await?
        && is_ours(&cm, children)
    {
        delete_ignoring_missing(&config_maps, &cm.name_any()).await?;
    }
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), target);
    if let Some(b) = bindings.get_opt(&children.cluster_name()).await?
        && is_ours(&b, children)
    {
        delete_ignoring_missing(&bindings, &b.name_any()).await?;
    }
    let roles: Api<Role> = Api::namespaced(client.clone(), target);
    if let Some(r) = roles.get_opt(&children.cluster_name()).await?
        && is_ours(&r, children)
    {
        delete_ignoring_missing(&roles, &r.name_any()).await?;
    }
    Ok(())
}

/// Deletes the cluster-scoped `name` if it exists and belongs to this discovery service.
async fn delete_if_ours<K>(api: &Api<K>, name: &str, children: &Children<'_>) -> Result<(), Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    if let Some(obj) = api.get_opt(name).await?
        && is_ours(&obj, children)
    {
        delete_ignoring_missing(api, name).await?;
    }
    Ok(())
}

fn is_ours<K: Resource>(obj: &K, children: &Children<'_>) -> bool {
    let want = children.labels();
    let labels = obj.labels();
    [OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL]
        .iter()
        .all(|k| labels.get(*k) == want.get(*k))
}

/// What the webhook's `caBundle` must trust, from the CA's Secret once issued: the CA's
/// trust bundle, which holds the next or the previous CA too while the CA is rotated.
pub async fn ca_certificate_pem(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    Ok(secrets.get_opt(name).await?.and_then(|s| {
        marin3r_certs::controller::bundle::trust_bundle(
            &marin3r_certs::controller::plan::tls_files(&s),
        )
    }))
}

/// Removes everything ownerReferences do not: the webhook configurations and cluster RBAC,
/// the client certificates with their Secrets, the bootstraps, the per-namespace Secret
/// access and the namespace labels.
async fn cleanup(ds: &DiscoveryService, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let ns = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    // A name that cannot be a label value was refused before anything was made for it
    // (`plan::check`), and no selector can name it: the API server refuses the listing, and
    // the DiscoveryService (and its namespace) could never be deleted.
    if !plan::name_is_label_value(&name) {
        return Ok(Action::await_change());
    }
    let selector = build::owner_selector(&name, &ns);
    let params = ListParams::default().labels(&selector);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for obj in webhooks.list(&params).await? {
        delete_ignoring_missing(&webhooks, &obj.name_any()).await?;
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for obj in validating.list(&params).await? {
        delete_ignoring_missing(&validating, &obj.name_any()).await?;
    }
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for obj in bindings.list(&params).await? {
        delete_ignoring_missing(&bindings, &obj.name_any()).await?;
    }
    let roles: Api<ClusterRole> = Api::all(client.clone());
    for obj in roles.list(&params).await? {
        delete_ignoring_missing(&roles, &obj.name_any()).await?;
    }
    // Client certificates are owned, but deleting them now removes their Secrets before the
    // DiscoveryService is gone.
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), &ns);
    for obj in dscs.list(&params).await? {
        if obj.labels().contains_key(CLIENT_NAMESPACE_LABEL) {
            delete_ignoring_missing(&dscs, &obj.name_any()).await?;
        }
    }
    let config_maps: Api<ConfigMap> = Api::all(client.clone());
    for cm in config_maps.list(&params).await? {
        let api: Api<ConfigMap> =
            Api::namespaced(client.clone(), &cm.namespace().unwrap_or_default());
        delete_ignoring_missing(&api, &cm.name_any()).await?;
    }
    for b in Api::<RoleBinding>::all(client.clone())
        .list(&params)
        .await?
    {
        let api: Api<RoleBinding> =
            Api::namespaced(client.clone(), &b.namespace().unwrap_or_default());
        delete_ignoring_missing(&api, &b.name_any()).await?;
    }
    for r in Api::<Role>::all(client.clone()).list(&params).await? {
        let api: Api<Role> = Api::namespaced(client.clone(), &r.namespace().unwrap_or_default());
        delete_ignoring_missing(&api, &r.name_any()).await?;
    }
    let owner = format!("{ns}/{name}");
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for namespace in ns_api.list(&ListParams::default()).await? {
        if let Some(patch) = namespaces::leave_patch(&name, &owner, &namespace) {
            let labels = namespace.labels();
            let ours = labels.get(marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL)
                == Some(&name)
                || namespace.annotations().get(build::LABELLED_BY_ANNOTATION) == Some(&owner);
            if ours {
                ns_api
                    .patch(
                        &namespace.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
            }
        }
    }
    info!(discoveryservice = %name, namespace = %ns, "removed the cluster-scoped and cross-namespace objects");
    Ok(Action::await_change())
}
