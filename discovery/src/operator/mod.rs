//! The `DiscoveryService` controller: keeps every child of a discovery service in shape (PKI,
//! RBAC, Service, Deployment, injection webhook, per-namespace client certificate and
//! bootstrap) and reports readiness. What to build is decided in `build` and `namespaces`;
//! this module only reads and writes the API. A finalizer removes what ownerReferences
//! cannot reach: cluster-scoped objects and objects in the served namespaces.

pub mod build;
pub mod leader;
pub mod namespaces;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalize, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::api::discovery_service::{DiscoveryService, DiscoveryServiceStatus};
use build::{CLIENT_NAMESPACE_LABEL, Children, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL};

const FIELD_MANAGER: &str = "marin3r-operator";
const FINALIZER: &str = "operator.marin3r.3scale.net/discoveryservice";
const READY: &str = "Ready";
/// How soon to look again while something is not ready yet (changes to owned objects
/// usually wake the controller sooner).
const NOT_READY_RETRY: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding an object: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

/// What the controller needs to know about the operator it runs in.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// The discovery pod's image when a `DiscoveryService` names none.
    pub default_image: String,
    /// Namespaces whose certificates may write Secrets elsewhere (see the certificate
    /// controller); a `DiscoveryService` must live in one to issue client certificates into
    /// the namespaces it serves.
    pub trusted_namespaces: BTreeSet<String>,
}

struct Context {
    client: Client,
    recorder: Recorder,
    config: Config,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let reporter = Reporter {
        controller: "marin3r-operator".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        config,
    });
    let controller = Controller::new(
        Api::<DiscoveryService>::all(client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let owned = || watcher::Config::default().labels(OWNER_NAME_LABEL);
    controller
        .owns(Api::<Deployment>::all(client.clone()), owned())
        .owns(
            Api::<DiscoveryServiceCertificate>::all(client.clone()),
            owned(),
        )
        // A namespace labelled or unlabelled by a user may change what any discovery
        // service serves.
        .watches(
            Api::<Namespace>::all(client),
            watcher::Config::default(),
            move |_| {
                store
                    .state()
                    .iter()
                    .map(|ds| ObjectRef::from_obj(&**ds))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => debug!(discoveryservice = %obj, "reconciled"),
                Err(err) => debug!(error = %err, "reconcile failed"),
            }
        })
        .await;
}

fn error_policy(ds: Arc<DiscoveryService>, err: &Error, _: Arc<Context>) -> Action {
    warn!(discoveryservice = %ds.name_any(), namespace = ?ds.namespace(), error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
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

/// Creates or updates `obj` with server-side apply; a no-op write changes nothing.
async fn apply_object<K>(api: &Api<K>, obj: &K) -> Result<K, Error>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
{
    let mut value = serde_json::to_value(obj)?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api
        .patch(&obj.name_any(), &params, &Patch::Apply(value))
        .await?)
}

async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Why the discovery service is not ready.
struct NotReady {
    reason: &'static str,
    message: String,
}

async fn apply(ds: &DiscoveryService, ctx: &Context) -> Result<Action, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let mut status = ds.status.clone().unwrap_or_default();
    // The name is a label value on every child and in the webhook's namespace selector.
    let name = ds.name_any();
    let checked = if name.len() > 63 {
        Err(format!(
            "metadata.name {name:?} is longer than 63 characters; it is used as a label value"
        ))
    } else {
        ds.resolve(&ctx.config.default_image)
    };
    let resolved = match checked {
        Ok(r) => r,
        Err(message) => {
            let not_ready = NotReady {
                reason: "InvalidSpec",
                message,
            };
            return finish(ctx, ds, status, Err(not_ready), &[]).await;
        }
    };
    if !ctx.config.trusted_namespaces.contains(&ns) {
        let not_ready = NotReady {
            reason: "UntrustedNamespace",
            message: format!(
                "namespace {ns} is not one of the operator's trusted namespaces ({}), so it may not issue client certificates into other namespaces; create the DiscoveryService in one of them or add --trusted-namespace={ns} to the operator",
                ctx.config
                    .trusted_namespaces
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        return finish(ctx, ds, status, Err(not_ready), &[]).await;
    }
    let children = Children::new(ds, &resolved);
    let client = &ctx.client;
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), &ns);

    let ca = apply_object(&dscs, &children.ca_certificate()).await?;
    let server = apply_object(&dscs, &children.server_certificate()).await?;
    apply_object(
        &Api::namespaced(client.clone(), &ns),
        &children.service_account(),
    )
    .await?;
    apply_object(
        &Api::<ClusterRole>::all(client.clone()),
        &children.cluster_role(),
    )
    .await?;
    apply_object(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        &children.cluster_role_binding(),
    )
    .await?;
    apply_object(&Api::namespaced(client.clone(), &ns), &children.service()).await?;

    // The namespaces served, their labels, client certificates and bootstraps.
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let owner = format!("{ns}/{}", ds.name_any());
    let clients = dscs
        .list(&ListParams::default().labels(&children.owner_selector()))
        .await?;
    let served: BTreeSet<String> = clients
        .items
        .iter()
        .filter_map(|c| c.labels().get(CLIENT_NAMESPACE_LABEL).cloned())
        .collect();
    let plan = namespaces::plan(
        &ds.name_any(),
        &owner,
        &resolved.enabled_namespaces,
        &namespaces.items,
        &served,
    );
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for (name, patch) in &plan.patches {
        ns_api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    let mut client_status = BTreeMap::new();
    for target in &plan.enabled {
        let dsc = apply_object(&dscs, &children.client_certificate(target)).await?;
        client_status.insert(target.clone(), certificate_ready(&dsc));
        let config_map = match children.bootstrap_config_map(target) {
            Ok(cm) => cm,
            Err(e) => {
                let not_ready = NotReady {
                    reason: "InvalidSpec",
                    message: format!("cannot render the sidecar bootstrap: {e}"),
                };
                return finish(ctx, ds, status, Err(not_ready), &[]).await;
            }
        };
        apply_object(&Api::namespaced(client.clone(), target), &config_map).await?;
        apply_object(
            &Api::namespaced(client.clone(), target),
            &children.secret_reader_role(target),
        )
        .await?;
        apply_object(
            &Api::namespaced(client.clone(), target),
            &children.secret_reader_binding(target),
        )
        .await?;
        if !served.contains(target) {
            publish(
                ctx,
                ds,
                EventType::Normal,
                "NamespaceEnabled",
                &format!(
                    "serving namespace {target}: client certificate, bootstrap and Secret access created"
                ),
            )
            .await;
        }
    }
    for target in &plan.leaving {
        leave_namespace(ctx, &children, target).await?;
        publish(
            ctx,
            ds,
            EventType::Normal,
            "NamespaceDisabled",
            &format!(
                "no longer serving namespace {target}: client certificate, bootstrap and Secret access removed"
            ),
        )
        .await;
    }
    status.enabled_namespaces = plan.enabled.clone();

    // The webhook trusts the CA; the discovery pod rolls with its server certificate.
    let ca_pem = ca_certificate_pem(client, &ns, children.ca_name()).await?;
    if let Some(ca_pem) = &ca_pem {
        apply_object(
            &Api::<MutatingWebhookConfiguration>::all(client.clone()),
            &children.webhook_configuration(ca_pem),
        )
        .await?;
    }
    let server_hash = server
        .status
        .as_ref()
        .and_then(|s| s.certificate_hash.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = match &server_hash {
        Some(hash) => Some(apply_object(&deployments, &children.deployment(hash)).await?),
        None => deployments.get_opt(&children.owned_name()).await?,
    };
    apply_object(
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns),
        &children.pod_disruption_budget(),
    )
    .await?;
    let (rolled_out, summary) = deployment_state(deployment.as_ref());
    status.deployment = summary;

    let pending_clients: Vec<&String> = client_status
        .iter()
        .filter(|(_, ready)| !**ready)
        .map(|(ns, _)| ns)
        .collect();
    let outcome = if !certificate_ready(&ca) || ca_pem.is_none() {
        Err(NotReady {
            reason: "CertificatesNotReady",
            message: format!("waiting for the CA certificate {}", children.ca_name()),
        })
    } else if !certificate_ready(&server) || server_hash.is_none() {
        Err(NotReady {
            reason: "CertificatesNotReady",
            message: format!(
                "waiting for the server certificate {}",
                children.server_name()
            ),
        })
    } else if !pending_clients.is_empty() {
        Err(NotReady {
            reason: "CertificatesNotReady",
            message: format!(
                "waiting for the client certificates of namespaces {}",
                pending_clients
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    } else if !rolled_out {
        Err(NotReady {
            reason: "DeploymentNotReady",
            message: format!(
                "Deployment {} is rolling out or has no ready pod ({})",
                children.owned_name(),
                status.deployment.as_deref().unwrap_or("0/1")
            ),
        })
    } else {
        Ok(())
    };
    finish(ctx, ds, status, outcome, &plan.missing).await
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

fn is_ours<K: Resource>(obj: &K, children: &Children<'_>) -> bool {
    let want = children.labels();
    let labels = obj.labels();
    [OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL]
        .iter()
        .all(|k| labels.get(*k) == want.get(*k))
}

fn certificate_ready(dsc: &DiscoveryServiceCertificate) -> bool {
    dsc.status.as_ref().and_then(|s| s.ready) == Some(true)
}

/// The CA certificate (PEM) from its Secret, once issued.
async fn ca_certificate_pem(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    Ok(secrets.get_opt(name).await?.and_then(|s| {
        s.data
            .and_then(|d| d.get("tls.crt").cloned())
            .and_then(|b| String::from_utf8(b.0).ok())
            .filter(|pem| pem.contains("BEGIN CERTIFICATE"))
    }))
}

/// Whether the Deployment has rolled out its current template with every replica ready,
/// and `ready/desired` for status.
fn deployment_state(deployment: Option<&Deployment>) -> (bool, Option<String>) {
    let Some(d) = deployment else {
        return (false, None);
    };
    let desired = d.spec.replicas.unwrap_or(1);
    let Some(status) = &d.status else {
        return (false, Some(format!("0/{desired}")));
    };
    let ready = status.ready_replicas.unwrap_or(0);
    let observed = status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0) >= desired;
    let available = status.available_replicas.unwrap_or(0) >= desired;
    let rolled_out = observed && updated && available && ready >= desired;
    (rolled_out, Some(format!("{ready}/{desired}")))
}

/// Writes the Ready condition and the status, and publishes an Event when readiness or its
/// reason changes.
async fn finish(
    ctx: &Context,
    ds: &DiscoveryService,
    mut status: DiscoveryServiceStatus,
    outcome: Result<(), NotReady>,
    missing: &[String],
) -> Result<Action, Error> {
    let (ready, reason, mut message) = match &outcome {
        Ok(()) => (
            true,
            "Ready",
            "the discovery service is deployed and every certificate is ready".to_owned(),
        ),
        Err(n) => (false, n.reason, n.message.clone()),
    };
    if !missing.is_empty() {
        message.push_str(&format!(
            "; listed namespaces not found: {}",
            missing.join(", ")
        ));
    }
    let value = if ready { "True" } else { "False" };
    let previous = status.conditions.iter().find(|c| c.type_ == READY).cloned();
    let transition = match &previous {
        Some(c) if c.status == value => c.last_transition_time.clone(),
        _ => Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let changed = previous
        .as_ref()
        .is_none_or(|c| c.status != value || c.reason != reason);
    status.conditions.retain(|c| c.type_ != READY);
    status.conditions.push(Condition {
        type_: READY.into(),
        status: value.into(),
        reason: reason.into(),
        message: message.clone(),
        last_transition_time: transition,
        observed_generation: ds.metadata.generation,
    });
    status.observed_generation = ds.metadata.generation;
    if changed {
        let type_ = if ready || reason == "DeploymentNotReady" || reason == "CertificatesNotReady" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        publish(ctx, ds, type_, reason, &message).await;
    }
    if ds.status.as_ref() != Some(&status) {
        let api: Api<DiscoveryService> =
            Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
        api.patch_status(
            &ds.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?;
    }
    Ok(match outcome {
        Ok(()) => Action::requeue(Duration::from_secs(300)),
        Err(n) if n.reason == "InvalidSpec" || n.reason == "UntrustedNamespace" => {
            Action::await_change()
        }
        Err(_) => Action::requeue(NOT_READY_RETRY),
    })
}

/// Removes everything ownerReferences do not: the webhook configuration and cluster RBAC,
/// the client certificates with their Secrets, the bootstraps, the per-namespace Secret
/// access and the namespace labels.
async fn cleanup(ds: &DiscoveryService, ctx: &Context) -> Result<Action, Error> {
    let client = &ctx.client;
    let ns = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    let selector = build::owner_selector(&name, &ns);
    let params = ListParams::default().labels(&selector);
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for obj in webhooks.list(&params).await? {
        delete_ignoring_missing(&webhooks, &obj.name_any()).await?;
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
            let ours = labels.get(crate::api::discovery_service::DISCOVERY_SERVICE_LABEL)
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

async fn publish(ctx: &Context, ds: &DiscoveryService, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&event, &ds.object_ref(&())).await {
        warn!(error = %err, "could not publish an event");
    }
}
