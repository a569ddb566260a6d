//! Pure builders of every object a `DiscoveryService` owns: its certificates, the discovery
//! pod's ServiceAccount, RBAC, Service, Deployment and PodDisruptionBudget, the injection
//! and EnvoyConfig validation webhook configurations and
//! the per-namespace client certificate and bootstrap. No I/O: the controller applies them.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, SeccompProfile,
    SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use marin3r_certs::api::{
    CaSigned, DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, SecretReference,
    SelfSigned, Signer,
};
use marin3r_webhook::config::{DEFAULT_BOOTSTRAP_CONFIG_MAP, DEFAULT_CLIENT_CERTIFICATE};

use crate::api::discovery_service::{
    DISCOVERY_SERVICE_LABEL, DiscoveryService, Resolved, SERVER_CERT_HASH_LABEL, STATUS_LABEL,
};
use crate::bootstrap::{BootstrapError, BootstrapOptions, render};

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

    /// The self-signed CA that signs the server and every client certificate.
    pub fn ca_certificate(&self) -> DiscoveryServiceCertificate {
        let spec = DiscoveryServiceCertificateSpec {
            common_name: format!("marin3r-ca-{}", self.name),
            server: None,
            is_ca: Some(true),
            valid_for: Self::secs(self.spec.ca_duration),
            hosts: None,
            signer: Signer {
                self_signed: Some(SelfSigned {}),
                ca_signed: None,
            },
            secret_ref: SecretReference {
                name: self.spec.ca_secret.clone(),
                namespace: Some(self.namespace.clone()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let mut dsc = DiscoveryServiceCertificate::new(self.ca_name(), spec);
        dsc.metadata = self.owned_meta(self.ca_name());
        dsc
    }

    fn ca_signer(&self) -> Signer {
        Signer {
            self_signed: None,
            ca_signed: Some(CaSigned {
                ca_secret_ref: SecretReference {
                    name: self.spec.ca_secret.clone(),
                    namespace: Some(self.namespace.clone()),
                },
            }),
        }
    }

    /// The discovery pod's certificate for xDS and the webhook: every Service DNS form.
    pub fn server_certificate(&self) -> DiscoveryServiceCertificate {
        let hosts = self.server_hosts();
        let spec = DiscoveryServiceCertificateSpec {
            common_name: hosts[2].clone(),
            server: Some(true),
            is_ca: None,
            valid_for: Self::secs(self.spec.server_duration),
            hosts: Some(hosts),
            signer: self.ca_signer(),
            secret_ref: SecretReference {
                name: self.spec.server_secret.clone(),
                namespace: Some(self.namespace.clone()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let mut dsc = DiscoveryServiceCertificate::new(self.server_name(), spec);
        dsc.metadata = self.owned_meta(self.server_name());
        dsc
    }

    /// The sidecars' client certificate of one enabled namespace. The resource lives (owned)
    /// beside the CA; its Secret is written into the enabled namespace.
    pub fn client_certificate(&self, namespace: &str) -> DiscoveryServiceCertificate {
        let id = marin3r_certs::spiffe_id(TRUST_DOMAIN, namespace);
        let spec = DiscoveryServiceCertificateSpec {
            common_name: format!("envoy-sidecar.{namespace}"),
            server: Some(false),
            is_ca: None,
            valid_for: Self::secs(self.spec.client_duration),
            hosts: Some(vec![id]),
            signer: self.ca_signer(),
            secret_ref: SecretReference {
                name: DEFAULT_CLIENT_CERTIFICATE.into(),
                namespace: Some(namespace.to_owned()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let name = self.client_certificate_name(namespace);
        let mut dsc = DiscoveryServiceCertificate::new(&name, spec);
        dsc.metadata = self.owned_meta(&name);
        dsc.metadata
            .labels
            .get_or_insert_default()
            .insert(CLIENT_NAMESPACE_LABEL.into(), namespace.to_owned());
        dsc
    }

    /// The shared bootstrap of the sidecars in `namespace` (see `crate::bootstrap`).
    pub fn bootstrap_config_map(&self, namespace: &str) -> Result<ConfigMap, BootstrapError> {
        let bootstrap = render(&BootstrapOptions::new(self.xds_host(), self.spec.xds_port))?;
        let data = bootstrap
            .files()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(ConfigMap {
            metadata: self.unowned_meta(DEFAULT_BOOTSTRAP_CONFIG_MAP, Some(namespace)),
            data: Some(data),
            ..Default::default()
        })
    }

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

    pub fn service(&self) -> Service {
        let port = |name: &str, port: u16, target: u16| ServicePort {
            name: Some(name.into()),
            port: i32::from(port),
            target_port: Some(IntOrString::Int(i32::from(target))),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let (type_, cluster_ip) = match self.spec.service_type.as_str() {
            "Headless" => (Some("ClusterIP".to_owned()), Some("None".to_owned())),
            other => (Some(other.to_owned()), None),
        };
        Service {
            metadata: self.owned_meta(&self.spec.service_name),
            spec: Some(ServiceSpec {
                type_,
                cluster_ip,
                selector: Some(self.selector_labels()),
                ports: Some(vec![
                    port("xds", self.spec.xds_port, self.spec.xds_port),
                    port("webhook", 443, self.spec.webhook_port),
                    port("metrics", self.spec.metrics_port, self.spec.metrics_port),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The discovery server's container: its flags, probes, ports and restricted security.
    fn container(&self) -> Container {
        let s = self.spec;
        let mut args: Vec<String> = vec![
            "discovery-service".into(),
            format!("--xds-port={}", s.xds_port),
            format!("--metrics-port={}", s.metrics_port),
            format!("--probe-port={}", s.probe_port),
            format!("--webhook-port={}", s.webhook_port),
            format!("--server-cert-dir={SERVER_CERT_DIR}"),
            // The name also tells the webhook which `discovery-service.name` annotations are
            // its own; a namespace-scoped one watches its namespace only.
            format!("--discovery-service-name={}", self.name),
            format!("--replica-selector={}", self.replica_selector()),
            // The sidecars' shutdown managers run the marin3r release that injected them.
            format!("--shutdown-manager-image={}", s.image),
        ];
        if self.scope == Scope::Namespace {
            args.push(format!("--watch-namespace={}", self.namespace));
        }
        if s.debug {
            args.push("--debug".into());
        }
        let field_env = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let port = |name: &str, port: u16| ContainerPort {
            name: Some(name.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        };
        let probe = |path: &str, initial: i32, period: i32, failures: i32| Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::Int(i32::from(s.probe_port)),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            initial_delay_seconds: Some(initial),
            period_seconds: Some(period),
            failure_threshold: Some(failures),
            timeout_seconds: Some(1),
            ..Default::default()
        };
        Container {
            name: CONTAINER_NAME.into(),
            image: Some(s.image.clone()),
            args: Some(args),
            env: Some(vec![
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
            ]),
            ports: Some(vec![
                port("xds", s.xds_port),
                port("webhook", s.webhook_port),
                port("metrics", s.metrics_port),
                port("probes", s.probe_port),
            ]),
            readiness_probe: Some(probe("/readyz", 0, 2, 3)),
            liveness_probe: Some(probe("/healthz", 30, 10, 6)),
            resources: s.resources.clone(),
            // Pod Security `restricted`; the image's own non-root user (no runAsUser, so a
            // `spec.image` that runs as root is refused by kubelet rather than run).
            security_context: Some(SecurityContext {
                run_as_non_root: Some(true),
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            volume_mounts: Some(vec![VolumeMount {
                name: "server-cert".into(),
                mount_path: SERVER_CERT_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    /// The discovery pod. `server_cert_hash` is the server certificate's hash: a new
    /// certificate changes the pod template and so rolls the pod, one ready before the old
    /// one stops (`maxUnavailable: 0` and the readiness probe).
    pub fn deployment(&self, server_cert_hash: &str) -> Deployment {
        let s = self.spec;
        let mut pod_labels = self.selector_labels();
        pod_labels.insert(SERVER_CERT_HASH_LABEL.into(), server_cert_hash.to_owned());
        let container = self.container();
        Deployment {
            metadata: self.owned_meta(&self.owned_name()),
            spec: DeploymentSpec {
                replicas: Some(s.replicas),
                selector: LabelSelector {
                    match_labels: Some(self.selector_labels()),
                    ..Default::default()
                },
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_unavailable: Some(IntOrString::Int(0)),
                        max_surge: Some(IntOrString::Int(1)),
                    }),
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(self.owned_name()),
                        priority_class_name: s.pod_priority_class.clone(),
                        security_context: Some(PodSecurityContext {
                            run_as_non_root: Some(true),
                            seccomp_profile: Some(SeccompProfile {
                                type_: "RuntimeDefault".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        containers: vec![container],
                        topology_spread_constraints: Some(self.spread()),
                        volumes: Some(vec![Volume {
                            name: "server-cert".into(),
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(s.server_secret.clone()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Replicas on different nodes, then zones, when the scheduler can: one node going down
    /// should not take every webhook and xDS endpoint with it. A preference
    /// (`ScheduleAnyway`), so a one-node cluster still runs every replica.
    fn spread(&self) -> Vec<TopologySpreadConstraint> {
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
            .into_iter()
            .map(|key| TopologySpreadConstraint {
                max_skew: 1,
                topology_key: key.into(),
                when_unsatisfiable: "ScheduleAnyway".into(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(self.selector_labels()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect()
    }

    /// The discovery pods' disruption budget: a voluntary eviction (a node drain) may take one
    /// discovery pod at a time. Not `minAvailable: 1`: with one replica that would block every
    /// drain of its node forever; the pod is back within seconds on another node, the
    /// proxies keep their config meanwhile, and only pod creation in enabled namespaces
    /// waits (the webhook's `failurePolicy: Fail`).
    pub fn pod_disruption_budget(&self) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: self.owned_meta(&self.owned_name()),
            spec: Some(PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                selector: Some(LabelSelector {
                    match_labels: Some(self.selector_labels()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The namespaces both webhooks see: those labelled for this discovery service, or, for a
    /// namespace-scoped one, its own namespace only.
    fn namespace_selector(&self) -> LabelSelector {
        let (key, value) = match self.scope {
            Scope::Cluster => (DISCOVERY_SERVICE_LABEL, &self.name),
            Scope::Namespace => (NAMESPACE_NAME_LABEL, &self.namespace),
        };
        LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_owned(), value.clone())])),
            ..Default::default()
        }
    }

    /// How the API server reaches a webhook `path` of the discovery pod: through the Service,
    /// trusting the CA.
    fn webhook_client(&self, ca_pem: &str, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            service: Some(ServiceReference {
                name: self.spec.service_name.clone(),
                namespace: self.namespace.clone(),
                path: Some(path.into()),
                port: Some(443),
            }),
            url: None,
        }
    }

    /// The injection webhook: pods labelled `status=enabled`, created in a namespace labelled
    /// for this discovery service, are sent to the discovery pod.
    pub fn webhook_configuration(&self, ca_pem: &str) -> MutatingWebhookConfiguration {
        let selector = |key: &str, value: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
            ..Default::default()
        };
        MutatingWebhookConfiguration {
            metadata: self.unowned_meta(&self.webhook_configuration_name(), None),
            webhooks: Some(vec![MutatingWebhook {
                name: format!(
                    "{}.{}.sidecar-injector.marin3r.3scale.net",
                    self.name, self.namespace
                ),
                admission_review_versions: vec!["v1".into()],
                client_config: self.webhook_client(ca_pem, WEBHOOK_PATH),
                failure_policy: Some(WEBHOOK_FAILURE_POLICY.into()),
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(self.namespace_selector()),
                object_selector: Some(selector(STATUS_LABEL, "enabled")),
                reinvocation_policy: Some("Never".into()),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into()]),
                    resources: Some(vec!["pods".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                side_effects: "None".into(),
                timeout_seconds: Some(WEBHOOK_TIMEOUT_SECONDS),
                ..Default::default()
            }]),
        }
    }

    /// The EnvoyConfig validation webhook: creates and updates of EnvoyConfigs in a namespace
    /// labelled for this discovery service are judged by the discovery pod, which refuses
    /// what it could not serve (what `marin3r validate` refuses, with the same field paths).
    pub fn validating_webhook_configuration(&self, ca_pem: &str) -> ValidatingWebhookConfiguration {
        ValidatingWebhookConfiguration {
            metadata: self.unowned_meta(&self.webhook_configuration_name(), None),
            webhooks: Some(vec![ValidatingWebhook {
                name: format!(
                    "{}.{}.envoyconfig-validator.marin3r.3scale.net",
                    self.name, self.namespace
                ),
                admission_review_versions: vec!["v1".into()],
                client_config: self.webhook_client(ca_pem, VALIDATING_WEBHOOK_PATH),
                failure_policy: Some(VALIDATING_WEBHOOK_FAILURE_POLICY.into()),
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(self.namespace_selector()),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec![marin3r_webhook::validate::GROUP.into()]),
                    api_versions: Some(vec!["v1alpha1".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["envoyconfigs".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                side_effects: "None".into(),
                timeout_seconds: Some(WEBHOOK_TIMEOUT_SECONDS),
                ..Default::default()
            }]),
        }
    }
}

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;

/// One RBAC rule.
fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}
