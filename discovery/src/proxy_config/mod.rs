//! What `marin3r proxy-config` shows: the configuration one Envoy holds (its admin
//! `/config_dump`, parsed by resource type), the configuration the control plane serves that
//! Envoy's node (the discovery pod's `/served-config`), the same secret fields redacted on
//! both sides, and the difference between the two. What a pod answers is printed with its
//! control characters escaped: a tenant's pod may answer anything, terminal escapes included.

pub mod diff;
pub mod dump;
pub mod redact;
pub mod served;

use std::borrow::Cow;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// The resource types `proxy-config` shows, in the order Envoy applies them; `bootstrap` is
/// Envoy's own and has no served counterpart.
pub const SECTIONS: [&str; 6] = [
    "bootstrap",
    "clusters",
    "endpoints",
    "listeners",
    "routes",
    "secrets",
];

/// One resource as a proxy holds it, or as the control plane serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `clusters`, `listeners`, ... (the `spec.envoyResources` list names).
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    /// `static` (in the bootstrap), `dynamic` (from xDS, in use), `warming` (from xDS, not in
    /// use yet), `error` (rejected), `file` (a secret the bootstrap reads from a file);
    /// `served` for what the control plane serves.
    pub state: String,
    /// The xDS version it came with, when dynamic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When Envoy last updated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<String>,
    /// The resource in proto3 JSON with the proto field names, secret fields redacted.
    pub config: serde_json::Value,
}

/// `text` with every control character (C0, DEL, C1) written as an escape (`\u{1b}`), so
/// that printing it cannot move a terminal's cursor or change its state.
pub fn printable(text: &str) -> Cow<'_, str> {
    escaped(text, |_| true)
}

fn escaped(text: &str, escape: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && escape(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Escapes the control characters of every string of `entry` (its keys and values), but
/// newlines and tabs in its config: JSON output escapes those itself, and YAML prints them
/// as line breaks and tabs, which do no harm.
pub fn defuse(entry: &mut Entry) {
    for text in [&mut entry.kind, &mut entry.name, &mut entry.state]
        .into_iter()
        .chain(entry.version.as_mut())
        .chain(entry.last_updated.as_mut())
    {
        if let Cow::Owned(safe) = printable(text) {
            *text = safe;
        }
    }
    defuse_value(&mut entry.config);
}

fn defuse_value(value: &mut serde_json::Value) {
    let keep = |c: char| c != '\n' && c != '\t';
    match value {
        serde_json::Value::String(text) => {
            if let Cow::Owned(safe) = escaped(text, keep) {
                *text = safe;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(defuse_value),
        serde_json::Value::Object(map) => {
            let unsafe_keys: Vec<String> = map
                .keys()
                .filter(|k| matches!(escaped(k, keep), Cow::Owned(_)))
                .cloned()
                .collect();
            for key in unsafe_keys {
                if let Some(v) = map.remove(&key) {
                    map.insert(escaped(&key, keep).into_owned(), v);
                }
            }
            map.values_mut().for_each(defuse_value);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's answer cannot drive the terminal it is printed on.
    #[test]
    fn control_characters_from_a_pod_are_escaped() {
        assert_eq!(printable("plain"), "plain");
        assert_eq!(
            printable("\u{1b}]0;owned\u{7}\r\nx\u{7f}\u{9b}2J"),
            "\\u{1b}]0;owned\\u{7}\\u{d}\\u{a}x\\u{7f}\\u{9b}2J"
        );
        let mut entry = Entry {
            kind: "listeners".into(),
            name: "a\u{1b}[2Jb".into(),
            state: "dynamic".into(),
            version: Some("v\r1".into()),
            last_updated: None,
            config: serde_json::json!({
                "inline_code": "line 1\n\tline 2\u{1b}[31m",
                "k\u{9b}ey": ["\u{7f}"],
            }),
        };
        defuse(&mut entry);
        assert_eq!(entry.name, "a\\u{1b}[2Jb");
        assert_eq!(entry.version.as_deref(), Some("v\\u{d}1"));
        assert_eq!(
            entry.config,
            serde_json::json!({
                "inline_code": "line 1\n\tline 2\\u{1b}[31m",
                "k\\u{9b}ey": ["\\u{7f}"],
            })
        );
    }
}
