//! Offline injection (`marin3r inject`): every YAML document that is a Pod, or a workload with
//! a pod template, gets the same mutation the webhook applies; other documents pass through.

use serde_json::{Value, json};

use crate::config::InjectionConfig;
use crate::mutate::{Selection, inject_json};

/// Kinds whose `spec.template` is a pod template.
const TEMPLATED_KINDS: [&str; 6] = [
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
];

/// Where a CronJob keeps its pod template.
const CRON_JOB_TEMPLATE: &str = "/spec/jobTemplate/spec/template";

#[derive(Debug, thiserror::Error)]
#[error("{location}: {message}")]
pub struct InjectError {
    /// e.g. `document 2 (Deployment "web")`.
    pub location: String,
    pub message: String,
}

/// The injected documents as YAML, and one note per pod that was left unchanged and why, or
/// per warning the webhook would give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    pub yaml: String,
    pub notes: Vec<String>,
}

pub fn inject_yaml(input: &str, config: &InjectionConfig) -> Result<Injected, InjectError> {
    let mut docs = Vec::new();
    let mut notes = Vec::new();
    let parsed: Vec<Value> = serde_saphyr::from_multiple(input).map_err(|e| InjectError {
        location: "input".into(),
        message: format!("not valid YAML: {}", e.without_snippet()),
    })?;
    for (i, mut doc) in parsed.into_iter().enumerate() {
        let at = format!("document {}", i + 1);
        if doc.is_null() {
            continue;
        }
        inject_object(&mut doc, config, &at, &mut notes)?;
        docs.push(doc);
    }
    let mut yaml = String::new();
    for (i, doc) in docs.iter().enumerate() {
        if i > 0 {
            yaml.push_str("---\n");
        }
        yaml.push_str(&serde_saphyr::to_string(doc).map_err(|e| InjectError {
            location: format!("document {}", i + 1),
            message: format!("writing YAML: {e}"),
        })?);
    }
    Ok(Injected { yaml, notes })
}

/// Injects one object (a `List` item by item); `at` names the document for messages.
fn inject_object(
    doc: &mut Value,
    config: &InjectionConfig,
    at: &str,
    notes: &mut Vec<String>,
) -> Result<(), InjectError> {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if kind == "List" {
        let items = doc.get_mut("items").and_then(Value::as_array_mut);
        for (j, item) in items.into_iter().flatten().enumerate() {
            inject_object(item, config, &format!("{at} item {}", j + 1), notes)?;
        }
        return Ok(());
    }
    let name = doc
        .pointer("/metadata/name")
        .or_else(|| doc.pointer("/metadata/generateName"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let location = format!("{at} ({kind} {name:?})");
    let selected = match kind.as_str() {
        "Pod" => inject_json(doc, config),
        k if TEMPLATED_KINDS.contains(&k) => inject_template(doc, "/spec/template", config),
        "CronJob" => inject_template(doc, CRON_JOB_TEMPLATE, config),
        _ => return Ok(()),
    };
    match selected {
        Ok((Selection::Inject, warnings)) => {
            notes.extend(
                warnings
                    .into_iter()
                    .map(|w| format!("{location}: warning: {w}")),
            );
            if matches!(kind.as_str(), "Job" | "CronJob") && !has_native_sidecar(doc) {
                notes.push(format!(
                    "{location}: warning: with a classic sidecar the Job's pods never complete \
                     (Envoy keeps running after the job's containers finish); inject native \
                     sidecars (--native-sidecars, or the pod annotation \
                     marin3r.3scale.net/native-sidecar: \"true\"; Kubernetes 1.29+)"
                ));
            }
            Ok(())
        }
        Ok((other, _)) => {
            notes.push(format!("{location}: not injected: {other}"));
            Ok(())
        }
        Err(denial) => Err(InjectError {
            location,
            message: denial.to_string(),
        }),
    }
}

/// Whether the object (a Job or CronJob, injected) has an init container that always restarts.
fn has_native_sidecar(doc: &Value) -> bool {
    let pointer = match doc.get("kind").and_then(Value::as_str) {
        Some("CronJob") => format!("{CRON_JOB_TEMPLATE}/spec/initContainers"),
        _ => "/spec/template/spec/initContainers".to_owned(),
    };
    doc.pointer(&pointer)
        .and_then(Value::as_array)
        .is_some_and(|list| list.iter().any(|c| c["restartPolicy"] == "Always"))
}

/// Injects into the pod template at `pointer` (e.g. `/spec/template`) by treating the
/// template as a Pod.
fn inject_template(
    doc: &mut Value,
    pointer: &str,
    config: &InjectionConfig,
) -> Result<(Selection, Vec<String>), crate::mutate::Denial> {
    let template = doc
        .pointer_mut(pointer)
        .filter(|t| t.is_object())
        .ok_or_else(|| {
            let field = pointer.trim_start_matches('/').replace('/', ".");
            crate::mutate::Denial::NotAPod(format!("the object has no {field}"))
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = "metadata:\n  labels: {marin3r.3scale.net/status: enabled}\n  annotations: {marin3r.3scale.net/node-id: db}\nspec:\n  containers: [{name: db, image: postgres}]\n";

    fn workload(kind: &str) -> String {
        let indented: String = TEMPLATE.lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: apps/v1\nkind: {kind}\nmetadata: {{name: db}}\nspec:\n  template:\n{indented}"
        )
    }

    fn sidecar_names(yaml: &str) -> Vec<String> {
        let v: Value = serde_saphyr::from_str(yaml).unwrap();
        let containers = v
            .pointer("/spec/template/spec/containers")
            .or_else(|| v.pointer("/items/0/spec/template/spec/containers"))
            .unwrap();
        containers
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_workload_kind_with_a_pod_template_is_injected() {
        for kind in TEMPLATED_KINDS {
            let out = inject_yaml(&workload(kind), &InjectionConfig::default()).unwrap();
            assert_eq!(sidecar_names(&out.yaml), ["db", "envoy-sidecar"], "{kind}");
            if kind == "Job" {
                assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
                assert!(out.notes[0].contains("never complete"), "{:?}", out.notes);
            } else {
                assert!(out.notes.is_empty(), "{kind}: {:?}", out.notes);
            }
        }
    }

    #[test]
    fn a_jobs_native_sidecar_needs_no_warning() {
        let native = InjectionConfig {
            native_sidecars: true,
            ..InjectionConfig::default()
        };
        let out = inject_yaml(&workload("Job"), &native).unwrap();
        assert!(out.notes.is_empty(), "{:?}", out.notes);
        let v: Value = serde_saphyr::from_str(&out.yaml).unwrap();
        let init = &v["spec"]["template"]["spec"]["initContainers"][0];
        assert_eq!(init["name"], "envoy-sidecar");
        assert_eq!(init["restartPolicy"], "Always");
    }

    #[test]
    fn a_cron_jobs_job_template_is_injected() {
        let indented: String = TEMPLATE.lines().map(|l| format!("        {l}\n")).collect();
        let cron = format!(
            "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: db}}\nspec:\n  schedule: '@hourly'\n  jobTemplate:\n    spec:\n      template:\n{indented}"
        );
        let out = inject_yaml(&cron, &InjectionConfig::default()).unwrap();
        let v: Value = serde_saphyr::from_str(&out.yaml).unwrap();
        let names: Vec<&str> = v
            .pointer("/spec/jobTemplate/spec/template/spec/containers")
            .and_then(Value::as_array)
            .unwrap()
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["db", "envoy-sidecar"]);
        assert_eq!(v["spec"]["schedule"], "@hourly");
        assert!(out.notes[0].contains("never complete"), "{:?}", out.notes);
        // Without a job template: an error naming the field.
        let err = inject_yaml(
            "kind: CronJob\nmetadata: {name: x}\nspec: {schedule: '@hourly'}\n",
            &InjectionConfig::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("spec.jobTemplate.spec.template"),
            "{err}"
        );
    }

    #[test]
    fn list_items_are_injected_and_named_in_errors() {
        let indented: String = workload("StatefulSet")
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect();
        let list = format!("apiVersion: v1\nkind: List\nitems:\n-{}", &indented[1..]);
        let out = inject_yaml(&list, &InjectionConfig::default()).unwrap();
        assert_eq!(sidecar_names(&out.yaml), ["db", "envoy-sidecar"]);

        let bad = list.replace("node-id: db", "node-id: \"d b\"");
        let err = inject_yaml(&bad, &InjectionConfig::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "document 1 item 1 (StatefulSet \"db\"): marin3r.3scale.net/node-id: \"d b\": must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        );
    }

    #[test]
    fn a_workload_without_a_template_is_an_error() {
        let err = inject_yaml(
            "kind: Deployment\nmetadata: {name: x}\nspec: {}\n",
            &InjectionConfig::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "document 1 (Deployment \"x\"): the object has no spec.template"
        );
    }
}
