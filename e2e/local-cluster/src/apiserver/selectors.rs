//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and field selectors
//! (`metadata.name`, `metadata.namespace` and other dotted paths to strings), parsed once per
//! request and matched against JSON objects.

use serde_json::Value;

use super::meta;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(s: &str, raw: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: {raw:?}: expected a (value, ...) set")
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), set_values(v, part)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Requirement::In(k.trim().into(), set_values(v, part)?)
            } else if part.contains(|c: char| c.is_whitespace() || "()<>".contains(c)) {
                return Err(format!("unable to parse requirement: {part:?}"));
            } else {
                Requirement::Exists(part.to_owned())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// From a `LabelSelector` object (`matchLabels`, `matchExpressions`), as webhooks use.
    pub fn from_object(sel: &Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                reqs.push(Requirement::Equals(
                    k.clone(),
                    v.as_str().unwrap_or("").into(),
                ));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            reqs.push(match e.get("operator").and_then(Value::as_str) {
                Some("In") => Requirement::In(key, values),
                Some("NotIn") => Requirement::NotIn(key, values),
                Some("Exists") => Requirement::Exists(key),
                Some("DoesNotExist") => Requirement::NotExists(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(Self(reqs))
    }

    pub fn matches_labels(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_labels(meta::labels(obj))
    }
}

/// A parsed field selector: `path=value`, `path==value`, `path!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (path, equal, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            reqs.push((path.trim().to_owned(), equal, value.trim().to_owned()));
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, equal, value)| {
            let pointer = format!("/{}", path.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *value) == *equal
        })
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, api)"));
        assert!(!m("app notin (web)"));
        assert!(m("missing notin (x)"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app in (web),tier=front"));
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_paths() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=a"));
        assert!(m("metadata.namespace==ns,metadata.name!=b"));
        assert!(!m("metadata.name=b"));
        assert!(m("spec.nodeName=n1"));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    /// A Secret's `type` as Istio and marin3r's loader exclude it (`type!=`, comma-joined),
    /// as a real API server supports it for Secrets.
    #[test]
    fn secret_type_exclusions() {
        let selector = FieldSelector::parse(
            "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token",
        )
        .unwrap();
        let secret = |type_: &str| json!({"metadata": {"name": "s"}, "type": type_});
        assert!(!selector.matches(&secret("helm.sh/release.v1")));
        assert!(!selector.matches(&secret("kubernetes.io/service-account-token")));
        assert!(selector.matches(&secret("kubernetes.io/tls")));
        assert!(selector.matches(&secret("Opaque")));
    }

    #[test]
    fn selector_objects() {
        let sel = LabelSelector::from_object(&json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]})).unwrap();
        assert!(sel.matches(&obj(json!({"app": "web", "tier": "front"}))));
        assert!(!sel.matches(&obj(json!({"app": "web"}))));
    }
}
