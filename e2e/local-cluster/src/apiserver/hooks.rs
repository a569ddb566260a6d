//! What the API server does for particular kinds on write: status reset on create,
//! `Secret.stringData`, namespace phase, and CustomResourceDefinition validation and status.

use base64::Engine;
use serde_json::{Value, json};

use super::endpointslices;
use super::error::ApiError;
use super::meta;
use super::registry::{self, ResourceInfo};

pub fn is_namespace(info: &ResourceInfo) -> bool {
    info.group.is_empty() && info.plural == "namespaces"
}

pub fn is_pod(info: &ResourceInfo) -> bool {
    info.group.is_empty() && info.plural == "pods"
}

pub fn is_crd(info: &ResourceInfo) -> bool {
    info.group == "apiextensions.k8s.io" && info.plural == "customresourcedefinitions"
}

fn is_secret(info: &ResourceInfo) -> bool {
    info.group.is_empty() && info.plural == "secrets"
}

/// Prepares a new object's kind-specific fields; the status a client sends on create is
/// dropped for kinds with a status subresource, as on a real API server.
pub fn on_create(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    if info.status {
        if let Some(o) = obj.as_object_mut() {
            o.remove("status");
        }
        let initial = match (info.group.as_str(), info.plural.as_str()) {
            ("", "pods") => Some(json!({"phase": "Pending"})),
            ("", "namespaces") => Some(json!({"phase": "Active"})),
            _ => None,
        };
        if let Some(status) = initial {
            obj["status"] = status;
        }
    }
    if endpointslices::is_endpoint_slice(info) {
        endpointslices::default(obj);
        let errors = endpointslices::validate(obj, None);
        if !errors.is_empty() {
            return Err(ApiError::invalid_fields(info, meta::name(obj), &errors));
        }
    }
    if is_secret(info) {
        fold_string_data(obj);
        if obj
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            obj["type"] = json!("Opaque");
        }
    }
    if is_namespace(info) {
        // As on a real cluster, so namespaceSelectors can select a namespace by name.
        let name = json!(meta::name(obj));
        if let Some(m) = meta::metadata_mut(obj) {
            let labels = m.entry("labels").or_insert_with(|| json!({}));
            if labels.is_object() {
                labels["kubernetes.io/metadata.name"] = name;
            }
        }
    }
    if info.group == "scheduling.k8s.io" && info.plural == "priorityclasses" {
        super::priority::validate_class(obj)
            .map_err(|e| ApiError::invalid(info, meta::name(obj), e))?;
    }
    if is_crd(info) {
        let infos =
            registry::from_crd(obj).map_err(|e| ApiError::invalid(info, meta::name(obj), e))?;
        obj["status"] = crd_status(obj, &infos);
    }
    Ok(())
}

/// Kind-specific work on an update of the main resource.
pub fn on_update(info: &ResourceInfo, old: &Value, obj: &mut Value) -> Result<(), ApiError> {
    if endpointslices::is_endpoint_slice(info) {
        endpointslices::default(obj);
        let errors = endpointslices::validate(obj, Some(old));
        if !errors.is_empty() {
            return Err(ApiError::invalid_fields(info, meta::name(obj), &errors));
        }
    }
    if is_secret(info) {
        fold_string_data(obj);
    }
    let errors = immutable_errors(info, old, obj);
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(info, meta::name(obj), &errors));
    }
    if is_crd(info) {
        registry::from_crd(obj).map_err(|e| ApiError::invalid(info, meta::name(obj), e))?;
    }
    Ok(())
}

/// A Secret or ConfigMap stored with `immutable: true` keeps its content and stays
/// immutable (only its metadata may change, or it is deleted), and a Secret keeps its type:
/// kube-apiserver's `ValidateSecretUpdate` and `ValidateConfigMapUpdate`.
fn immutable_errors(info: &ResourceInfo, old: &Value, new: &Value) -> Vec<String> {
    let is_config_map = info.group.is_empty() && info.plural == "configmaps";
    if !is_secret(info) && !is_config_map {
        return Vec::new();
    }
    let mut errors = Vec::new();
    if is_secret(info) && old.get("type") != new.get("type") {
        let new_type = new.get("type").and_then(Value::as_str).unwrap_or_default();
        errors.push(format!(
            "type: Invalid value: {new_type:?}: field is immutable"
        ));
    }
    if old.get("immutable") != Some(&Value::Bool(true)) {
        return errors;
    }
    const FORBIDDEN: &str = "Forbidden: field is immutable when `immutable` is set";
    if new.get("immutable") != Some(&Value::Bool(true)) {
        errors.push(format!("immutable: {FORBIDDEN}"));
    }
    let fields: &[&str] = if is_config_map {
        &["data", "binaryData"]
    } else {
        &["data"]
    };
    for field in fields {
        let empty =
            |v: Option<&Value>| v.is_none_or(|v| v.as_object().is_some_and(|o| o.is_empty()));
        let same = old.get(*field) == new.get(*field)
            || (empty(old.get(*field)) && empty(new.get(*field)));
        if !same {
            errors.push(format!("{field}: {FORBIDDEN}"));
        }
    }
    errors
}

/// `stringData` is write-only: merged into `data` base64-encoded.
fn fold_string_data(obj: &mut Value) {
    let Some(string_data) = obj.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    let Some(entries) = string_data.as_object() else {
        return;
    };
    if !obj.get("data").is_some_and(Value::is_object) {
        obj["data"] = json!({});
    }
    for (k, v) in entries {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = Value::String(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

/// A CRD is established as soon as it is stored: its resources are served at once.
fn crd_status(crd: &Value, infos: &[ResourceInfo]) -> Value {
    let now = meta::now();
    let condition = |type_: &str, reason: &str, message: &str| json!({"type": type_, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message});
    let storage: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let stored = if storage.is_empty() {
        infos
            .first()
            .map(|i| vec![json!(i.version)])
            .unwrap_or_default()
    } else {
        storage
    };
    json!({
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_is_folded() {
        let info = registry::builtins()
            .into_iter()
            .find(|i| i.plural == "secrets")
            .unwrap();
        let mut s =
            json!({"metadata": {"name": "s"}, "data": {"a": "eA=="}, "stringData": {"b": "hi"}});
        on_create(&info, &mut s).unwrap();
        assert_eq!(s["data"], json!({"a": "eA==", "b": "aGk="}));
        assert_eq!(s["type"], "Opaque");
        assert!(s.get("stringData").is_none());
    }

    #[test]
    fn bad_crd_is_invalid() {
        let info = registry::builtins().into_iter().find(is_crd).unwrap();
        let mut crd = json!({"metadata": {"name": "things.example.com"}, "spec": {"group": "example.com", "scope": "Namespaced", "names": {"plural": "things"}, "versions": []}});
        let err = on_create(&info, &mut crd).unwrap_err();
        assert_eq!(err.reason, "Invalid");
        assert!(err.message.contains("spec.names.kind"), "{}", err.message);
    }
}
