//! Offline injection (`marin3r inject`): every YAML document that is a Pod, or a workload with
//! a pod template, gets the same mutation the webhook applies; other documents pass through.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::InjectionConfig;
use crate::mutate::{Selection, inject_json};

/// Kinds whose `spec.template` is a pod template.
const TEMPLATED_KINDS: [&str; 5] = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "Job",
];

#[derive(Debug, thiserror::Error)]
#[error("{location}: {message}")]
pub struct InjectError {
    /// e.g. `document 2 (Deployment "web")`.
    pub location: String,
    pub message: String,
}

/// The injected documents as YAML, and one note per pod that was left unchanged and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    pub yaml: String,
    pub notes: Vec<String>,
}

pub fn inject_yaml(input: &str, config: &InjectionConfig) -> Result<Injected, InjectError> {
    let mut docs = Vec::new();
    let mut notes = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(input).enumerate() {
        let at = |what: &str| format!("document {}{what}", i + 1);
        let mut doc = Value::deserialize(de).map_err(|e| InjectError {
            location: at(""),
            message: format!("not valid YAML: {e}"),
        })?;
        if doc.is_null() {
            continue;
        }
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = doc
            .pointer("/metadata/name")
            .or_else(|| doc.pointer("/metadata/generateName"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let location = at(&format!(" ({kind} {name:?})"));
        let selected = match kind {
            "Pod" => Some(inject_json(&mut doc, config)),
            k if TEMPLATED_KINDS.contains(&k) => Some(inject_template(&mut doc, config)),
            _ => None,
        };
        match selected {
            Some(Ok(Selection::Inject)) | None => {}
            Some(Ok(other)) => notes.push(format!("{location}: not injected: {other}")),
            Some(Err(denial)) => {
                return Err(InjectError {
                    location,
                    message: denial.to_string(),
                });
            }
        }
        docs.push(doc);
    }
    let mut yaml = String::new();
    for (i, doc) in docs.iter().enumerate() {
        if i > 0 {
            yaml.push_str("---\n");
        }
        yaml.push_str(&serde_yaml::to_string(doc).map_err(|e| InjectError {
            location: format!("document {}", i + 1),
            message: format!("writing YAML: {e}"),
        })?);
    }
    Ok(Injected { yaml, notes })
}

/// Injects into `spec.template` by treating the template as a Pod.
fn inject_template(
    doc: &mut Value,
    config: &InjectionConfig,
) -> Result<Selection, crate::mutate::Denial> {
    let template = doc
        .pointer_mut("/spec/template")
        .filter(|t| t.is_object())
        .ok_or_else(|| crate::mutate::Denial::NotAPod("the object has no spec.template".into()))?;
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": template.get("spec").cloned().unwrap_or(Value::Null),
    });
    let selected = inject_json(&mut pod, config)?;
    if let (Some(t), Some(p)) = (template.as_object_mut(), pod.as_object_mut()) {
        for key in ["metadata", "spec"] {
            if let Some(v) = p.remove(key) {
                t.insert(key.into(), v);
            }
        }
    }
    Ok(selected)
}
