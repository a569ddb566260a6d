//! What kube-apiserver checks and defaults on autoscaling/v2 HorizontalPodAutoscalers and
//! policy/v1 PodDisruptionBudgets (its `ValidateHorizontalPodAutoscaler`,
//! `SetDefaults_HorizontalPodAutoscaler` and `ValidatePodDisruptionBudgetSpec`), so an
//! autoscaler or budget a real server would refuse is refused here too, in its words.

use serde_json::{Value, json};

use super::registry::ResourceInfo;

fn is_hpa(info: &ResourceInfo) -> bool {
    info.group == "autoscaling" && info.plural == "horizontalpodautoscalers"
}

fn is_pdb(info: &ResourceInfo) -> bool {
    info.group == "policy" && info.plural == "poddisruptionbudgets"
}

/// Defaults, then validates, an HPA or a PDB; the errors of any other kind are none.
pub fn admit(info: &ResourceInfo, obj: &mut Value) -> Vec<String> {
    if is_hpa(info) {
        default_hpa(obj);
        validate_hpa(obj)
    } else if is_pdb(info) {
        validate_pdb(obj)
    } else {
        Vec::new()
    }
}

/// `minReplicas` 1; no metrics means 80% average CPU utilization; a behavior's missing
/// rules are Kubernetes' default scale-up and scale-down rules.
fn default_hpa(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("minReplicas").or_insert(json!(1));
    let no_metrics = spec
        .get("metrics")
        .is_none_or(|m| m.as_array().is_none_or(Vec::is_empty));
    if no_metrics {
        spec.insert(
            "metrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 80}}}]),
        );
    }
    if let Some(behavior) = spec.get_mut("behavior").and_then(Value::as_object_mut) {
        let up = json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15},
            {"type": "Pods", "value": 4, "periodSeconds": 15}]});
        let down = json!({"stabilizationWindowSeconds": 300, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15}]});
        for (key, defaults) in [("scaleUp", up), ("scaleDown", down)] {
            let rules = behavior.entry(key).or_insert_with(|| json!({}));
            if let (Some(rules), Some(defaults)) = (rules.as_object_mut(), defaults.as_object()) {
                for (k, v) in defaults {
                    rules.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
        }
    }
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

fn text(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or_default()
}

fn validate_hpa(obj: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let min = int(spec.get("minReplicas"));
    match min {
        Some(n) if n < 1 => errors.push(format!(
            "spec.minReplicas: Invalid value: {n}: must be greater than or equal to 1"
        )),
        _ => {}
    }
    match spec.get("maxReplicas") {
        None => errors.push("spec.maxReplicas: Required value".into()),
        Some(v) => match v.as_i64() {
            None => errors.push(format!("spec.maxReplicas: Invalid value: {v}: must be an integer")),
            Some(max) if max < 1 => errors.push(format!(
                "spec.maxReplicas: Invalid value: {max}: must be greater than 0"
            )),
            Some(max) if min.is_some_and(|m| max < m) => errors.push(format!(
                "spec.maxReplicas: Invalid value: {max}: must be greater than or equal to `minReplicas`"
            )),
            Some(_) => {}
        },
    }
    for field in ["kind", "name"] {
        let path = format!("spec.scaleTargetRef.{field}");
        match spec.pointer(&format!("/scaleTargetRef/{field}")).and_then(Value::as_str) {
            None | Some("") => errors.push(format!("{path}: Required value")),
            Some(v) if v.contains('/') || v.contains('%') || v == "." || v == ".." => errors
                .push(format!(
                    "{path}: Invalid value: {v:?}: may not contain '/' or '%' and may not be '.' or '..'"
                )),
            Some(_) => {}
        }
    }
    for (i, metric) in spec
        .get("metrics")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        errors.extend(validate_metric(metric, &format!("spec.metrics[{i}]")));
    }
    if let Some(behavior) = spec.get("behavior") {
        for key in ["scaleUp", "scaleDown"] {
            if let Some(rules) = behavior.get(key) {
                errors.extend(validate_rules(rules, &format!("spec.behavior.{key}")));
            }
        }
    }
    errors
}

const METRIC_TYPES: [(&str, &str); 5] = [
    ("ContainerResource", "containerResource"),
    ("External", "external"),
    ("Object", "object"),
    ("Pods", "pods"),
    ("Resource", "resource"),
];

fn validate_metric(metric: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let type_ = text(metric.get("type"));
    let expected = METRIC_TYPES
        .iter()
        .find(|(t, _)| *t == type_)
        .map(|(_, f)| *f);
    if type_.is_empty() {
        errors.push(format!(
            "{path}.type: Required value: must specify a metric source type"
        ));
    }
    if expected.is_none() {
        let supported: Vec<String> = METRIC_TYPES.iter().map(|(t, _)| format!("{t:?}")).collect();
        errors.push(format!(
            "{path}.type: Unsupported value: {type_:?}: supported values: {}",
            supported.join(", ")
        ));
    }
    let present: Vec<&str> = METRIC_TYPES
        .iter()
        .map(|(_, f)| *f)
        .filter(|f| metric.get(*f).is_some_and(|v| !v.is_null()))
        .collect();
    if let Some(field) = expected {
        if !present.contains(&field) {
            errors.push(format!(
                "{path}.{field}: Required value: must populate information for the given metric source"
            ));
        }
        for other in present.iter().filter(|f| **f != field) {
            errors.push(format!(
                "{path}.{other}: Forbidden: must populate the given metric source only"
            ));
        }
    }
    if let Some(resource) = metric
        .get("resource")
        .filter(|_| expected == Some("resource"))
    {
        let at = format!("{path}.resource");
        if text(resource.get("name")).is_empty() {
            errors.push(format!(
                "{at}.name: Required value: must specify a resource name"
            ));
        }
        let target = resource.get("target").cloned().unwrap_or(Value::Null);
        errors.extend(validate_target(&target, &format!("{at}.target")));
        let utilization = target.get("averageUtilization").is_some();
        let average = target.get("averageValue").is_some();
        if !utilization && !average {
            errors.push(format!(
                "{at}.target.averageUtilization: Required value: must set either a target raw value or a target utilization"
            ));
        }
        if utilization && average {
            errors.push(format!(
                "{at}.target.averageValue: Forbidden: may not set both a target raw value and a target utilization"
            ));
        }
    }
    errors
}

fn validate_target(target: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let type_ = text(target.get("type"));
    if type_.is_empty() {
        errors.push(format!(
            "{path}.type: Required value: must specify a metric target type"
        ));
    }
    if !["Utilization", "Value", "AverageValue"].contains(&type_) {
        errors.push(format!(
            "{path}.type: Invalid value: {type_:?}: must be either Utilization, Value, or AverageValue"
        ));
    }
    if let Some(n) = int(target.get("averageUtilization"))
        && n < 1
    {
        errors.push(format!(
            "{path}.averageUtilization: Invalid value: {n}: must be greater than 0"
        ));
    }
    errors
}

fn validate_rules(rules: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(w) = int(rules.get("stabilizationWindowSeconds")) {
        if w < 0 {
            errors.push(format!(
                "{path}.stabilizationWindowSeconds: Invalid value: {w}: must be greater than or equal to zero"
            ));
        } else if w > 3600 {
            errors.push(format!(
                "{path}.stabilizationWindowSeconds: Invalid value: {w}: must be less than or equal to 3600"
            ));
        }
    }
    if let Some(p) = rules.get("selectPolicy").and_then(Value::as_str)
        && !["Disabled", "Max", "Min"].contains(&p)
    {
        errors.push(format!(
            "{path}.selectPolicy: Unsupported value: {p:?}: supported values: \"Disabled\", \"Max\", \"Min\""
        ));
    }
    let policies = rules.get("policies").and_then(Value::as_array);
    if policies.is_none_or(Vec::is_empty) {
        errors.push(format!(
            "{path}.policies: Required value: must specify at least one Policy"
        ));
    }
    for (i, policy) in policies.into_iter().flatten().enumerate() {
        let at = format!("{path}.policies[{i}]");
        let type_ = text(policy.get("type"));
        if !["Pods", "Percent"].contains(&type_) {
            errors.push(format!(
                "{at}.type: Unsupported value: {type_:?}: supported values: \"Percent\", \"Pods\""
            ));
        }
        let value = int(policy.get("value")).unwrap_or(0);
        if value <= 0 {
            errors.push(format!(
                "{at}.value: Invalid value: {value}: must be greater than zero"
            ));
        }
        let period = int(policy.get("periodSeconds")).unwrap_or(0);
        if period <= 0 {
            errors.push(format!(
                "{at}.periodSeconds: Invalid value: {period}: must be greater than zero"
            ));
        } else if period > 1800 {
            errors.push(format!(
                "{at}.periodSeconds: Invalid value: {period}: must be less than or equal to 1800"
            ));
        }
    }
    errors
}

fn validate_pdb(obj: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let (min, max) = (spec.get("minAvailable"), spec.get("maxUnavailable"));
    if min.is_some_and(|v| !v.is_null()) && max.is_some_and(|v| !v.is_null()) {
        errors.push(
            "spec: Invalid value: \"spec\": minAvailable and maxUnavailable cannot be both set"
                .into(),
        );
    }
    for (field, value) in [("minAvailable", min), ("maxUnavailable", max)] {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            continue;
        };
        let path = format!("spec.{field}");
        match value {
            Value::Number(n) => match n.as_i64() {
                Some(n) if n >= 0 => {}
                _ => errors.push(format!(
                    "{path}: Invalid value: {n}: must be greater than or equal to 0"
                )),
            },
            Value::String(s) => match s.strip_suffix('%').map(str::parse::<u64>) {
                Some(Ok(p)) if p <= 100 => {}
                Some(Ok(_)) => errors.push(format!(
                    "{path}: Invalid value: {s:?}: must not be greater than 100%"
                )),
                _ => errors.push(format!(
                    "{path}: Invalid value: {s:?}: a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')"
                )),
            },
            other => errors.push(format!("{path}: Invalid value: {other}: must be an integer or a percentage")),
        }
    }
    if let Some(p) = spec
        .get("unhealthyPodEvictionPolicy")
        .and_then(Value::as_str)
        && !["AlwaysAllow", "IfHealthyBudget"].contains(&p)
    {
        errors.push(format!(
            "spec.unhealthyPodEvictionPolicy: Unsupported value: {p:?}: supported values: \"AlwaysAllow\", \"IfHealthyBudget\""
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(spec: Value) -> Value {
        json!({"metadata": {"name": "h"}, "spec": spec})
    }

    fn target() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"})
    }

    #[test]
    fn an_hpa_is_defaulted_as_kubernetes_defaults_it() {
        let mut obj = hpa(json!({"scaleTargetRef": target(), "maxReplicas": 3, "behavior": {}}));
        default_hpa(&mut obj);
        assert_eq!(obj["spec"]["minReplicas"], 1);
        assert_eq!(
            obj["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            obj["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            300
        );
        assert!(validate_hpa(&obj).is_empty(), "{:?}", validate_hpa(&obj));
    }

    #[test]
    fn a_bad_hpa_is_refused_in_kubernetes_words() {
        for (spec, want) in [
            (
                json!({"scaleTargetRef": target(), "maxReplicas": 0}),
                "spec.maxReplicas: Invalid value: 0: must be greater than 0",
            ),
            (
                json!({"scaleTargetRef": target(), "minReplicas": 3, "maxReplicas": 2}),
                "must be greater than or equal to `minReplicas`",
            ),
            (
                json!({"scaleTargetRef": target(), "minReplicas": 0, "maxReplicas": 2}),
                "spec.minReplicas: Invalid value: 0",
            ),
            (
                json!({"scaleTargetRef": {"kind": "Deployment"}, "maxReplicas": 2}),
                "spec.scaleTargetRef.name: Required value",
            ),
            (
                json!({"scaleTargetRef": target(), "maxReplicas": 2, "metrics": [{"type": "Resource"}]}),
                "spec.metrics[0].resource: Required value: must populate information for the given metric source",
            ),
            (
                json!({"scaleTargetRef": target(), "maxReplicas": 2, "metrics": [{"type": "Memory"}]}),
                "spec.metrics[0].type: Unsupported value: \"Memory\"",
            ),
            (
                json!({"scaleTargetRef": target(), "maxReplicas": 2, "metrics": [{"type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization"}}}]}),
                "must set either a target raw value or a target utilization",
            ),
            (
                json!({"scaleTargetRef": target(), "maxReplicas": 2, "behavior": {"scaleUp": {"policies": [
                {"type": "Pods", "value": 0, "periodSeconds": 15}]}}}),
                "spec.behavior.scaleUp.policies[0].value: Invalid value: 0: must be greater than zero",
            ),
        ] {
            let mut obj = hpa(spec.clone());
            default_hpa(&mut obj);
            let errors = validate_hpa(&obj);
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{spec}: {errors:?}"
            );
        }
    }

    #[test]
    fn a_bad_budget_is_refused_in_kubernetes_words() {
        let pdb = |spec: Value| json!({"spec": spec});
        assert!(validate_pdb(&pdb(json!({"minAvailable": 1}))).is_empty());
        assert!(validate_pdb(&pdb(json!({"maxUnavailable": "25%"}))).is_empty());
        for (spec, want) in [
            (
                json!({"minAvailable": 1, "maxUnavailable": 1}),
                "minAvailable and maxUnavailable cannot be both set",
            ),
            (
                json!({"minAvailable": -1}),
                "spec.minAvailable: Invalid value: -1",
            ),
            (
                json!({"maxUnavailable": "150%"}),
                "must not be greater than 100%",
            ),
            (json!({"maxUnavailable": "half"}), "a valid percent string"),
        ] {
            let errors = validate_pdb(&pdb(spec.clone()));
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{spec}: {errors:?}"
            );
        }
    }
}
