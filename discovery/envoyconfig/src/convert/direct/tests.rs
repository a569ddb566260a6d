//! The fast path writes what the full path writes, or declines: on every fixture, on shapes
//! that exercise each kind of field it takes, on the forms it must leave to the full parser,
//! and on random changes to valid resources.

use proptest::prelude::*;
use prost::Message as _;
use serde_json::{Value, json};

use super::super::fuzz_tests::{FIXTURES, mutate, mutation};
use super::super::pool::descriptor_pool;
use super::super::*;

/// What the full path makes of a value: parsed, encoded, made canonical.
fn full_as(kind: ResourceType, text: &str, serialization: Serialization) -> Option<Vec<u8>> {
    let pool = descriptor_pool().unwrap();
    let desc = pool.get_message_by_name(kind.message_name()).unwrap();
    let message = parse::parse(&desc, text, serialization).ok()?;
    canonical::canonical(pool, &desc, &message.encode_to_vec()).ok()
}

fn fast_as(kind: ResourceType, text: &str, serialization: Serialization) -> Option<Vec<u8>> {
    let pool = descriptor_pool().unwrap();
    let desc = pool.get_message_by_name(kind.message_name()).unwrap();
    match serialization {
        Serialization::Yaml => super::encode_yaml(pool, &desc, text),
        _ => super::encode(pool, &desc, text),
    }
}

fn fast(kind: ResourceType, text: &str) -> Option<Vec<u8>> {
    fast_as(kind, text, Serialization::Json)
}

fn yaml(doc: &Value) -> String {
    serde_saphyr::to_string(doc).unwrap()
}

/// The fast path takes `doc`, written in JSON and in YAML, and writes the full path's bytes.
#[track_caller]
fn takes(kind: ResourceType, doc: &Value) {
    for (text, serialization) in [
        (doc.to_string(), Serialization::Json),
        (yaml(doc), Serialization::Yaml),
    ] {
        let bytes =
            fast_as(kind, &text, serialization).unwrap_or_else(|| panic!("declined {text}"));
        assert_eq!(Some(bytes), full_as(kind, &text, serialization), "{text}");
    }
}

#[test]
fn every_fixture_takes_the_fast_path_and_writes_the_full_paths_bytes() {
    for (kind, yaml) in FIXTURES {
        let doc: Value = serde_saphyr::from_str(yaml).unwrap();
        // The secret's key and certificate are `bytes`, which the fast path leaves alone.
        if kind == ResourceType::Secret {
            assert_eq!(fast(kind, &doc.to_string()), None);
            continue;
        }
        takes(kind, &doc);
    }
}

#[test]
fn each_kind_of_field_it_takes_is_written_as_the_full_path_writes_it() {
    let hcm = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
    let listener = json!({
        "name": "l",
        // A map of Structs, a Struct of every JSON type, keys out of order.
        "metadata": {"filter_metadata": {"z": {"b": [1, -2.5, "x", true, false, {"k": {}}, []], "a": 0}, "a": {}}},
        "address": {"socketAddress": {"address": "::", "portValue": 0, "ipv4_compat": true}},
        // Wrappers, at their defaults and not; an enum by name; a negative int32 and an int64.
        "per_connection_buffer_limit_bytes": 0,
        "freebind": false,
        "transparent": true,
        "tcp_backlog_size": 7,
        "drain_type": "MODIFY_ONLY",
        "listener_filters_timeout": "-0.000000001s",
        "filter_chains": [{
            "filters": [{"name": "hcm", "typed_config": {
                "@type": hcm,
                "stat_prefix": "s",
                "common_http_protocol_options": {"idle_timeout": "3600.5s", "max_headers_count": 100},
                "route_config": {"virtual_hosts": [{"name": "v", "domains": ["a", ""], "routes": [
                    {"match": {"prefix": ""}, "route": {"cluster": "c", "timeout": "0s",
                        "retry_policy": {"num_retries": 3, "retry_on": "5xx"}}},
                    {"match": {"safe_regex": {"regex": ".*"}}, "redirect": {"response_code": "FOUND"}}
                ]}]},
                "http_filters": [{"name": "r", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }}]
        }]
    });
    takes(ResourceType::Listener, &listener);
    let cluster = json!({
        "name": "c",
        "type": "EDS",
        "lb_policy": "LEAST_REQUEST",
        "connect_timeout": "1s",
        "per_connection_buffer_limit_bytes": 32768,
        "ignore_health_on_host_removal": true,
        "outlier_detection": {"consecutive_5xx": 0, "max_ejection_percent": 100},
        "common_lb_config": {"healthy_panic_threshold": {"value": 25.5}}
    });
    takes(ResourceType::Cluster, &cluster);
    let runtime = json!({"name": "rt", "layer": {"n": 1, "s": "x", "deep": {"deeper": [[], {}]}}});
    takes(ResourceType::Runtime, &runtime);
}

#[test]
fn what_it_does_not_take_is_left_to_the_full_parser() {
    let declined = [
        // Nulls, unknown fields, a field written twice (by either name), two members of a oneof.
        (ResourceType::Cluster, r#"{"name":"c","type":null}"#),
        (ResourceType::Cluster, r#"{"name":"c","nope":1}"#),
        (ResourceType::Cluster, r#"{"name":"c","name":"d"}"#),
        (
            ResourceType::Cluster,
            r#"{"name":"c","lb_policy":"RANDOM","lbPolicy":"RANDOM"}"#,
        ),
        (
            ResourceType::Route,
            r#"{"name":"r","virtual_hosts":[{"name":"v","domains":["*"],"routes":[{"match":{"prefix":"/","path":"/x"}}]}]}"#,
        ),
        // Envoy's lenient forms: an enum in another case, a single object for a list, `{}` as
        // an `Any`.
        (ResourceType::Cluster, r#"{"name":"c","type":"strict_dns"}"#),
        (
            ResourceType::Route,
            r#"{"name":"r","virtual_hosts":{"name":"v","domains":["*"]}}"#,
        ),
        (
            ResourceType::Listener,
            r#"{"name":"l","filter_chains":[{"filters":[{"name":"x","typed_config":{}}]}]}"#,
        ),
        // Numbers as strings, fractions for integers, floats, bytes, an unknown or a
        // well-known type in an `Any`, a duration in Go's units, a map key written twice.
        (
            ResourceType::Cluster,
            r#"{"name":"c","per_connection_buffer_limit_bytes":"5"}"#,
        ),
        (
            ResourceType::Cluster,
            r#"{"name":"c","per_connection_buffer_limit_bytes":1.5}"#,
        ),
        (
            ResourceType::Cluster,
            r#"{"name":"c","connect_timeout":"5ms"}"#,
        ),
        (
            ResourceType::Cluster,
            r#"{"name":"c","connect_timeout":"1.0000000001s"}"#,
        ),
        (ResourceType::Cluster, r#"{"name":"c","connect_timeout":5}"#),
        (
            ResourceType::Listener,
            r#"{"name":"l","filter_chains":[{"filters":[{"name":"x","typed_config":{"@type":"type.googleapis.com/nope.Nope"}}]}]}"#,
        ),
        (
            ResourceType::Listener,
            r#"{"name":"l","filter_chains":[{"filters":[{"name":"x","typed_config":{"@type":"type.googleapis.com/google.protobuf.Struct","value":{}}}]}]}"#,
        ),
        (
            ResourceType::Runtime,
            r#"{"name":"rt","layer":{"a":1,"a":2}}"#,
        ),
        (ResourceType::Runtime, r#"{"name":"rt","layer":{"a":null}}"#),
        // Not JSON at all, or more than one value.
        (ResourceType::Cluster, "name: c"),
        (ResourceType::Cluster, r#"{"name":"c"} {}"#),
        (ResourceType::Cluster, ""),
    ];
    for (kind, text) in declined {
        assert_eq!(fast(kind, text), None, "{text}");
    }
    // In YAML: anchors, aliases, tags, merges and directives; a null, a quoted number or a
    // number in another notation where a number belongs; a key that is not text; a key written
    // twice; a second document, an empty one; deeper than the full path reads.
    let deep = format!(
        "name: rt\nlayer:\n{}",
        (0..70)
            .map(|i| format!("{}k:\n", " ".repeat(2 * i + 2)))
            .collect::<String>()
    );
    let declined_yaml = [
        "name: &n c\nalt_stat_name: *n",
        "name: !!str c",
        "%YAML 1.2\n---\nname: c",
        "base: &b {name: c}\n<<: *b",
        "<<: {name: c}",
        "name: ~",
        "name: c\nper_connection_buffer_limit_bytes: '5'",
        "name: c\nper_connection_buffer_limit_bytes: 0x10",
        "name: c\nper_connection_buffer_limit_bytes: 010",
        "name: c\nper_connection_buffer_limit_bytes: +5",
        "name: c\nper_connection_buffer_limit_bytes: 1_000",
        "name: c\ncommon_lb_config: {healthy_panic_threshold: {value: 1e2}}",
        "name: c\ncommon_lb_config: {healthy_panic_threshold: {value: .5}}",
        "name: c\nignore_health_on_host_removal: yes",
        "name: c\n1: x",
        "name: c\nname: d",
        "name: c\n---\nname: d",
        "",
        "# nothing",
    ];
    for text in declined_yaml {
        assert_eq!(
            fast_as(ResourceType::Cluster, text, Serialization::Yaml),
            None,
            "{text}"
        );
    }
    assert_eq!(
        fast_as(ResourceType::Runtime, &deep, Serialization::Yaml),
        None
    );
}

/// Plain scalars are read as the field they fill asks, as the full path reads them.
#[test]
fn plain_yaml_scalars_are_read_as_the_full_path_reads_them() {
    let cluster = [
        "name: 123",
        "name: true",
        "name: yes",
        "name: 0x10",
        "name: 1_000",
        "name: .inf",
        "name: 1e3",
        "name: c # a comment\n# another",
        "name: 'single ''quoted'''\nalt_stat_name: \"double \\u00e9\"",
        "name: |\n  literal\n  block\nalt_stat_name: >\n  folded\n  block",
        "name: a plain\n  scalar on two lines",
        "---\nname: c\n...\n",
        "name: c\ntype: STRICT_DNS\nper_connection_buffer_limit_bytes: 0",
        "name: c\nconnect_timeout: 0.25s\ncommon_lb_config: {healthy_panic_threshold: {value: 25.5}}",
        "name: c\ncommon_lb_config: {healthy_panic_threshold: {value: -0.5}}",
        "name: c\nignore_health_on_host_removal: false",
        "name: c\nmetadata: {filter_metadata: {a: {num: 1, f: 2.5, b: true, s: text, t: 'true'}}}",
    ];
    for text in cluster {
        let bytes = fast_as(ResourceType::Cluster, text, Serialization::Yaml)
            .unwrap_or_else(|| panic!("declined {text}"));
        assert_eq!(
            Some(bytes),
            full_as(ResourceType::Cluster, text, Serialization::Yaml),
            "{text}"
        );
    }
}

#[test]
fn a_value_the_fast_path_takes_but_a_rule_refuses_gets_the_full_paths_errors() {
    // An empty cluster name breaks no JSON rule but leaves the resource unnamed; a cluster
    // with a negative connect timeout breaks Envoy's `gt: 0` rule.
    for text in [r#"{"name":""}"#, r#"{"name":"c","connect_timeout":"-1s"}"#] {
        assert!(fast(ResourceType::Cluster, text).is_some(), "{text}");
        let errors = convert_value(ResourceType::Cluster, text, Serialization::Json).unwrap_err();
        assert!(!errors.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the fast path takes, the full parser takes too, with the same bytes.
    #[test]
    fn the_fast_path_agrees_with_the_full_one_on_changed_resources(
        fixture in 0usize..FIXTURES.len(),
        changes in prop::collection::vec((any::<usize>(), mutation()), 0..4),
    ) {
        let (kind, yaml) = FIXTURES[fixture];
        let mut doc: Value = serde_saphyr::from_str(yaml).unwrap();
        for (pick, m) in &changes {
            mutate(&mut doc, *pick, m);
        }
        for (text, serialization) in [
            (doc.to_string(), Serialization::Json),
            (doc.to_string(), Serialization::Yaml),
            (serde_saphyr::to_string(&doc).unwrap_or_default(), Serialization::Yaml),
        ] {
            if let Some(bytes) = fast_as(kind, &text, serialization) {
                prop_assert_eq!(Some(bytes), full_as(kind, &text, serialization), "{}", text);
            }
        }
    }

    /// A plain YAML scalar of any look, in a string, an enum, an integer, a double, a
    /// duration, a map key and a `Value`: read as the full path reads it, or declined.
    #[test]
    fn plain_scalars_of_any_look_are_read_as_the_full_path_reads_them(
        scalar in "[-+.0-9a-zA-Z_~:]{0,8}",
    ) {
        let shapes = [
            format!("name: {scalar}"),
            format!("name: c\ntype: {scalar}"),
            format!("name: c\nper_connection_buffer_limit_bytes: {scalar}"),
            format!("name: c\ncommon_lb_config: {{healthy_panic_threshold: {{value: {scalar}}}}}"),
            format!("name: c\nconnect_timeout: {scalar}"),
            format!("name: c\nmetadata: {{filter_metadata: {{{scalar}: {{}}}}}}"),
            format!("name: c\nmetadata: {{filter_metadata: {{a: {{k: {scalar}}}}}}}"),
        ];
        for text in shapes {
            if let Some(bytes) = fast_as(ResourceType::Cluster, &text, Serialization::Yaml) {
                prop_assert_eq!(
                    Some(bytes),
                    full_as(ResourceType::Cluster, &text, Serialization::Yaml),
                    "{}",
                    text
                );
            }
        }
    }
}
