//! Server-side apply with per-manager field ownership: each manager's applied fields are
//! recorded in `metadata.managedFields` (FieldsV1, lists atomic), and a field a manager
//! applied before but leaves out now is removed, unless another manager applied it too.
//! Conflicts between managers are not detected (every apply acts as if forced).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::meta;
use super::store::Target;

type FieldPath = Vec<String>;

/// The metadata fields apply can own; the rest are the server's or identify the object.
const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// The leaf paths of an applied configuration within what `target` may change.
fn applied_paths(applied: &Value, target: Target) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let Some(root) = applied.as_object() else {
        return out;
    };
    for (key, value) in root {
        let in_scope = match (target, key.as_str()) {
            (Target::Status, k) => k == "status",
            (Target::Main, "status" | "apiVersion" | "kind") => false,
            (Target::Main, _) => true,
        };
        if !in_scope {
            continue;
        }
        if key == "metadata" {
            for field in OWNED_METADATA {
                if let Some(v) = value.get(field) {
                    leaves(v, vec!["metadata".into(), field.into()], &mut out);
                }
            }
        } else {
            leaves(value, vec![key.clone()], &mut out);
        }
    }
    out
}

fn leaves(value: &Value, path: FieldPath, out: &mut BTreeSet<FieldPath>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                let mut p = path.clone();
                p.push(k.clone());
                leaves(v, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// Paths as FieldsV1: `{"f:spec": {"f:size": {}}}`.
fn to_fields(paths: &BTreeSet<FieldPath>) -> Value {
    let mut root = Map::new();
    for path in paths {
        let mut node = &mut root;
        for segment in path {
            let entry = node
                .entry(format!("f:{segment}"))
                .or_insert_with(|| json!({}));
            if !entry.is_object() {
                *entry = json!({});
            }
            let Some(next) = entry.as_object_mut() else {
                break;
            };
            node = next;
        }
    }
    Value::Object(root)
}

fn from_fields(fields: &Value) -> BTreeSet<FieldPath> {
    fn walk(v: &Value, path: FieldPath, out: &mut BTreeSet<FieldPath>) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path);
            }
            return;
        }
        for (k, child) in children {
            let mut p = path.clone();
            p.push(k.trim_start_matches("f:").to_owned());
            walk(child, p, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(fields, Vec::new(), &mut out);
    out
}

fn subresource(target: Target) -> &'static str {
    match target {
        Target::Main => "",
        Target::Status => "status",
    }
}

fn remove_path(doc: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = doc;
    for p in parents {
        match node.get_mut(p) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

/// Maps merge recursively; anything else (lists included) is replaced; nulls remove.
fn merge(doc: &mut Value, applied: &Value) {
    match (doc, applied) {
        (Value::Object(live), Value::Object(cfg)) => {
            for (k, v) in cfg {
                if v.is_null() {
                    live.remove(k);
                } else if let Some(existing) = live.get_mut(k) {
                    merge(existing, v);
                } else {
                    live.insert(k.clone(), v.clone());
                }
            }
        }
        (doc, applied) => *doc = applied.clone(),
    }
}

/// Applies `applied` for `manager` over `live` (`{}` when creating).
pub fn apply(
    live: &Value,
    applied: &Value,
    manager: &str,
    target: Target,
    api_version: &str,
) -> Value {
    let entries: Vec<Value> = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sub = subresource(target);
    let is_mine = |e: &Value| {
        e.get("manager").and_then(Value::as_str) == Some(manager)
            && e.get("operation").and_then(Value::as_str) == Some("Apply")
            && e.get("subresource").and_then(Value::as_str).unwrap_or("") == sub
    };
    let mut previous = BTreeSet::new();
    let mut others = BTreeSet::new();
    for e in &entries {
        let paths = from_fields(e.get("fieldsV1").unwrap_or(&Value::Null));
        if is_mine(e) {
            previous.extend(paths);
        } else {
            others.extend(paths);
        }
    }
    let now = applied_paths(applied, target);
    let mut doc = live.clone();
    for old in previous.difference(&now) {
        let still_applied = now.iter().any(|n| n.starts_with(old) || old.starts_with(n));
        if !still_applied && !others.contains(old) {
            remove_path(&mut doc, old);
        }
    }
    let mut scoped = applied.clone();
    if let Some(m) = scoped.as_object_mut() {
        match target {
            Target::Status => m.retain(|k, _| k == "status"),
            Target::Main => {
                m.remove("status");
            }
        }
    }
    merge(&mut doc, &scoped);
    let mut managed: Vec<Value> = entries.into_iter().filter(|e| !is_mine(e)).collect();
    let mut entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": api_version,
        "time": meta::now(),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields(&now),
    });
    if !sub.is_empty() {
        entry["subresource"] = json!(sub);
    }
    managed.push(entry);
    meta::set(&mut doc, "managedFields", Value::Array(managed));
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let applied = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "labels": {"l": "1"}}, "spec": {"a": 1, "b": {"c": [1]}, "e": {}}, "status": {"s": 1}});
        let paths = applied_paths(&applied, Target::Main);
        let fields = to_fields(&paths);
        assert_eq!(
            fields,
            json!({"f:metadata": {"f:labels": {"f:l": {}}}, "f:spec": {"f:a": {}, "f:b": {"f:c": {}}, "f:e": {}}})
        );
        assert_eq!(from_fields(&fields), paths);
        assert_eq!(
            applied_paths(&applied, Target::Status),
            [vec!["status".to_owned(), "s".to_owned()]].into()
        );
    }

    #[test]
    fn a_dropped_field_is_removed_unless_another_manager_applied_it() {
        let first = json!({"spec": {"a": 1, "b": 2, "c": 3}});
        let live = apply(&json!({}), &first, "one", Target::Main, "v1");
        let live = apply(&live, &json!({"spec": {"c": 3}}), "two", Target::Main, "v1");
        let live = apply(&live, &json!({"spec": {"a": 5}}), "one", Target::Main, "v1");
        assert_eq!(live["spec"], json!({"a": 5, "c": 3}));
        assert_eq!(
            live["metadata"]["managedFields"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn status_and_main_are_owned_apart() {
        let live = apply(
            &json!({"spec": {"a": 1}}),
            &json!({"status": {"x": 1, "y": 2}}),
            "ctl",
            Target::Status,
            "v1",
        );
        let live = apply(
            &live,
            &json!({"status": {"x": 2}, "spec": {"a": 9}}),
            "ctl",
            Target::Status,
            "v1",
        );
        assert_eq!(live["status"], json!({"x": 2}));
        assert_eq!(live["spec"], json!({"a": 1}));
    }
}
