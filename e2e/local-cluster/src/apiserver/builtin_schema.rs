//! The fields of the built-in kinds this server stores, as structural schemas generated from
//! their k8s-openapi types (the way kube derives a CRD's schema). A real API server decodes a
//! built-in object into its Go type, which drops what the type lacks, and refuses those
//! fields under `fieldValidation=Strict`; the same schemas let this server do both.
//! Events (stored once, served in two versions) and CustomResourceDefinitions (their schema
//! type is recursive) have none here: their unknown fields are kept.

use std::collections::HashMap;
use std::sync::OnceLock;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde_json::Value;

use super::registry::ResourceInfo;

type Generate = fn() -> Value;

/// `group/version/Kind` of each kind with a schema here, and how to generate it.
const KINDS: &[(&str, Generate)] = &[
    ("/v1/Pod", generate::<Pod>),
    ("/v1/Service", generate::<Service>),
    ("/v1/Secret", generate::<Secret>),
    ("/v1/ConfigMap", generate::<ConfigMap>),
    ("/v1/Namespace", generate::<Namespace>),
    ("/v1/ServiceAccount", generate::<ServiceAccount>),
    ("apps/v1/Deployment", generate::<Deployment>),
    (
        "autoscaling/v2/HorizontalPodAutoscaler",
        generate::<HorizontalPodAutoscaler>,
    ),
    (
        "policy/v1/PodDisruptionBudget",
        generate::<PodDisruptionBudget>,
    ),
    ("rbac.authorization.k8s.io/v1/Role", generate::<Role>),
    (
        "rbac.authorization.k8s.io/v1/RoleBinding",
        generate::<RoleBinding>,
    ),
    (
        "rbac.authorization.k8s.io/v1/ClusterRole",
        generate::<ClusterRole>,
    ),
    (
        "rbac.authorization.k8s.io/v1/ClusterRoleBinding",
        generate::<ClusterRoleBinding>,
    ),
    (
        "discovery.k8s.io/v1/EndpointSlice",
        generate::<EndpointSlice>,
    ),
    (
        "scheduling.k8s.io/v1/PriorityClass",
        generate::<PriorityClass>,
    ),
    ("coordination.k8s.io/v1/Lease", generate::<Lease>),
    (
        "admissionregistration.k8s.io/v1/MutatingWebhookConfiguration",
        generate::<MutatingWebhookConfiguration>,
    ),
    (
        "admissionregistration.k8s.io/v1/ValidatingWebhookConfiguration",
        generate::<ValidatingWebhookConfiguration>,
    ),
];

/// The schema of a built-in kind, if it has one here (generated once, on first use).
pub fn for_kind(info: &ResourceInfo) -> Option<&'static Value> {
    static SCHEMAS: OnceLock<HashMap<&'static str, Value>> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| KINDS.iter().map(|(k, g)| (*k, g())).collect());
    let key = format!("{}/{}/{}", info.group, info.version, info.kind);
    schemas.get(key.as_str())
}

/// The structural schema of `K`: subschemas inlined, optional fields `nullable`, as
/// kube-derive builds a CRD's; then every object the type leaves open (`RawExtension`,
/// `FieldsV1`: an object with no properties) keeps what it holds, as a real server does.
fn generate<K: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<K>()).unwrap_or_default();
    open_objects_preserve(&mut schema);
    schema
}

fn open_objects_preserve(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    let open = map.get("type").and_then(Value::as_str) == Some("object")
        && !map.contains_key("properties")
        && !map.contains_key("additionalProperties");
    if open {
        map.insert(
            "x-kubernetes-preserve-unknown-fields".into(),
            Value::Bool(true),
        );
    }
    for (k, v) in map.iter_mut() {
        match k.as_str() {
            "properties" => v
                .as_object_mut()
                .into_iter()
                .flat_map(|p| p.values_mut())
                .for_each(open_objects_preserve),
            "items" | "additionalProperties" => open_objects_preserve(v),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node pruning walks is plain structure: no reference or combinator left
    /// unresolved, and every object says which fields it keeps.
    fn check(path: &str, schema: &Value, problems: &mut Vec<String>) {
        let Some(map) = schema.as_object() else {
            return;
        };
        for k in ["$ref", "anyOf", "oneOf", "allOf"] {
            if map.contains_key(k) {
                problems.push(format!("{path}: {k}"));
            }
        }
        let object = map.get("type").and_then(Value::as_str) == Some("object");
        let says = [
            "properties",
            "additionalProperties",
            "x-kubernetes-preserve-unknown-fields",
        ]
        .iter()
        .any(|k| map.contains_key(*k));
        if object && !says {
            problems.push(format!("{path}: an object keeping nothing"));
        }
        for (name, sub) in map
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            check(&format!("{path}.{name}"), sub, problems);
        }
        for k in ["items", "additionalProperties"] {
            if let Some(sub) = map.get(k) {
                check(&format!("{path}[{k}]"), sub, problems);
            }
        }
    }

    #[test]
    fn every_schema_is_structural() {
        for (kind, generate) in KINDS {
            let schema = generate();
            let mut problems = Vec::new();
            check(kind, &schema, &mut problems);
            assert!(problems.is_empty(), "{problems:#?}");
            assert!(schema["properties"]["metadata"].is_object(), "{kind}");
        }
        let hpa = KINDS[7].1();
        let spec = &hpa["properties"]["spec"]["properties"];
        assert!(
            spec["maxReplicas"].is_object() && spec["behavior"].is_object(),
            "{spec}"
        );
    }
}
