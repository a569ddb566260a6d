//! Every problem of one value, each at its path in proto field names.

#![allow(clippy::unwrap_used)] // test code

use super::*;

fn problems(kind: &str, value: serde_json::Value) -> Vec<String> {
    let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
        "nodeID": "edge",
        "resources": [{"type": kind, "value": value}],
    }))
    .unwrap();
    match validate_config(&spec) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

/// Seven mistakes in one listener, of every kind the parser stops at (a misspelt field, a
/// wrong type, an unknown enum value, a Go-style duration) and a broken declared rule: each
/// is reported, not only the first.
#[test]
fn every_problem_of_one_value_is_reported() {
    let got = problems(
        "listener",
        serde_json::json!({
            "name": "http",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": "eighty"}},
            "stat_prefx": "typo",
            "traffic_direction": "SIDEWAYS",
            "listener_filters_timeout": "250ms",
            "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                    "stat_prefix": "tcp", "cluster": "app", "idle_timout": "1s"}}]},
                {"filters": [], "name": 7},
            ],
            "per_connection_buffer_limit_bytes": {"value": -1},
            "drain_type": "DEFAULT",
            "listener_filters": [{"name": ""}],
        }),
    );
    let at = |path: &str| got.iter().any(|p| p.contains(&format!("value: {path}: ")));
    for path in [
        "address.socket_address.port_value",
        "traffic_direction",
        "listener_filters_timeout",
        "filter_chains[0].filters[0].typed_config",
        "filter_chains[1].name",
        "per_connection_buffer_limit_bytes",
        "listener_filters[0].name",
    ] {
        assert!(at(path), "no problem at {path}: {got:#?}");
    }
    assert!(
        got.iter()
            .any(|p| p.contains("unknown field \"stat_prefx\"")),
        "{got:#?}"
    );
    assert!(
        got.iter()
            .any(|p| p.contains("unknown field \"idle_timout\"")),
        "{got:#?}"
    );
    assert!(got.len() >= 8, "{got:#?}");
}

/// The two JSON names of a field (`socketAddress`, `socket_address`) give one path: the
/// proto names, as Envoy's rules name them, inside a typed `Any` too.
#[test]
fn paths_use_the_proto_field_names_whatever_was_written() {
    let camel = problems(
        "listener",
        serde_json::json!({
            "name": "http",
            "address": {"socketAddress": {"address": "0.0.0.0", "portValue": "eighty"}},
            "filterChains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "statPrefix": "tcp", "cluster": "app", "idleTimeout": "soon"}}]}],
        }),
    );
    assert!(
        camel
            .iter()
            .any(|p| p.contains("value: address.socket_address.port_value: expected an integer")),
        "{camel:#?}"
    );
    assert!(
        camel.iter().any(|p| p.contains(
            "value: filter_chains[0].filters[0].typed_config.idle_timeout: expected a duration"
        )),
        "{camel:#?}"
    );
}

/// A problem the parser reports and the rule it then breaks by its absence are one problem.
#[test]
fn a_field_taken_out_is_not_reported_again_by_its_rules() {
    let got = problems(
        "listener",
        serde_json::json!({
            "name": "http",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": "eighty"}},
        }),
    );
    assert_eq!(got.len(), 1, "{got:#?}");
}
