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
    in_seconds(0)
}

/// `seconds` from now, as [`now`] writes it.
pub fn in_seconds(seconds: i64) -> String {
    let now = time::OffsetDateTime::now_utc() + time::Duration::seconds(seconds);
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
}
