//! Envoy's `/config_dump?include_eds` as entries: each `*ConfigDump` of its `configs` list
//! taken apart into its static, dynamic, warming and rejected resources.

use serde_json::Value;

use super::Entry;
use super::redact::redact_resource;

/// A `*ConfigDump` section whose items are listed the same way.
struct Section {
    /// The last part of its `@type`.
    dump: &'static str,
    /// Its entries' kind.
    kind: &'static str,
    /// The key each item holds its resource under.
    key: &'static str,
    /// Each list of items, with the state of its resources.
    lists: &'static [(&'static str, &'static str)],
}

const SECTIONS: &[Section] = &[
    Section {
        dump: "ClustersConfigDump",
        kind: "clusters",
        key: "cluster",
        lists: &[
            ("static_clusters", "static"),
            ("dynamic_active_clusters", "dynamic"),
            ("dynamic_warming_clusters", "warming"),
        ],
    },
    Section {
        dump: "EndpointsConfigDump",
        kind: "endpoints",
        key: "endpoint_config",
        lists: &[
            ("static_endpoint_configs", "static"),
            ("dynamic_endpoint_configs", "dynamic"),
        ],
    },
    Section {
        dump: "ListenersConfigDump",
        kind: "listeners",
        key: "listener",
        lists: &[("static_listeners", "static")],
    },
    Section {
        dump: "RoutesConfigDump",
        kind: "routes",
        key: "route_config",
        lists: &[
            ("static_route_configs", "static"),
            ("dynamic_route_configs", "dynamic"),
        ],
    },
    Section {
        dump: "SecretsConfigDump",
        kind: "secrets",
        key: "secret",
        lists: &[
            ("static_secrets", "static"),
            ("dynamic_active_secrets", "dynamic"),
            ("dynamic_warming_secrets", "warming"),
        ],
    },
];

/// An admin answer that is not a config dump.
#[derive(Debug, thiserror::Error)]
#[error("not an Envoy config dump: no `configs` list")]
pub struct NotADump;

/// The entries of `dump` (the admin's JSON answer), secret fields redacted.
pub fn entries(dump: &Value) -> Result<Vec<Entry>, NotADump> {
    let configs = dump
        .get("configs")
        .and_then(Value::as_array)
        .ok_or(NotADump)?;
    let mut out = Vec::new();
    for config in configs {
        let kind = config
            .get("@type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = kind.rsplit('.').next().unwrap_or_default();
        section(&mut out, config, name);
    }
    // Secrets the bootstrap reads from files (the sidecar's client certificate and CA) are
    // listed as dynamic, but are the proxy's own: no control plane serves them.
    let mut from_files = std::collections::BTreeSet::new();
    if let Some(bootstrap) = out.iter().find(|e| e.kind == "bootstrap") {
        file_secrets(&bootstrap.config, &mut from_files);
    }
    for entry in &mut out {
        if entry.kind == "secrets" && entry.state == "dynamic" && from_files.contains(&entry.name) {
            entry.state = "file".into();
        }
        redact_resource(&entry.kind, &mut entry.config);
        super::defuse(entry);
    }
    Ok(out)
}

/// The entries of one `*ConfigDump` (`name`, its type's last part), in the dump's order:
/// static, then dynamic, then warming; sections we do not show are skipped.
fn section(out: &mut Vec<Entry>, config: &Value, name: &str) {
    if name == "BootstrapConfigDump" {
        out.push(Entry {
            kind: "bootstrap".into(),
            name: "bootstrap".into(),
            state: "static".into(),
            version: None,
            last_updated: text(config, "last_updated"),
            config: config.get("bootstrap").cloned().unwrap_or_default(),
        });
        return;
    }
    let Some(section) = SECTIONS.iter().find(|s| s.dump == name) else {
        return;
    };
    for (list, state) in section.lists {
        take(out, config, section.kind, list, state, section.key);
    }
    if name == "ListenersConfigDump" {
        listeners(out, config);
    }
}

/// The names of the SDS secrets `config` asks for from a file (`sds_config` with `path` or
/// `path_config_source`), at any depth.
fn file_secrets(config: &Value, names: &mut std::collections::BTreeSet<String>) {
    match config {
        Value::Object(map) => {
            let from_file = map
                .get("sds_config")
                .is_some_and(|c| c.get("path").is_some() || c.get("path_config_source").is_some());
            if from_file && let Some(name) = map.get("name").and_then(Value::as_str) {
                names.insert(name.to_owned());
            }
            for value in map.values() {
                file_secrets(value, names);
            }
        }
        Value::Array(items) => {
            for item in items {
                file_secrets(item, names);
            }
        }
        _ => {}
    }
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// The entries of `config[list]`, each holding its resource under `key`.
fn take(out: &mut Vec<Entry>, config: &Value, kind: &str, list: &str, state: &str, key: &str) {
    for item in config
        .get(list)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(resource) = item.get(key) else {
            continue;
        };
        out.push(entry(kind, item, resource, state));
    }
}

fn entry(kind: &str, item: &Value, resource: &Value, state: &str) -> Entry {
    let mut config = resource.clone();
    // The dump wraps each resource as an `Any`; the served side is the bare message.
    if let Some(map) = config.as_object_mut() {
        map.remove("@type");
    }
    let name = text(resource, "name")
        .or_else(|| text(resource, "cluster_name"))
        .or_else(|| text(item, "name"))
        .unwrap_or_default();
    Entry {
        kind: kind.to_owned(),
        name,
        state: state.to_owned(),
        version: text(item, "version_info"),
        last_updated: text(item, "last_updated"),
        config,
    }
}

/// `dynamic_listeners`: each with an active, warming, draining or error state.
fn listeners(out: &mut Vec<Entry>, config: &Value) {
    let items = config.get("dynamic_listeners").and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        for (field, state) in [("active_state", "dynamic"), ("warming_state", "warming")] {
            if let Some(s) = item.get(field)
                && let Some(listener) = s.get("listener")
            {
                out.push(entry("listeners", s, listener, state));
            }
        }
        if let Some(error) = item.get("error_state") {
            let mut e = entry("listeners", error, error, "error");
            e.name = text(item, "name").unwrap_or_default();
            e.version = text(error, "version_info");
            out.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_section_is_taken_apart_and_redacted() {
        let dump = json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
             "bootstrap": {"node": {"id": "gw"}, "static_resources": {"clusters": [{"transport_socket":
                {"typed_config": {"common_tls_context": {"tls_certificate_sds_secret_configs": [
                  {"name": "client", "sds_config": {"path_config_source": {"path": "/etc/sds.json"}}}]}}}}]}},
             "last_updated": "t0"},
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {"@type": "x", "name": "xds"}, "last_updated": "t1"}],
             "dynamic_active_clusters": [{"version_info": "c1", "cluster": {"@type": "x", "name": "app"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
             "dynamic_endpoint_configs": [{"version_info": "e1", "endpoint_config": {"cluster_name": "app"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
             "dynamic_listeners": [
                {"name": "http", "active_state": {"version_info": "l1", "listener": {"name": "http"}}},
                {"name": "bad", "error_state": {"details": "no router", "version_info": "l2"}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
             "dynamic_active_secrets": [{"name": "tls", "version_info": "s1",
                "secret": {"name": "tls", "tls_certificate": {"private_key": {"inline_bytes": "a2V5"}}}},
                {"name": "client", "secret": {"name": "client"}}]},
        ]});
        let entries = entries(&dump).unwrap();
        let seen: Vec<(&str, &str, &str, Option<&str>)> = entries
            .iter()
            .map(|e| {
                (
                    e.kind.as_str(),
                    e.name.as_str(),
                    e.state.as_str(),
                    e.version.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("bootstrap", "bootstrap", "static", None),
                ("clusters", "xds", "static", None),
                ("clusters", "app", "dynamic", Some("c1")),
                ("endpoints", "app", "dynamic", Some("e1")),
                ("listeners", "http", "dynamic", Some("l1")),
                ("listeners", "bad", "error", Some("l2")),
                ("secrets", "tls", "dynamic", Some("s1")),
                // Read from a file, as the bootstrap says: not from xDS.
                ("secrets", "client", "file", None),
            ]
        );
        assert_eq!(entries[2].config, json!({"name": "app"}));
        assert!(!serde_json::to_string(&entries).unwrap().contains("a2V5"));
        assert!(super::entries(&json!({"nope": 1})).is_err());
    }
}
