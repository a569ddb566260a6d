use serde_json::{Value, json};

use super::*;
use marin3r_api::EnvoyConfigSpec;

/// The resources a spec with these `resources` entries is served as.
fn served(entries: Value) -> Vec<Resource> {
    let spec: EnvoyConfigSpec =
        serde_json::from_value(json!({"nodeID": "gw", "resources": entries})).unwrap();
    crate::convert::validate_config(&spec).unwrap()
}

fn cluster(name: &str) -> Value {
    json!({"type": "cluster", "value": {"name": name, "connect_timeout": "1s"}})
}

fn routes(name: &str, routes: Value) -> Value {
    json!({"type": "route", "value": {"name": name, "virtual_hosts": [
        {"name": "all", "domains": ["*"], "routes": routes}
    ]}})
}

fn to(cluster: &str) -> Value {
    json!([{"match": {"prefix": "/"}, "route": {"cluster": cluster}}])
}

/// A listener whose HCM takes its routes from RDS configuration `rds`.
fn rds_listener(name: &str, port: u16, rds: &str) -> Value {
    json!({"type": "listener", "value": {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "rds": {"route_config_name": rds, "config_source": {"ads": {}, "resource_api_version": "V3"}},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    }})
}

/// A listener whose HCM holds its routes inline.
fn inline_listener(name: &str, routes: Value) -> Value {
    json!({"type": "listener", "value": {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8443}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "route_config": {"name": "inline", "virtual_hosts": [
                    {"name": "all", "domains": ["*"], "routes": routes}
                ]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }
        }]}]
    }})
}

fn tcp_listener(name: &str, specifier: Value) -> Value {
    let mut config = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
        "stat_prefix": name,
    });
    config
        .as_object_mut()
        .unwrap()
        .extend(specifier.as_object().unwrap().clone());
    json!({"type": "listener", "value": {
        "name": name,
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9000}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy", "typed_config": config}]}]
    }})
}

fn limits(max: u8, emptied: bool) -> BlastRadius {
    BlastRadius {
        max_removed_percent: Some(max),
        hold_emptied_listeners: Some(emptied),
    }
}

fn five_clusters() -> Vec<Value> {
    ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| cluster(n))
        .collect()
}

#[test]
fn removals_are_counted_per_type_against_the_share() {
    let before = served(Value::Array(five_clusters()));
    // One of five (20%) is within the default 30%.
    let after = served(Value::Array(five_clusters()[..4].to_vec()));
    let found = compare(&before, &after);
    assert_eq!(found.hold(&BlastRadius::default()), None);
    assert_eq!(found.summary(), "removes 1 of 5 clusters (20%): e");
    // Four of five holds, naming them.
    let after = served(json!([cluster("a")]));
    let found = compare(&before, &after);
    assert_eq!(
        found.hold(&BlastRadius::default()).unwrap(),
        "removes 4 of 5 clusters (80% > 30%): b, c, d, e"
    );
    // 100 never holds for removals; 80 lets exactly 80% through.
    assert_eq!(found.hold(&limits(100, true)), None);
    assert_eq!(found.hold(&limits(80, true)), None);
    assert!(found.hold(&limits(79, true)).is_some());
    // Additions take nothing away; a type the served version lacks cannot be removed from.
    let found = compare(&after, &before);
    assert_eq!(found.hold(&limits(1, true)), None);
    assert_eq!(found.summary(), "");
}

#[test]
fn a_rename_counts_as_a_removal() {
    let before = served(json!([cluster("a"), cluster("b")]));
    let after = served(json!([cluster("a"), cluster("b2")]));
    let found = compare(&before, &after);
    assert_eq!(
        found.hold(&BlastRadius::default()).unwrap(),
        "removes 1 of 2 clusters (50% > 30%): b"
    );
}

#[test]
fn many_names_are_cut_to_ten_each_shown_short() {
    let long = "x".repeat(100);
    let mut names: Vec<String> = (0..20).map(|i| format!("c{i:02}")).collect();
    names.push(long.clone());
    let before = served(Value::Array(names.iter().map(|n| cluster(n)).collect()));
    let after = served(json!([cluster("c00")]));
    let message = compare(&before, &after).hold(&limits(10, true)).unwrap();
    assert!(
        message.starts_with("removes 20 of 21 clusters (95% > 10%): c01, c02,"),
        "{message}"
    );
    assert!(message.ends_with("c10, and 10 more"), "{message}");
    let before = served(json!([cluster(&long), cluster("a")]));
    let after = served(json!([cluster("a")]));
    let message = compare(&before, &after).hold(&limits(10, true)).unwrap();
    assert!(
        message.ends_with(&format!("{}...", "x".repeat(64))),
        "{message}"
    );
}

#[test]
fn a_listener_emptied_through_rds_or_inline_is_held() {
    let serving = json!([
        rds_listener("http", 8080, "main"),
        routes("main", to("a")),
        cluster("a"),
    ]);
    let before = served(serving.clone());
    // The RDS configuration loses its routes: the listener routes nothing.
    let after = served(json!([
        rds_listener("http", 8080, "main"),
        routes("main", json!([])),
        cluster("a"),
    ]));
    let found = compare(&before, &after);
    assert_eq!(found.emptied, vec!["http".to_owned()]);
    assert_eq!(
        found.hold(&BlastRadius::default()).unwrap(),
        "empties listener http (routes no traffic)"
    );
    assert_eq!(found.hold(&limits(30, false)), None);
    // Pointing the listener at a configuration the version does not define empties it too
    // (and the removed one counts: 1 of 1 route configurations).
    let after = served(json!([rds_listener("http", 8080, "other"), cluster("a")]));
    let message = compare(&before, &after)
        .hold(&BlastRadius::default())
        .unwrap();
    assert_eq!(
        message,
        "removes 1 of 1 route configurations (100% > 30%): main; empties listener http \
         (routes no traffic)"
    );
    // Inline routes: the same.
    let before = served(json!([inline_listener("https", to("a")), cluster("a")]));
    let after = served(json!([inline_listener("https", json!([])), cluster("a")]));
    assert_eq!(compare(&before, &after).emptied, vec!["https".to_owned()]);
    // A listener that routed nothing before is not emptied by staying empty, and a new
    // empty listener empties nothing.
    let found = compare(&after, &after);
    assert!(found.emptied.is_empty());
    let after_new = served(json!([
        inline_listener("https", to("a")),
        rds_listener("new", 8081, "none"),
        cluster("a"),
    ]));
    assert!(compare(&before, &after_new).emptied.is_empty());
    // Routing to another cluster is still routing: the guard judges shape, not health.
    let other = served(json!([
        inline_listener("https", to("b")),
        cluster("a"),
        cluster("b")
    ]));
    assert_eq!(compare(&before, &other).hold(&BlastRadius::default()), None);
}

#[test]
fn a_tcp_proxy_without_a_cluster_routes_nothing_and_unknown_filters_route() {
    let before = served(json!([
        tcp_listener("db", json!({"cluster": "a"})),
        cluster("a")
    ]));
    let weighted = served(json!([
        tcp_listener(
            "db",
            json!({"weighted_clusters": {"clusters": [{"name": "a", "weight": 1}]}})
        ),
        cluster("a"),
    ]));
    assert!(compare(&before, &weighted).emptied.is_empty());
    // A filter the guard does not know counts as routing: it holds only what it can show.
    let echo = served(json!([
        {"type": "listener", "value": {
            "name": "db",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9000}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.echo", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.echo.v3.Echo"}}]}]
        }},
        cluster("a"),
    ]));
    assert!(compare(&before, &echo).emptied.is_empty());
    // No filter chain at all, no listener filter: nothing is routed.
    let bare = served(json!([
        {"type": "listener", "value": {
            "name": "db",
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 9000}}
        }},
        cluster("a"),
    ]));
    assert_eq!(compare(&before, &bare).emptied, vec!["db".to_owned()]);
}
