//! What an EnvoyConfig may hold and Envoy accepts, but that does not do what the user meant:
//! admission warnings (`kubectl apply` prints them) and `marin3r validate` warnings, never
//! refusals. A reference to a resource the config does not define (Envoy accepts it and fails
//! at run time: a route to a cluster nobody defines answers 503), and an `envoyResources[].name`
//! that differs from the resource's own name (it has no effect, as in the original MARIN3R).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::convert::{Entry, entries};
use crate::judge::SIDECAR_CLUSTERS;
use marin3r_api::EnvoyConfigSpec;
use marin3r_xds::resource::ResourceType;

/// The most warnings reported for one config (kubectl prints each on its own line).
const MAX_WARNINGS: usize = 20;

/// Every warning for `spec`, each with its field path.
pub fn warnings(spec: &EnvoyConfigSpec) -> Vec<String> {
    let Ok(entries) = entries(spec) else {
        return Vec::new();
    };
    let mut out = name_warnings(spec, &entries);
    out.extend(reference_warnings(spec, &entries));
    out.truncate(MAX_WARNINGS);
    out
}

/// `entries` holds the `envoyResources` values first, in the order `serialized` lists them.
fn name_warnings(spec: &EnvoyConfigSpec, entries: &[Entry]) -> Vec<String> {
    let listed = spec
        .envoy_resources
        .serialized()
        .into_iter()
        .flat_map(|(kind, list)| list.iter().enumerate().map(move |(i, e)| (kind, i, e)));
    let mut out = Vec::new();
    for ((kind, i, entry), value) in listed.zip(entries) {
        if let (Some(name), Some(own)) = (entry.name.as_deref(), own_name(kind, &value.value))
            && name != own
        {
            out.push(format!(
                "spec.envoyResources.{}[{i}].name: \"{name}\" differs from the resource's own \
                 name \"{own}\" and has no effect (the resource is served as \"{own}\")",
                kind.spec_field()
            ));
        }
    }
    out
}

fn own_name(kind: ResourceType, value: &Value) -> Option<&str> {
    let field = if kind == ResourceType::Endpoint {
        "cluster_name"
    } else {
        "name"
    };
    value.get(field).and_then(Value::as_str)
}

/// Routes to clusters, RDS names and SDS names the config does not define.
fn reference_warnings(spec: &EnvoyConfigSpec, entries: &[Entry]) -> Vec<String> {
    let defined = |kind: ResourceType| -> BTreeSet<String> {
        entries
            .iter()
            .filter(|e| e.kind == kind)
            .filter_map(|e| own_name(kind, &e.value).map(str::to_owned))
            .collect()
    };
    let mut clusters = defined(ResourceType::Cluster);
    clusters.extend(SIDECAR_CLUSTERS.iter().map(|c| (*c).to_owned()));
    let routes = defined(ResourceType::Route);
    let mut secrets = defined(ResourceType::Secret);
    secrets.extend(
        crate::convert::secret_sources(&spec.envoy_resources, &spec.resources)
            .into_iter()
            .map(|s| s.sds_name),
    );
    let mut out = Vec::new();
    for e in entries {
        let mut refs = Vec::new();
        references(&e.value, &mut String::new(), &mut refs);
        for (path, kind, name) in refs {
            let (known, what) = match kind {
                Ref::Cluster => (&clusters, "cluster"),
                Ref::Route => (&routes, "route configuration"),
                Ref::Secret => (&secrets, "secret"),
            };
            if !known.contains(&name) {
                out.push(format!(
                    "{}: {path}: no {what} named \"{name}\" in this EnvoyConfig; Envoy accepts \
                     the reference and fails at run time",
                    e.path
                ));
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ref {
    Cluster,
    Route,
    Secret,
}

/// The references in `v`: a route's or TCP proxy's `cluster`, a weighted cluster's `name`,
/// an RDS `route_config_name`, and the `name` of an SDS secret config (beside `sds_config`).
fn references(v: &Value, at: &mut String, out: &mut Vec<(String, Ref, String)>) {
    match v {
        Value::Object(map) => {
            // A field under either of its JSON names (`route_config_name`, `routeConfigName`).
            let field = |k: &str| map.get(k).or_else(|| map.get(&camel(k)));
            let text = |k: &str| field(k).and_then(Value::as_str).map(str::to_owned);
            let here = |field: &str| {
                if at.is_empty() {
                    field.to_owned()
                } else {
                    format!("{at}.{field}")
                }
            };
            if let Some(c) = text("cluster") {
                out.push((here("cluster"), Ref::Cluster, c));
            }
            if let Some(r) = text("route_config_name") {
                out.push((here("route_config_name"), Ref::Route, r));
            }
            if field("sds_config").is_some()
                && let Some(s) = text("name")
            {
                out.push((here("name"), Ref::Secret, s));
            }
            if let Some(Value::Array(weighted)) = field("clusters")
                && at.ends_with("weighted_clusters")
            {
                for (i, w) in weighted.iter().enumerate() {
                    if let Some(name) = w.get("name").and_then(Value::as_str) {
                        out.push((
                            here(&format!("clusters[{i}].name")),
                            Ref::Cluster,
                            name.into(),
                        ));
                    }
                }
            }
            for (key, child) in map {
                let len = at.len();
                let first = at.is_empty();
                at.push_str(&crate::convert::key_segment(&snake(key), first));
                references(child, at, out);
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = at.len();
                at.push_str(&format!("[{i}]"));
                references(item, at, out);
                at.truncate(len);
            }
        }
        _ => {}
    }
}

/// A proto field name's JSON name: `route_config_name` -> `routeConfigName`.
fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// A field's proto name from its JSON name (`socketAddress` -> `socket_address`), for paths
/// in one casing; any other key (a map's, with dots or dashes) as it is.
fn snake(key: &str) -> String {
    let json_name = key.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && key.chars().all(|c| c.is_ascii_alphanumeric())
        && key.chars().any(|c| c.is_ascii_uppercase());
    if !json_name {
        return key.to_owned();
    }
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(value: Value) -> EnvoyConfigSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn references_to_what_the_config_does_not_define_are_warned_with_their_paths() {
        let s = spec(json!({"nodeID": "n", "resources": [
            {"type": "cluster", "value": {"name": "app"}},
            {"type": "route", "value": {"name": "local", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": [
                {"match": {"prefix": "/a"}, "route": {"cluster": "app"}},
                {"match": {"prefix": "/b"}, "route": {"cluster": "missing"}},
                {"match": {"prefix": "/c"}, "route": {"weighted_clusters": {"clusters": [{"name": "app", "weight": 1}, {"name": "gone", "weight": 1}]}}},
            ]}]}},
            {"type": "listener", "value": {"name": "l", "filter_chains": [{
                "transport_socket": {"name": "tls", "typed_config": {"common_tls_context": {"tls_certificate_sds_secret_configs": [{"name": "cert", "sds_config": {"ads": {}}}]}}},
                "filters": [{"name": "hcm", "typed_config": {"rds": {"route_config_name": "nowhere", "config_source": {"ads": {}}}}}],
            }]}},
        ]}));
        let w = warnings(&s);
        assert_eq!(w.len(), 4, "{w:#?}");
        assert!(w[0].starts_with("spec.resources[1].value: virtual_hosts[0].routes[1].route.cluster: no cluster named \"missing\""), "{}", w[0]);
        assert!(
            w[1].contains("weighted_clusters.clusters[1].name: no cluster named \"gone\""),
            "{}",
            w[1]
        );
        assert!(
            w.iter().any(|x| x
                .contains("tls_certificate_sds_secret_configs[0].name: no secret named \"cert\"")),
            "{w:#?}"
        );
        assert!(
            w.iter()
                .any(|x| x
                    .contains("rds.route_config_name: no route configuration named \"nowhere\"")),
            "{w:#?}"
        );
    }

    /// The same references written with the fields' JSON names are warned too, at the
    /// same paths (proto names).
    #[test]
    fn references_written_in_camel_case_are_warned_at_proto_paths() {
        let s = spec(json!({"nodeID": "n", "resources": [
            {"type": "listener", "value": {"name": "l", "filterChains": [{
                "transportSocket": {"name": "tls", "typedConfig": {"commonTlsContext": {"tlsCertificateSdsSecretConfigs": [{"name": "cert", "sdsConfig": {"ads": {}}}]}}},
                "filters": [{"name": "hcm", "typedConfig": {"rds": {"routeConfigName": "nowhere", "configSource": {"ads": {}}}}}],
            }]}},
        ]}));
        let w = warnings(&s);
        assert_eq!(w.len(), 2, "{w:#?}");
        assert!(w.iter().any(|x| x.contains("spec.resources[0].value: filter_chains[0].transport_socket.typed_config.common_tls_context.tls_certificate_sds_secret_configs[0].name: no secret named \"cert\"")), "{w:#?}");
        assert!(w.iter().any(|x| x.contains("filter_chains[0].filters[0].typed_config.rds.route_config_name: no route configuration named \"nowhere\"")), "{w:#?}");
    }

    #[test]
    fn a_differing_envoy_resources_name_is_a_warning() {
        let s = spec(
            json!({"nodeID": "n", "serialization": "yaml", "envoyResources": {
                "clusters": [{"name": "old-name", "value": "name: app\nconnect_timeout: 1s"}],
            }}),
        );
        assert_eq!(
            warnings(&s),
            [
                "spec.envoyResources.clusters[0].name: \"old-name\" differs from the resource's own name \"app\" and has no effect (the resource is served as \"app\")"
            ]
        );
        assert!(crate::convert::validate_config(&s).is_ok());
    }
}
