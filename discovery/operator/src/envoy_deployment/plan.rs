//! The `EnvoyDeployment` controller's decisions, pure: from the gateway, its DiscoveryService,
//! its EnvoyConfig and its current Deployment to the children to apply, and from what
//! applying them returned to the status, the Events and when to look again.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_controller::{Note, set_condition};
use marin3r_webhook::annotations::{PROMETHEUS_ANNOTATIONS, parse_bool};
use marin3r_webhook::sidecar::NoRandomness;

use super::build::{Gateway, Inputs, bootstrap_hash, current_token};
use crate::plan::{certificate_ready, deployment_state};
use marin3r_api::EnvoyConfig;
use marin3r_api::discovery_service::DiscoveryService;
use marin3r_api::envoy_deployment::{EnvoyDeployment, EnvoyDeploymentStatus};
use marin3r_api::envoy_deployment_resolve::Resolved;

const READY: &str = "Ready";
/// How soon to look again while something is not ready yet (owned objects usually wake the
/// controller sooner).
const NOT_READY_RETRY: Duration = Duration::from_secs(10);
/// How often a ready gateway is looked at anyway.
const READY_RESYNC: Duration = Duration::from_secs(300);

marin3r_controller::reasons! {
    /// The reasons of the Ready condition and of the gateway's Events.
    pub enum Reason {
        Ready,
        InvalidSpec,
        DiscoveryServiceNotFound,
        EnvoyConfigNotFound,
        CertificateNotReady,
        DeploymentNotReady,
        /// No shutdown manager token could be drawn (the system's random source failed).
        ShutdownTokenUnavailable,
        InitManagerUnused,
    }
}

impl Reason {
    /// Progress towards ready is Normal; a problem only a user can fix is a Warning.
    fn is_progress(self) -> bool {
        matches!(
            self,
            Self::Ready | Self::CertificateNotReady | Self::DeploymentNotReady
        )
    }
}

/// Why the gateway is not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    pub reason: Reason,
    pub message: String,
}

impl NotReady {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            reason: Reason::InvalidSpec,
            message: message.into(),
        }
    }
}

/// What the controller read for one gateway.
pub struct Observed<'a> {
    pub ed: &'a EnvoyDeployment,
    pub spec: Result<Resolved, String>,
    /// The referenced DiscoveryService, if it exists.
    pub discovery_service: Option<DiscoveryService>,
    /// The referenced EnvoyConfig, if it exists.
    pub envoy_config: Option<EnvoyConfig>,
    /// The Deployment as it is now.
    pub deployment: Option<Deployment>,
    /// The operator's image: the DiscoveryService's default and the shutdown manager's.
    pub marin3r_image: String,
    /// The operator logs JSON: so do the shutdown managers.
    pub json_logs: bool,
    pub now: Time,
}

/// The children to apply.
#[derive(Debug, Clone)]
pub struct Children {
    pub certificate: DiscoveryServiceCertificate,
    pub bootstrap: ConfigMap,
    pub deployment: Deployment,
    pub autoscaler: Option<HorizontalPodAutoscaler>,
    pub pod_disruption_budget: Option<PodDisruptionBudget>,
    /// Events to publish whatever comes of applying.
    pub events: Vec<Note>,
}

/// The children, or why the gateway cannot be built. `new_token` draws a shutdown manager
/// token when the current Deployment has none.
pub fn decide(
    obs: &Observed<'_>,
    new_token: impl FnOnce() -> Result<String, NoRandomness>,
) -> Result<Children, NotReady> {
    let spec = obs.spec.as_ref().map_err(NotReady::invalid)?;
    let ns = obs.ed.namespace().unwrap_or_default();
    let Some(ds) = &obs.discovery_service else {
        return Err(NotReady {
            reason: Reason::DiscoveryServiceNotFound,
            message: format!(
                "spec.discoveryServiceRef: DiscoveryService {:?} not found in namespace {ns}",
                spec.discovery_service
            ),
        });
    };
    let ds_spec = ds.resolve(&obs.marin3r_image).map_err(|e| {
        NotReady::invalid(format!(
            "spec.discoveryServiceRef: DiscoveryService {:?} has a bad spec: {e}",
            spec.discovery_service
        ))
    })?;
    let Some(ec) = &obs.envoy_config else {
        return Err(NotReady {
            reason: Reason::EnvoyConfigNotFound,
            message: format!(
                "spec.envoyConfigRef: EnvoyConfig {:?} not found in namespace {ns}",
                spec.envoy_config
            ),
        });
    };
    let shutdown_token = match obs.deployment.as_ref().and_then(current_token) {
        Some(token) => token,
        None if spec.shutdown_manager.is_some() => new_token().map_err(|e| NotReady {
            reason: Reason::ShutdownTokenUnavailable,
            message: format!("drawing the shutdown manager's token: {e}"),
        })?,
        None => String::new(),
    };
    let inputs = Inputs {
        prometheus_annotations: prometheus_annotations(obs.ed, ds)?,
        node_id: ec.spec.node_id.clone(),
        xds_host: format!("{}.{}.svc", ds_spec.service_name, ns),
        xds_port: ds_spec.xds_port,
        ca_secret: ds_spec.ca_secret.clone(),
        marin3r_image: obs.marin3r_image.clone(),
        json_logs: obs.json_logs,
        shutdown_token,
    };
    let gateway = Gateway::new(obs.ed, spec, &inputs);
    let bootstrap = gateway
        .bootstrap()
        .map_err(|e| NotReady::invalid(format!("cannot render the bootstrap: {e}")))?;
    let deployment = gateway.deployment(&bootstrap_hash(&bootstrap));
    let mut events = Vec::new();
    let first_look =
        obs.ed.status.as_ref().and_then(|s| s.observed_generation) != obs.ed.metadata.generation;
    if spec.init_manager && first_look {
        events.push(Note::warning(
            Reason::InitManagerUnused,
            "spec.initManager has no effect: marin3r runs no init container (the operator \
             writes the bootstrap, and per-pod settings travel on Envoy's command line)",
        ));
    }
    Ok(Children {
        certificate: gateway.client_certificate(),
        bootstrap,
        deployment,
        autoscaler: gateway.autoscaler(),
        pod_disruption_budget: gateway.pod_disruption_budget(),
        events,
    })
}

/// Whether the gateway's pods get the `prometheus.io/*` annotations: as the sidecar's pod
/// annotation decides for a pod, the EnvoyDeployment's own
/// `marin3r.3scale.net/prometheus-annotations` decides for its pods; without it, the
/// DiscoveryService's `spec.sidecar.prometheusAnnotations`; without that, yes.
pub fn prometheus_annotations(
    ed: &EnvoyDeployment,
    ds: &DiscoveryService,
) -> Result<bool, NotReady> {
    match ed.annotations().get(PROMETHEUS_ANNOTATIONS) {
        Some(value) => parse_bool(value).map_err(|e| {
            NotReady::invalid(format!(
                "metadata.annotations[{PROMETHEUS_ANNOTATIONS}]: {value:?}: {e}"
            ))
        }),
        None => Ok(ds
            .spec
            .sidecar
            .as_ref()
            .and_then(|s| s.prometheus_annotations)
            .unwrap_or(true)),
    }
}

/// What to write after acting.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: EnvoyDeploymentStatus,
    pub events: Vec<Note>,
    pub requeue: Option<Duration>,
}

/// Readiness once everything is applied: the certificate first, then the rollout.
/// `deployment`: the Deployment as the API server now has it (`None` while the certificate
/// is not issued yet and none was applied before).
pub fn report(
    obs: &Observed<'_>,
    certificate: &DiscoveryServiceCertificate,
    deployment: Option<&Deployment>,
) -> Outcome {
    let mut status = obs.ed.status.clone().unwrap_or_default();
    status.deployment_name = deployment.map(ResourceExt::name_any);
    status.deployment_status = deployment.and_then(|d| d.status.clone());
    let (rolled_out, summary) = deployment_state(deployment);
    let result = if !certificate_ready(certificate) {
        Err(NotReady {
            reason: Reason::CertificateNotReady,
            message: format!(
                "waiting for the client certificate {}",
                certificate.name_any()
            ),
        })
    } else if !rolled_out {
        Err(NotReady {
            reason: Reason::DeploymentNotReady,
            message: format!(
                "Deployment {} is rolling out or has no ready pod ({})",
                obs.ed.owned_name(),
                summary.as_deref().unwrap_or("0/1")
            ),
        })
    } else {
        Ok(())
    };
    finish(obs, status, result)
}

/// The status of a gateway that cannot be built or applied: what was applied before stays.
pub fn not_ready(obs: &Observed<'_>, not_ready: NotReady) -> Outcome {
    let status = obs.ed.status.clone().unwrap_or_default();
    finish(obs, status, Err(not_ready))
}

/// Sets the Ready condition; an Event when readiness or its reason changes.
fn finish(
    obs: &Observed<'_>,
    mut status: EnvoyDeploymentStatus,
    result: Result<(), NotReady>,
) -> Outcome {
    let (reason, message) = match &result {
        Ok(()) => (
            Reason::Ready,
            "the Envoy Deployment is rolled out and its client certificate is ready".to_owned(),
        ),
        Err(n) => (n.reason, n.message.clone()),
    };
    let generation = obs.ed.metadata.generation;
    let changed = set_condition(
        &mut status.conditions,
        READY,
        result.is_ok(),
        reason,
        &message,
        generation,
        &obs.now,
    );
    status.observed_generation = generation;
    let events = match (changed, reason.is_progress()) {
        (false, _) => Vec::new(),
        (true, true) => vec![Note::normal(reason, message)],
        (true, false) => vec![Note::warning(reason, message)],
    };
    let requeue = match &result {
        Ok(()) => Some(READY_RESYNC),
        // A missing reference wakes the controller when it appears; a bad spec when it is
        // changed.
        Err(n) if !n.reason.is_progress() => None,
        Err(_) => Some(NOT_READY_RETRY),
    };
    Outcome {
        status,
        events,
        requeue,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
