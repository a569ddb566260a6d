//! Conversion tables: every resource type in every serialization, the errors users make,
//! and a round trip through envoy-types' prost structs.

use base64::Engine as _;
use envoy_types::pb::envoy;
use prost::Message as _;
use prost_reflect::DynamicMessage;

use super::*;
use marin3r_api::{EnvoyResource, EnvoySecretResource, SecretReference};

const LISTENER: &str = include_str!("testdata/listener_hcm.yaml");
const CLUSTER: &str = include_str!("testdata/cluster.yaml");
const ENDPOINT: &str = include_str!("testdata/endpoint.yaml");
const ROUTE: &str = include_str!("testdata/route.yaml");
const SCOPED_ROUTE: &str = include_str!("testdata/scoped_route.yaml");
const SECRET: &str = include_str!("testdata/secret.yaml");
const RUNTIME: &str = include_str!("testdata/runtime.yaml");
const EXTENSION_CONFIG: &str = include_str!("testdata/extension_config.yaml");

/// Every resource type with a realistic value and the name it must get.
fn fixtures() -> [(ResourceType, &'static str, &'static str); 8] {
    [
        (ResourceType::Listener, LISTENER, "http"),
        (ResourceType::Cluster, CLUSTER, "backend"),
        (ResourceType::Endpoint, ENDPOINT, "backend"),
        (ResourceType::Route, ROUTE, "local_route"),
        (ResourceType::ScopedRoute, SCOPED_ROUTE, "scope-a"),
        (ResourceType::Secret, SECRET, "server-cert"),
        (ResourceType::Runtime, RUNTIME, "runtime"),
        (ResourceType::ExtensionConfig, EXTENSION_CONFIG, "router"),
    ]
}

/// The same resource written in `serialization` (JSON as a user writes it: snake_case).
fn mk_value(yaml: &str, serialization: Serialization) -> String {
    let json = || {
        let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        serde_json::to_string_pretty(&value).unwrap()
    };
    match serialization {
        Serialization::Yaml => yaml.to_owned(),
        Serialization::Json => json(),
        Serialization::B64json => base64::engine::general_purpose::STANDARD.encode(json()),
    }
}

const ALL_SERIALIZATIONS: [Serialization; 3] = [
    Serialization::Yaml,
    Serialization::Json,
    Serialization::B64json,
];

fn mk_entry(value: String) -> EnvoyResource {
    EnvoyResource { name: None, value }
}

fn mk_resources(kind: ResourceType, values: &[&str], ser: Serialization) -> EnvoyResources {
    let mut resources = EnvoyResources::default();
    let list = values.iter().map(|v| mk_entry(mk_value(v, ser))).collect();
    match kind {
        ResourceType::Endpoint => resources.endpoints = list,
        ResourceType::Cluster => resources.clusters = list,
        ResourceType::Route => resources.routes = list,
        ResourceType::ScopedRoute => resources.scoped_routes = list,
        ResourceType::Listener => resources.listeners = list,
        ResourceType::Runtime => resources.runtimes = list,
        ResourceType::ExtensionConfig => resources.extension_configs = list,
        ResourceType::Secret => panic!("secrets are references, not values"),
    }
    resources
}

fn messages(errors: &[ConversionError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn every_type_converts_in_every_serialization() {
    for (kind, yaml, name) in fixtures() {
        for ser in ALL_SERIALIZATIONS {
            let resource = convert_value(kind, &mk_value(yaml, ser), ser)
                .unwrap_or_else(|e| panic!("{kind} in {}: {e:?}", ser.as_str()));
            assert_eq!((resource.kind, resource.name.as_str()), (kind, name));
            assert!(!resource.body.is_empty());
        }
    }
}

#[test]
fn encoding_is_deterministic() {
    // A runtime layer is a Struct (a map), and so is a route's typed_per_filter_config map of
    // Any payloads that hold maps themselves.
    let route = ROUTE.replace(
        "    routes:\n",
        "    typed_per_filter_config:\n      \
         a: { \"@type\": type.googleapis.com/google.protobuf.Struct, value: { x: 1, y: 2, z: 3 } }\n      \
         b: { \"@type\": type.googleapis.com/google.protobuf.Struct, value: { u: 1, v: 2, w: 3 } }\n      \
         c: { \"@type\": type.googleapis.com/google.protobuf.Struct, value: { r: 1, s: 2, t: 3 } }\n    \
         routes:\n",
    );
    for (kind, yaml) in [
        (ResourceType::Runtime, RUNTIME),
        (ResourceType::Route, route.as_str()),
    ] {
        let first = convert_value(kind, yaml, Serialization::Yaml).unwrap();
        for ser in ALL_SERIALIZATIONS.into_iter().cycle().take(30) {
            let again = convert_value(kind, &mk_value(yaml, ser), ser).unwrap();
            assert_eq!(first.body, again.body, "{kind} in {}", ser.as_str());
        }
    }
}

#[test]
fn serializations_give_the_same_message() {
    let pool = descriptor_pool().unwrap();
    for (kind, yaml, _) in fixtures() {
        let desc = pool.get_message_by_name(kind.message_name()).unwrap();
        // Compared decoded: protobuf map entries (a runtime layer's Struct) have no fixed order.
        let messages: Vec<_> = ALL_SERIALIZATIONS
            .iter()
            .map(|&ser| {
                let body = convert_value(kind, &mk_value(yaml, ser), ser).unwrap().body;
                DynamicMessage::decode(desc.clone(), body).unwrap()
            })
            .collect();
        assert!(messages.windows(2).all(|w| w[0] == w[1]), "{kind}");
    }
}

#[test]
fn spec_lists_convert_in_order() {
    for (kind, yaml, name) in fixtures() {
        if kind == ResourceType::Secret {
            continue;
        }
        let second = yaml.replacen(name, &format!("{name}-2"), 1);
        let resources = mk_resources(kind, &[yaml, &second], Serialization::Yaml);
        let out = envoy_resources(&resources, Serialization::Yaml).unwrap();
        let names: Vec<_> = out.iter().map(|r| (r.kind, r.name.as_str())).collect();
        let expected_second = format!("{name}-2");
        assert_eq!(names, [(kind, name), (kind, expected_second.as_str())]);
    }
}

#[test]
fn a_manifest_spec_in_the_original_format_parses() {
    let spec: EnvoyConfigSpec = serde_saphyr::from_str(
        r#"
nodeID: my-proxy
serialization: yaml
envoyResources:
  secrets:
    - name: my-certificate
      ref: { name: my-certificate-secret, namespace: default }
  runtime:
    - name: runtime
      value: "name: runtime\nlayer: { a: 1 }"
  clusters:
    - value: "name: backend\nconnect_timeout: 1s"
"#,
    )
    .unwrap();
    assert_eq!(spec.envoy_api, EnvoyApi::V3);
    assert_eq!(
        spec.envoy_resources.runtimes.len(),
        1,
        "`runtime` is an alias"
    );
    assert_eq!(
        spec.envoy_resources.secrets[0].secret_namespace(),
        Some("default")
    );
    let out = validate_config(&spec).unwrap();
    let kinds: Vec<_> = out.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [ResourceType::Cluster, ResourceType::Runtime]);

    let json: EnvoyConfigSpec = serde_json::from_str(r#"{"nodeID": "p"}"#).unwrap();
    assert_eq!(
        (json.serialization, json.envoy_api),
        (Serialization::Json, EnvoyApi::V3)
    );
    let v2: EnvoyConfigSpec = serde_json::from_str(r#"{"nodeID": "p", "envoyAPI": "v2"}"#).unwrap();
    assert_eq!(v2.envoy_api, EnvoyApi::V2);
    // Unknown fields are accepted (an API server prunes them); `marin3r validate` reports them.
    let typo: EnvoyConfigSpec =
        serde_json::from_str(r#"{"nodeID": "p", "envoyResource": {}}"#).unwrap();
    assert!(typo.envoy_resources.is_empty());
}

/// Decodes `body` with the envoy-types prost struct, encodes it again and checks that both
/// encodings mean the same message (prost and prost-reflect need not order fields alike).
fn assert_round_trip<M: prost::Message + Default>(kind: ResourceType, body: &[u8]) -> M {
    let typed = M::decode(body).unwrap_or_else(|e| panic!("{kind}: {e}"));
    let desc = descriptor_pool()
        .unwrap()
        .get_message_by_name(kind.message_name())
        .unwrap();
    let ours = DynamicMessage::decode(desc.clone(), body).unwrap();
    let theirs = DynamicMessage::decode(desc, typed.encode_to_vec().as_slice()).unwrap();
    assert_eq!(ours, theirs, "{kind}");
    assert!(
        ours.unknown_fields().next().is_none(),
        "{kind} has unknown fields"
    );
    typed
}

#[test]
fn encoded_resources_decode_with_envoy_types() {
    use envoy::config::{cluster, endpoint, listener, route};
    use envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager::RouteSpecifier,
    };
    let body = |kind, yaml| convert_value(kind, yaml, Serialization::Yaml).unwrap().body;

    let l: listener::v3::Listener = assert_round_trip(
        ResourceType::Listener,
        &body(ResourceType::Listener, LISTENER),
    );
    let any = l.filter_chains[0].filters[0].config_type.clone().unwrap();
    let listener::v3::filter::ConfigType::TypedConfig(any) = any else {
        panic!("typed_config expected")
    };
    assert!(any.type_url.ends_with("v3.HttpConnectionManager"));
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    assert_eq!(hcm.stat_prefix, "ingress_http");
    let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
        panic!("inline route_config expected")
    };
    assert_eq!(rc.virtual_hosts[0].domains, ["*"]);
    assert_eq!(hcm.http_filters[0].name, "envoy.filters.http.router");

    let c: cluster::v3::Cluster =
        assert_round_trip(ResourceType::Cluster, &body(ResourceType::Cluster, CLUSTER));
    assert_eq!(c.connect_timeout.unwrap().nanos, 250_000_000);
    let cla = c.load_assignment.unwrap();
    assert_eq!(cla.cluster_name, "backend");
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);

    let e: endpoint::v3::ClusterLoadAssignment = assert_round_trip(
        ResourceType::Endpoint,
        &body(ResourceType::Endpoint, ENDPOINT),
    );
    assert_eq!(
        e.endpoints[0].lb_endpoints[0]
            .load_balancing_weight
            .map(|w| w.value),
        Some(10)
    );

    let r: route::v3::RouteConfiguration =
        assert_round_trip(ResourceType::Route, &body(ResourceType::Route, ROUTE));
    assert_eq!(r.virtual_hosts[0].routes.len(), 2);

    let s: route::v3::ScopedRouteConfiguration = assert_round_trip(
        ResourceType::ScopedRoute,
        &body(ResourceType::ScopedRoute, SCOPED_ROUTE),
    );
    assert_eq!(s.route_configuration_name, "local_route");

    let secret: envoy::extensions::transport_sockets::tls::v3::Secret =
        assert_round_trip(ResourceType::Secret, &body(ResourceType::Secret, SECRET));
    let Some(envoy::extensions::transport_sockets::tls::v3::secret::Type::TlsCertificate(tls)) =
        secret.r#type
    else {
        panic!("tls_certificate expected")
    };
    let chain = tls.certificate_chain.unwrap().specifier.unwrap();
    assert_eq!(
        chain,
        envoy::config::core::v3::data_source::Specifier::InlineBytes(
            b"-----BEGIN CERTIFICATE-----\n".to_vec()
        )
    );

    let rt: envoy::service::runtime::v3::Runtime =
        assert_round_trip(ResourceType::Runtime, &body(ResourceType::Runtime, RUNTIME));
    let layer = rt.layer.unwrap();
    assert!(
        layer
            .fields
            .contains_key("envoy.reloadable_features.example")
    );

    let ext: envoy::config::core::v3::TypedExtensionConfig = assert_round_trip(
        ResourceType::ExtensionConfig,
        &body(ResourceType::ExtensionConfig, EXTENSION_CONFIG),
    );
    assert!(
        ext.typed_config
            .unwrap()
            .type_url
            .ends_with("router.v3.Router")
    );
}

#[test]
fn tls_secrets_from_kubernetes_data_match_the_parsed_form() {
    let from_k8s = tls_secret(
        "server-cert",
        b"-----BEGIN CERTIFICATE-----\n",
        b"-----BEGIN PRIVATE KEY-----\n",
    )
    .unwrap();
    let parsed = convert_value(ResourceType::Secret, SECRET, Serialization::Yaml).unwrap();
    assert_eq!(from_k8s, parsed);
    assert_eq!(
        tls_secret("s", b"", b"key").unwrap_err().to_string(),
        "secret \"s\": tls.crt is empty"
    );
    assert_eq!(
        tls_secret("s", b"crt", b"").unwrap_err().to_string(),
        "secret \"s\": tls.key is empty"
    );
}

#[test]
fn the_descriptor_pool_knows_every_resource_type_and_keeps_validation_rules() {
    let pool = descriptor_pool().unwrap();
    for kind in ResourceType::ALL {
        assert!(
            pool.get_message_by_name(kind.message_name()).is_some(),
            "{kind}"
        );
    }
    // protoc-gen-validate rules survive (custom options are kept by prost-reflect's decoder).
    let port = pool
        .get_message_by_name("envoy.config.core.v3.SocketAddress")
        .unwrap()
        .get_field_by_name("port_value")
        .unwrap();
    assert!(
        port.options()
            .extensions()
            .any(|(ext, _)| ext.full_name() == "validate.rules"),
        "validate.rules lost"
    );
}

/// Envoy's protoc-gen-validate rules that the conversion checks itself, each with the
/// message a user gets (every violation of a value is listed).
#[test]
fn validation_rules_are_checked_inside_any_too() {
    use ResourceType as T;
    let cases: [(T, String, &[&str]); 7] = [
        (
            T::Listener,
            LISTENER.replace("port_value: 8080", "port_value: 70000"),
            &["address.socket_address.port_value: must be <= 65535 (got 70000)"],
        ),
        (
            T::Listener,
            LISTENER
                .replace("stat_prefix: ingress_http", "stat_prefix: \"\"")
                .replace("domains: [\"*\"]", "domains: []"),
            &[
                "filter_chains[0].filters[0].typed_config.stat_prefix: must have at least 1 \
                 characters (has 0)",
                "filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].domains: \
                 must have at least 1 items (has 0)",
            ],
        ),
        (
            T::Cluster,
            CLUSTER.replace("0.25s", "0s"),
            &["connect_timeout: must be > 0s (got 0s)"],
        ),
        (
            T::Route,
            ROUTE.replace(
                "route: { cluster: backend, timeout: 5s }",
                "route: { cluster: \"\" }",
            ),
            &["virtual_hosts[0].routes[0].route.cluster: must have at least 1 characters (has 0)"],
        ),
        (
            T::Route,
            ROUTE.replace(
                "        direct_response: { status: 200, body: { inline_string: ok } }\n",
                "",
            ),
            &[
                "virtual_hosts[0].routes[1]: one of route, redirect, direct_response, \
               filter_action, non_forwarding_action must be set",
            ],
        ),
        (
            T::Route,
            ROUTE.replace("status: 200", "status: 99"),
            &[
                "virtual_hosts[0].routes[1].direct_response.status: must be >= 200 and < 600 \
               (got 99)",
            ],
        ),
        (
            T::Endpoint,
            ENDPOINT.replace("load_balancing_weight: 10", "load_balancing_weight: 0"),
            &["endpoints[0].lb_endpoints[0].load_balancing_weight: must be >= 1 (got 0)"],
        ),
    ];
    for (kind, value, expected) in cases {
        let errors = convert_value(kind, &value, Serialization::Yaml).unwrap_err();
        let got: Vec<_> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(got, expected, "{kind}");
    }
}

#[test]
fn node_ids_that_cannot_name_revisions_or_labels_are_refused() {
    for good in ["proxy", "my-proxy.v1", "0", &"a".repeat(63)] {
        assert_eq!(super::node_id_problem(good), None, "{good}");
    }
    for bad in [
        "Gateway",
        "my_node",
        "-edge",
        "edge.",
        "a b",
        &"a".repeat(64),
    ] {
        let spec = EnvoyConfigSpec {
            node_id: bad.to_owned(),
            ..serde_json::from_str(r#"{"nodeID": "p"}"#).unwrap()
        };
        let errors = messages(&validate_config(&spec).unwrap_err());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("spec.nodeID: ") && errors[0].contains("is not a valid node id"),
            "{errors:?}"
        );
    }
}

#[test]
fn secret_names_that_would_escape_their_api_path_are_refused() {
    let spec: EnvoyConfigSpec = serde_json::from_value(serde_json::json!({
        "nodeID": "p",
        "envoyResources": {"secrets": [
            {"name": "../../other/secrets/token"},
            {"name": "ok", "ref": {"name": "a/b"}},
            {"name": "fine", "ref": {"name": "cert", "namespace": "Other_NS"}},
            {"name": "any_sds-name", "ref": {"name": "cert"}},
        ]}
    }))
    .unwrap();
    let errors = messages(&validate_config(&spec).unwrap_err());
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].starts_with("spec.envoyResources.secrets[0].name: \"../../other"),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with("spec.envoyResources.secrets[1].ref.name: \"a/b\""),
        "{errors:?}"
    );
    assert!(
        errors[2].starts_with("spec.envoyResources.secrets[2].ref.namespace: \"Other_NS\" is not a valid namespace name"),
        "{errors:?}"
    );
}

#[path = "bad_value_tests.rs"]
mod bad_values;
