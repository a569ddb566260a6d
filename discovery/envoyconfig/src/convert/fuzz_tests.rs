//! Conversion never panics, whatever a user puts in `envoyResources`: arbitrary JSON and YAML
//! shapes built from Envoy's own field names, mutations of valid resources of every type,
//! deep nesting and huge strings, in every serialization. Each case ends in a resource or in
//! errors that say something.

use base64::Engine as _;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

pub(super) const FIXTURES: [(ResourceType, &str); 8] = [
    (
        ResourceType::Listener,
        include_str!("testdata/listener_hcm.yaml"),
    ),
    (ResourceType::Cluster, include_str!("testdata/cluster.yaml")),
    (
        ResourceType::Endpoint,
        include_str!("testdata/endpoint.yaml"),
    ),
    (ResourceType::Route, include_str!("testdata/route.yaml")),
    (
        ResourceType::ScopedRoute,
        include_str!("testdata/scoped_route.yaml"),
    ),
    (ResourceType::Secret, include_str!("testdata/secret.yaml")),
    (ResourceType::Runtime, include_str!("testdata/runtime.yaml")),
    (
        ResourceType::ExtensionConfig,
        include_str!("testdata/extension_config.yaml"),
    ),
];

/// Field names Envoy resources use, so generated shapes reach past the first unknown field.
const KEYS: [&str; 24] = [
    "name",
    "address",
    "socket_address",
    "port_value",
    "filter_chains",
    "filters",
    "typed_config",
    "@type",
    "cluster_name",
    "endpoints",
    "lb_endpoints",
    "endpoint",
    "connect_timeout",
    "type",
    "virtual_hosts",
    "domains",
    "routes",
    "match",
    "prefix",
    "route",
    "cluster",
    "layer",
    "route_configuration_name",
    "key",
];

const TYPE_URLS: [&str; 4] = [
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
    "type.googleapis.com/google.protobuf.Struct",
    "type.googleapis.com/nope.Unknown",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        prop::num::f64::ANY
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[ -~]{0,16}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
        prop::sample::select(TYPE_URLS.to_vec()).prop_map(|s| json!(s)),
        prop::sample::select(vec![
            "1s",
            "-1s",
            "0.25s",
            "10000000000000s",
            "STATIC",
            "STRICT_DNS",
            "127.0.0.1",
            "::1",
            ""
        ])
        .prop_map(|s| json!(s)),
        (0usize..200_000).prop_map(|n| Value::String("x".repeat(n))),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(KEYS.to_vec()).prop_map(String::from),
        1 => "[ -~]{0,10}",
    ]
}

/// Arbitrary JSON values, up to a few levels deep, keyed mostly by Envoy field names.
fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One change at a random place of a valid resource.
#[derive(Debug, Clone)]
pub(super) enum Mutation {
    Replace(Value),
    Remove,
    Insert(String, Value),
    WrapInArray,
    Stringify,
}

pub(super) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => json_value().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        2 => (key(), json_value()).prop_map(|(k, v)| Mutation::Insert(k, v)),
        1 => Just(Mutation::WrapInArray),
        1 => Just(Mutation::Stringify),
    ]
}

/// Applies `m` at the `pick`-th node (in pre-order, modulo the node count) of `doc`.
pub(super) fn mutate(doc: &mut Value, pick: usize, m: &Mutation) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn visit(v: &mut Value, target: &mut usize, m: &Mutation) -> bool {
        if *target == 0 {
            match m {
                Mutation::Replace(new) => *v = new.clone(),
                Mutation::Remove => *v = Value::Null,
                Mutation::Insert(k, new) => match v {
                    Value::Object(o) => {
                        o.insert(k.clone(), new.clone());
                    }
                    Value::Array(a) => a.push(new.clone()),
                    _ => *v = json!({ k.clone(): new.clone() }),
                },
                Mutation::WrapInArray => *v = Value::Array(vec![v.take()]),
                Mutation::Stringify => *v = Value::String(v.to_string()),
            }
            return true;
        }
        *target -= 1;
        match v {
            Value::Array(a) => a.iter_mut().any(|c| visit(c, target, m)),
            Value::Object(o) => {
                if matches!(m, Mutation::Remove) {
                    // Removing a key, not nulling it, when the target is a direct child.
                    let keys: Vec<String> = o.keys().cloned().collect();
                    for k in keys {
                        if *target == 0 {
                            o.remove(&k);
                            return true;
                        }
                        if let Some(c) = o.get_mut(&k)
                            && visit(c, target, m)
                        {
                            return true;
                        }
                    }
                    false
                } else {
                    o.values_mut().any(|c| visit(c, target, m))
                }
            }
            _ => false,
        }
    }
    let n = count(doc);
    let mut target = pick % n;
    visit(doc, &mut target, m);
}

fn serialize(doc: &Value, serialization: Serialization) -> String {
    match serialization {
        Serialization::Json => doc.to_string(),
        Serialization::Yaml => serde_saphyr::to_string(doc).unwrap_or_else(|_| doc.to_string()),
        Serialization::B64json => base64::engine::general_purpose::STANDARD.encode(doc.to_string()),
    }
}

fn serialization() -> impl Strategy<Value = Serialization> {
    prop::sample::select(vec![
        Serialization::Yaml,
        Serialization::Json,
        Serialization::B64json,
    ])
}

fn kind() -> impl Strategy<Value = ResourceType> {
    prop::sample::select(ResourceType::ALL.to_vec())
}

/// A conversion ends in a named resource of its kind, or in errors that say something.
fn check(
    kind: ResourceType,
    value: &str,
    serialization: Serialization,
) -> Result<(), TestCaseError> {
    match convert_value(kind, value, serialization) {
        Ok(resource) => {
            prop_assert_eq!(resource.kind, kind);
            prop_assert!(!resource.name.is_empty());
        }
        Err(errors) => {
            prop_assert!(!errors.is_empty());
            for e in &errors {
                prop_assert!(!e.to_string().trim().is_empty(), "{:?}", e);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_shapes_never_panic(kind in kind(), doc in json_value(), ser in serialization()) {
        check(kind, &serialize(&doc, ser), ser)?;
    }

    #[test]
    fn mutated_valid_resources_never_panic(
        fixture in 0usize..FIXTURES.len(),
        changes in prop::collection::vec((any::<usize>(), mutation()), 1..4),
        ser in serialization(),
        as_kind in prop::option::weighted(0.2, kind()),
    ) {
        let (kind, yaml) = FIXTURES[fixture];
        let mut doc: Value = serde_saphyr::from_str(yaml).unwrap();
        for (pick, m) in &changes {
            mutate(&mut doc, *pick, m);
        }
        check(as_kind.unwrap_or(kind), &serialize(&doc, ser), ser)?;
    }

    #[test]
    fn arbitrary_text_never_panics(kind in kind(), text in "[ -~\n\t]{0,200}", ser in serialization()) {
        check(kind, &text, ser)?;
    }
}

/// Deep nesting in each serialization is refused or converted, never a stack overflow, on
/// the 2 MiB stack of a tokio worker. The documents are built as text: a deep
/// `serde_json::Value` would itself recurse when printed or dropped.
#[test]
fn deep_nesting_does_not_overflow_a_worker_stack() {
    let handle = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            for depth in [16usize, 64, 128, 200, 1_000, 10_000] {
                // A runtime layer is a Struct: nesting is legal there.
                let objects = format!("{}1{}", r#"{"k":"#.repeat(depth), "}".repeat(depth));
                let lists = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
                for nested in [&objects, &lists] {
                    let json = format!(r#"{{"name":"runtime","layer":{{"k":{nested}}}}}"#);
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&json);
                    // JSON is YAML (flow style).
                    for (text, ser) in [
                        (&json, Serialization::Json),
                        (&json, Serialization::Yaml),
                        (&b64, Serialization::B64json),
                    ] {
                        check(ResourceType::Runtime, text, ser).unwrap();
                    }
                }
                let listener = format!(
                    r#"{{"name":"l","filter_chains":[{{"filters":[{{"name":"x","typed_config":{{"@type":"type.googleapis.com/google.protobuf.Struct","value":{objects}}}}}]}}]}}"#
                );
                check(ResourceType::Listener, &listener, Serialization::Json).unwrap();
            }
        })
        .unwrap();
    handle.join().expect("conversion overflowed a 2 MiB stack");
}

#[test]
fn huge_names_and_strings_are_handled() {
    let name = "n".repeat(1 << 20);
    let doc = json!({"name": name, "layer": {"big": "v".repeat(1 << 20)}});
    for ser in [
        Serialization::Json,
        Serialization::Yaml,
        Serialization::B64json,
    ] {
        check(ResourceType::Runtime, &serialize(&doc, ser), ser).unwrap();
    }
}
