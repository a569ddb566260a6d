//! What a real API server does with a custom resource against its CRD version's structural
//! `openAPIV3Schema`: pruning of unknown fields (honouring `x-kubernetes-preserve-unknown-fields`,
//! `x-kubernetes-embedded-resource`, `x-kubernetes-int-or-string`, `additionalProperties`),
//! `default`s (on write and on read from storage), and validation with Kubernetes' messages
//! (`spec.x: Required value`, `... in body must be of type integer: "string"`, ...).

use serde_json::{Map, Value};

/// The fields of `metav1.ObjectMeta`: anything else in `metadata` is dropped, as decoding
/// into the typed struct does on a real server.
const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Drops the fields of `metadata` that `ObjectMeta` does not have.
pub fn prune_metadata(obj: &mut Value) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|k, _| OBJECT_META_FIELDS.contains(&k.as_str()));
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

/// Prunes, defaults and validates a whole custom resource; the errors are field errors in
/// Kubernetes' words, empty when the object is valid.
pub fn admit(schema: &Value, obj: &mut Value) -> Vec<String> {
    prune_root(schema, obj);
    default_root(schema, obj);
    let mut errors = Vec::new();
    if let Some(root) = obj.as_object() {
        let mut props = root.clone();
        // apiVersion, kind and metadata are the server's; only the rest is the schema's.
        for k in ["apiVersion", "kind", "metadata"] {
            props.remove(k);
        }
        validate_object_body(schema, &props, "", &mut errors);
    }
    errors
}

/// Prunes the root: apiVersion, kind and metadata stay (metadata down to ObjectMeta).
pub fn prune_root(schema: &Value, obj: &mut Value) {
    prune_metadata(obj);
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    map.retain(|k, _| {
        matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
            || preserve
            || props.is_some_and(|p| p.contains_key(k))
    });
    for (k, v) in map.iter_mut() {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(s) = props.and_then(|p| p.get(k)) {
            prune(s, v);
        }
    }
}

/// The paths (`spec.x`, `metadata.y`) of the fields pruning would drop from a whole object,
/// as `fieldValidation=Strict` reports them.
pub fn unknown_fields(schema: Option<&Value>, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(meta) = obj.get("metadata").and_then(Value::as_object) {
        for k in meta.keys() {
            if !OBJECT_META_FIELDS.contains(&k.as_str()) {
                out.push(format!("metadata.{k}"));
            }
        }
    }
    let (Some(schema), Some(map)) = (schema, obj.as_object()) else {
        return out;
    };
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in map {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.and_then(|p| p.get(k)) {
            Some(s) => collect_unknown(s, v, k, &mut out),
            None if !preserve => out.push(k.clone()),
            None => {}
        }
    }
    out
}

fn collect_unknown(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let mut pruned = value.clone();
    prune(schema, &mut pruned);
    diff(value, &pruned, path, out);
}

/// What is in `before` and not in `after` (which is `before` pruned).
fn diff(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, v) in b {
                let p = format!("{path}.{k}");
                match a.get(k) {
                    Some(av) => diff(v, av, &p, out),
                    None => out.push(p),
                }
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            for (i, (bv, av)) in b.iter().zip(a).enumerate() {
                diff(bv, av, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Removes what `schema` does not specify from `value`, recursively.
pub fn prune(schema: &Value, value: &mut Value) {
    if flag(schema, "x-kubernetes-int-or-string") {
        return;
    }
    match value {
        Value::Object(map) => {
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            if embedded && let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.retain(|k, _| OBJECT_META_FIELDS.contains(&k.as_str()));
            }
            let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keeps_unknown =
                preserve || additional.is_some_and(|a| a.is_object() || a == &Value::Bool(true));
            map.retain(|k, _| {
                keeps_unknown
                    || props.is_some_and(|p| p.contains_key(k))
                    || (embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
            });
            for (k, v) in map.iter_mut() {
                match props.and_then(|p| p.get(k)) {
                    Some(s) => prune(s, v),
                    None => {
                        if let Some(a) = additional.filter(|a| a.is_object()) {
                            prune(a, v);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for item in items {
                    prune(s, item);
                }
            }
        }
        _ => {}
    }
}

fn default_root(schema: &Value, obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    default_object(schema, map, true);
}

/// Applies `default`s of `schema` to `value`, recursively: a missing property with a default
/// gets it, and so does a null one that is not nullable.
pub fn default(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => default_object(schema, map, false),
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for item in items {
                    default(s, item);
                }
            }
        }
        _ => {}
    }
}

fn default_object(schema: &Value, map: &mut Map<String, Value>, root: bool) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let Some(d) = s.get("default") else {
                continue;
            };
            let missing = match map.get(k) {
                None => true,
                Some(Value::Null) => !flag(s, "nullable"),
                Some(_) => false,
            };
            if missing {
                let mut d = d.clone();
                // Defaults are pruned like any other value.
                prune(s, &mut d);
                map.insert(k.clone(), d);
            }
        }
        for (k, v) in map.iter_mut() {
            if let Some(s) = props.get(k) {
                default(s, v);
            }
        }
    } else if let Some(a) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        for v in map.values_mut() {
            default(a, v);
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value as Kubernetes quotes it in "Invalid value: ..." (strings quoted, others as JSON).
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) | Value::Array(_) => format!("{:?}", type_name(v)),
        other => other.to_string(),
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match want {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        _ => true,
    }
}

/// Validates `value` at `path` against `schema`, pushing each problem found.
pub fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if !flag(schema, "nullable") && schema.get("type").is_some() {
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema.get("type").and_then(Value::as_str).unwrap_or("")
            ));
        }
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(value.is_string() || type_matches("integer", value)) {
            errors.push(format!(
                "{path}: Invalid value: {}: {path} in body must be of type integer or string: {:?}",
                shown(value),
                type_name(value)
            ));
        }
        return;
    }
    if let Some(want) = schema.get("type").and_then(Value::as_str)
        && !type_matches(want, value)
    {
        errors.push(format!(
            "{path}: Invalid value: {:?}: {path} in body must be of type {want}: {:?}",
            type_name(value),
            type_name(value)
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(shown).collect();
        errors.push(format!(
            "{path}: Unsupported value: {}: supported values: {}",
            shown(value),
            list.join(", ")
        ));
    }
    match value {
        Value::Object(map) => validate_object_body(schema, map, path, errors),
        Value::Array(items) => {
            let n = items.len();
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && n as u64 > max
            {
                errors.push(format!(
                    "{path}: Too many: {n}: must have at most {max} items"
                ));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (n as u64) < min
            {
                errors.push(format!(
                    "{path}: Invalid value: {n}: {path} in body should have at least {min} items"
                ));
            }
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(s, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::String(s) => validate_string(schema, s, path, errors),
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let bound = |k: &str| schema.get(k).and_then(Value::as_f64);
            if let Some(min) = bound("minimum") {
                if flag(schema, "exclusiveMinimum") && x <= min {
                    errors.push(format!(
                        "{path}: Invalid value: {n}: {path} in body should be greater than {min}"
                    ));
                } else if x < min {
                    errors.push(format!(
                        "{path}: Invalid value: {n}: {path} in body should be greater than or equal to {min}"
                    ));
                }
            }
            if let Some(max) = bound("maximum") {
                if flag(schema, "exclusiveMaximum") && x >= max {
                    errors.push(format!(
                        "{path}: Invalid value: {n}: {path} in body should be less than {max}"
                    ));
                } else if x > max {
                    errors.push(format!(
                        "{path}: Invalid value: {n}: {path} in body should be less than or equal to {max}"
                    ));
                }
            }
            if let Some(format) = schema.get("format").and_then(Value::as_str) {
                let range = match format {
                    "int32" => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
                    "uint16" => Some((0.0, f64::from(u16::MAX))),
                    _ => None,
                };
                if let Some((lo, hi)) = range
                    && (x < lo || x > hi)
                {
                    errors.push(format!(
                        "{path}: Invalid value: {n}: {path} in body must be of type {format}: \"{n}\""
                    ));
                }
            }
        }
        _ => {}
    }
    validate_combinators(schema, value, path, errors);
}

fn validate_string(schema: &Value, s: &str, path: &str, errors: &mut Vec<String>) {
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errors.push(format!(
            "{path}: Too long: may not be more than {max} bytes"
        ));
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        errors.push(format!(
            "{path}: Invalid value: {s:?}: {path} in body should be at least {min} chars long"
        ));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => errors.push(format!(
                "{path}: Invalid value: {s:?}: {path} in body should match '{pattern}'"
            )),
            Ok(_) => {}
            Err(e) => errors.push(format!(
                "{path}: Invalid value: {s:?}: the schema's pattern '{pattern}' does not compile: {e}"
            )),
        }
    }
    if schema.get("format").and_then(Value::as_str) == Some("date-time")
        && time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).is_err()
    {
        errors.push(format!(
            "{path}: Invalid value: {s:?}: {path} in body must be of type date-time: {s:?}"
        ));
    }
}

fn validate_object_body(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    errors: &mut Vec<String>,
) {
    let n = map.len() as u64;
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && n > max
    {
        errors.push(format!(
            "{path}: Too many: {n}: must have at most {max} items"
        ));
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && n < min
    {
        errors.push(format!(
            "{path}: Invalid value: {n}: {path} in body should have at least {min} properties"
        ));
    }
    for key in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(key) {
            errors.push(format!("{}: Required value", join(path, key)));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (k, v) in map {
        match (props.and_then(|p| p.get(k)), additional) {
            (Some(s), _) | (None, Some(s)) => validate(s, v, &join(path, k), errors),
            _ => {}
        }
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`, which structural schemas allow as value validations.
fn validate_combinators(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let subs = |k: &str| {
        schema
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let passes = |s: &Value| {
        let mut e = Vec::new();
        validate(s, value, path, &mut e);
        e.is_empty()
    };
    for s in subs("allOf") {
        validate(&s, value, path, errors);
    }
    let any = subs("anyOf");
    if !any.is_empty() && !any.iter().any(passes) {
        errors.push(format!(
            "{path}: Invalid value: {}: {path} in body must match at least one schema in anyOf",
            shown(value)
        ));
    }
    let one = subs("oneOf");
    if !one.is_empty() && one.iter().filter(|s| passes(s)).count() != 1 {
        errors.push(format!(
            "{path}: Invalid value: {}: {path} in body must match exactly one schema in oneOf",
            shown(value)
        ));
    }
    if let Some(not) = schema.get("not")
        && passes(not)
    {
        errors.push(format!(
            "{path}: Invalid value: {}: {path} in body must not match the schema in not",
            shown(value)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["nodeID"],
                    "properties": {
                        "nodeID": {"type": "string", "maxLength": 5},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "port": {"type": "integer", "minimum": 1, "maximum": 10},
                        "any": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"x": {"type": "string"}}}},
                        "ios": {"x-kubernetes-int-or-string": true},
                        "one": {"type": "object", "minProperties": 1, "maxProperties": 1, "properties": {"a": {"type": "object"}, "b": {"type": "object"}}},
                    }
                },
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}},
            }
        })
    }

    #[test]
    fn prunes_unknown_fields_and_keeps_preserved_ones() {
        let mut obj = json!({
            "apiVersion": "x/v1", "kind": "T",
            "metadata": {"name": "t", "bogus": 1},
            "extra": 1,
            "spec": {"nodeID": "n", "unknown": true, "any": {"free": 1}, "map": {"k": {"x": "y", "z": 1}}, "ios": "80%"},
        });
        assert!(admit(&schema(), &mut obj).is_empty());
        assert_eq!(
            obj,
            json!({
                "apiVersion": "x/v1", "kind": "T", "metadata": {"name": "t"},
                "spec": {"nodeID": "n", "mode": "a", "any": {"free": 1}, "map": {"k": {"x": "y"}}, "ios": "80%"},
            })
        );
    }

    #[test]
    fn unknown_fields_are_listed_by_path() {
        let obj = json!({"metadata": {"name": "t", "bogus": 1}, "extra": 1, "spec": {"nodeID": "n", "x": 1, "any": {"free": 1}, "map": {"k": {"z": 1}}}});
        assert_eq!(
            unknown_fields(Some(&schema()), &obj),
            vec!["metadata.bogus", "extra", "spec.map.k.z", "spec.x"]
        );
    }

    #[test]
    fn validation_names_the_field() {
        let mut obj = json!({"spec": {"mode": "c", "port": 11, "nodeID": 3, "one": {}}});
        let errors = admit(&schema(), &mut obj);
        assert_eq!(
            errors,
            vec![
                "spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\"",
                "spec.nodeID: Invalid value: \"integer\": spec.nodeID in body must be of type string: \"integer\"",
                "spec.one: Invalid value: 0: spec.one in body should have at least 1 properties",
                "spec.port: Invalid value: 11: spec.port in body should be less than or equal to 10",
            ]
        );
        let mut obj = json!({"spec": {}});
        assert_eq!(
            admit(&schema(), &mut obj),
            vec!["spec.nodeID: Required value"]
        );
        let mut obj = json!({"spec": {"nodeID": "toolong"}});
        assert_eq!(
            admit(&schema(), &mut obj),
            vec!["spec.nodeID: Too long: may not be more than 5 bytes"]
        );
    }
}
