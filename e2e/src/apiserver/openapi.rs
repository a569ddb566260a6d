//! A minimal OpenAPI v3 surface: an index of group/versions and, per group/version, each
//! resource's PATCH operation with its GVK and query parameters. kubectl reads it only to
//! learn that the server validates fields itself (`fieldValidation`), which spares it from
//! downloading schemas for client-side validation. No schemas are served.

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
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.37.0"},
        "paths": paths,
        "components": {},
    }))
}
