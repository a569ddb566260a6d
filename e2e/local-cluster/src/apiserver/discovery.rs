//! Discovery documents (`/version`, `/api`, `/apis`, `/api/v1`, `/apis/<group>[/<version>]`)
//! in their legacy (unaggregated) form, which kubectl and kube-rs fall back to when the
//! server does not answer with `APIGroupDiscoveryList`.

use serde_json::{Value, json};

use super::registry::{Registry, ResourceInfo};

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "37",
        "gitVersion": "v1.37.0-marin3r-local",
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "",
        "compiler": "rust",
        "platform": "linux/amd64",
    })
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

fn group(name: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(json!({})),
    })
}

pub fn group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn api_group(registry: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = registry.groups().into_iter().find(|(g, _)| g == name)?;
    let mut out = group(&g, &vs);
    out["kind"] = json!("APIGroup");
    out["apiVersion"] = json!("v1");
    Some(out)
}

fn resource(info: &ResourceInfo) -> Value {
    json!({
        "name": info.plural,
        "singularName": info.singular,
        "namespaced": info.namespaced,
        "kind": info.kind,
        "verbs": VERBS,
        "shortNames": info.short_names,
        "categories": info.categories,
    })
}

/// The resources of one group/version, `None` when nothing is served there.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for info in registry
        .all()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(resource(info));
        if info.group.is_empty() && info.plural == "pods" {
            resources.push(json!({
                "name": "pods/log",
                "singularName": "",
                "namespaced": true,
                "kind": "Pod",
                "verbs": ["get"],
            }));
        }
        if info.group == "apps" && info.plural == "deployments" {
            resources.push(json!({
                "name": "deployments/scale",
                "singularName": "",
                "namespaced": true,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        if info.status {
            resources.push(json!({
                "name": format!("{}/status", info.plural),
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": info.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_and_group_resources() {
        let reg = Registry::default();
        let core = resource_list(&reg, "", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert!(names.contains(&"pods") && names.contains(&"pods/status"));
        assert!(resource_list(&reg, "apps", "v1").is_some());
        assert!(resource_list(&reg, "nope", "v1").is_none());
        let groups = group_list(&reg);
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "apps")
        );
        assert!(api_group(&reg, "apps").is_some());
    }
}
