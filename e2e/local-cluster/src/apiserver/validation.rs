//! `ObjectMeta` validation every kind gets on a real API server: the name rule of the kind
//! (DNS-1123 subdomain, DNS-1123 label for Namespaces, DNS-1035 label for Services, path
//! segment for RBAC objects), label keys and values, annotation keys and their total size,
//! and the size limits of request bodies (3 MiB) and stored objects (etcd's 1.5 MiB).

use serde_json::Value;

use super::registry::ResourceInfo;

/// The largest request body the API server decodes (`Request entity too large: limit is ...`).
pub const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;
/// The largest object etcd stores by default (`--max-request-bytes`).
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024 + 512 * 1024;
/// The largest total size of an object's annotations (keys plus values).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Problems of `s` as a DNS-1123 label (63 characters at most).
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !is_dns1123_label(s) {
        out.push(DNS1123_LABEL.to_owned());
    }
    out
}

/// Problems of `s` as a DNS-1123 subdomain (253 characters at most).
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_owned());
    }
    if !s.split('.').all(is_dns1123_label) {
        out.push(DNS1123_SUBDOMAIN.to_owned());
    }
    out
}

fn dns1035_label(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !is_dns1123_label(s) || !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.push(DNS1035_LABEL.to_owned());
    }
    out
}

/// RBAC objects may be named anything that is a path segment (`system:discovery`).
fn path_segment(s: &str) -> Vec<String> {
    match s {
        "." => vec!["may not be '.'".to_owned()],
        ".." => vec!["may not be '..'".to_owned()],
        _ => ["/", "%"]
            .iter()
            .filter(|c| s.contains(**c))
            .map(|c| format!("may not contain '{c}'"))
            .collect(),
    }
}

/// Problems of `name` as the name of an object of `info`'s kind.
pub fn name(info: &ResourceInfo, name: &str) -> Vec<String> {
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") => dns1123_label(name),
        ("", "services") => dns1035_label(name),
        ("rbac.authorization.k8s.io", _) => path_segment(name),
        _ => dns1123_subdomain(name),
    }
}

fn alnum_edges(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn qualified_chars(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Problems of a label or annotation key: `[prefix/]name`, prefix a DNS subdomain.
pub fn qualified_name(key: &str) -> Vec<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let mut out = Vec::new();
    if name.contains('/') {
        out.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_owned());
        return out;
    }
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            out.push("prefix part must be non-empty".to_owned());
        } else {
            out.extend(
                dns1123_subdomain(prefix)
                    .into_iter()
                    .map(|p| format!("prefix part {p}")),
            );
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > 63 {
            out.push("name part must be no more than 63 characters".to_owned());
        }
        if !qualified_chars(name) || !alnum_edges(name) {
            out.push(QUALIFIED_NAME.to_owned());
        }
    }
    out
}

/// Problems of a label value: 63 characters at most, empty or alphanumeric at both ends
/// with `-_.` inside.
pub fn label_value(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    if value.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !value.is_empty() && (!qualified_chars(value) || !alnum_edges(value)) {
        out.push(LABEL_VALUE.to_owned());
    }
    out
}

/// Every field error of `metadata` (name, labels, annotations), in Kubernetes' words.
pub fn object_meta(info: &ResourceInfo, obj: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let obj_name = super::meta::name(obj);
    for p in name(info, obj_name) {
        errors.push(format!("metadata.name: Invalid value: {obj_name:?}: {p}"));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            None => errors.push(
                "metadata.labels: Invalid value: \"object\": labels must be a map of strings"
                    .into(),
            ),
            Some(labels) => {
                for (k, v) in labels {
                    for p in qualified_name(k) {
                        errors.push(format!("metadata.labels: Invalid value: {k:?}: {p}"));
                    }
                    match v.as_str() {
                        Some(v) => {
                            for p in label_value(v) {
                                errors.push(format!("metadata.labels: Invalid value: {v:?}: {p}"));
                            }
                        }
                        None => errors.push(format!(
                            "metadata.labels.{k}: Invalid value: {v}: must be a string"
                        )),
                    }
                }
            }
        }
    }
    if let Some(annotations) = obj.pointer("/metadata/annotations") {
        match annotations.as_object() {
            None => errors.push(
                "metadata.annotations: Invalid value: \"object\": annotations must be a map of strings"
                    .into(),
            ),
            Some(annotations) => {
                let mut total = 0;
                for (k, v) in annotations {
                    for p in qualified_name(&k.to_lowercase()) {
                        errors.push(format!("metadata.annotations: Invalid value: {k:?}: {p}"));
                    }
                    match v.as_str() {
                        Some(v) => total += k.len() + v.len(),
                        None => errors.push(format!(
                            "metadata.annotations.{k}: Invalid value: {v}: must be a string"
                        )),
                    }
                }
                if total > MAX_ANNOTATIONS_BYTES {
                    errors.push(format!(
                        "metadata.annotations: Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"
                    ));
                }
            }
        }
    }
    errors
}

/// The 1 MiB limit of ConfigMap and Secret data, checked by their validation.
pub fn data_size(info: &ResourceInfo, obj: &Value) -> Vec<String> {
    const MAX: usize = 1024 * 1024;
    let sum = |key: &str, decode: bool| -> usize {
        obj.get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                let v = v.as_str().unwrap_or("");
                // base64 data counts decoded.
                k.len() + if decode { v.len() / 4 * 3 } else { v.len() }
            })
            .sum()
    };
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "configmaps") if sum("data", false) + sum("binaryData", true) > MAX => {
            vec![format!("[]: Too long: must have at most {MAX} bytes")]
        }
        ("", "secrets") if sum("data", true) > MAX => {
            vec![format!("data: Too long: must have at most {MAX} bytes")]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values() {
        assert!(label_value("").is_empty());
        assert!(label_value("My_value-1.2").is_empty());
        assert_eq!(label_value(&"a".repeat(64)).len(), 1);
        assert_eq!(label_value("-a"), vec![LABEL_VALUE.to_owned()]);
        assert_eq!(label_value("a b"), vec![LABEL_VALUE.to_owned()]);
    }

    #[test]
    fn label_keys() {
        assert!(qualified_name("app.kubernetes.io/name").is_empty());
        assert!(qualified_name("marin3r.3scale.net/node-id").is_empty());
        assert!(!qualified_name("Example.com/x").is_empty());
        assert!(!qualified_name("a/b/c").is_empty());
        assert!(!qualified_name(&"x".repeat(64)).is_empty());
        assert!(!qualified_name("/x").is_empty());
        assert!(!qualified_name("x/").is_empty());
    }

    #[test]
    fn names_per_kind() {
        let find = |plural: &str| {
            super::super::registry::builtins()
                .into_iter()
                .find(|i| i.plural == plural)
                .unwrap()
        };
        assert!(name(&find("namespaces"), "a.b").len() == 1);
        assert!(name(&find("secrets"), "a.b").is_empty());
        assert!(name(&find("services"), "1abc").len() == 1);
        assert!(name(&find("pods"), "1abc").is_empty());
        assert!(name(&find("clusterroles"), "system:discovery").is_empty());
        assert!(!name(&find("clusterroles"), "a/b").is_empty());
        assert!(!name(&find("pods"), "").is_empty());
    }
}
