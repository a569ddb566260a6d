//! The Priority admission plugin, as a real API server runs it on Pod CREATE: a pod naming a
//! `priorityClassName` gets that PriorityClass's value as `spec.priority`, and a pod naming a
//! class that does not exist is refused, with Kubernetes' own message. The two classes every
//! cluster has (`system-cluster-critical`, `system-node-critical`) exist here too.

use std::sync::Arc;

use serde_json::{Value, json};

use super::ServerState;
use super::error::ApiError;
use super::meta;

/// The classes a real API server creates at start.
const SYSTEM_CLASSES: [(&str, i64); 2] = [
    ("system-cluster-critical", 2_000_000_000),
    ("system-node-critical", 2_000_001_000),
];

/// The highest value a class that is not a system class may have.
const HIGHEST_USER_DEFINABLE_PRIORITY: i64 = 1_000_000_000;

/// A new PriorityClass as the real validation checks it: an integer `value` no higher than
/// user classes may go, and no name in the reserved `system-` prefix.
pub fn validate_class(class: &Value) -> Result<(), String> {
    if meta::name(class).starts_with("system-") {
        return Err(
            "metadata.name: Invalid value: priority class names with 'system-' prefix are reserved"
                .into(),
        );
    }
    match class.get("value").and_then(Value::as_i64) {
        None => Err("value: Required value".into()),
        Some(v) if v > HIGHEST_USER_DEFINABLE_PRIORITY => Err(format!(
            "value: Invalid value: {v}: maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}"
        )),
        Some(_) => Ok(()),
    }
}

/// Sets `spec.priority` of `pod` from its PriorityClass, or refuses it.
pub fn admit(state: &Arc<ServerState>, pod: &mut Value) -> Result<(), ApiError> {
    let Some(class) = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
    else {
        return Ok(());
    };
    let stored = state
        .store
        .registry()
        .find("scheduling.k8s.io", "v1", "priorityclasses")
        .and_then(|info| state.store.get(info, "", &class).ok())
        .and_then(|pc| pc.get("value").and_then(Value::as_i64));
    let system = SYSTEM_CLASSES
        .iter()
        .find(|(name, _)| *name == class)
        .map(|(_, value)| *value);
    let name = meta::name(pod).to_owned();
    let Some(value) = stored.or(system) else {
        return Err(ApiError::forbidden(format!(
            "pods \"{name}\" is forbidden: no PriorityClass with name {class} was found"
        )));
    };
    match pod.pointer("/spec/priority").and_then(Value::as_i64) {
        Some(given) if given != value => Err(ApiError::forbidden(format!(
            "pods \"{name}\" is forbidden: the integer value of priority ({given}) must not be \
             provided in pod spec; priority admission controller computed {value} from the \
             given PriorityClass name"
        ))),
        _ => {
            pod["spec"]["priority"] = json!(value);
            Ok(())
        }
    }
}
