//! Pure builders of every object a `DiscoveryService` owns, no I/O (the controller applies
//! them): here the names, labels and metadata they share; in `pki` the certificates and the
//! per-namespace bootstrap, in `rbac` the discovery pod's identity and rights, in `workload`
//! its Service, Deployment and PodDisruptionBudget, in `webhooks` the injection and
//! EnvoyConfig validation webhook configurations.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use marin3r_api::discovery_service::{DiscoveryService, Resolved};

/// Labels naming the `DiscoveryService` an object belongs to; the cleanup of objects that
/// cannot be owned (cluster-scoped or in other namespaces) selects on them.
pub const OWNER_NAME_LABEL: &str = "operator.marin3r.3scale.net/discoveryservice";
pub const OWNER_NAMESPACE_LABEL: &str = "operator.marin3r.3scale.net/discoveryservice-namespace";
/// On a client certificate: the namespace it is for.
pub const CLIENT_NAMESPACE_LABEL: &str = "operator.marin3r.3scale.net/client-namespace";
/// On a Namespace the operator labelled because `spec.enabledNamespaces` lists it: which
/// discovery service did (`<namespace>/<name>`), so that removing it from the list also
/// removes the label, while a label a user set stays theirs.
pub const LABELLED_BY_ANNOTATION: &str = "operator.marin3r.3scale.net/labelled-by";
/// Where the server certificate Secret is mounted in the discovery pod.
pub const SERVER_CERT_DIR: &str = "/etc/marin3r/tls/server";
pub const WEBHOOK_PATH: &str = "/pod-v1-mutate";
/// How long the API server waits for the webhook before applying the failure policy.
pub const WEBHOOK_TIMEOUT_SECONDS: i32 = 10;
/// `Fail`: a pod that asked for a sidecar (it carries the `status=enabled` label, which the
/// object selector matches) is refused rather than started without one while the discovery
/// service is down. Pods without the label never reach the webhook.
pub const WEBHOOK_FAILURE_POLICY: &str = "Fail";
/// The label the API server sets on every Namespace to its name; a namespace-scoped
/// discovery service's webhook selects its namespace with it, which no user can fake.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
pub use marin3r_webhook::server::VALIDATE_ENVOY_CONFIG_PATH as VALIDATING_WEBHOOK_PATH;
/// `Fail`: while the discovery service is down, creating or changing an EnvoyConfig in a
/// namespace it serves is refused (and retried by the user or their GitOps tool) rather than
/// admitted unchecked; nothing could serve that change meanwhile anyway. Deletes, status
/// writes and other namespaces never reach the webhook.
pub const VALIDATING_WEBHOOK_FAILURE_POLICY: &str = "Fail";
/// The SPIFFE trust domain of client certificate identities.
pub use marin3r_certs::TRUST_DOMAIN;
const CONTAINER_NAME: &str = "marin3r";

/// The label selector of every object a `DiscoveryService` labelled as its own.
pub fn owner_selector(name: &str, namespace: &str) -> String {
    format!("{OWNER_NAME_LABEL}={name},{OWNER_NAMESPACE_LABEL}={namespace}")
}

/// How far a `DiscoveryService` reaches, decided by the namespace it lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// In one of the operator's trusted namespaces: it serves the namespaces listed in
    /// `spec.enabledNamespaces` or labelled for it, and its discovery pod reads EnvoyConfigs
    /// cluster-wide.
    #[default]
    Cluster,
    /// Anywhere else: it serves its own namespace and nothing outside it, as the original
    /// MARIN3R's namespaced DiscoveryService did.
    Namespace,
}

/// Builds the children of one `DiscoveryService` from its resolved spec.
#[derive(Debug, Clone)]
pub struct Children<'a> {
    ds: &'a DiscoveryService,
    spec: &'a Resolved,
    name: String,
    namespace: String,
    scope: Scope,
}

impl<'a> Children<'a> {
    pub fn new(ds: &'a DiscoveryService, spec: &'a Resolved) -> Self {
        Self {
            ds,
            spec,
            name: ds.name_any(),
            namespace: ds.namespace().unwrap_or_default(),
            scope: Scope::Cluster,
        }
    }

    pub fn with_scope(mut self, scope: Scope) -> Self {
        self.scope = scope;
        self
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The webhook configuration's name in `scope`. A namespace-scoped one is
    /// `marin3r-ns.<namespace>.<name>`: namespace names have no dots, so it can equal neither
    /// another namespace's nor a trusted discovery service's `marin3r-<namespace>-<name>`,
    /// and a namespace admin cannot take over another's webhook by choosing a name.
    pub fn webhook_configuration_name_in(&self, scope: Scope) -> String {
        match scope {
            Scope::Cluster => self.cluster_name(),
            Scope::Namespace => format!("marin3r-ns.{}.{}", self.namespace, self.name),
        }
    }

    pub fn webhook_configuration_name(&self) -> String {
        self.webhook_configuration_name_in(self.scope)
    }

    /// `marin3r-<name>`: the Deployment, ServiceAccount and namespaced objects.
    pub fn owned_name(&self) -> String {
        self.ds.owned_name()
    }

    /// Cluster-scoped objects carry the namespace too, since two namespaces may each have a
    /// `DiscoveryService` of the same name.
    pub fn cluster_name(&self) -> String {
        format!("marin3r-{}-{}", self.namespace, self.name)
    }

    pub fn ca_name(&self) -> &str {
        &self.spec.ca_secret
    }

    pub fn server_name(&self) -> &str {
        &self.spec.server_secret
    }

    pub fn client_certificate_name(&self, namespace: &str) -> String {
        format!("marin3r-client-{}-{}", self.name, namespace)
    }

    /// The host the sidecars dial: in the server certificate and resolvable from any namespace.
    pub fn xds_host(&self) -> String {
        format!("{}.{}.svc", self.spec.service_name, self.namespace)
    }

    /// The Service's DNS names, each a SAN of the server certificate.
    pub fn server_hosts(&self) -> Vec<String> {
        let (svc, ns) = (&self.spec.service_name, &self.namespace);
        vec![
            svc.clone(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ]
    }

    /// Labels on every child.
    pub fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.selector_labels();
        labels.insert(
            "app.kubernetes.io/managed-by".into(),
            "marin3r-operator".into(),
        );
        labels.insert(OWNER_NAME_LABEL.into(), self.name.clone());
        labels.insert(OWNER_NAMESPACE_LABEL.into(), self.namespace.clone());
        labels
    }

    /// The labels that select the discovery pods.
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("app.kubernetes.io/name".into(), "marin3r".into()),
            (
                "app.kubernetes.io/component".into(),
                "discovery-service".into(),
            ),
            ("app.kubernetes.io/instance".into(), self.name.clone()),
        ])
    }

    /// The discovery pods' selector as a string, for the replicas to find each other.
    pub fn replica_selector(&self) -> String {
        self.selector_labels()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The label selector (as a string) of the objects that cannot be owned.
    pub fn owner_selector(&self) -> String {
        owner_selector(&self.name, &self.namespace)
    }

    /// The DiscoveryService's namespace, where the owned objects live.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn owner(&self) -> Option<OwnerReference> {
        self.ds.controller_owner_ref(&())
    }

    /// Metadata of an object in the DiscoveryService's namespace, owned by it.
    fn owned_meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels()),
            owner_references: self.owner().map(|o| vec![o]),
            ..Default::default()
        }
    }

    /// Metadata of an object ownerReferences cannot reach (another namespace or cluster).
    fn unowned_meta(&self, name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            labels: Some(self.labels()),
            ..Default::default()
        }
    }

    fn secs(d: std::time::Duration) -> i64 {
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
    }
}

mod pki;
mod rbac;
mod webhooks;
mod workload;

pub use workload::restricted_pod_security;

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
