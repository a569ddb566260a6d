//! The discovery pod itself: its container, Deployment, Service and PodDisruptionBudget.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use marin3r_api::discovery_service::SERVER_CERT_HASH_LABEL;

use super::{CONTAINER_NAME, Children, SERVER_CERT_DIR, Scope};

impl Children<'_> {
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
        Container {
            name: CONTAINER_NAME.into(),
            image: Some(s.image.clone()),
            args: Some(self.args()),
            env: Some(vec![
                field_env("POD_NAME", "metadata.name"),
                field_env("POD_NAMESPACE", "metadata.namespace"),
                EnvVar {
                    name: "TMPDIR".into(),
                    value: Some(TMP_DIR.into()),
                    ..Default::default()
                },
            ]),
            ports: Some(vec![
                port("xds", s.xds_port),
                port("webhook", s.webhook_port),
                port("metrics", s.metrics_port),
                port("probes", s.probe_port),
            ]),
            readiness_probe: Some(self.probe("/readyz", 0, 2, 3)),
            liveness_probe: Some(self.probe("/healthz", 30, 10, 6)),
            resources: Some(s.resources.clone().unwrap_or_else(default_resources)),
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
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "server-cert".into(),
                    mount_path: SERVER_CERT_DIR.into(),
                    read_only: Some(true),
                    ..Default::default()
                },
                VolumeMount {
                    name: TMP.into(),
                    mount_path: TMP_DIR.into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    /// `marin3r discovery-service` and its flags.
    fn args(&self) -> Vec<String> {
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
        args.extend(s.sidecar_args.iter().cloned());
        if s.debug {
            args.push("--debug".into());
        }
        if s.json_logs {
            args.push("--log-format=json".into());
        }
        if let Some(n) = s.max_proxies_per_namespace {
            args.push(format!("--xds-max-connections-per-namespace={n}"));
            args.push(format!("--xds-max-streams-per-namespace={n}"));
        }
        args
    }

    /// An HTTP probe on the probe port.
    fn probe(&self, path: &str, initial: i32, period: i32, failures: i32) -> Probe {
        Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path.into()),
                port: IntOrString::Int(i32::from(self.spec.probe_port)),
                scheme: Some("HTTP".into()),
                ..Default::default()
            }),
            initial_delay_seconds: Some(initial),
            period_seconds: Some(period),
            failure_threshold: Some(failures),
            timeout_seconds: Some(1),
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
                        security_context: Some(restricted_pod_security()),
                        containers: vec![container],
                        affinity: Some(s.affinity.clone()),
                        // Beside any affinity: a preference only, and it counts only the
                        // nodes the affinity allows (the scheduler's default
                        // `nodeAffinityPolicy: Honor`).
                        topology_spread_constraints: Some(self.spread()),
                        volumes: Some(vec![
                            Volume {
                                name: "server-cert".into(),
                                secret: Some(SecretVolumeSource {
                                    secret_name: Some(s.server_secret.clone()),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                            // The Envoy judge's bootstraps (the root is read-only), in memory.
                            Volume {
                                name: TMP.into(),
                                empty_dir: Some(EmptyDirVolumeSource {
                                    medium: Some("Memory".into()),
                                    size_limit: Some(Quantity("64Mi".into())),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            },
                        ]),
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
}

/// The pod-level part of Pod Security `restricted` that every pod the operator runs has (the
/// discovery service's, the gateways'): no root, the runtime's default seccomp profile.
pub fn restricted_pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The discovery pod's temporary folder (`TMPDIR`), where the Envoy judge writes each
/// bootstrap: the root is read-only. Not `/tmp`, which images and tools keep for themselves.
const TMP: &str = "tmp";
const TMP_DIR: &str = "/var/tmp";

/// What a discovery pod asks for when its DiscoveryService says nothing: its steady use, and
/// a memory ceiling above the xDS byte budgets and the judge's Envoys (four at a time), so
/// that a leak or an attack ends this pod, not the node.
fn default_resources() -> ResourceRequirements {
    let quantities = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    };
    ResourceRequirements {
        requests: Some(quantities(&[("cpu", "100m"), ("memory", "256Mi")])),
        limits: Some(quantities(&[("memory", "1Gi")])),
        ..Default::default()
    }
}
