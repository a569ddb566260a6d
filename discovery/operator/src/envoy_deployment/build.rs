//! Pure builders of what an `EnvoyDeployment` owns, no I/O: the client certificate, the
//! bootstrap ConfigMap, the Deployment (its Envoy container built by the sidecar's own
//! builder, so the gateway gets the same readiness listener, loopback admin, restricted
//! security context and shutdown manager), the HorizontalPodAutoscaler and the
//! PodDisruptionBudget. Names and labels are the original MARIN3R's.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec, PodTemplateSpec, Probe};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use marin3r_certs::api::{
    CaSigned, DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, SecretReference, Signer,
};
use marin3r_webhook::annotations::{Admin, Layout, ShutdownManager, SidecarSpec};
use marin3r_webhook::config::{DRAIN_GRACE_MARGIN, Resources};
use marin3r_webhook::sidecar;
use sha2::{Digest, Sha256};

use crate::build::restricted_pod_security;
use marin3r_api::envoy_deployment::{EnvoyDeployment, ProbeSpec};
use marin3r_api::envoy_deployment_resolve::{Replicas, Resolved};
use marin3r_webhook::bootstrap::{BootstrapError, BootstrapOptions, render};

/// The pod template label holding the bootstrap's hash (the original's key): a changed
/// bootstrap (the discovery service moved) rolls the pods, since Envoy reads it only at start.
pub const BOOTSTRAP_HASH_LABEL: &str = "marin3r.3scale.net/bootstrap-config-hash";
/// The Envoy container's name and the volumes' names (the original's).
pub const CONTAINER_NAME: &str = "envoy";
const CONFIG_VOLUME: &str = "envoy-bootstrap";
const TLS_VOLUME: &str = "envoy-tls";
/// The managed-by value of every child.
const MANAGED_BY: &str = "marin3r-operator";

/// What the children depend on besides the spec: read from the referenced objects.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The EnvoyConfig's `nodeID`.
    pub node_id: String,
    /// Where the discovery service listens (its Service's `<name>.<namespace>.svc`).
    pub xds_host: String,
    pub xds_port: u16,
    /// The discovery service's CA Secret, which signs the client certificate.
    pub ca_secret: String,
    /// The shutdown manager's image unless the spec names one: the operator's own.
    pub marin3r_image: String,
    /// The shutdown manager logs JSON lines, as the operator.
    pub json_logs: bool,
    /// The shutdown manager's token: the one the current Deployment carries, so the pods
    /// do not roll at every reconcile, else a new one.
    pub shutdown_token: String,
    /// Annotate the pods `prometheus.io/*` for Envoy's stats (see `plan::prometheus_annotations`).
    pub prometheus_annotations: bool,
}

/// The children of one `EnvoyDeployment`.
pub struct Gateway<'a> {
    ed: &'a EnvoyDeployment,
    spec: &'a Resolved,
    inputs: &'a Inputs,
    name: String,
    namespace: String,
}

impl<'a> Gateway<'a> {
    pub fn new(ed: &'a EnvoyDeployment, spec: &'a Resolved, inputs: &'a Inputs) -> Self {
        Self {
            ed,
            spec,
            inputs,
            name: ed.name_any(),
            namespace: ed.namespace().unwrap_or_default(),
        }
    }

    /// `marin3r-envoydeployment-<name>`.
    pub fn owned_name(&self) -> String {
        self.ed.owned_name()
    }

    /// The labels that select the Envoy pods, as the original's (Services select them).
    pub fn selector_labels(&self) -> BTreeMap<String, String> {
        labels(&self.name)
    }

    fn owned_meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.selector_labels()),
            owner_references: self.ed.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        }
    }

    /// The proxies' client certificate, signed by the discovery service's CA; its SPIFFE ID
    /// names this namespace, whose EnvoyConfigs the proxies may then be served.
    pub fn client_certificate(&self) -> DiscoveryServiceCertificate {
        let name = self.ed.client_certificate_name();
        let spec = DiscoveryServiceCertificateSpec {
            common_name: name.clone(),
            server: Some(false),
            is_ca: None,
            valid_for: i64::try_from(self.spec.client_duration.as_secs()).unwrap_or(i64::MAX),
            hosts: Some(vec![marin3r_certs::spiffe_id(
                marin3r_certs::TRUST_DOMAIN,
                &self.namespace,
            )]),
            signer: Signer {
                self_signed: None,
                ca_signed: Some(CaSigned {
                    ca_secret_ref: SecretReference {
                        name: self.inputs.ca_secret.clone(),
                        namespace: Some(self.namespace.clone()),
                    },
                }),
            },
            secret_ref: SecretReference {
                name: name.clone(),
                namespace: Some(self.namespace.clone()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let mut dsc = DiscoveryServiceCertificate::new(&name, spec);
        dsc.metadata = self.owned_meta(&name);
        dsc
    }

    /// The proxies' bootstrap: the discovery service's address and the SDS files of the
    /// client certificate (the node, cluster and admin travel on Envoy's command line).
    pub fn bootstrap(&self) -> Result<ConfigMap, BootstrapError> {
        let bootstrap = render(&BootstrapOptions::new(
            self.inputs.xds_host.clone(),
            self.inputs.xds_port,
        ))?;
        let data = bootstrap
            .files()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(ConfigMap {
            metadata: self.owned_meta(&self.owned_name()),
            data: Some(data),
            ..Default::default()
        })
    }

    /// What the sidecar builder needs to build this gateway's Envoy.
    fn sidecar_spec(&self) -> SidecarSpec {
        let s = self.spec;
        SidecarSpec {
            node_id: self.inputs.node_id.clone(),
            cluster_id: s
                .cluster_id
                .clone()
                .unwrap_or_else(|| self.inputs.node_id.clone()),
            container_name: CONTAINER_NAME.into(),
            ports: s.ports.clone(),
            envoy_image: s.image.clone(),
            config_volume: CONFIG_VOLUME.into(),
            tls_volume: TLS_VOLUME.into(),
            client_certificate: self.ed.client_certificate_name(),
            extra_args: s.extra_args.clone(),
            // The spec's ResourceRequirements are set whole on the container below.
            resources: Resources::default(),
            admin: Admin {
                port: s.admin_port,
                bind_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                access_log_path: s.admin_access_log_path.clone(),
                stats_on_port: false,
            },
            readiness_port: s.readiness_port,
            bootstrap_config_map: self.owned_name(),
            shutdown_manager: s.shutdown_manager.as_ref().map(|m| ShutdownManager {
                port: m.port,
                image: m
                    .image
                    .clone()
                    .unwrap_or_else(|| self.inputs.marin3r_image.clone()),
                drain_time: m.drain_time,
                drain_strategy: m.drain_strategy,
                extra_lifecycle_hooks: Vec::new(),
                token: self.inputs.shutdown_token.clone(),
                json_logs: self.inputs.json_logs,
            }),
            layout: Layout::Classic { hold: false },
            // The original's EnvoyDeployment has no protocol field: state of the world, as
            // its gateways always spoke.
            xds_protocol: marin3r_webhook::config::XdsProtocol::Sotw,
            prometheus_annotations: self.inputs.prometheus_annotations,
            image_pull_secrets: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// The Envoy Deployment; `bootstrap_hash` rolls its pods when the bootstrap changes.
    /// With dynamic replicas `spec.replicas` is left to the autoscaler.
    pub fn deployment(&self, bootstrap_hash: &str) -> Deployment {
        let s = self.spec;
        let sidecar_spec = self.sidecar_spec();
        let mut envoy = sidecar::container(&sidecar_spec);
        envoy.resources = s.resources.clone();
        envoy.readiness_probe = envoy.readiness_probe.map(|p| timed(p, &s.readiness));
        envoy.liveness_probe = envoy.liveness_probe.map(|p| timed(p, &s.liveness));
        let mut containers = vec![envoy];
        if let Some(manager) = &sidecar_spec.shutdown_manager {
            containers.push(sidecar::shutdown_manager_container(&sidecar_spec, manager));
        }
        let mut pod_labels = self.selector_labels();
        pod_labels.insert(BOOTSTRAP_HASH_LABEL.into(), bootstrap_hash.to_owned());
        let replicas = match &s.replicas {
            Replicas::Static(n) => Some(*n),
            Replicas::Dynamic(_) => None,
        };
        // The original's 25%/25%: with one replica, a new pod is ready before the old goes.
        let quarter = || Some(IntOrString::String("25%".into()));
        Deployment {
            metadata: self.owned_meta(&self.owned_name()),
            spec: DeploymentSpec {
                replicas,
                selector: LabelSelector {
                    match_labels: Some(self.selector_labels()),
                    ..Default::default()
                },
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_unavailable: quarter(),
                        max_surge: quarter(),
                    }),
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        // Scraped like every sidecar: Envoy's stats on the readiness port.
                        annotations: sidecar_spec.prometheus_annotations.then(|| {
                            marin3r_webhook::readiness::prometheus_annotations(s.readiness_port)
                                .into_iter()
                                .map(|(k, v)| (k.to_owned(), v))
                                .collect()
                        }),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        // Envoy and the shutdown manager never call the Kubernetes API.
                        automount_service_account_token: Some(false),
                        security_context: Some(restricted_pod_security()),
                        termination_grace_period_seconds: s
                            .shutdown_manager
                            .as_ref()
                            .map(|m| i64::from(m.drain_time) + DRAIN_GRACE_MARGIN),
                        affinity: s.affinity.clone(),
                        containers,
                        volumes: Some(sidecar::volumes(&sidecar_spec)),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The autoscaler of dynamic replicas; `None` for static ones.
    pub fn autoscaler(&self) -> Option<HorizontalPodAutoscaler> {
        let Replicas::Dynamic(d) = &self.spec.replicas else {
            return None;
        };
        Some(HorizontalPodAutoscaler {
            metadata: self.owned_meta(&self.owned_name()),
            spec: HorizontalPodAutoscalerSpec {
                scale_target_ref: CrossVersionObjectReference {
                    api_version: Some("apps/v1".into()),
                    kind: "Deployment".into(),
                    name: self.owned_name(),
                },
                min_replicas: d.min_replicas,
                max_replicas: d.max_replicas,
                metrics: d.metrics.clone(),
                behavior: d.behavior.clone(),
            },
            ..Default::default()
        })
    }

    /// The PodDisruptionBudget when the spec asks for one.
    pub fn pod_disruption_budget(&self) -> Option<PodDisruptionBudget> {
        let pdb = self.spec.pod_disruption_budget.as_ref()?;
        Some(PodDisruptionBudget {
            metadata: self.owned_meta(&self.owned_name()),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: pdb.min_available.clone(),
                max_unavailable: pdb.max_unavailable.clone(),
                selector: Some(LabelSelector {
                    match_labels: Some(self.selector_labels()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// The labels of every child and the Envoy pods' selector (the original's four).
pub fn labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "marin3r".into()),
        ("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
        (
            "app.kubernetes.io/component".into(),
            "envoy-deployment".into(),
        ),
        ("app.kubernetes.io/instance".into(), instance.into()),
    ])
}

/// The label selector (as a string) of every gateway child, for the controller's watches.
pub const CHILDREN_SELECTOR: &str =
    "app.kubernetes.io/component=envoy-deployment,app.kubernetes.io/managed-by=marin3r-operator";

/// The bootstrap's hash: the first 16 hex digits of the SHA-256 of its files.
pub fn bootstrap_hash(config_map: &ConfigMap) -> String {
    let mut hasher = Sha256::new();
    for (k, v) in config_map.data.iter().flatten() {
        hasher.update(k.as_bytes());
        hasher.update([0]);
        hasher.update(v.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A probe of the readiness listener with the spec's timings.
fn timed(mut probe: Probe, spec: &ProbeSpec) -> Probe {
    probe.initial_delay_seconds = Some(spec.initial_delay_seconds);
    probe.timeout_seconds = Some(spec.timeout_seconds);
    probe.period_seconds = Some(spec.period_seconds);
    probe.success_threshold = Some(spec.success_threshold);
    probe.failure_threshold = Some(spec.failure_threshold);
    probe
}

/// The field manager that keeps a Deployment's replica count when its gateway turns to
/// dynamic replicas: the operator's own apply then leaves `spec.replicas` out, and a field
/// no manager applies any more is removed by the API server (so defaulted to 1, scaling the
/// gateway down until its autoscaler scales it back up). Applied once, with the count as it
/// is, this manager keeps the field; the autoscaler's first change takes it over.
pub const REPLICAS_HANDOVER_MANAGER: &str = "marin3r-operator-replicas-handover";

/// The apply that hands `deployment`'s replica count over to [`REPLICAS_HANDOVER_MANAGER`],
/// when `manager`'s own apply still owns it (the gateway had static replicas); `None`
/// otherwise.
pub fn replicas_handover(deployment: &Deployment, manager: &str) -> Option<serde_json::Value> {
    let replicas = deployment.spec.replicas?;
    let owned = deployment
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|e| {
            e.manager.as_deref() == Some(manager)
                && e.operation.as_deref() == Some("Apply")
                && e.subresource.as_deref().unwrap_or_default().is_empty()
                && e.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        });
    owned.then(|| {
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": deployment.name_any(), "namespace": deployment.namespace()},
            "spec": {"replicas": replicas},
        })
    })
}

/// The shutdown manager token a Deployment built here carries, if any.
pub fn current_token(deployment: &Deployment) -> Option<String> {
    deployment
        .spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .filter(|c| c.name == marin3r_webhook::config::SHUTDOWN_MANAGER_CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == sidecar::SHUTDOWN_TOKEN_ENV)
        .and_then(|e| e.value.clone())
        .filter(|t| !t.is_empty())
}
