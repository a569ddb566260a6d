//! `meta.k8s.io/v1` Table output, which kubectl asks for (`Accept: ...;as=Table`): a Name
//! column, the resource's printer columns (a CRD's `additionalPrinterColumns`), and Age.

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

fn column_definitions(info: &ResourceInfo) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in &info.columns {
        cols.push(json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}));
    }
    if !info
        .columns
        .iter()
        .any(|c| c.json_path == ".metadata.creationTimestamp")
    {
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
    if !info
        .columns
        .iter()
        .any(|c| c.json_path == ".metadata.creationTimestamp")
    {
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

/// Cells kubectl's built-in printers compute rather than read: a pod's ready containers,
/// status (a container's waiting reason, Terminating) and restarts; a deployment's ready
/// replicas.
fn computed(name: &str, obj: &Value) -> Option<Value> {
    let int = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let statuses: &[Value] = obj
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    match name {
        "podReady" => {
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses
                .iter()
                .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
                .count();
            Some(json!(format!("{ready}/{total}")))
        }
        "podStatus" => {
            if meta::is_deleting(obj) {
                return Some(json!("Terminating"));
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
    fn table_accept_header() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }
}
