//! Bad values and specs: what users get wrong, each reported with its path, every one of a
//! spec (a child of the conversion tables, whose fixtures it uses).

use super::*;

/// One bad value: the type, the value, its serialization, and the whole expected message
/// (path from `spec` included).
struct Bad {
    kind: ResourceType,
    value: String,
    ser: Serialization,
    expected: &'static str,
}

fn bad(kind: ResourceType, value: impl Into<String>, expected: &'static str) -> Bad {
    Bad {
        kind,
        value: value.into(),
        ser: Serialization::Yaml,
        expected,
    }
}

fn bad_json(kind: ResourceType, value: impl Into<String>, expected: &'static str) -> Bad {
    Bad {
        ser: Serialization::Json,
        ..bad(kind, value, expected)
    }
}

#[test]
fn bad_values_are_reported_with_their_path() {
    use ResourceType as T;
    let table = [
        bad(
            T::Listener,
            LISTENER.replace("stat_prefix", "stat_prefx"),
            "spec.envoyResources.listeners[0].value: filter_chains[0].filters[0].typed_config: \
             unknown field \"stat_prefx\" (line 8, column 11 of the value)",
        ),
        bad(
            T::Listener,
            LISTENER.replace("codec_type: AUTO", "codec_type: AUTOMATIC"),
            "spec.envoyResources.listeners[0].value: \
             filter_chains[0].filters[0].typed_config.codec_type: unknown enum value \
             \"AUTOMATIC\" (line 9, column 23 of the value)",
        ),
        bad(
            T::Listener,
            LISTENER.replace(
                "envoy.extensions.filters.network.http_connection_manager.v3",
                "envoy.config.filter.network.http_connection_manager.v2",
            ),
            "spec.envoyResources.listeners[0].value: filter_chains[0].filters[0].typed_config: \
             Envoy's v2 API is not supported; use v3 (\"@type\" names \
             envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager) \
             (line 7, column 11 of the value)",
        ),
        bad(
            T::Listener,
            LISTENER.replace("router.v3.Router", "router.v3.Routr"),
            "spec.envoyResources.listeners[0].value: \
             filter_chains[0].filters[0].typed_config.http_filters[0].typed_config: unknown \
             \"@type\": no Envoy v3 message is named envoy.extensions.filters.http.router.v3.Routr \
             (line 21, column 17 of the value)",
        ),
        bad(
            T::Listener,
            LISTENER.replace("filter_chains:", "filter_chainz:"),
            "spec.envoyResources.listeners[0].value: unknown field \"filter_chainz\" \
             (line 3, column 1 of the value)",
        ),
        bad(
            T::Listener,
            LISTENER.replace("port_value: 8080", "port_value: eighty"),
            "spec.envoyResources.listeners[0].value: address.socket_address.port_value: \
             expected an integer (line 2, column 62 of the value)",
        ),
        bad(
            T::Listener,
            CLUSTER,
            "spec.envoyResources.listeners[0].value: this is an envoy.config.cluster.v3.Cluster \
             resource, which belongs in `clusters`; `listeners` holds \
             envoy.config.listener.v3.Listener resources (unknown field \"connect_timeout\")",
        ),
        bad(
            T::Cluster,
            CLUSTER.replace("type: STRICT_DNS", "type: DNS"),
            "spec.envoyResources.clusters[0].value: type: unknown enum value \"DNS\" \
             (line 3, column 7 of the value)",
        ),
        bad(
            T::Cluster,
            CLUSTER.replace("0.25s", "forever"),
            "spec.envoyResources.clusters[0].value: connect_timeout: expected a duration in \
             seconds ending in 's', such as \"0.25s\" or \"5s\" (Go-style units such as \"250ms\" \
             are not protobuf JSON; Envoy refuses them too) (line 2, column 18 of the value)",
        ),
        bad(
            T::Cluster,
            CLUSTER.replacen("name: backend\n", "", 1),
            "spec.envoyResources.clusters[0].value: the resource has no name: set `name`",
        ),
        bad(
            T::Endpoint,
            ENDPOINT.replace("cluster_name: backend\n", ""),
            "spec.envoyResources.endpoints[0].value: the resource has no name: set \
             `cluster_name`",
        ),
        bad(
            T::Route,
            ROUTE.replace("timeout: 5s", "timeout: 5s, retries: 3"),
            "spec.envoyResources.routes[0].value: virtual_hosts[0].routes[0].route: unknown \
             field \"retries\" (line 7, column 49 of the value)",
        ),
        bad(
            T::ScopedRoute,
            SCOPED_ROUTE.replace("string_key", "int_key"),
            "spec.envoyResources.scopedRoutes[0].value: key.fragments[0]: unknown field \
             \"int_key\" (line 5, column 7 of the value)",
        ),
        bad(
            T::Runtime,
            "name: runtime\nlayer: [1, 2]\n",
            "spec.envoyResources.runtimes[0].value: layer: expected mapping start \
             (line 2, column 8 of the value)",
        ),
        bad(
            T::ExtensionConfig,
            "name: router\ntyped_config:\n  suppress_envoy_headers: true\n",
            "spec.envoyResources.extensionConfigs[0].value: typed_config: expected '@type' \
             field (line 3, column 3 of the value)",
        ),
        bad(
            T::Listener,
            "name: [",
            "spec.envoyResources.listeners[0].value: name: expected string scalar \
             (line 1, column 7 of the value)",
        ),
        bad_json(
            T::Listener,
            r#"{"name": "x", "address": {"socket_address": {"port_value": 1, "adress": "1"}}}"#,
            "spec.envoyResources.listeners[0].value: address.socket_address: unknown field \
             \"adress\" (line 1, column 63 of the value)",
        ),
        bad(
            T::Cluster,
            "name: a\nname: b\n",
            "spec.envoyResources.clusters[0].value: duplicate key \"name\" \
             (line 2, column 1 of the value)",
        ),
        bad(
            T::Cluster,
            "  \n",
            "spec.envoyResources.clusters[0].value: the value is empty",
        ),
        bad_json(
            T::Cluster,
            r#"{"name": "x"} trailing"#,
            "spec.envoyResources.clusters[0].value: trailing characters \
             (line 1, column 15 of the value)",
        ),
        bad_json(
            T::Cluster,
            "name: backend",
            "spec.envoyResources.clusters[0].value: the value is YAML, not JSON: set \
             `spec.serialization: yaml` (expected ident (line 1, column 2 of the value))",
        ),
        Bad {
            ser: Serialization::B64json,
            ..bad(
                T::Cluster,
                "not base64!",
                "spec.envoyResources.clusters[0].value: invalid base64: Invalid symbol 33, offset 9.",
            )
        },
    ];
    let mut failures = Vec::new();
    for case in table {
        let resources = mk_resources(case.kind, &[], case.ser);
        let mut resources = resources;
        let entry = mk_entry(case.value.clone());
        match case.kind {
            ResourceType::Endpoint => resources.endpoints.push(entry),
            ResourceType::Cluster => resources.clusters.push(entry),
            ResourceType::Route => resources.routes.push(entry),
            ResourceType::ScopedRoute => resources.scoped_routes.push(entry),
            ResourceType::Listener => resources.listeners.push(entry),
            ResourceType::Runtime => resources.runtimes.push(entry),
            ResourceType::ExtensionConfig => resources.extension_configs.push(entry),
            ResourceType::Secret => unreachable!(),
        }
        match envoy_resources(&resources, case.ser) {
            Ok(_) => failures.push(format!("accepted: {}", case.expected)),
            Err(errors) if messages(&errors) != [case.expected] => {
                failures.push(format!(
                    "expected {}\n     got {:?}",
                    case.expected,
                    messages(&errors)
                ));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_v2_resource_is_refused_with_the_v3_advice() {
    let v2 = LISTENER.replace(
        "envoy.extensions.filters.http.router.v3.Router",
        "envoy.config.filter.http.router.v2.Router",
    );
    let err = &convert_value(ResourceType::Listener, &v2, Serialization::Yaml).unwrap_err()[0];
    assert!(
        err.message
            .starts_with("Envoy's v2 API is not supported; use v3"),
        "{err}"
    );
    // The whole spec: envoyAPI v2 is refused even when every value is fine.
    let spec = EnvoyConfigSpec {
        node_id: "proxy".into(),
        envoy_api: EnvoyApi::V2,
        serialization: Serialization::Yaml,
        envoy_resources: mk_resources(ResourceType::Cluster, &[CLUSTER], Serialization::Yaml),
        ..Default::default()
    };
    assert_eq!(
        messages(&validate_config(&spec).unwrap_err()),
        ["spec.envoyAPI: Envoy's v2 API is not supported; use v3"]
    );
}

#[test]
fn every_error_of_a_spec_is_collected() {
    let mut resources = EnvoyResources {
        listeners: vec![
            mk_entry(LISTENER.to_owned()),
            mk_entry(LISTENER.replace("stat_prefix", "stat_prefx")),
            mk_entry(LISTENER.to_owned()),
        ],
        clusters: vec![EnvoyResource {
            name: Some("other".into()),
            value: CLUSTER.to_owned(),
        }],
        secrets: vec![
            EnvoySecretResource {
                name: "cert".into(),
                secret_ref: Some(SecretReference {
                    name: "cert-secret".into(),
                    namespace: None,
                }),
            },
            EnvoySecretResource {
                name: "cert".into(),
                secret_ref: Some(SecretReference::default()),
            },
        ],
        ..Default::default()
    };
    let spec = EnvoyConfigSpec {
        node_id: " ".into(),
        serialization: Serialization::Yaml,
        envoy_api: EnvoyApi::V3,
        envoy_resources: resources.clone(),
        ..Default::default()
    };
    assert_eq!(
        messages(&validate_config(&spec).unwrap_err()),
        [
            "spec.nodeID: must not be empty",
            "spec.envoyResources.listeners[1].value: filter_chains[0].filters[0].typed_config: \
             unknown field \"stat_prefx\" (line 8, column 11 of the value)",
            "spec.envoyResources.listeners[2]: duplicate name \"http\" (also in listeners[0])",
            "spec.envoyResources.secrets[1]: duplicate name \"cert\" (also in secrets[0])",
            "spec.envoyResources.secrets[1].ref.name: must name a kubernetes.io/tls Secret",
        ]
    );
    // Fixed, the same spec converts; a matching entry name is accepted.
    resources.listeners.truncate(1);
    resources.clusters[0].name = Some("backend".into());
    resources.secrets.truncate(1);
    let out = envoy_resources(&resources, Serialization::Yaml).unwrap();
    assert_eq!(out.len(), 2);
}
