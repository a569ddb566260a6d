//! How a scoped route configuration or an extension config becomes part of the bootstrap the
//! judge validates, like a route configuration: each inside a listener of its own on a pipe
//! address, where Envoy builds it as a proxy would when it arrives by SRDS or ECDS.

use serde_json::{Value, json};

use super::OWN;

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

fn router() -> Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}})
}

fn pipe_listener(kind: &str, i: usize, filter_chain: Value) -> Value {
    json!({
        "name": format!("{OWN}-{kind}-{i}"),
        "address": {"pipe": {"path": format!("/{OWN}/{kind}-{i}")}},
        "filter_chains": [filter_chain],
    })
}

fn hcm(stat_prefix: String, rest: Value) -> Value {
    let mut config = json!({"@type": HCM, "stat_prefix": stat_prefix});
    if let (Some(config), Some(rest)) = (config.as_object_mut(), rest.as_object()) {
        config.extend(rest.clone());
    }
    json!({"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": config}]})
}

/// A scoped route configuration as the one scope of an HTTP connection manager's inline list,
/// with a key builder of as many header fragments as its key has (Envoy matches a request's
/// key against it; a different count is no error, it never matches). An inline list may not
/// fetch routes by RDS, so a scope naming its route configuration gets an empty inline one of
/// that name instead: the routes are judged as entries of their own.
pub fn scoped_route_listener(i: usize, scope: &Value) -> Value {
    let mut scope = scope.clone();
    if let Some(map) = scope.as_object_mut()
        && let Some(name) = map.remove("route_configuration_name")
    {
        map.entry("route_configuration")
            .or_insert_with(|| json!({ "name": name }));
    }
    let fragments = scope
        .pointer("/key/fragments")
        .and_then(Value::as_array)
        .map_or(1, Vec::len)
        .max(1);
    let builder: Vec<Value> = (0..fragments)
        .map(|f| json!({"header_value_extractor": {"name": format!("x-{OWN}-{f}"), "index": 0}}))
        .collect();
    let rest = json!({
        "scoped_routes": {
            "name": format!("{OWN}-scopes-{i}"),
            "scope_key_builder": {"fragments": builder},
            "rds_config_source": {"ads": {}, "resource_api_version": "V3"},
            "scoped_route_configurations_list": {"scoped_route_configurations": [scope]},
        },
        "http_filters": [router()],
    });
    pipe_listener("scopes", i, hcm(format!("{OWN}-scopes-{i}"), rest))
}

/// An extension config as the filter it configures, when its type says which kind of filter
/// that is: an HTTP filter before the router (the router itself alone), a listener filter.
/// Anything else (a network filter, which may or may not be terminal; a type of another
/// category) is left to marin3r's own checks: `None`.
pub fn extension_listener(i: usize, extension: &Value) -> Option<Value> {
    let type_url = extension.pointer("/typed_config/@type")?.as_str()?;
    let package = type_url.rsplit('/').next()?;
    let name = extension
        .get("name")
        .cloned()
        .unwrap_or_else(|| json!(format!("{OWN}-extension-{i}")));
    let filter = json!({"name": name, "typed_config": extension.get("typed_config")?});
    if package.starts_with("envoy.extensions.filters.http.") {
        let filters = if type_url == ROUTER_TYPE {
            vec![filter]
        } else {
            vec![filter, router()]
        };
        let rest = json!({
            "route_config": {"name": format!("{OWN}-extension-{i}")},
            "http_filters": filters,
        });
        return Some(pipe_listener(
            "extensions",
            i,
            hcm(format!("{OWN}-extension-{i}"), rest),
        ));
    }
    if package.starts_with("envoy.extensions.filters.listener.") {
        let rest = json!({
            "route_config": {"name": format!("{OWN}-extension-{i}")},
            "http_filters": [router()],
        });
        let mut listener =
            pipe_listener("extensions", i, hcm(format!("{OWN}-extension-{i}"), rest));
        listener["listener_filters"] = json!([filter]);
        return Some(listener);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_gets_a_key_builder_of_its_key_length_and_an_rds_source() {
        let scope = json!({"name": "s", "route_configuration_name": "r",
            "key": {"fragments": [{"string_key": "a"}, {"string_key": "b"}]}});
        let l = scoped_route_listener(3, &scope);
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        let scoped = &hcm["scoped_routes"];
        assert_eq!(
            scoped["scope_key_builder"]["fragments"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(scoped["rds_config_source"]["ads"], json!({}));
        let judged = &scoped["scoped_route_configurations_list"]["scoped_route_configurations"][0];
        assert_eq!(judged["route_configuration"], json!({"name": "r"}));
        assert!(judged.get("route_configuration_name").is_none());
        assert_eq!(judged["key"], scope["key"]);
        assert_eq!(l["address"]["pipe"]["path"], format!("/{OWN}/scopes-3"));
    }

    #[test]
    fn an_extension_config_is_placed_by_its_kind_of_filter() {
        let http = json!({"name": "add-header", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"}});
        let l = extension_listener(0, &http).unwrap();
        let filters = &l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
        assert_eq!(filters[0]["name"], "add-header");
        assert_eq!(filters[1]["typed_config"]["@type"], ROUTER_TYPE);

        let router_ext = json!({"name": "r", "typed_config": {"@type": ROUTER_TYPE}});
        let l = extension_listener(0, &router_ext).unwrap();
        let filters = &l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"];
        assert_eq!(filters.as_array().map(Vec::len), Some(1));

        let listener_filter = json!({"name": "tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector"}});
        let l = extension_listener(1, &listener_filter).unwrap();
        assert_eq!(l["listener_filters"][0]["name"], "tls");

        let network = json!({"name": "n", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"}});
        assert!(extension_listener(2, &network).is_none());
        assert!(extension_listener(2, &json!({"name": "no-type"})).is_none());
    }
}
