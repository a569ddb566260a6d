//! The `DiscoveryService` controller's decisions, pure: from the discovery service, the
//! Namespaces and its client certificates to the children to apply, and from what applying
//! them returned to the status, the Events and when to look again. Two children depend on
//! what others became (the webhook trusts the issued CA; the Deployment rolls with the
//! server certificate's hash), so acting happens in two steps with [`dependents`] between.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_controller::{Note, set_condition};
use serde_json::Value;

use super::Config;
use super::build::{CLIENT_NAMESPACE_LABEL, Children, Scope};
use super::namespaces;
use marin3r_api::discovery_service::{DiscoveryService, DiscoveryServiceStatus, Resolved};

const READY: &str = "Ready";
/// How soon to look again while something is not ready yet (changes to owned objects
/// usually wake the controller sooner).
const NOT_READY_RETRY: Duration = Duration::from_secs(10);
/// How often a discovery service refused for its namespace's older one looks again.
const ALREADY_SERVED_RETRY: Duration = Duration::from_secs(30);
/// How often a ready discovery service is looked at anyway.
const READY_RESYNC: Duration = Duration::from_secs(300);

marin3r_controller::reasons! {
    /// The reasons of the Ready condition and of the discovery service's Events.
    pub enum Reason {
        Ready,
        InvalidSpec,
        ForbiddenNamespace,
        CertificatesNotReady,
        DeploymentNotReady,
        NamespaceEnabled,
        NamespaceDisabled,
        NamespaceAlreadyServed,
    }
}

impl Reason {
    /// Progress towards ready is Normal; a problem only a user can fix is a Warning.
    fn is_progress(self) -> bool {
        matches!(
            self,
            Self::Ready | Self::CertificatesNotReady | Self::DeploymentNotReady
        )
    }
}

/// Why the discovery service is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    pub reason: Reason,
    pub message: String,
}

/// What the controller read for one discovery service.
pub struct Observed<'a> {
    pub ds: &'a DiscoveryService,
    /// The resolved spec, or why it cannot be served ([`check`]).
    pub spec: Result<Resolved, NotReady>,
    /// Where it may reach ([`scope`]).
    pub scope: Scope,
    /// Every Namespace (read only for a spec that passes).
    pub namespaces: Vec<Namespace>,
    /// The client certificates this discovery service has now (idem).
    pub clients: Vec<DiscoveryServiceCertificate>,
    pub now: Time,
}

/// What to do about one discovery service.
pub enum Plan<'a> {
    NotReady(NotReady),
    Apply(Box<Apply<'a>>),
}

/// The children that depend only on the spec and the Namespaces.
pub struct Apply<'a> {
    pub children: Children<'a>,
    pub ca: DiscoveryServiceCertificate,
    pub server: DiscoveryServiceCertificate,
    pub service_account: ServiceAccount,
    /// The discovery pod's cluster-wide access; none for a namespace-scoped discovery
    /// service (its namespace's Role grants what it needs), whose old ones are removed.
    pub cluster_rbac: Option<(ClusterRole, ClusterRoleBinding)>,
    pub service: Service,
    /// Merge patches to Namespaces, by name.
    pub namespace_patches: BTreeMap<String, Value>,
    /// Per served namespace: its client certificate and sidecar bootstrap.
    pub clients: Vec<(String, DiscoveryServiceCertificate, ConfigMap)>,
    /// Namespaces no longer served, whose client certificate and bootstrap go.
    pub leaving: Vec<String>,
    pub enabled: Vec<String>,
    /// Listed in the spec but not in the cluster.
    pub missing: Vec<String>,
    pub events: Vec<Note>,
}

/// What applying the first children returned.
pub struct Applied {
    pub ca: DiscoveryServiceCertificate,
    pub server: DiscoveryServiceCertificate,
    /// Per served namespace, whether its client certificate is ready.
    pub clients_ready: BTreeMap<String, bool>,
    /// The issued CA certificate (PEM), from its Secret.
    pub ca_pem: Option<String>,
}

/// What to write after acting.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: DiscoveryServiceStatus,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

/// A discovery service in one of the operator's trusted namespaces serves the namespaces
/// listed or labelled for it; anywhere else it serves its own namespace only, so a namespace
/// admin who may create one gains nothing outside their namespace.
pub fn scope(ds: &DiscoveryService, config: &Config) -> Scope {
    if config
        .trusted_namespaces
        .contains(&ds.namespace().unwrap_or_default())
    {
        Scope::Cluster
    } else {
        Scope::Namespace
    }
}

/// Whether a DiscoveryService's name can be a label value (at most 63 characters; a
/// resource name is otherwise one already): every child carries it in one, and the owner
/// selector the cleanup lists them by names it.
pub fn name_is_label_value(name: &str) -> bool {
    name.len() <= 63
}

/// Checks the name and the spec, and that a namespace-scoped discovery service lists no
/// other namespace.
pub fn check(ds: &DiscoveryService, config: &Config) -> Result<Resolved, NotReady> {
    let ns = ds.namespace().unwrap_or_default();
    // The name is a label value on every child and in the webhook's namespace selector.
    let name = ds.name_any();
    let invalid = |message| NotReady {
        reason: Reason::InvalidSpec,
        message,
    };
    if !name_is_label_value(&name) {
        return Err(invalid(format!(
            "metadata.name {name:?} is longer than 63 characters; it is used as a label value"
        )));
    }
    let mut resolved = ds.resolve(&config.default_image).map_err(invalid)?;
    resolved.json_logs = config.json_logs;
    if scope(ds, config) == Scope::Namespace {
        let listed = ds.spec.enabled_namespaces.as_deref().unwrap_or_default();
        if let Some((i, other)) = listed.iter().enumerate().find(|(_, n)| **n != ns) {
            let trusted: Vec<&str> = config
                .trusted_namespaces
                .iter()
                .map(String::as_str)
                .collect();
            return Err(NotReady {
                reason: Reason::ForbiddenNamespace,
                message: format!(
                    "spec.enabledNamespaces[{i}]: {other:?} is another namespace; a DiscoveryService outside the operator's trusted namespaces ({}) serves only its own namespace {ns}. Remove it from the list, or create the DiscoveryService in a trusted namespace",
                    trusted.join(", ")
                ),
            });
        }
    }
    Ok(resolved)
}

/// A namespace has one discovery service of its own: its EnvoyConfigs, their revisions and
/// rollbacks, its client certificate and bootstrap have one owner. Of several
/// namespace-scoped discovery services in one namespace, the oldest (then the first by name)
/// serves it; the others are refused, naming it. `others`: the discovery services of the
/// same namespace.
pub fn first_in_namespace(
    ds: &DiscoveryService,
    scope: Scope,
    others: &[DiscoveryService],
) -> Result<(), NotReady> {
    if scope != Scope::Namespace {
        return Ok(());
    }
    let key = |d: &DiscoveryService| (d.metadata.creation_timestamp.clone(), d.name_any());
    let mine = key(ds);
    let Some(older) = others
        .iter()
        .filter(|o| o.name_any() != ds.name_any() && o.metadata.deletion_timestamp.is_none())
        .filter(|o| key(o) < mine)
        .min_by_key(|o| key(o))
    else {
        return Ok(());
    };
    let ns = ds.namespace().unwrap_or_default();
    Err(NotReady {
        reason: Reason::NamespaceAlreadyServed,
        message: format!(
            "namespace {ns} is already served by the DiscoveryService {:?}: marin3r serves a \
             namespace from one DiscoveryService, which owns its EnvoyConfigs' revisions and \
             rollbacks, so pods cannot choose another with \
             marin3r.3scale.net/discovery-service.name as the original allowed. Delete this one, \
             or move the workloads it was meant for to another namespace (docs/migrating.md)",
            older.name_any()
        ),
    })
}

/// The children to apply, the Namespaces to patch and the namespaces to leave.
pub fn decide<'a>(obs: &'a Observed<'a>) -> Plan<'a> {
    let resolved = match &obs.spec {
        Ok(resolved) => resolved,
        Err(not_ready) => return Plan::NotReady(not_ready.clone()),
    };
    let ds = obs.ds;
    let children = Children::new(ds, resolved).with_scope(obs.scope);
    let owner = format!("{}/{}", children.namespace(), ds.name_any());
    let served: BTreeSet<String> = obs
        .clients
        .iter()
        .filter_map(|c| c.labels().get(CLIENT_NAMESPACE_LABEL).cloned())
        .collect();
    let ns_plan = match obs.scope {
        Scope::Cluster => namespaces::plan(
            &ds.name_any(),
            &owner,
            &resolved.enabled_namespaces,
            &obs.namespaces,
            &served,
        ),
        Scope::Namespace => namespaces::plan_own(
            &ds.name_any(),
            &owner,
            children.namespace(),
            &obs.namespaces,
            &served,
        ),
    };
    let mut clients = Vec::new();
    let mut events = Vec::new();
    for target in &ns_plan.enabled {
        let config_map = match children.bootstrap_config_map(target) {
            Ok(cm) => cm,
            Err(e) => {
                return Plan::NotReady(NotReady {
                    reason: Reason::InvalidSpec,
                    message: format!("cannot render the sidecar bootstrap: {e}"),
                });
            }
        };
        clients.push((
            target.clone(),
            children.client_certificate(target),
            config_map,
        ));
        if !served.contains(target) {
            events.push(Note::normal(
                Reason::NamespaceEnabled,
                format!(
                    "serving namespace {target}: client certificate, bootstrap and Secret access created"
                ),
            ));
        }
    }
    for target in &ns_plan.leaving {
        events.push(Note::normal(
            Reason::NamespaceDisabled,
            format!(
                "no longer serving namespace {target}: client certificate, bootstrap and Secret access removed"
            ),
        ));
    }
    Plan::Apply(Box::new(Apply {
        ca: children.ca_certificate(),
        server: children.server_certificate(),
        service_account: children.service_account(),
        cluster_rbac: (obs.scope == Scope::Cluster)
            .then(|| (children.cluster_role(), children.cluster_role_binding())),
        service: children.service(),
        children,
        namespace_patches: ns_plan.patches,
        clients,
        leaving: ns_plan.leaving,
        enabled: ns_plan.enabled,
        missing: ns_plan.missing,
        events,
    }))
}

/// The webhook configurations (injection, EnvoyConfig validation), once the CA is issued,
/// and the Deployment, once the server certificate is (it rolls whenever that certificate
/// changes).
pub fn dependents(
    plan: &Apply<'_>,
    applied: &Applied,
) -> (
    Option<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration)>,
    Option<Deployment>,
) {
    let webhooks = applied.ca_pem.as_deref().map(|pem| {
        (
            plan.children.webhook_configuration(pem),
            plan.children.validating_webhook_configuration(pem),
        )
    });
    let deployment = server_hash(applied).map(|hash| plan.children.deployment(hash));
    (webhooks, deployment)
}

fn server_hash(applied: &Applied) -> Option<&str> {
    applied
        .server
        .status
        .as_ref()
        .and_then(|s| s.certificate_hash.as_deref())
}

pub fn certificate_ready(dsc: &DiscoveryServiceCertificate) -> bool {
    dsc.status.as_ref().and_then(|s| s.ready) == Some(true)
}

/// Readiness once everything is applied: certificates first, then the rollout.
pub fn report(
    obs: &Observed<'_>,
    plan: &Apply<'_>,
    applied: &Applied,
    deployment: Option<&Deployment>,
) -> Outcome {
    let mut status = obs.ds.status.clone().unwrap_or_default();
    status.enabled_namespaces = plan.enabled.clone();
    let (rolled_out, summary) = deployment_state(deployment);
    status.deployment = summary;
    status.deployment_name = deployment.map(ResourceExt::name_any);
    status.deployment_status = deployment.and_then(|d| d.status.clone());
    let children = &plan.children;
    let pending: Vec<&str> = applied
        .clients_ready
        .iter()
        .filter(|(_, ready)| !**ready)
        .map(|(ns, _)| ns.as_str())
        .collect();
    let waiting = |message: String| {
        Err(NotReady {
            reason: Reason::CertificatesNotReady,
            message,
        })
    };
    let result = if !certificate_ready(&applied.ca) || applied.ca_pem.is_none() {
        waiting(format!(
            "waiting for the CA certificate {}",
            children.ca_name()
        ))
    } else if !certificate_ready(&applied.server) || server_hash(applied).is_none() {
        waiting(format!(
            "waiting for the server certificate {}",
            children.server_name()
        ))
    } else if !pending.is_empty() {
        waiting(format!(
            "waiting for the client certificates of namespaces {}",
            pending.join(", ")
        ))
    } else if !rolled_out {
        Err(NotReady {
            reason: Reason::DeploymentNotReady,
            message: format!(
                "Deployment {} is rolling out or has no ready pod ({})",
                children.owned_name(),
                status.deployment.as_deref().unwrap_or("0/1")
            ),
        })
    } else {
        Ok(())
    };
    let mut outcome = finish(obs, status, result, &plan.missing);
    let mut events = plan.events.clone();
    events.append(&mut outcome.events);
    outcome.events = events;
    outcome
}

/// The status of a discovery service that cannot be applied.
pub fn not_ready(obs: &Observed<'_>, not_ready: NotReady) -> Outcome {
    let status = obs.ds.status.clone().unwrap_or_default();
    finish(obs, status, Err(not_ready), &[])
}

/// Sets the Ready condition; an Event when readiness or its reason changes.
fn finish(
    obs: &Observed<'_>,
    mut status: DiscoveryServiceStatus,
    result: Result<(), NotReady>,
    missing: &[String],
) -> Outcome {
    let (reason, mut message) = match &result {
        Ok(()) => (
            Reason::Ready,
            "the discovery service is deployed and every certificate is ready".to_owned(),
        ),
        Err(n) => (n.reason, n.message.clone()),
    };
    if !missing.is_empty() {
        message.push_str(&format!(
            "; listed namespaces not found: {}",
            missing.join(", ")
        ));
    }
    let generation = obs.ds.metadata.generation;
    let ready = result.is_ok();
    let changed = set_condition(
        &mut status.conditions,
        READY,
        ready,
        reason,
        &message,
        generation,
        &obs.now,
    );
    status.observed_generation = generation;
    let events = if !changed {
        Vec::new()
    } else if reason.is_progress() {
        vec![Note::normal(reason, message)]
    } else {
        vec![Note::warning(reason, message)]
    };
    let requeue = match result {
        Ok(()) => Some(READY_RESYNC),
        // Only a change by a user fixes these.
        // Until the other discovery service goes, which wakes nothing here.
        Err(n) if n.reason == Reason::NamespaceAlreadyServed => Some(ALREADY_SERVED_RETRY),
        Err(n) if !n.reason.is_progress() => None,
        Err(_) => Some(NOT_READY_RETRY),
    };
    Outcome {
        status,
        events,
        requeue,
    }
}

/// Whether the Deployment has rolled out its current template with every replica ready,
/// and `ready/desired` for status.
pub(crate) fn deployment_state(deployment: Option<&Deployment>) -> (bool, Option<String>) {
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

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
