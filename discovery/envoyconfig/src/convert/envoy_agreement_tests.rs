//! Verdicts that must be Envoy's: what Envoy 1.40 accepts that a descriptor-only
//! check refused (types outside the `envoy.*` packages, an empty `Any`), and what it refuses
//! that parsing alone let through (an extension given by name only).

use prost::Message as _;
use serde_json::json;

use super::*;
use marin3r_api::EnvoyConfigSpec;

fn listener(http_filters: serde_json::Value, route_extra: serde_json::Value) -> EnvoyConfigSpec {
    let mut route = json!({"match": {"prefix": "/"}, "direct_response": {"status": 200}});
    if let (Some(r), Some(extra)) = (route.as_object_mut(), route_extra.as_object()) {
        r.extend(extra.clone());
    }
    serde_json::from_value(json!({"nodeID": "proxy", "resources": [{"type": "listener", "value": {
        "name": "http",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8080}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "http",
                "route_config": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
                "http_filters": http_filters,
            },
        }]}],
    }}]}))
    .unwrap()
}

fn router() -> serde_json::Value {
    json!({"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
}

fn problems(spec: &EnvoyConfigSpec) -> Vec<String> {
    match validate_config(spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn typed_structs_of_both_packages_are_accepted() {
    for package in ["xds.type.v3", "udpa.type.v1"] {
        let buffer = json!({"name": "envoy.filters.http.buffer", "typed_config": {
            "@type": format!("type.googleapis.com/{package}.TypedStruct"),
            "type_url": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
            "value": {"max_request_bytes": 1024},
        }});
        let spec = listener(json!([buffer, router()]), json!({}));
        assert_eq!(problems(&spec), Vec::<String>::new(), "{package}");
    }
}

#[test]
fn an_empty_any_is_accepted_and_served_empty() {
    let per_filter = json!({"typed_per_filter_config": {"envoy.filters.http.buffer": {
        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
        "config": {},
    }}});
    let spec = listener(json!([router()]), per_filter);
    let resources = validate_config(&spec).unwrap();
    let served =
        envoy_types::pb::envoy::config::listener::v3::Listener::decode(resources[0].body.clone())
            .unwrap();
    // Down to the FilterConfig: its `config` is an Any with no type, as Envoy parses `{}`.
    let hcm = served.filter_chains[0].filters[0]
        .config_type
        .clone()
        .unwrap();
    let envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) = hcm
    else {
        panic!("no typed_config");
    };
    let hcm = envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!("no inline route config");
    };
    let per = &rc.virtual_hosts[0].routes[0].typed_per_filter_config["envoy.filters.http.buffer"];
    let filter_config =
        envoy_types::pb::envoy::config::route::v3::FilterConfig::decode(per.value.as_slice())
            .unwrap();
    let config = filter_config.config.expect("the empty Any is present");
    assert_eq!((config.type_url.as_str(), config.value.len()), ("", 0));
    // A non-empty object without "@type" is still refused, where it is.
    let bad = listener(
        json!([router()]),
        json!({"typed_per_filter_config": {"x": {"max_request_bytes": 1}}}),
    );
    let errors = problems(&bad);
    assert!(errors[0].contains("expected '@type' field"), "{errors:?}");
}

#[test]
fn an_extension_given_by_name_only_is_refused_in_envoys_words() {
    let name_only = json!([{"name": "envoy.filters.http.router"}]);
    let errors = problems(&listener(name_only, json!({})));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("http_filters[0].typed_config: Didn't find a registered implementation for 'envoy.filters.http.router' with type URL: ''"),
        "{errors:?}"
    );
    // Envoy skips an optional one.
    let optional = json!([{"name": "envoy.filters.http.buffer", "is_optional": true}, router()]);
    assert_eq!(
        problems(&listener(optional, json!({}))),
        Vec::<String>::new()
    );
}
