//! `meta.k8s.io/v1` Table output, which kubectl asks for (`Accept: ...;as=Table`): a Name
//! column, the resource's printer columns, and Age for a built-in kind. A custom resource's
//! columns are its CRD's `additionalPrinterColumns` (Age alone when it declares none, see
//! `registry`), with no Age added: as kube-apiserver serves them.

use serde_json::{Value, json};

use super::meta;
use super::registry::ResourceInfo;
use super::store::present;

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// Whether an `Accept` header asks for Table output.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// A built-in kind (no CRD schema) whose columns here leave out the Age its real table has.
fn builtin_without_age(info: &ResourceInfo) -> bool {
    info.schema.is_none()
        && !info
            .columns
            .iter()
            .any(|c| c.json_path == ".metadata.creationTimestamp")
}

fn column_definitions(info: &ResourceInfo) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in &info.columns {
        cols.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    if builtin_without_age(info) {
        cols.push(json!({"name": "Age", "type": "date", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    }
    cols
}

/// A whole table for a list (or one watch event).
pub fn table(
    info: &ResourceInfo,
    objects: &[Value],
    resource_version: u64,
    include: IncludeObject,
) -> Value {
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": column_definitions(info),
        "rows": objects.iter().map(|o| row(info, o, include)).collect::<Vec<_>>(),
    })
}

fn row(info: &ResourceInfo, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![json!(meta::name(obj))];
    for c in &info.columns {
        let v = match c.json_path.strip_prefix('#') {
            Some(name) => computed(name, obj),
            None => eval_path(obj, &c.json_path),
        };
        cells.push(match (c.type_.as_str(), v) {
            (_, None) => Value::Null,
            ("date", Some(Value::String(ts))) => json!(age(&ts)),
            (_, Some(v)) => v,
        });
    }
    if builtin_without_age(info) {
        let created = obj
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .unwrap_or("");
        cells.push(json!(age(created)));
    }
    let mut row = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            });
        }
        IncludeObject::Object => row["object"] = present(info, obj),
    }
    row
}

fn array<'a>(obj: &'a Value, pointer: &str) -> &'a [Value] {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The names of the pod's sidecars (init containers with `restartPolicy: Always`).
fn sidecar_names(obj: &Value) -> Vec<&str> {
    array(obj, "/spec/initContainers")
        .iter()
        .filter(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always"))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect()
}

/// kubectl's status of a pod still initializing: `Init:<reason>` for a failing or waiting
/// init container, else `Init:<done>/<all>`; sidecars are passed over, as kubectl does.
fn init_status(obj: &Value) -> Option<String> {
    let sidecars = sidecar_names(obj);
    let total = array(obj, "/spec/initContainers").len();
    for (i, c) in array(obj, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        if sidecars.contains(&name) {
            continue;
        }
        if let Some(t) = c.pointer("/state/terminated") {
            match t.get("exitCode").and_then(Value::as_i64) {
                Some(0) => continue,
                code => {
                    let reason = t.get("reason").and_then(Value::as_str);
                    return Some(reason.map_or_else(
                        || format!("Init:ExitCode:{}", code.unwrap_or_default()),
                        |r| format!("Init:{r}"),
                    ));
                }
            }
        }
        let waiting = c.pointer("/state/waiting/reason").and_then(Value::as_str);
        return Some(match waiting {
            Some(r) if r != "PodInitializing" => format!("Init:{r}"),
            _ => format!("Init:{i}/{total}"),
        });
    }
    None
}

/// Cells kubectl's built-in printers compute rather than read: a pod's ready containers
/// (sidecars included), status (initializing, a container's waiting reason, Terminating)
/// and restarts; a deployment's ready replicas.
fn computed(name: &str, obj: &Value) -> Option<Value> {
    let int = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let statuses = array(obj, "/status/containerStatuses");
    let init_statuses = array(obj, "/status/initContainerStatuses");
    let is_true = |c: &Value, key: &str| c.get(key).and_then(Value::as_bool) == Some(true);
    match name {
        "podReady" => {
            let sidecars = sidecar_names(obj);
            let total = array(obj, "/spec/containers").len() + sidecars.len();
            let ready_sidecars = init_statuses.iter().filter(|c| {
                let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
                sidecars.contains(&name) && is_true(c, "started") && is_true(c, "ready")
            });
            let ready =
                statuses.iter().filter(|c| is_true(c, "ready")).count() + ready_sidecars.count();
            Some(json!(format!("{ready}/{total}")))
        }
        "podStatus" => {
            if meta::is_deleting(obj) {
                return Some(json!("Terminating"));
            }
            if let Some(init) = init_status(obj) {
                return Some(json!(init));
            }
            let waiting = statuses.iter().find_map(|c| {
                c.pointer("/state/waiting/reason")
                    .or_else(|| c.pointer("/state/terminated/reason"))
                    .and_then(Value::as_str)
            });
            let phase = obj.pointer("/status/phase").and_then(Value::as_str);
            waiting.or(phase).map(|s| json!(s))
        }
        "podRestarts" => Some(json!(
            statuses
                .iter()
                .chain(init_statuses)
                .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
                .sum::<i64>()
        )),
        "deploymentReady" => Some(json!(format!(
            "{}/{}",
            int("/status/readyReplicas"),
            obj.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        ))),
        _ => None,
    }
}

/// Evaluates the JSONPath subset printer columns use: `.a.b`, `.a[0]`,
/// `.a[?(@.type=="Ready")].status`.
pub fn eval_path(obj: &Value, path: &str) -> Option<Value> {
    let mut cur = obj.clone();
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut rest = path.strip_prefix('.').unwrap_or(path);
    while !rest.is_empty() {
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let (field, after) = rest.split_at(end);
        if !field.is_empty() {
            cur = cur.get(field)?.clone();
        }
        rest = after;
        if let Some(bracket) = rest.strip_prefix('[') {
            let close = bracket.find(']')?;
            let inner = &bracket[..close];
            rest = &bracket[close + 1..];
            cur = if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')'))
            {
                let (key, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
                cur.as_array()?
                    .iter()
                    .find(|item| item.get(key.trim()).and_then(Value::as_str) == Some(want))?
                    .clone()
            } else {
                cur.get(inner.parse::<usize>().ok()?)?.clone()
            };
        }
        rest = rest.strip_prefix('.').unwrap_or(rest);
    }
    Some(cur)
}

/// A short age as kubectl prints it ("45s", "3m", "5h", "2d").
fn age(timestamp: &str) -> String {
    let Ok(created) =
        time::OffsetDateTime::parse(timestamp, &time::format_description::well_known::Rfc3339)
    else {
        return "<unknown>".into();
    };
    let secs = (time::OffsetDateTime::now_utc() - created)
        .whole_seconds()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths() {
        let o = json!({"spec": {"a": {"b": 3}, "l": [{"x": 1}]}, "status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(eval_path(&o, ".spec.a.b"), Some(json!(3)));
        assert_eq!(eval_path(&o, ".spec.l[0].x"), Some(json!(1)));
        assert_eq!(
            eval_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(eval_path(&o, ".spec.missing"), None);
    }

    #[test]
    fn computed_pod_and_deployment_cells() {
        let pod = json!({
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Pending", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "ErrImagePull"}}},
            ]},
        });
        assert_eq!(computed("podReady", &pod), Some(json!("1/2")));
        assert_eq!(computed("podStatus", &pod), Some(json!("ErrImagePull")));
        assert_eq!(computed("podRestarts", &pod), Some(json!(3)));
        let deploy = json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}});
        assert_eq!(computed("deploymentReady", &deploy), Some(json!("1/2")));
    }

    #[test]
    fn pod_cells_count_sidecars_as_kubectl_does() {
        let init = json!([
            {"name": "proxy", "restartPolicy": "Always"},
            {"name": "setup"},
        ]);
        let pod = |init_statuses: Value, statuses: Value| {
            json!({"spec": {"initContainers": init, "containers": [{"name": "app"}]},
                "status": {"phase": "Pending", "initContainerStatuses": init_statuses,
                    "containerStatuses": statuses}})
        };
        let waiting = json!([{"name": "app", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "PodInitializing"}}}]);
        let initializing = pod(
            json!([
                {"name": "proxy", "ready": true, "started": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "setup", "ready": false, "restartCount": 0, "state": {"running": {}}},
            ]),
            waiting.clone(),
        );
        assert_eq!(computed("podReady", &initializing), Some(json!("1/2")));
        assert_eq!(
            computed("podStatus", &initializing),
            Some(json!("Init:1/2"))
        );
        assert_eq!(computed("podRestarts", &initializing), Some(json!(2)));
        let failed = pod(
            json!([
                {"name": "proxy", "ready": false, "started": false, "restartCount": 0, "state": {"running": {}}},
                {"name": "setup", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 3, "reason": "Error"}}},
            ]),
            waiting,
        );
        assert_eq!(computed("podReady", &failed), Some(json!("0/2")));
        assert_eq!(computed("podStatus", &failed), Some(json!("Init:Error")));
        let running = pod(
            json!([
                {"name": "proxy", "ready": true, "started": true, "restartCount": 0, "state": {"running": {}}},
                {"name": "setup", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            ]),
            json!([{"name": "app", "ready": true, "restartCount": 1, "state": {"running": {}}}]),
        );
        assert_eq!(computed("podReady", &running), Some(json!("2/2")));
        assert_eq!(computed("podStatus", &running), Some(json!("Pending")));
    }

    #[test]
    fn table_accept_header() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
