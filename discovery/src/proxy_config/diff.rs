//! The proxy's dynamic resources against the ones the control plane serves its node, by type
//! and name: what both hold alike, what differs (a unified diff of their JSON), what is
//! served and not held (not requested yet, or rejected) and what is held and not served
//! (left over from an older version).

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Write;

use super::Entry;

/// How the two sides compare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// `type/name` of the resources both hold alike.
    pub same: Vec<String>,
    /// `type/name` and the unified diff (served first, proxy second).
    pub differ: Vec<(String, String)>,
    /// Served, not held by the proxy.
    pub not_held: Vec<String>,
    /// Held by the proxy (from xDS), not served.
    pub not_served: Vec<String>,
}

impl Comparison {
    /// Both sides hold the same resources, and there is at least one.
    pub fn in_sync(&self) -> bool {
        self.agree() && !self.same.is_empty()
    }

    /// Both sides agree because neither holds anything: nothing to be in sync with.
    pub fn nothing_served(&self) -> bool {
        self.agree() && self.same.is_empty()
    }

    fn agree(&self) -> bool {
        self.differ.is_empty() && self.not_held.is_empty() && self.not_served.is_empty()
    }

    /// The report `proxy-config` prints after the proxy's config.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.nothing_served() {
            let _ = writeln!(
                out,
                "Nothing served: the control plane serves this node no resource of this kind, and the proxy holds none from xDS."
            );
            return out;
        }
        if self.in_sync() {
            let _ = writeln!(
                out,
                "In sync: the proxy holds the {} resource(s) the control plane serves its node.",
                self.same.len()
            );
            return out;
        }
        let _ = writeln!(
            out,
            "Not in sync with the control plane ({} alike):",
            self.same.len()
        );
        for name in &self.not_held {
            let _ = writeln!(out, "  served, not held by the proxy: {name}");
        }
        for name in &self.not_served {
            let _ = writeln!(out, "  held by the proxy, not served: {name}");
        }
        for (name, diff) in &self.differ {
            let _ = writeln!(out, "  differs: {name}");
            out.push_str(diff);
        }
        out
    }
}

/// Compares the proxy's dynamic (in use) resources with the served ones; the bootstrap's
/// static resources are the proxy's own and are left out.
pub fn compare(proxy: &[Entry], served: &[Entry]) -> Comparison {
    let key = |e: &Entry| format!("{}/{}", e.kind, e.name);
    let held: BTreeMap<String, &Entry> = proxy
        .iter()
        .filter(|e| e.state == "dynamic")
        .map(|e| (key(e), e))
        .collect();
    let served: BTreeMap<String, &Entry> = served.iter().map(|e| (key(e), e)).collect();
    let split = split(
        &served,
        &held,
        |name| format!("served {name}"),
        |name| format!("proxy {name}"),
    );
    Comparison {
        same: split.same,
        differ: split.differ,
        not_held: split.only_first,
        not_served: split.only_second,
    }
}

/// Two sets of resources by `type/name`, each in name order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Held by the first set only.
    pub only_first: Vec<String>,
    /// Held by the second set only.
    pub only_second: Vec<String>,
    /// Held alike by both.
    pub same: Vec<String>,
    /// Held by both, differently: the name and a unified diff (the first `-`, the second
    /// `+`, each headed by its label of the name).
    pub differ: Vec<(String, String)>,
}

/// Compares `first` with `second`, resources keyed by `type/name`.
pub fn split<A: Borrow<Entry>, B: Borrow<Entry>>(
    first: &BTreeMap<String, A>,
    second: &BTreeMap<String, B>,
    first_label: impl Fn(&str) -> String,
    second_label: impl Fn(&str) -> String,
) -> Split {
    let mut split = Split::default();
    for (name, a) in first {
        let a = a.borrow();
        match second.get(name).map(Borrow::borrow) {
            None => split.only_first.push(name.clone()),
            Some(b) if a.config == b.config => split.same.push(name.clone()),
            Some(b) => {
                let diff = unified(
                    &first_label(name),
                    &second_label(name),
                    &a.config,
                    &b.config,
                );
                split.differ.push((name.clone(), diff));
            }
        }
    }
    split.only_second = second
        .keys()
        .filter(|name| !first.contains_key(*name))
        .cloned()
        .collect();
    split
}

/// A unified diff of two resources' pretty JSON, three lines of context, headed `--- a`,
/// `+++ b`.
fn unified(a_label: &str, b_label: &str, a: &serde_json::Value, b: &serde_json::Value) -> String {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
    let (a, b) = (pretty(a), pretty(b));
    similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header(a_label, b_label)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e(kind: &str, name: &str, state: &str, config: serde_json::Value) -> Entry {
        Entry {
            kind: kind.into(),
            name: name.into(),
            state: state.into(),
            version: None,
            last_updated: None,
            config,
        }
    }

    #[test]
    fn alike_different_missing_and_left_over_resources_are_told_apart() {
        let served = [
            e(
                "clusters",
                "app",
                "served",
                json!({"name": "app", "connect_timeout": "1s"}),
            ),
            e(
                "listeners",
                "http",
                "served",
                json!({"name": "http", "port": 8080}),
            ),
            e("routes", "local", "served", json!({"name": "local"})),
        ];
        let proxy = [
            e("clusters", "xds", "static", json!({"name": "xds"})),
            e(
                "clusters",
                "app",
                "dynamic",
                json!({"name": "app", "connect_timeout": "1s"}),
            ),
            e(
                "listeners",
                "http",
                "dynamic",
                json!({"name": "http", "port": 9090}),
            ),
            e("listeners", "old", "dynamic", json!({"name": "old"})),
        ];
        let c = compare(&proxy, &served);
        assert_eq!(c.same, ["clusters/app"]);
        assert_eq!(c.not_held, ["routes/local"]);
        assert_eq!(c.not_served, ["listeners/old"]);
        assert_eq!(c.differ.len(), 1);
        let (name, diff) = &c.differ[0];
        assert_eq!(name, "listeners/http");
        assert!(diff.contains("--- served listeners/http"), "{diff}");
        assert!(
            diff.contains("-  \"port\": 8080") && diff.contains("+  \"port\": 9090"),
            "{diff}"
        );
        assert!(!c.in_sync());
        let report = c.render();
        assert!(
            report.contains("served, not held by the proxy: routes/local"),
            "{report}"
        );
        let alike = compare(&proxy[..2], &served[..1]);
        assert!(alike.in_sync());
        assert_eq!(
            alike.render(),
            "In sync: the proxy holds the 1 resource(s) the control plane serves its node.\n"
        );
        // Nothing on either side (the bootstrap's static resources are the proxy's own) is
        // not "in sync".
        let nothing = compare(&proxy[..1], &[]);
        assert!(!nothing.in_sync() && nothing.nothing_served());
        assert!(
            nothing.render().starts_with("Nothing served: "),
            "{}",
            nothing.render()
        );
        assert!(!c.nothing_served());
    }
}
