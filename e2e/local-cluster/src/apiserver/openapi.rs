//! A minimal OpenAPI v3 surface: an index of group/versions and, per group/version, each
//! resource's PATCH operation with its GVK and query parameters, and the schema of every
//! custom resource. kubectl reads the operations to learn that the server validates fields
//! itself (`fieldValidation`), which spares it from client-side validation, and the schemas
//! for `kubectl explain`: each CRD version's structural `openAPIV3Schema` under
//! `components.schemas`, named and tagged with `x-kubernetes-group-version-kind` as
//! kube-apiserver names and tags them. Built-in kinds have no schema here.

use serde_json::{Map, Value, json};

use super::registry::{Registry, ResourceInfo};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: where each group/version's document is.
pub fn index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let p = gv_path(&group, &version);
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
            );
        }
    }
    json!({"paths": paths})
}

fn object_path(info: &ResourceInfo) -> String {
    let base = gv_path(&info.group, &info.version);
    if info.namespaced {
        format!("/{base}/namespaces/{{namespace}}/{}/{{name}}", info.plural)
    } else {
        format!("/{base}/{}/{{name}}", info.plural)
    }
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/<group>/<version>`; `None` if nothing is there.
pub fn group_version(registry: &Registry, path: &str) -> Option<Value> {
    let path = path
        .trim_start_matches("/openapi/v3/")
        .trim_end_matches('/');
    let (group, version) = match path.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), (*v).to_owned()),
        ["apis", g, v] => ((*g).to_owned(), (*v).to_owned()),
        _ => return None,
    };
    let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let mut paths = Map::new();
    for info in registry
        .all()
        .filter(|r| r.group == group && r.version == version)
    {
        paths.insert(
            object_path(info),
            json!({
                "patch": {
                    "operationId": format!("patch{}", info.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {"group": info.group, "version": info.version, "kind": info.kind},
                    "responses": {"200": {"description": "OK"}},
                    "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")],
                },
            }),
        );
    }
    if paths.is_empty() {
        return None;
    }
    let schemas: Map<String, Value> = registry
        .all()
        .filter(|r| r.group == group && r.version == version)
        .filter_map(|info| {
            Some((
                schema_name(info),
                resource_schema(info, info.schema.as_deref()?),
            ))
        })
        .collect();
    let components = if schemas.is_empty() {
        json!({})
    } else {
        json!({"schemas": schemas})
    };
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "components": components,
    }))
}

/// kube-apiserver's name for a custom resource's schema: the group reversed, the version and
/// the kind (`net.3scale.marin3r.v1alpha1.EnvoyConfig`).
fn schema_name(info: &ResourceInfo) -> String {
    let mut parts: Vec<&str> = info.group.split('.').rev().collect();
    parts.push(&info.version);
    parts.push(&info.kind);
    parts.join(".")
}

/// The CRD's schema as served: tagged with its GVK, and with the fields every object has
/// described where the CRD leaves them out, as kube-apiserver does.
fn resource_schema(info: &ResourceInfo, schema: &Value) -> Value {
    let mut schema = schema.clone();
    let Some(obj) = schema.as_object_mut() else {
        return schema;
    };
    obj.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([{"group": info.group, "version": info.version, "kind": info.kind}]),
    );
    let properties = obj
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut();
    if let Some(properties) = properties {
        for (field, type_, description) in [
            (
                "apiVersion",
                "string",
                "The versioned schema of this object: group/version. See https://kubernetes.io/docs/reference/using-api/api-concepts/",
            ),
            (
                "kind",
                "string",
                "The REST resource this object represents, in CamelCase. See https://kubernetes.io/docs/reference/using-api/api-concepts/",
            ),
            (
                "metadata",
                "object",
                "Standard object metadata: name, namespace, labels, annotations, ownerReferences and the fields the server sets.",
            ),
        ] {
            let entry = properties
                .entry(field)
                .or_insert_with(|| json!({"type": type_}));
            if let Some(entry) = entry.as_object_mut() {
                entry
                    .entry("description")
                    .or_insert_with(|| Value::String(description.to_owned()));
            }
        }
    }
    schema
}
