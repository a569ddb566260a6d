//! The API reference in `docs/reference/`: one Markdown page per CRD, rendered from the
//! `openAPIV3Schema` the Rust types generate, so the reference cannot say something the API
//! server would not accept. `marin3r crds --reference DIR` writes it; a test checks it.

use std::fmt::Write as _;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// The page of a CRD: `<plural>.md`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.md", crd.spec.names.plural)
}

/// The index page (`README.md`) linking every CRD's page.
pub fn index(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::from(
        "# API reference\n\n\
         Generated from the Rust types by `marin3r crds --reference docs/reference`; do not edit \
         by hand (`discovery/tests/it/reference.rs` fails when these pages drift from the types).\n\n\
         | kind | group | short names | scope |\n| --- | --- | --- | --- |\n",
    );
    for crd in crds {
        let names = &crd.spec.names;
        let _ = writeln!(
            out,
            "| [{}]({}) | `{}` | {} | {} |",
            names.kind,
            file_name(crd),
            crd.spec.group,
            short_names(crd),
            crd.spec.scope
        );
    }
    out
}

fn short_names(crd: &CustomResourceDefinition) -> String {
    match crd.spec.names.short_names.as_deref() {
        Some(names) if !names.is_empty() => names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "-".to_owned(),
    }
}

/// One CRD's page: identity, printer columns and a table of every field of every version.
pub fn render(crd: &CustomResourceDefinition) -> String {
    let names = &crd.spec.names;
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", names.kind);
    let _ = writeln!(
        out,
        "Generated from the Rust types by `marin3r crds --reference docs/reference`; do not edit by hand.\n"
    );
    let _ = writeln!(out, "- group: `{}`", crd.spec.group);
    let _ = writeln!(
        out,
        "- kind: `{}` (plural `{}`, short names {})",
        names.kind,
        names.plural,
        short_names(crd)
    );
    let _ = writeln!(out, "- scope: {}", crd.spec.scope);
    for version in &crd.spec.versions {
        let _ = writeln!(out, "\n## {}/{}\n", crd.spec.group, version.name);
        let has_status = version
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some());
        let _ = writeln!(
            out,
            "Served: {}. Storage: {}. Status subresource: {}.",
            yes_no(version.served),
            yes_no(version.storage),
            yes_no(has_status)
        );
        if let Some(columns) = version
            .additional_printer_columns
            .as_ref()
            .filter(|c| !c.is_empty())
        {
            out.push_str("\nColumns of `kubectl get`:\n\n| column | from |\n| --- | --- |\n");
            for c in columns {
                let _ = writeln!(out, "| {} | `{}` |", c.name, c.json_path);
            }
        }
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| serde_json::to_value(s).ok());
        let Some(schema) = schema else {
            out.push_str("\nNo schema.\n");
            continue;
        };
        for top in ["spec", "status"] {
            let Some(part) = schema.get("properties").and_then(|p| p.get(top)) else {
                continue;
            };
            let _ = writeln!(out, "\n### `{top}`\n");
            if let Some(d) = part.get("description").and_then(Value::as_str) {
                let _ = writeln!(out, "{}\n", one_line(d));
            }
            out.push_str("| field | type | required | default | description |\n");
            out.push_str("| --- | --- | --- | --- | --- |\n");
            let mut rows = Vec::new();
            fields(part, top, &mut rows);
            if rows.is_empty() {
                out.push_str("| (no fields) | | | | |\n");
            }
            for row in rows {
                out.push_str(&row);
            }
        }
    }
    out
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// One table row per property below `schema`, depth first, in the schema's (sorted) order.
fn fields(schema: &Value, path: &str, rows: &mut Vec<String>) {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, prop) in props {
            let field = format!("{path}.{name}");
            rows.push(row(&field, prop, required.contains(&name.as_str())));
            fields(prop, &field, rows);
        }
    }
    if let Some(items) = schema.get("items") {
        fields(items, &format!("{path}[]"), rows);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        fields(values, &format!("{path}.<key>"), rows);
    }
    for alt in ["oneOf", "anyOf"] {
        for variant in schema
            .get(alt)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            fields(variant, path, rows);
        }
    }
}

fn row(field: &str, prop: &Value, required: bool) -> String {
    let default = prop
        .get("default")
        .map_or_else(|| "-".to_owned(), |d| format!("`{d}`"));
    let mut description = prop
        .get("description")
        .and_then(Value::as_str)
        .map(one_line)
        .unwrap_or_default();
    let mut limits = Vec::new();
    if let Some(values) = prop.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
        limits.push(format!("one of {}", values.join(", ")));
    }
    for (key, what) in [
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("minItems", "at least items:"),
        ("maxItems", "at most items:"),
        ("minProperties", "at least fields:"),
        ("maxProperties", "at most fields:"),
        ("pattern", "pattern"),
    ] {
        if let Some(v) = prop.get(key) {
            limits.push(format!("{what} `{}`", plain(v)));
        }
    }
    for rule in prop
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(message) = rule.get("message").and_then(Value::as_str) {
            limits.push(message.to_owned());
        }
    }
    if !limits.is_empty() {
        if !description.is_empty() {
            description.push(' ');
        }
        let _ = write!(description, "({})", limits.join("; "));
    }
    format!(
        "| `{field}` | {} | {} | {} | {} |\n",
        type_name(prop),
        if required { "yes" } else { "no" },
        escape(&default),
        escape(&description)
    )
}

fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// The field's type as `kubectl explain` would say it.
fn type_name(prop: &Value) -> String {
    if prop.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int or string".to_owned();
    }
    let base = match prop.get("type").and_then(Value::as_str) {
        Some("array") => format!(
            "[]{}",
            prop.get("items")
                .map_or_else(|| "any".to_owned(), type_name)
        ),
        Some("object") => match prop.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map[string]{}", type_name(values)),
            _ => "object".to_owned(),
        },
        Some(t) => match prop.get("format").and_then(Value::as_str) {
            Some(f) => format!("{t} ({f})"),
            None => t.to_owned(),
        },
        None if prop.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) => {
            "any".to_owned()
        }
        None => "object".to_owned(),
    };
    if prop.get("nullable") == Some(&Value::Bool(true)) {
        format!("{base}, nullable")
    } else {
        base
    }
}

/// Paragraphs joined into one table cell.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn escape(cell: &str) -> String {
    cell.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_read_like_kubectl_explain() {
        let t = |v: Value| type_name(&v);
        assert_eq!(t(serde_json::json!({"type": "string"})), "string");
        assert_eq!(
            t(serde_json::json!({"type": "integer", "format": "int64"})),
            "integer (int64)"
        );
        assert_eq!(
            t(serde_json::json!({"type": "array", "items": {"type": "string"}})),
            "[]string"
        );
        assert_eq!(
            t(serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}})),
            "map[string]string"
        );
        assert_eq!(
            t(serde_json::json!({"x-kubernetes-int-or-string": true})),
            "int or string"
        );
        assert_eq!(
            t(serde_json::json!({"type": "string", "nullable": true})),
            "string, nullable"
        );
    }

    #[test]
    fn nested_fields_get_their_full_path_and_limits() {
        let schema = serde_json::json!({
            "properties": {
                "signer": {
                    "type": "object",
                    "maxProperties": 1,
                    "properties": {"caSigned": {"type": "object", "required": ["name"],
                        "properties": {"name": {"type": "string", "description": "a | b"}}}}
                },
                "hosts": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["signer"]
        });
        let mut rows = Vec::new();
        fields(&schema, "spec", &mut rows);
        assert_eq!(
            rows,
            [
                "| `spec.hosts` | []string | no | - |  |\n",
                "| `spec.signer` | object | yes | - | (at most fields: `1`) |\n",
                "| `spec.signer.caSigned` | object | no | - |  |\n",
                "| `spec.signer.caSigned.name` | string | yes | - | a \\| b |\n",
            ]
        );
    }
}
