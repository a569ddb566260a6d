//! No tenant code runs in the judge. Before Envoy sees an entry, every typed config in it is
//! looked up in `extensions.rs`: one Envoy loads as written stays; one that carries code (a
//! Lua script, a WebAssembly module, a native dynamic module) is replaced by a neutral
//! stand-in of the same kind, so that Envoy still judges everything around it; one the judge
//! does not know leaves the entry to marin3r's own checks. Errors in the code itself are the
//! NACK path's job: the proxy that runs it refuses it, and the revision is rolled back.
//!
//! An access log file is pointed at `/dev/null`: Envoy's validate mode creates the file, and
//! the judge writes nothing.

use serde_json::{Map, Value, json};

use super::extensions::{CARRIES_CODE, LOADED_AS_WRITTEN};
use crate::convert::Entry;

/// What the judge does with a typed config of a given type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Treatment {
    /// Loaded as written.
    AsWritten,
    /// Carries code: replaced by this stand-in (`None`: taken out of the map or list that
    /// holds it).
    StandIn(Option<Value>),
    /// Carries code and nothing neutral can stand in for it, or the judge does not know the
    /// type: the entry is not Envoy's to judge.
    NotJudged,
}

/// Why an entry is left to marin3r's own checks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: holds {type_name}, which the Envoy judge does not load")]
pub struct NotJudged {
    pub path: String,
    pub type_name: String,
}

/// The neutral copy of each entry (see the module's documentation).
pub fn neutral(entries: &[Entry]) -> Result<Vec<Entry>, NotJudged> {
    entries
        .iter()
        .map(|entry| {
            let mut value = entry.value.clone();
            match neutralize(&mut value) {
                Ok(()) => Ok(Entry {
                    value,
                    ..entry.clone()
                }),
                Err(type_name) => Err(NotJudged {
                    path: entry.path.clone(),
                    type_name,
                }),
            }
        })
        .collect()
}

/// Neutralizes `value` in place; `Err` names a type that makes it not Envoy's to judge.
fn neutralize(value: &mut Value) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            if let Some(name) = type_of(map) {
                match treatment(&name) {
                    Treatment::AsWritten => {}
                    Treatment::StandIn(Some(stand_in)) => {
                        *value = stand_in;
                        return Ok(());
                    }
                    // Only an entry of a map or list can be taken out: see below.
                    Treatment::StandIn(None) | Treatment::NotJudged => return Err(name),
                }
                if name == FILE_ACCESS_LOG {
                    map.insert("path".to_owned(), json!("/dev/null"));
                }
            }
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if let Some(child) = map.get_mut(&key) {
                    if removable(child) {
                        map.remove(&key);
                    } else {
                        neutralize(child)?;
                    }
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            items.retain(|item| !removable(item));
            items.iter_mut().try_for_each(neutralize)
        }
        _ => Ok(()),
    }
}

/// Whether `value` is a typed config to take out of the map or list that holds it.
fn removable(value: &Value) -> bool {
    let Value::Object(map) = value else {
        return false;
    };
    type_of(map).is_some_and(|name| treatment(&name) == Treatment::StandIn(None))
}

const FILE_ACCESS_LOG: &str = "envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// The message type a typed config holds: its `@type`, or what a `TypedStruct` wraps.
fn type_of(map: &Map<String, Value>) -> Option<String> {
    let url = map.get("@type")?.as_str()?;
    let name = url.rsplit('/').next().unwrap_or(url);
    if matches!(name, "xds.type.v3.TypedStruct" | "udpa.type.v1.TypedStruct") {
        let inner = map.get("type_url").or_else(|| map.get("typeUrl"));
        if let Some(inner) = inner.and_then(Value::as_str) {
            return Some(inner.rsplit('/').next().unwrap_or(inner).to_owned());
        }
    }
    Some(name.to_owned())
}

/// What the judge does with a typed config of `type_name` (a full message name).
pub fn treatment(type_name: &str) -> Treatment {
    if !type_name.starts_with("envoy.extensions.") {
        let known = [
            "envoy.config.",
            "envoy.type.",
            "xds.",
            "udpa.",
            "google.protobuf.",
        ];
        return match known.iter().any(|p| type_name.starts_with(p)) {
            true => Treatment::AsWritten,
            false => Treatment::NotJudged,
        };
    }
    let package = extension_package(type_name);
    if LOADED_AS_WRITTEN.contains(&package) {
        return Treatment::AsWritten;
    }
    if !CARRIES_CODE.contains(&package) {
        return Treatment::NotJudged;
    }
    stand_in(type_name)
}

/// `envoy.extensions.filters.http.lua.v3.Lua` → `envoy.extensions.filters.http.lua`.
pub fn extension_package(type_name: &str) -> &str {
    let package = type_name.rsplit_once('.').map_or(type_name, |(p, _)| p);
    match package.rsplit_once('.') {
        Some((rest, version)) if is_version(version) => rest,
        _ => package,
    }
}

fn is_version(segment: &str) -> bool {
    segment
        .strip_prefix('v')
        .and_then(|v| v.chars().next())
        .is_some_and(|c| c.is_ascii_digit())
}

/// What a script of the judge's own says: nothing.
const NO_CODE: &str = "-- marin3r's judge does not run the tenant's script";

/// The stand-in for a typed config that carries code.
fn stand_in(type_name: &str) -> Treatment {
    let any = |name: &str, fields: Value| {
        let mut value = json!({"@type": format!("type.googleapis.com/{name}")});
        if let (Some(map), Value::Object(fields)) = (value.as_object_mut(), fields) {
            map.extend(fields);
        }
        Treatment::StandIn(Some(value))
    };
    match type_name {
        // The same filter, with a script that defines nothing (Envoy then hooks nothing).
        "envoy.extensions.filters.http.lua.v3.Lua" => any(
            type_name,
            json!({"default_source_code": {"inline_string": NO_CODE}}),
        ),
        "envoy.extensions.filters.http.lua.v3.LuaPerRoute" => any(
            type_name,
            json!({"source_code": {"inline_string": NO_CODE}}),
        ),
        "envoy.extensions.router.cluster_specifiers.lua.v3.LuaConfig" => any(
            type_name,
            json!({"source_code": {"inline_string": "function envoy_on_route(route_handle) return '' end"}}),
        ),
        "envoy.extensions.string_matcher.lua.v3.Lua" => any(
            type_name,
            json!({"source_code": {"inline_string": "function envoy_match(value) return false end"}}),
        ),
        // Modules (WebAssembly or native): a filter of the same kind that loads nothing.
        _ if type_name.ends_with("PerRoute") => Treatment::StandIn(None),
        _ if type_name.starts_with("envoy.extensions.filters.http.") => {
            any("envoy.extensions.filters.http.cors.v3.Cors", json!({}))
        }
        _ if type_name.starts_with("envoy.extensions.filters.network.") => any(
            "envoy.extensions.filters.network.rbac.v3.RBAC",
            json!({"stat_prefix": "marin3r-judge"}),
        ),
        _ if type_name.starts_with("envoy.extensions.filters.listener.") => any(
            "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
            json!({}),
        ),
        _ if type_name.starts_with("envoy.extensions.access_loggers.") => {
            any(FILE_ACCESS_LOG, json!({"path": "/dev/null"}))
        }
        _ => Treatment::NotJudged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_xds::resource::ResourceType;

    fn entry(value: Value) -> Entry {
        Entry {
            path: "spec.resources[0].value".into(),
            kind: ResourceType::Listener,
            value,
        }
    }

    fn lua(source: Value) -> Value {
        json!({"name": "lua", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": source,
            "source_codes": {"lib": {"filename": "/etc/passwd"}},
        }})
    }

    #[test]
    fn every_extension_envoy_types_knows_is_on_exactly_one_list() {
        let pool = crate::convert::descriptor_pool().unwrap();
        let mut missing = Vec::new();
        for file in pool.files() {
            let package = file.package_name();
            if !package.starts_with("envoy.extensions.") {
                continue;
            }
            let package = extension_package(&format!("{package}.M")).to_owned();
            let lists = [LOADED_AS_WRITTEN, CARRIES_CODE]
                .iter()
                .filter(|l| l.contains(&package.as_str()))
                .count();
            if lists != 1 {
                missing.push(format!("{package} ({lists} lists)"));
            }
        }
        missing.sort();
        missing.dedup();
        assert!(missing.is_empty(), "classify these: {missing:?}");
    }

    #[test]
    fn lua_keeps_its_filter_and_loses_its_code() {
        let value = json!({"filter_chains": [{"filters": [{"typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "http_filters": [lua(json!({"inline_string": "io.open('/etc/passwd')"})), {"name": "router"}],
        }}]}]});
        let out = neutral(&[entry(value)]).unwrap();
        let text = out[0].value.to_string();
        assert!(!text.contains("io.open"), "{text}");
        assert!(!text.contains("/etc/passwd"), "{text}");
        let filters =
            &out[0].value["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
        assert_eq!(filters[0]["name"], "lua");
        assert_eq!(
            filters[0]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"
        );
        assert_eq!(filters[1]["name"], "router");
    }

    #[test]
    fn code_wrapped_in_a_typed_struct_is_code_too() {
        let value = json!({"typed_config": {
            "@type": "type.googleapis.com/xds.type.v3.TypedStruct",
            "type_url": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "value": {"default_source_code": {"inline_string": "os.exit(1)"}},
        }});
        let out = neutral(&[entry(value)]).unwrap();
        assert!(!out[0].value.to_string().contains("os.exit"));
    }

    #[test]
    fn modules_get_a_neutral_filter_of_their_kind_and_per_route_configs_go() {
        let wasm = json!({"http_filters": [{"name": "w", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {"vm_config": {"code": {"local": {"inline_bytes": "AGFzbQEAAAA="}}}},
        }}], "typed_per_filter_config": {"dm": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilterPerRoute",
        }, "keep": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.CorsPolicy"}}});
        let out = neutral(&[entry(wasm)]).unwrap();
        let v = &out[0].value;
        assert_eq!(
            v["http_filters"][0]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"
        );
        assert!(v["typed_per_filter_config"].get("dm").is_none());
        assert!(v["typed_per_filter_config"].get("keep").is_some());
    }

    #[test]
    fn an_unknown_type_or_code_without_a_stand_in_is_not_judged() {
        let cluster = json!({"cluster_type": {"name": "dm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_modules.v3.ClusterConfig",
        }}});
        let err = neutral(&[entry(cluster)]).unwrap_err();
        assert_eq!(
            err.type_name,
            "envoy.extensions.clusters.dynamic_modules.v3.ClusterConfig"
        );
        let unknown = json!({"typed_config": {"@type": "type.googleapis.com/acme.Evil"}});
        assert!(neutral(&[entry(unknown)]).is_err());
        let plain = json!({"typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        }});
        assert!(neutral(&[entry(plain)]).is_ok());
    }

    #[test]
    fn access_logs_go_to_dev_null() {
        let value = json!({"access_log": [{"name": "f", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": "/var/log/envoy/access.log",
        }}]});
        let out = neutral(&[entry(value)]).unwrap();
        assert_eq!(
            out[0].value["access_log"][0]["typed_config"]["path"],
            "/dev/null"
        );
    }
}
