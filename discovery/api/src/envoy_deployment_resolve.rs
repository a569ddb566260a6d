//! An `EnvoyDeployment` spec with its defaults applied and every field checked, as the
//! controller builds the gateway from it. A check that fails names the field, so a bad spec
//! becomes a `Ready=False` condition before anything is applied.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use marin3r_certs::names::is_dns_subdomain;
pub use marin3r_webhook::annotations::{DrainStrategy, PortSpec as ResolvedPort, Protocol};
use marin3r_webhook::config::{DEFAULT_ADMIN_PORT, DEFAULT_DRAIN_TIME, DEFAULT_ENVOY_IMAGE};

use super::envoy_deployment::{
    DynamicReplicasSpec, EnvoyDeployment, NO_ACCESS_LOG, PodDisruptionBudgetSpec, ProbeSpec,
    parse_duration,
};

/// The shutdown manager's port unless `serverPort` says otherwise (the original's).
pub const DEFAULT_SHUTDOWN_MANAGER_PORT: u16 = 8090;

/// How many replicas, and who decides.
#[derive(Debug, Clone, PartialEq)]
pub enum Replicas {
    /// The operator sets `spec.replicas` of the Deployment.
    Static(i32),
    /// A HorizontalPodAutoscaler does; the operator leaves `spec.replicas` to it.
    Dynamic(DynamicReplicasSpec),
}

/// `spec.shutdownManager`, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedShutdownManager {
    /// `None`: the operator's own image.
    pub image: Option<String>,
    pub port: u16,
    pub drain_time: u32,
    pub drain_strategy: DrainStrategy,
}

/// An `EnvoyDeployment` spec with every default applied and every field checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub envoy_config: String,
    pub discovery_service: String,
    /// `None`: the EnvoyConfig's node id.
    pub cluster_id: Option<String>,
    pub ports: Vec<ResolvedPort>,
    pub image: String,
    pub resources: Option<ResourceRequirements>,
    pub client_duration: Duration,
    pub extra_args: Vec<String>,
    pub admin_port: u16,
    /// The readiness listener kubelet probes: the port after the admin's.
    pub readiness_port: u16,
    /// `None`: no admin access log.
    pub admin_access_log_path: Option<String>,
    pub replicas: Replicas,
    pub liveness: ProbeSpec,
    pub readiness: ProbeSpec,
    pub affinity: Option<Affinity>,
    /// `None`: no PodDisruptionBudget (unset, or set with neither field).
    pub pod_disruption_budget: Option<PodDisruptionBudgetSpec>,
    pub shutdown_manager: Option<ResolvedShutdownManager>,
    /// Whether `spec.initManager` is set (it has no effect; the controller says so).
    pub init_manager: bool,
}

/// The original's liveness probe: 30s delay, 1s timeout, every 10s, 1 success, 10 failures.
pub const DEFAULT_LIVENESS: ProbeSpec = ProbeSpec {
    initial_delay_seconds: 30,
    timeout_seconds: 1,
    period_seconds: 10,
    success_threshold: 1,
    failure_threshold: 10,
};

/// The original's readiness probe: 15s delay, 1s timeout, every 5s, 1 success, 1 failure.
pub const DEFAULT_READINESS: ProbeSpec = ProbeSpec {
    initial_delay_seconds: 15,
    timeout_seconds: 1,
    period_seconds: 5,
    success_threshold: 1,
    failure_threshold: 1,
};

impl EnvoyDeployment {
    /// Applies the defaults and checks the spec; the error names the field.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let spec = &self.spec;
        check_names(self)?;
        let image = match spec.image.as_deref() {
            Some("") => return Err("spec.image: must not be empty when set".into()),
            Some(image) => image.to_owned(),
            None => DEFAULT_ENVOY_IMAGE.to_owned(),
        };
        let admin_port = admin_port(spec.admin_port)?;
        let readiness_port = admin_port + 1;
        let shutdown_manager = spec
            .shutdown_manager
            .as_ref()
            .map(resolve_shutdown_manager)
            .transpose()?;
        let ports = ports(self, admin_port, readiness_port, shutdown_manager.as_ref())?;
        let extra_args = spec.extra_args.clone().unwrap_or_default();
        marin3r_webhook::annotations::check_extra_args(&extra_args, shutdown_manager.is_some())
            .map_err(|e| format!("spec.extraArgs: {e}"))?;
        let admin_access_log_path = admin_access_log_path(spec.admin_access_log_path.as_deref())?;
        let liveness = spec.liveness_probe.clone().unwrap_or(DEFAULT_LIVENESS);
        check_probe("spec.livenessProbe", &liveness)?;
        if liveness.success_threshold != 1 {
            return Err("spec.livenessProbe.successThreshold: must be 1".into());
        }
        let readiness = spec.readiness_probe.clone().unwrap_or(DEFAULT_READINESS);
        check_probe("spec.readinessProbe", &readiness)?;
        Ok(Resolved {
            envoy_config: spec.envoy_config_ref.clone(),
            discovery_service: spec.discovery_service_ref.clone(),
            cluster_id: spec.cluster_id.clone(),
            ports,
            image,
            resources: spec.resources.clone(),
            client_duration: parse_duration(spec.client_certificate_duration.as_deref())?,
            extra_args,
            admin_port,
            readiness_port,
            admin_access_log_path,
            replicas: replicas(self)?,
            liveness,
            readiness,
            affinity: spec.affinity.clone(),
            pod_disruption_budget: pod_disruption_budget(self)?,
            shutdown_manager,
            init_manager: spec.init_manager.is_some(),
        })
    }
}

/// The names the EnvoyDeployment's objects and references are made of.
fn check_names(ed: &EnvoyDeployment) -> Result<(), String> {
    let spec = &ed.spec;
    let name = ed.metadata.name.as_deref().unwrap_or_default();
    if name.len() > 63 {
        return Err(format!(
            "metadata.name {name:?} is longer than 63 characters; it is the value of the \
             app.kubernetes.io/instance label that selects the Envoy pods"
        ));
    }
    for (field, value) in [
        ("spec.envoyConfigRef", &spec.envoy_config_ref),
        ("spec.discoveryServiceRef", &spec.discovery_service_ref),
    ] {
        if !is_dns_subdomain(value) {
            return Err(format!("{field}: {value:?} is not an object name"));
        }
    }
    if spec.cluster_id.as_deref().is_some_and(str::is_empty) {
        return Err("spec.clusterID: must not be empty when set".into());
    }
    Ok(())
}

/// `spec.adminPort`, which leaves room for the readiness listener on the next port.
fn admin_port(port: Option<u32>) -> Result<u16, String> {
    let Some(p) = port else {
        return Ok(DEFAULT_ADMIN_PORT);
    };
    u16::try_from(p)
        .ok()
        .filter(|p| (1..u16::MAX).contains(p))
        .ok_or_else(|| {
            format!(
                "spec.adminPort: {p} is not a port between 1 and 65534 (the readiness \
                 listener takes the next one)"
            )
        })
}

/// `spec.adminAccessLogPath`: an absolute path, else none.
fn admin_access_log_path(path: Option<&str>) -> Result<Option<String>, String> {
    match path {
        None | Some(NO_ACCESS_LOG) => Ok(None),
        Some(path) if path.starts_with('/') => Ok(Some(path.to_owned())),
        Some(path) => Err(format!(
            "spec.adminAccessLogPath: {path:?} is not an absolute path"
        )),
    }
}

fn resolve_shutdown_manager(
    m: &super::envoy_deployment::ShutdownManager,
) -> Result<ResolvedShutdownManager, String> {
    if m.image.as_deref() == Some("") {
        return Err("spec.shutdownManager.image: must not be empty when set".into());
    }
    let port = match m.server_port {
        None => DEFAULT_SHUTDOWN_MANAGER_PORT,
        Some(p) => u16::try_from(p).ok().filter(|p| *p > 0).ok_or_else(|| {
            format!("spec.shutdownManager.serverPort: {p} is not a port between 1 and 65535")
        })?,
    };
    let max = marin3r_webhook::annotations::MAX_DRAIN_TIME;
    let drain_time = match m.drain_time {
        None => DEFAULT_DRAIN_TIME,
        Some(t) => u32::try_from(t).ok().filter(|t| *t <= max).ok_or_else(|| {
            format!(
                "spec.shutdownManager.drainTime: {t} is not between 0 and {max} seconds (7 days)"
            )
        })?,
    };
    let drain_strategy = match m.drain_strategy.as_deref() {
        None | Some("gradual") => DrainStrategy::Gradual,
        Some("immediate") => DrainStrategy::Immediate,
        Some(other) => {
            return Err(format!(
                "spec.shutdownManager.drainStrategy: {other:?} is not one of gradual, immediate"
            ));
        }
    };
    Ok(ResolvedShutdownManager {
        image: m.image.clone(),
        port,
        drain_time,
        drain_strategy,
    })
}

/// `spec.ports`, checked: IANA service names, distinct names and ports, none of them a port
/// the pod already uses (admin, readiness, shutdown manager).
fn ports(
    ed: &EnvoyDeployment,
    admin: u16,
    readiness: u16,
    manager: Option<&ResolvedShutdownManager>,
) -> Result<Vec<ResolvedPort>, String> {
    let mut taken = vec![(admin, "the admin port (spec.adminPort)".to_owned())];
    taken.push((
        readiness,
        "the readiness listener's port (spec.adminPort + 1)".into(),
    ));
    if let Some(m) = manager {
        taken.push((
            m.port,
            "the shutdown manager's port (spec.shutdownManager.serverPort)".into(),
        ));
    }
    let mut out: Vec<ResolvedPort> = Vec::new();
    for (i, p) in ed.spec.ports.iter().flatten().enumerate() {
        let field = format!("spec.ports[{i}]");
        if !is_port_name(&p.name) {
            return Err(format!(
                "{field}.name: {:?} is not a port name (at most 15 lowercase letters, digits \
                 and '-', with a letter, no '-' at either end or twice in a row)",
                p.name
            ));
        }
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{field}.port: {} is not between 1 and 65535", p.port))?;
        let protocol = match p.protocol.as_deref() {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            Some(other) => {
                return Err(format!(
                    "{field}.protocol: {other:?} is not one of TCP, UDP, SCTP"
                ));
            }
        };
        if let Some(j) = out.iter().position(|o| o.name == p.name) {
            return Err(format!(
                "{field}.name: {:?} is also spec.ports[{j}]'s name",
                p.name
            ));
        }
        if let Some(j) = out
            .iter()
            .position(|o| o.port == port && o.protocol == protocol)
        {
            return Err(format!(
                "{field}.port: {port} is also spec.ports[{j}]'s port"
            ));
        }
        if let Some((_, what)) = taken.iter().find(|(t, _)| *t == port) {
            return Err(format!("{field}.port: {port} is {what}"));
        }
        out.push(ResolvedPort {
            name: p.name.clone(),
            port,
            protocol,
            host_port: None,
        });
    }
    Ok(out)
}

/// Kubernetes' IANA_SVC_NAME rule for container port names.
fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn check_probe(field: &str, p: &ProbeSpec) -> Result<(), String> {
    if p.initial_delay_seconds < 0 {
        return Err(format!("{field}.initialDelaySeconds: must be at least 0"));
    }
    for (name, value) in [
        ("timeoutSeconds", p.timeout_seconds),
        ("periodSeconds", p.period_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if value < 1 {
            return Err(format!("{field}.{name}: {value} must be at least 1"));
        }
    }
    Ok(())
}

/// `spec.replicas`: static or dynamic, not both (default static 1).
fn replicas(ed: &EnvoyDeployment) -> Result<Replicas, String> {
    let Some(spec) = &ed.spec.replicas else {
        return Ok(Replicas::Static(1));
    };
    match (spec.static_, &spec.dynamic) {
        (Some(_), Some(_)) => Err(
            "spec.replicas: only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed"
                .into(),
        ),
        (None, None) => Err(
            "spec.replicas: one of 'spec.replicas.static' or 'spec.replicas.dynamic' is required"
                .into(),
        ),
        (Some(n), None) if n < 0 => Err(format!(
            "spec.replicas.static: {n} must be at least 0"
        )),
        (Some(n), None) => Ok(Replicas::Static(n)),
        (None, Some(d)) => {
            let min = d.min_replicas.unwrap_or(1);
            if min < 1 {
                return Err(format!(
                    "spec.replicas.dynamic.minReplicas: {min} must be at least 1"
                ));
            }
            if d.max_replicas < min {
                return Err(format!(
                    "spec.replicas.dynamic.maxReplicas: {} must be at least minReplicas ({min})",
                    d.max_replicas
                ));
            }
            Ok(Replicas::Dynamic(d.clone()))
        }
    }
}

/// `spec.podDisruptionBudget`: `minAvailable` or `maxUnavailable`, not both; `None` when
/// neither is set.
fn pod_disruption_budget(ed: &EnvoyDeployment) -> Result<Option<PodDisruptionBudgetSpec>, String> {
    let Some(pdb) = &ed.spec.pod_disruption_budget else {
        return Ok(None);
    };
    match (&pdb.min_available, &pdb.max_unavailable) {
        (Some(_), Some(_)) => Err("spec.podDisruptionBudget: only one of 'spec.podDisruptionBudget.minAvailable' or 'spec.podDisruptionBudget.maxUnavailable' is allowed".into()),
        (None, None) => Ok(None),
        (Some(v), None) => check_int_or_percent("spec.podDisruptionBudget.minAvailable", v).map(|()| Some(pdb.clone())),
        (None, Some(v)) => check_int_or_percent("spec.podDisruptionBudget.maxUnavailable", v).map(|()| Some(pdb.clone())),
    }
}

/// A count of at least 0, or a percentage `0%`..`100%` (Kubernetes' rule for PDBs).
fn check_int_or_percent(field: &str, v: &IntOrString) -> Result<(), String> {
    match v {
        IntOrString::Int(n) if *n >= 0 => Ok(()),
        IntOrString::Int(n) => Err(format!("{field}: {n} must be at least 0")),
        IntOrString::String(s) => match s.strip_suffix('%').map(str::parse::<u32>) {
            Some(Ok(p)) if p <= 100 => Ok(()),
            _ => Err(format!(
                "{field}: {s:?} is neither a number nor a percentage between 0% and 100%"
            )),
        },
    }
}

#[cfg(test)]
#[path = "envoy_deployment_tests.rs"]
mod tests;

/// The `EnvoyDeployment` `kuard` of namespace `shop` (uid `u-1`, generation 1) naming the
/// EnvoyConfig `kuard` and the DiscoveryService `instance`, with `spec`'s fields on top:
/// the tests' gateway.
#[cfg(test)]
pub(crate) fn fixture(spec: serde_json::Value) -> EnvoyDeployment {
    let mut full =
        serde_json::json!({"envoyConfigRef": "kuard", "discoveryServiceRef": "instance"});
    for (k, v) in spec.as_object().into_iter().flatten() {
        full[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyDeployment",
        "metadata": {"name": "kuard", "namespace": "shop", "uid": "u-1", "generation": 1},
        "spec": full,
    }))
    .expect("a valid EnvoyDeployment")
}
