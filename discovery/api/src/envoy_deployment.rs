//! The `EnvoyDeployment` resource (`operator.marin3r.3scale.net/v1alpha1`): Envoy run as a
//! Deployment of its own (an edge proxy or gateway), configured by an `EnvoyConfig` through
//! a `DiscoveryService` of the same namespace. Field names, defaults and the two
//! one-of rules are the original MARIN3R's (v0.13.3); the checks of [`EnvoyDeployment::resolve`]
//! name the field that is wrong.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DeploymentStatus;
use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscalerBehavior, MetricSpec};
use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Deployment of Envoy proxies (a gateway) configured by an `EnvoyConfig`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "operator.marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyDeployment",
    namespaced,
    shortname = "envoydep",
    category = "marin3r",
    doc = "Envoy run as a Deployment of its own (an edge proxy or gateway): the operator runs the Envoy pods, issues their client certificate from the referenced DiscoveryService's CA and writes their bootstrap; the discovery service configures them from the referenced EnvoyConfig, with revisions and rollback as for sidecars. The pods are annotated `prometheus.io/*` for Envoy's stats unless the EnvoyDeployment's annotation `marin3r.3scale.net/prometheus-annotations` (else the DiscoveryService's `spec.sidecar.prometheusAnnotations`) says false.",
    status = "EnvoyDeploymentStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Deployment","type":"string","jsonPath":".status.deploymentName"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.deploymentStatus.readyReplicas"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyDeploymentSpec {
    /// The EnvoyConfig, in the same namespace, that holds this Deployment's Envoy resources;
    /// its `nodeID` is the proxies' node id.
    pub envoy_config_ref: String,
    /// The DiscoveryService, in the same namespace, that configures the proxies and whose CA
    /// signs their client certificate.
    pub discovery_service_ref: String,
    /// Envoy's `--service-cluster` (default: the EnvoyConfig's `nodeID`).
    #[serde(default, rename = "clusterID", skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// The ports the Envoy container exposes (the listeners' ports a Service targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<ContainerPort>>,
    /// The Envoy image (default `envoyproxy/envoy:v1.40.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Requests and limits of the Envoy container (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Lifetime of the proxies' client certificate, a Go duration (default `48h`); it is
    /// renewed before it expires and Envoy reloads it without a restart.
    #[serde(default, rename = "duration", skip_serializing_if = "Option::is_none")]
    pub client_certificate_duration: Option<String>,
    /// More arguments for Envoy (the bootstrap, node and cluster flags, and the drain flags
    /// when `shutdownManager` is set, are the operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_args: Option<Vec<String>>,
    /// Envoy's admin port (default 9901), on the pod's loopback only; the readiness listener
    /// that kubelet probes is the next port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_port: Option<u32>,
    /// Where the admin interface writes its access log (default `/dev/null`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access_log_path: Option<String>,
    /// How many replicas: `static` or `dynamic` (an autoscaler), exactly one (default:
    /// static 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicasSpec>,
    /// The Envoy container's liveness probe timings (default 30s delay, 1s timeout, every
    /// 10s, 1 success, 10 failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<ProbeSpec>,
    /// The Envoy container's readiness probe timings (default 15s delay, 1s timeout, every
    /// 5s, 1 success, 1 failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<ProbeSpec>,
    /// The Envoy pods' affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// A PodDisruptionBudget for the Envoy pods (`minAvailable` or `maxUnavailable`, not
    /// both); none when unset or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<PodDisruptionBudgetSpec>,
    /// A graceful drain on pod termination: a `marin3r shutdown-manager` container drains
    /// Envoy's listeners and waits for the connections before Envoy stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_manager: Option<ShutdownManager>,
    /// Accepted for compatibility and without effect: marin3r runs no init container (the
    /// operator writes the bootstrap, and per-pod settings travel on Envoy's command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_manager: Option<InitManager>,
}

/// A port of the Envoy container.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ContainerPort {
    /// The port's name (an IANA service name: at most 15 lowercase letters, digits and
    /// '-'), which a Service's `targetPort` may use.
    pub name: String,
    /// The port number.
    pub port: i32,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

/// How many replicas the Deployment runs. `static` and `dynamic` exclude each other.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.static) != has(self.dynamic)",
    "message": "set exactly one of static (a fixed number) or dynamic (an autoscaler)",
}]))]
pub struct ReplicasSpec {
    /// A fixed number of replicas.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_: Option<i32>,
    /// An autoscaling/v2 HorizontalPodAutoscaler between `minReplicas` and `maxReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic: Option<DynamicReplicasSpec>,
}

/// The HorizontalPodAutoscaler's bounds, metrics and behavior.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
    "message": "minReplicas must not be more than maxReplicas",
}]))]
pub struct DynamicReplicasSpec {
    /// The fewest replicas (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_replicas: Option<i32>,
    /// The most replicas; at least `minReplicas`.
    pub max_replicas: i32,
    /// What the autoscaler scales on (default, as Kubernetes defaults it: 80% average CPU
    /// utilization).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Vec<MetricSpec>>,
    /// How fast it scales up and down (default: Kubernetes' scaling rules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

/// A probe's timings; kubelet probes the readiness listener's `GET /ready`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSpec {
    /// Seconds after the container starts before the first probe.
    pub initial_delay_seconds: i32,
    /// Seconds after which one probe times out.
    pub timeout_seconds: i32,
    /// Seconds between probes.
    pub period_seconds: i32,
    /// Consecutive successes that count as success after a failure (1 for liveness).
    pub success_threshold: i32,
    /// Consecutive failures that count as failure.
    pub failure_threshold: i32,
}

/// The PodDisruptionBudget of the Envoy pods: one of the two fields.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.minAvailable) && has(self.maxUnavailable))",
    "message": "set minAvailable or maxUnavailable, not both",
}]))]
pub struct PodDisruptionBudgetSpec {
    /// Evictions are allowed while at least this many (or this percentage of) pods stay
    /// available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// Evictions are allowed while at most this many (or this percentage of) pods are
    /// unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// The graceful drain of the Envoy pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownManager {
    /// The shutdown manager's image (default: the operator's own marin3r image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The shutdown manager's port (default 8090).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_port: Option<u32>,
    /// Seconds Envoy drains its listeners for on shutdown (default 300); also the drain
    /// time of listeners changed or removed through LDS. The pods' grace period is this
    /// plus 15 seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_time: Option<i64>,
    /// `gradual` (default) or `immediate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["gradual", "immediate"]))]
    pub drain_strategy: Option<String>,
}

/// The original's init manager; see `spec.initManager`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct InitManager {
    /// The init manager's image (unused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// The gateway's readiness and its Deployment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyDeploymentStatus {
    /// `Ready`, with the reason when it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The name of the Envoy Deployment (`marin3r-envoydeployment-<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_name: Option<String>,
    /// The Envoy Deployment's own status, as its controller last wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_status: Option<DeploymentStatus>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The default client certificate lifetime (the original's).
pub const DEFAULT_CLIENT_CERT_DURATION: &str = "48h";
/// The original's default `adminAccessLogPath`: no admin access log.
pub const NO_ACCESS_LOG: &str = "/dev/null";

impl EnvoyDeployment {
    /// `marin3r-envoydeployment-<name>`: the Deployment, its bootstrap ConfigMap, the
    /// autoscaler and the PodDisruptionBudget.
    pub fn owned_name(&self) -> String {
        format!(
            "marin3r-envoydeployment-{}",
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// `envoy-client-cert-<name>`: the client certificate and its Secret.
    pub fn client_certificate_name(&self) -> String {
        format!(
            "envoy-client-cert-{}",
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

pub(super) fn parse_duration(value: Option<&str>) -> Result<Duration, String> {
    let text = value.unwrap_or(DEFAULT_CLIENT_CERT_DURATION);
    let d = super::duration::parse_go_duration(text).map_err(|e| format!("spec.duration: {e}"))?;
    if d < Duration::from_secs(60) {
        return Err(format!("spec.duration: {text:?} is shorter than 1m"));
    }
    Ok(d)
}
