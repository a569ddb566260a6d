//! The pure core of the webhook: whether a pod is to be injected, and the JSONPatch that adds
//! the sidecar, its volumes and the `injected` marker, or the reason it is denied.

use std::collections::BTreeMap;
use std::fmt;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::Value;

use crate::annotations::{
    self, AnnotationError, CONFIG_VOLUME, CONTAINER_NAME, HOST_PORT_MAPPINGS, INJECTED, Layout,
    SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS, SHUTDOWN_MANAGER_PORT, STATUS_LABEL, ShutdownManager,
    SidecarSpec, TLS_VOLUME,
};
use crate::config::{
    DRAIN_GRACE_MARGIN, HOLD_CONTAINER, InjectionConfig, SHUTDOWN_MANAGER_CONTAINER,
};
use crate::{readiness, sidecar};

/// Why a pod may not be created as it is. The message names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// One or more annotations are invalid.
    #[error("{}", join(.0))]
    Annotations(Vec<AnnotationError>),
    /// The pod already has something the sidecar would need to add under the same name.
    #[error("{0}")]
    Conflict(String),
    /// The object could not be read as a Pod.
    #[error("{0}")]
    NotAPod(String),
}

fn join(errors: &[AnnotationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the webhook does with a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Not labelled `marin3r.3scale.net/status=enabled`: left alone.
    NotSelected,
    /// Carries the `injected` marker: left alone, so injection is idempotent.
    AlreadyInjected,
    Inject,
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotSelected => write!(f, "the pod is not labelled {STATUS_LABEL}=enabled"),
            Self::AlreadyInjected => write!(f, "the pod carries the {INJECTED} annotation"),
            Self::Inject => write!(f, "the pod is selected for injection"),
        }
    }
}

pub fn selection(pod: &Pod) -> Selection {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(INJECTED))
    {
        return Selection::AlreadyInjected;
    }
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(STATUS_LABEL))
        .is_some_and(|v| v == "enabled");
    if labelled {
        Selection::Inject
    } else {
        Selection::NotSelected
    }
}

/// Admission warnings for a pod selected for injection: its `marin3r.3scale.net/*`
/// annotations that the webhook does not know (typos, or annotations of another version).
pub fn warnings(pod: &Pod) -> Vec<String> {
    if selection(pod) != Selection::Inject {
        return Vec::new();
    }
    pod.metadata
        .annotations
        .as_ref()
        .map(annotations::unknown_warnings)
        .unwrap_or_default()
}

/// The sidecar spec for a pod selected for injection (annotations parsed, defaults applied).
pub fn sidecar_spec(pod: &Pod, config: &InjectionConfig) -> Result<SidecarSpec, Denial> {
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    annotations::parse(annotations, config).map_err(Denial::Annotations)
}

/// The final Envoy args of the sidecar injected into `pod`, with the downward-API variables
/// expanded as kubelet would for a pod named `pod_name` in `namespace`: the command line the
/// sidecar runs (after `envoy`).
pub fn sidecar_command_line(
    pod: &Pod,
    config: &InjectionConfig,
    pod_name: &str,
    namespace: &str,
) -> Result<Vec<String>, Denial> {
    let spec = sidecar_spec(pod, config)?;
    let env = BTreeMap::from([
        (sidecar::POD_NAME_ENV.to_owned(), pod_name.to_owned()),
        (sidecar::POD_NAMESPACE_ENV.to_owned(), namespace.to_owned()),
    ]);
    Ok(sidecar::expand_env(&sidecar::sidecar_args(&spec), &env))
}

/// The JSONPatch that injects the sidecar into `pod`; empty when the pod is not selected or
/// already injected.
pub fn mutate(pod: &Pod, config: &InjectionConfig) -> Result<Patch, Denial> {
    mutation(pod, config).map(|m| m.patch)
}

/// What injection does to a pod: the patch, and what the user should be told about it
/// (annotations accepted without effect), for the admission response's warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct Mutation {
    pub patch: Patch,
    pub warnings: Vec<String>,
}

/// [`mutate`], with the warnings.
pub fn mutation(pod: &Pod, config: &InjectionConfig) -> Result<Mutation, Denial> {
    if selection(pod) != Selection::Inject {
        return Ok(Mutation {
            patch: Patch(Vec::new()),
            warnings: Vec::new(),
        });
    }
    let mut spec = sidecar_spec(pod, config)?;
    check_conflicts(pod, &spec)?;
    if let Some(manager) = spec.shutdown_manager.as_mut() {
        manager.token = sidecar::shutdown_token()
            .map_err(|e| Denial::NotAPod(format!("drawing the shutdown manager's token: {e}")))?;
    }
    // Unknown annotations first, then the known ones accepted without (full) effect.
    let mut all_warnings = warnings(pod);
    all_warnings.append(&mut spec.warnings);
    let mut warnings = all_warnings;

    // The drain's hooks name the pod's containers by index: before anything is inserted.
    let mut ops = drain_patch(pod, &spec, &mut warnings)?;
    ops.extend(placement(pod, &spec, config)?);
    ops.extend(pull_secrets(pod, &spec)?);
    let volumes = sidecar::volumes(&spec);
    let pod_spec = pod.spec.as_ref();
    match pod_spec.and_then(|s| s.volumes.as_ref()) {
        Some(existing) if !existing.is_empty() => {
            for volume in volumes {
                ops.push(add(
                    &["spec", "volumes", "-"],
                    serde_json::to_value(volume),
                )?);
            }
        }
        // `add` on a missing (or, from a client that sends `[]`, empty) list creates it.
        _ => ops.push(add(&["spec", "volumes"], serde_json::to_value(volumes))?),
    }
    // The node-id annotation exists (it was required), so the annotations map does too.
    ops.push(add(
        &["metadata", "annotations", INJECTED],
        Ok(Value::String("true".into())),
    )?);
    ops.extend(prometheus_patch(pod, &spec)?);
    Ok(Mutation {
        patch: Patch(ops),
        warnings,
    })
}

/// Where Envoy, the shutdown manager and the hold container go, by the layout.
fn placement(
    pod: &Pod,
    spec: &SidecarSpec,
    config: &InjectionConfig,
) -> Result<Vec<PatchOperation>, Denial> {
    let envoy = serde_json::to_value(sidecar::container(spec));
    let manager = spec
        .shutdown_manager
        .as_ref()
        .map(|m| serde_json::to_value(sidecar::shutdown_manager_container(spec, m)));
    let pod_spec = pod.spec.as_ref();
    let mut ops = Vec::new();
    match spec.layout {
        Layout::Native => {
            // First, so the pod's own init containers can use Envoy; the manager before
            // Envoy, so kubelet stops it after Envoy (reverse order).
            let first = [manager, Some(envoy)].into_iter().flatten();
            let has_init = pod_spec.is_some_and(|s| s.init_containers.iter().flatten().count() > 0);
            if has_init {
                for (i, container) in first.enumerate() {
                    let i = i.to_string();
                    ops.push(add(&["spec", "initContainers", &i], container)?);
                }
            } else {
                let list: Result<Vec<Value>, _> = first.collect();
                ops.push(add(&["spec", "initContainers"], list.map(Value::Array))?);
            }
        }
        Layout::Classic { hold } => {
            if hold {
                // Kubelet starts containers in order, each after the previous one's postStart.
                let holder = sidecar::hold_container(spec, &config.shutdown_manager_image);
                ops.push(add(&["spec", "containers", "0"], envoy)?);
                ops.push(add(
                    &["spec", "containers", "1"],
                    serde_json::to_value(holder),
                )?);
            } else {
                ops.push(add(&["spec", "containers", "-"], envoy)?);
            }
            if let Some(manager) = manager {
                ops.push(add(&["spec", "containers", "-"], manager)?);
            }
        }
    }
    Ok(ops)
}

/// The cluster's image pull Secrets the pod does not list yet.
fn pull_secrets(pod: &Pod, spec: &SidecarSpec) -> Result<Vec<PatchOperation>, Denial> {
    let existing: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.image_pull_secrets.iter().flatten())
        .map(|r| r.name.as_str())
        .collect();
    let missing: Vec<Value> = spec
        .image_pull_secrets
        .iter()
        .filter(|name| !existing.contains(&name.as_str()))
        .map(|name| serde_json::json!({ "name": name }))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    if existing.is_empty() {
        return Ok(vec![add(
            &["spec", "imagePullSecrets"],
            Ok(Value::Array(missing)),
        )?]);
    }
    missing
        .into_iter()
        .map(|secret| add(&["spec", "imagePullSecrets", "-"], Ok(secret)))
        .collect()
}

/// With the shutdown manager: a termination grace period that covers the drain (never
/// shortened), and a preStop hook on every container named in `extra-lifecycle-hooks`, which
/// then gets SIGTERM only once Envoy has drained. A name that is not a container of the pod is
/// a warning (the original ignored it).
fn drain_patch(
    pod: &Pod,
    spec: &SidecarSpec,
    warnings: &mut Vec<String>,
) -> Result<Vec<PatchOperation>, Denial> {
    let Some(manager) = &spec.shutdown_manager else {
        return Ok(Vec::new());
    };
    let Some(pod_spec) = pod.spec.as_ref() else {
        return Err(Denial::NotAPod("the pod has no spec".into()));
    };
    let mut ops = Vec::new();
    let needed = i64::from(manager.drain_time) + DRAIN_GRACE_MARGIN;
    // Kubernetes' default when the pod sets none.
    let current = pod_spec.termination_grace_period_seconds.unwrap_or(30);
    if current < needed {
        ops.push(add(
            &["spec", "terminationGracePeriodSeconds"],
            Ok(Value::from(needed)),
        )?);
    }
    let mut missing = Vec::new();
    for name in &manager.extra_lifecycle_hooks {
        let Some((index, container)) = pod_spec
            .containers
            .iter()
            .enumerate()
            .find(|(_, c)| &c.name == name)
        else {
            missing.push(format!("{name:?}"));
            continue;
        };
        let index = index.to_string();
        let hook = sidecar::pre_stop_hook(manager, sidecar::DRAIN_PATH);
        match &container.lifecycle {
            None => ops.push(add(
                &["spec", "containers", &index, "lifecycle"],
                serde_json::to_value(hook),
            )?),
            // No preStop there (a conflict otherwise): keep the user's postStart beside it.
            Some(_) => ops.push(add(
                &["spec", "containers", &index, "lifecycle", "preStop"],
                serde_json::to_value(hook.pre_stop),
            )?),
        }
    }
    if !missing.is_empty() {
        warnings.push(format!(
            "{SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS}: {} not a container of the pod; ignored",
            missing.join(", ")
        ));
    }
    Ok(ops)
}

/// `prometheus.io/scrape|port|path` for Envoy's stats, unless the pod or the cluster turned
/// them off, or the pod has any of the three: then the user decides what is scraped (mixing
/// their `scrape` with our `port` would silently move their application's scrape to Envoy).
fn prometheus_patch(pod: &Pod, spec: &SidecarSpec) -> Result<Vec<PatchOperation>, Denial> {
    let annotations = readiness::prometheus_annotations(spec.readiness_port);
    let user_set = pod.metadata.annotations.as_ref().is_some_and(|existing| {
        annotations
            .iter()
            .any(|(name, _)| existing.contains_key(*name))
    });
    if !spec.prometheus_annotations || user_set {
        return Ok(Vec::new());
    }
    annotations
        .into_iter()
        .map(|(name, value)| add(&["metadata", "annotations", name], Ok(Value::String(value))))
        .collect()
}

fn add(path: &[&str], value: Result<Value, serde_json::Error>) -> Result<PatchOperation, Denial> {
    let value = value.map_err(|e| Denial::NotAPod(format!("encoding the sidecar: {e}")))?;
    Ok(PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(path.iter().copied()),
        value,
    }))
}

/// Never clobber: a container or volume of the same name, or a host port already taken, is
/// the user's to rename.
fn check_conflicts(pod: &Pod, spec: &SidecarSpec) -> Result<(), Denial> {
    let Some(pod_spec) = pod.spec.as_ref() else {
        return Err(Denial::NotAPod("the pod has no spec".into()));
    };
    for c in all_containers(pod_spec) {
        if c.name == spec.container_name {
            return Err(Denial::Conflict(format!(
                "the pod already has a container named {:?}; set {CONTAINER_NAME} to another name for the Envoy sidecar",
                c.name
            )));
        }
    }
    if let Some(manager) = &spec.shutdown_manager {
        check_shutdown_manager_conflicts(pod_spec, manager)?;
    }
    if spec.layout == (Layout::Classic { hold: true })
        && let Some(c) = all_containers(pod_spec).find(|c| c.name == HOLD_CONTAINER)
    {
        return Err(Denial::Conflict(format!(
            "the pod already has a container named {:?}, the name of the container that holds \
             the applications until Envoy is ready",
            c.name
        )));
    }
    for v in pod_spec.volumes.iter().flatten() {
        for (name, annotation) in [
            (&spec.config_volume, CONFIG_VOLUME),
            (&spec.tls_volume, TLS_VOLUME),
        ] {
            if &v.name == name {
                return Err(Denial::Conflict(format!(
                    "the pod already has a volume named {name:?}; set {annotation} to another name for the sidecar's volume"
                )));
            }
        }
    }
    check_host_port_conflicts(pod_spec, spec)
}

/// The pod's containers and init containers.
fn all_containers(pod_spec: &PodSpec) -> impl Iterator<Item = &Container> {
    pod_spec
        .containers
        .iter()
        .chain(pod_spec.init_containers.iter().flatten())
}

/// The shutdown manager's container name and port must be free, and the containers that
/// wait for the drain must have no preStop hook of their own.
fn check_shutdown_manager_conflicts(
    pod_spec: &PodSpec,
    manager: &ShutdownManager,
) -> Result<(), Denial> {
    for c in all_containers(pod_spec) {
        if c.name == SHUTDOWN_MANAGER_CONTAINER {
            return Err(Denial::Conflict(format!(
                "the pod already has a container named {SHUTDOWN_MANAGER_CONTAINER:?}, the \
                 name of the shutdown manager marin3r injects"
            )));
        }
        if c.ports.iter().flatten().any(|p| {
            p.container_port == i32::from(manager.port)
                && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        }) {
            return Err(Denial::Conflict(format!(
                "{SHUTDOWN_MANAGER_PORT}: port {} is already used by the container {:?}; \
                 set {SHUTDOWN_MANAGER_PORT} to a free port",
                manager.port, c.name
            )));
        }
    }
    for c in &pod_spec.containers {
        if manager.extra_lifecycle_hooks.contains(&c.name)
            && c.lifecycle.as_ref().is_some_and(|l| l.pre_stop.is_some())
        {
            return Err(Denial::Conflict(format!(
                "{SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS}: the container {:?} already has a \
                 preStop hook, which the drain's would replace; remove it from one of the two",
                c.name
            )));
        }
    }
    Ok(())
}

/// A host port the sidecar maps may not be one another container already maps.
fn check_host_port_conflicts(pod_spec: &PodSpec, spec: &SidecarSpec) -> Result<(), Denial> {
    let host_ports: Vec<(i32, String)> = all_containers(pod_spec)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            p.host_port.map(|hp| (hp, protocol))
        })
        .collect();
    for p in &spec.ports {
        if let Some(hp) = p.host_port
            && host_ports
                .iter()
                .any(|(h, proto)| *h == i32::from(hp) && proto == p.protocol.as_str())
        {
            return Err(Denial::Conflict(format!(
                "{HOST_PORT_MAPPINGS}: host port {hp}/{} is already used by another container of the pod",
                p.protocol.as_str()
            )));
        }
    }
    Ok(())
}

/// Applies the mutation to a pod's JSON (unknown fields kept), for offline injection; returns
/// the selection and the warnings the webhook would give.
pub fn inject_json(
    pod_json: &mut Value,
    config: &InjectionConfig,
) -> Result<(Selection, Vec<String>), Denial> {
    let pod: Pod = serde_json::from_value(pod_json.clone())
        .map_err(|e| Denial::NotAPod(format!("not a valid Pod: {e}")))?;
    let selected = selection(&pod);
    let Mutation { patch, warnings } = mutation(&pod, config)?;
    json_patch::patch(pod_json, &patch.0)
        .map_err(|e| Denial::NotAPod(format!("applying the sidecar patch: {e}")))?;
    Ok((selected, warnings))
}

#[cfg(test)]
#[path = "mutate_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "mutate_layout_tests.rs"]
mod layout_tests;

#[cfg(test)]
#[path = "mutate_stats_tests.rs"]
mod stats_tests;
