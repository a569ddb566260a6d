//! Reading and normalising `metadata` of objects held as JSON.

use serde_json::{Map, Value};

pub fn name(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn uid(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn resource_version(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/labels").and_then(Value::as_object)
}

pub fn finalizers(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub fn is_deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The uids this object names in `ownerReferences`.
pub fn owner_uids(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default()
}

/// The `metadata` map of an object, created when missing or not a map; `None` when the
/// object itself is not a map (callers reject such bodies first).
pub fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = obj
        .as_object_mut()?
        .entry("metadata")
        .or_insert(Value::Null);
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

pub fn set(obj: &mut Value, key: &str, value: Value) {
    if let Some(meta) = metadata_mut(obj) {
        meta.insert(key.to_owned(), value);
    }
}

pub fn remove(obj: &mut Value, key: &str) -> Option<Value> {
    metadata_mut(obj)?.remove(key)
}

/// Drops empty and null metadata fields the way Go's `omitempty` would, so clients see the
/// same shapes as from a real API server (kube-rs' `finalizer()` tests `finalizers` is null).
pub fn normalise(obj: &mut Value) {
    let Some(meta) = metadata_mut(obj) else {
        return;
    };
    meta.retain(|_, v| match v {
        Value::Null => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    });
    meta.remove("selfLink");
}

/// Now, as Kubernetes writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second()
    )
}

/// Whether `name` is a DNS-1123 subdomain (most kinds) or label (namespaces); `None` when valid.
pub fn name_problem(name: &str, label_only: bool) -> Option<String> {
    let max = if label_only { 63 } else { 253 };
    let ok_chars = name.chars().all(|c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (!label_only && c == '.')
    });
    let ok_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name.len() > max {
        Some(format!("must be no more than {max} characters"))
    } else if !ok_chars || !ok_ends {
        Some(format!(
            "a lowercase RFC 1123 {} must consist of lower case alphanumeric characters{}, and must start and end with an alphanumeric character",
            if label_only { "label" } else { "subdomain" },
            if label_only {
                " or '-'"
            } else {
                ", '-' or '.'"
            }
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn normalise_drops_what_go_omits() {
        let mut o = json!({"metadata": {"name": "a", "finalizers": [], "labels": {}, "managedFields": [], "annotations": {"x": "y"}}});
        normalise(&mut o);
        assert_eq!(
            o,
            json!({"metadata": {"name": "a", "annotations": {"x": "y"}}})
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(name_problem("web-1.example", false).is_none());
        assert!(name_problem("web-1.example", true).is_some());
        assert!(name_problem("Web", false).is_some());
        assert!(name_problem("-a", false).is_some());
        assert!(name_problem("", false).is_some());
    }
}
