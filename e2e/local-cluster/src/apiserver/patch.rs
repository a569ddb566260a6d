//! The document patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge (approximated by a merge patch: lists are replaced, not merged by key).
//! Server-side apply is in `ssa`.

use serde_json::Value;

/// Which format a PATCH body is in, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchKind {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Parses a body that may be JSON or YAML (apply patches are YAML; kube-rs sends JSON).
pub fn parse_json_or_yaml(body: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(json_err) => serde_saphyr::from_slice::<Value>(body).map_err(|yaml_err| {
            format!(
                "neither JSON ({json_err}) nor YAML ({})",
                yaml_err.without_snippet()
            )
        }),
    }
}

/// Applies `patch` of `kind` to `current`, giving the patched document.
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, String> {
    let mut doc = current.clone();
    match kind {
        PatchKind::Merge | PatchKind::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| format!("invalid merge patch: {e}"))?;
            if !patch.is_object() {
                return Err("a merge patch must be a JSON object".into());
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchKind::Apply => {
            return Err("server-side apply is not a document patch (see ssa.rs)".into());
        }
        PatchKind::Json => {
            let ops: Value =
                serde_json::from_slice(body).map_err(|e| format!("invalid JSON patch: {e}"))?;
            let ops = tolerate_null_tests(&doc, ops)?;
            let patch: json_patch::Patch =
                serde_json::from_value(ops).map_err(|e| format!("invalid JSON patch: {e}"))?;
            json_patch::patch(&mut doc, &patch).map_err(|e| e.to_string())?;
        }
    }
    Ok(doc)
}

/// Kubernetes' JSON patch treats a missing path as null, so `test` with value null on a
/// missing path passes (kube-rs' `finalizer()` adds the first finalizer that way).
fn tolerate_null_tests(doc: &Value, ops: Value) -> Result<Value, String> {
    let Value::Array(ops) = ops else {
        return Err("a JSON patch must be an array of operations".into());
    };
    let kept = ops
        .into_iter()
        .filter(|op| {
            let is_null_test = op.get("op").and_then(Value::as_str) == Some("test")
                && op.get("value").is_some_and(Value::is_null);
            let path = op.get("path").and_then(Value::as_str).unwrap_or("");
            !(is_null_test && doc.pointer(path).is_none_or(Value::is_null))
        })
        .collect();
    Ok(Value::Array(kept))
}

/// `value` without the keys of strategic merge patch directives (`$patch`, `$retainKeys`,
/// `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`), at any depth.
pub fn without_directives(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(without_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(without_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn null_test_on_missing_path_passes() {
        let cur = json!({"metadata": {"name": "a"}});
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":null},{"op":"add","path":"/metadata/finalizers","value":["f"]}]"#;
        let out = apply(PatchKind::Json, &cur, body).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["f"]));
    }

    #[test]
    fn failing_test_op_fails() {
        let cur = json!({"metadata": {"name": "a", "finalizers": ["g"]}});
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":null}]"#;
        assert!(apply(PatchKind::Json, &cur, body).is_err());
        let body = br#"[{"op":"test","path":"/metadata/finalizers/0","value":"f"},{"op":"remove","path":"/metadata/finalizers/0"}]"#;
        assert!(apply(PatchKind::Json, &cur, body).is_err());
    }

    #[test]
    fn merge_and_yaml() {
        let cur = json!({"spec": {"a": 1, "b": [1, 2], "c": {"d": 1}}});
        let out = apply(PatchKind::Merge, &cur, br#"{"spec":{"a":null,"b":[3]}}"#).unwrap();
        assert_eq!(out, json!({"spec": {"b": [3], "c": {"d": 1}}}));
        assert!(apply(PatchKind::Merge, &cur, b"[1]").is_err());
        assert_eq!(
            parse_json_or_yaml(b"spec:\n  c: 2\n").unwrap(),
            json!({"spec": {"c": 2}})
        );
        assert!(parse_json_or_yaml(b": : :").is_err());
    }
}
