//! The discovery pod's ServiceAccount and what it may do: cluster-wide or in its own
//! namespace, per served namespace for Secrets, and among its replicas.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use super::{Children, Scope};

impl Children<'_> {
    pub fn service_account(&self) -> ServiceAccount {
        ServiceAccount {
            metadata: self.owned_meta(&self.owned_name()),
            ..Default::default()
        }
    }

    /// What the discovery pod may do everywhere. Cluster-wide because it watches every
    /// namespace that carries its label: namespaces (to find them), EnvoyConfigs (read) and
    /// their revisions (it owns the revisions and writes both statuses), and Events. Secrets
    /// are not here: each served namespace grants them with [`Self::secret_reader_role`].
    pub fn cluster_role(&self) -> ClusterRole {
        let mut rules = vec![rule(&[""], &["namespaces"], &["get", "list", "watch"])];
        rules.extend(self.config_rules());
        ClusterRole {
            metadata: self.unowned_meta(&self.cluster_name(), None),
            rules: Some(rules),
            ..Default::default()
        }
    }

    /// What the discovery pods may do in their own namespace: hold the leader election Lease
    /// (only the leader runs the EnvoyConfig controller and writes taints) and list their
    /// sibling pods (whose NACK reports count).
    pub fn replicas_role(&self) -> Role {
        Role {
            metadata: self.owned_meta(&self.owned_name()),
            rules: Some(vec![
                rule(
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["get", "create", "update"],
                ),
                rule(&[""], &["pods"], &["get", "list"]),
            ]),
        }
    }

    /// Binds [`Self::replicas_role`] to the discovery pod's ServiceAccount.
    pub fn replicas_role_binding(&self) -> RoleBinding {
        RoleBinding {
            metadata: self.owned_meta(&self.owned_name()),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: self.owned_name(),
            },
            subjects: Some(vec![self.service_account_subject()]),
        }
    }

    /// EnvoyConfigs (read) and their revisions (it owns the revisions and writes both
    /// statuses), and Events.
    fn config_rules(&self) -> Vec<PolicyRule> {
        let read = ["get", "list", "watch"];
        vec![
            rule(&["marin3r.3scale.net"], &["envoyconfigs"], &read),
            rule(
                &["marin3r.3scale.net"],
                &["envoyconfigrevisions"],
                &[
                    "get", "list", "watch", "create", "update", "patch", "delete",
                ],
            ),
            rule(
                &["marin3r.3scale.net"],
                &["envoyconfigs/status", "envoyconfigrevisions/status"],
                &["get", "update", "patch"],
            ),
            rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        ]
    }

    /// Read access to the Secrets of one served namespace (the TLS and Opaque Secrets its
    /// revisions serve over SDS, watched for changes) and its EndpointSlices (the endpoints
    /// of `generateFromEndpointSlices`, watched too), so the discovery pod never reads the
    /// Secrets of a namespace it does not serve, such as its own CA's. A namespace-scoped
    /// discovery service has no ClusterRole: this Role also grants, in its one namespace,
    /// what the ClusterRole grants everywhere (but Namespaces, which it never reads).
    pub fn secret_reader_role(&self, namespace: &str) -> Role {
        let read = ["get", "list", "watch"];
        let mut rules = vec![
            rule(&[""], &["secrets"], &read),
            rule(&["discovery.k8s.io"], &["endpointslices"], &read),
        ];
        if self.scope == Scope::Namespace {
            rules.extend(self.config_rules());
        }
        Role {
            metadata: self.unowned_meta(&self.cluster_name(), Some(namespace)),
            rules: Some(rules),
        }
    }

    /// Binds [`Self::secret_reader_role`] to the discovery pod's ServiceAccount.
    pub fn secret_reader_binding(&self, namespace: &str) -> RoleBinding {
        RoleBinding {
            metadata: self.unowned_meta(&self.cluster_name(), Some(namespace)),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Role".into(),
                name: self.cluster_name(),
            },
            subjects: Some(vec![self.service_account_subject()]),
        }
    }

    fn service_account_subject(&self) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: self.owned_name(),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        }
    }

    pub fn cluster_role_binding(&self) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: self.unowned_meta(&self.cluster_name(), None),
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: self.cluster_name(),
            },
            subjects: Some(vec![self.service_account_subject()]),
        }
    }
}

/// One RBAC rule.
fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}
