//! The Pod spec validation of a real API server that native sidecars depend on, on Pods and
//! on Deployments' pod templates: a container `restartPolicy` only on init containers and
//! only `Always` (a sidecar); probes and lifecycle hooks only on app containers and sidecars;
//! `successThreshold` 1 for liveness and startup probes. Field paths and messages are
//! kube-apiserver's (`pkg/apis/core/validation`), regular containers checked first.

use serde_json::Value;

use super::registry::ResourceInfo;

const INIT_ONLY_FIELDS: [&str; 4] = [
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
];

/// Every field error of the pod spec in `obj` (a Pod, or a Deployment's template).
pub fn validate(info: &ResourceInfo, obj: &Value) -> Vec<String> {
    let (spec, path) = match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => (obj.get("spec"), "spec"),
        ("apps", "deployments") => (obj.pointer("/spec/template/spec"), "spec.template.spec"),
        _ => return Vec::new(),
    };
    spec.map(|s| pod_spec(s, path)).unwrap_or_default()
}

fn list<'a>(spec: &'a Value, key: &str) -> &'a [Value] {
    spec.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A field that is set (a JSON `null` is not).
fn set<'a>(container: &'a Value, field: &str) -> Option<&'a Value> {
    container.get(field).filter(|v| !v.is_null())
}

/// The field errors of one pod spec at `path`.
pub fn pod_spec(spec: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for (i, c) in list(spec, "containers").iter().enumerate() {
        let at = format!("{path}.containers[{i}]");
        errors.extend(success_thresholds(c, &at));
        if set(c, "restartPolicy").is_some() {
            errors.push(format!(
                "{at}.restartPolicy: Forbidden: may not be set for non-init containers"
            ));
        }
    }
    for (i, c) in list(spec, "initContainers").iter().enumerate() {
        let at = format!("{path}.initContainers[{i}]");
        let policy = set(c, "restartPolicy");
        if let Some(p) = policy.filter(|p| p.as_str() != Some("Always")) {
            errors.push(format!(
                "{at}.restartPolicy: Unsupported value: {p}: supported values: \"Always\""
            ));
        }
        if policy.and_then(Value::as_str) == Some("Always") {
            errors.extend(success_thresholds(c, &at));
            continue;
        }
        for field in INIT_ONLY_FIELDS.into_iter().filter(|f| set(c, f).is_some()) {
            errors.push(format!(
                "{at}.{field}: Forbidden: may not be set for init containers without restartPolicy=Always"
            ));
        }
    }
    errors
}

/// Liveness and startup probes pass once: `successThreshold` must be 1 (0, or unset, is
/// defaulted to 1).
fn success_thresholds(container: &Value, at: &str) -> Vec<String> {
    ["livenessProbe", "startupProbe"]
        .into_iter()
        .filter_map(|probe| {
            let n = container.get(probe)?.get("successThreshold")?.as_i64()?;
            (n != 0 && n != 1)
                .then(|| format!("{at}.{probe}.successThreshold: Invalid value: {n}: must be 1"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mk_spec(init: Value, containers: Value) -> Value {
        json!({"initContainers": init, "containers": containers})
    }

    #[test]
    fn sidecars_pass_and_so_do_app_containers_with_probes() {
        let probe = json!({"exec": {"command": ["true"]}, "successThreshold": 1});
        let spec = mk_spec(
            json!([{"name": "proxy", "restartPolicy": "Always", "startupProbe": probe,
                "livenessProbe": probe, "readinessProbe": probe,
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}}},
                {"name": "setup"}]),
            json!([{"name": "app", "startupProbe": probe, "lifecycle": {}}]),
        );
        assert!(pod_spec(&spec, "spec").is_empty());
    }

    #[test]
    fn restart_policies_are_refused_in_kube_apiserver_words() {
        let spec = mk_spec(
            json!([{"name": "a", "restartPolicy": "OnFailure"}, {"name": "b", "restartPolicy": "Never"}]),
            json!([{"name": "app", "restartPolicy": "Always"}]),
        );
        assert_eq!(
            pod_spec(&spec, "spec"),
            [
                "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
                r#"spec.initContainers[0].restartPolicy: Unsupported value: "OnFailure": supported values: "Always""#,
                r#"spec.initContainers[1].restartPolicy: Unsupported value: "Never": supported values: "Always""#,
            ]
        );
    }

    #[test]
    fn regular_init_containers_have_no_probes_or_hooks() {
        let probe = json!({"exec": {"command": ["true"]}});
        let spec = mk_spec(
            json!([{"name": "setup", "startupProbe": probe, "livenessProbe": probe,
                "readinessProbe": probe, "lifecycle": {"postStart": {"exec": {"command": ["true"]}}}}]),
            json!([{"name": "app"}]),
        );
        let forbidden = |f: &str| {
            format!(
                "spec.initContainers[0].{f}: Forbidden: may not be set for init containers without restartPolicy=Always"
            )
        };
        assert_eq!(
            pod_spec(&spec, "spec"),
            [
                "lifecycle",
                "livenessProbe",
                "readinessProbe",
                "startupProbe"
            ]
            .map(forbidden)
        );
    }

    #[test]
    fn liveness_and_startup_probes_succeed_once() {
        let probe = |n: i64| json!({"exec": {"command": ["true"]}, "successThreshold": n});
        let spec = mk_spec(
            json!([{"name": "proxy", "restartPolicy": "Always", "startupProbe": probe(3)}]),
            json!([{"name": "app", "livenessProbe": probe(2), "readinessProbe": probe(5),
                "startupProbe": probe(0)}]),
        );
        assert_eq!(
            pod_spec(&spec, "spec.template.spec"),
            [
                "spec.template.spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
                "spec.template.spec.initContainers[0].startupProbe.successThreshold: Invalid value: 3: must be 1",
            ]
        );
    }
}
