//! `spec.resources`: EnvoyConfigs in the original MARIN3R's form convert; every rule of a `type`
//! is enforced with the field path; secrets are built from Secret data as the original does.

use std::collections::BTreeMap;

use prost::Message as _;
use serde_json::json;

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret::Type};

use super::*;
use marin3r_api::{Blueprint, EnvoyConfig, EnvoyConfigSpec};

fn manifest(file: &str) -> EnvoyConfigSpec {
    let text = match file {
        "tls-endpoints" => include_str!("../../../tests/testdata/resources/tls-endpoints.yaml"),
        "oauth2" => include_str!("../../../tests/testdata/resources/oauth2.yaml"),
        _ => unreachable!(),
    };
    serde_saphyr::from_str::<EnvoyConfig>(text).unwrap().spec
}

fn mk_spec(resources: serde_json::Value) -> EnvoyConfigSpec {
    serde_json::from_value(json!({"nodeID": "proxy", "resources": resources})).unwrap()
}

fn messages(spec: &EnvoyConfigSpec) -> Vec<String> {
    validate_config(spec)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn manifests_in_the_originals_form_convert() {
    let spec = manifest("tls-endpoints");
    let resources = validate_config(&spec).unwrap();
    let names: Vec<(ResourceType, &str)> = resources
        .iter()
        .map(|r| (r.kind, r.name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            (ResourceType::Cluster, "kuard"),
            (ResourceType::Route, "front"),
            (ResourceType::Listener, "front-tls"),
        ]
    );
    let secrets = secret_sources(&spec.envoy_resources, &spec.resources);
    assert_eq!(secrets.len(), 1);
    assert_eq!(
        (
            secrets[0].path.as_str(),
            secrets[0].sds_name.as_str(),
            secrets[0].secret_name.as_str()
        ),
        ("spec.resources[3].generateFromTlsSecret", "kuard", "kuard")
    );
    assert_eq!(
        secrets[0].build,
        SecretBuild::Tls(Blueprint::TlsCertificate)
    );
    let endpoints = endpoint_sources(&spec.resources);
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0].cluster_name, "kuard");
    assert_eq!(endpoints[0].target_port, "http");
    assert_eq!(
        endpoints[0].selector.to_query().unwrap(),
        "kubernetes.io/service-name=kuard"
    );

    let spec = manifest("oauth2");
    assert_eq!(validate_config(&spec).unwrap().len(), 4);
    let secrets = secret_sources(&spec.envoy_resources, &spec.resources);
    let opaque: Vec<(&str, &str, &SecretBuild)> = secrets
        .iter()
        .map(|s| (s.sds_name.as_str(), s.secret_name.as_str(), &s.build))
        .collect();
    assert_eq!(
        opaque,
        [
            (
                "kuard",
                "kuard",
                &SecretBuild::Tls(Blueprint::TlsCertificate)
            ),
            (
                "oauth_client_secret",
                "oauth-secrets",
                &SecretBuild::Key("client_secret".into())
            ),
            (
                "oauth_hmac",
                "oauth-secrets",
                &SecretBuild::Key("hmac".into())
            ),
        ]
    );
}

#[test]
fn a_value_converts_like_the_same_resource_in_envoy_resources() {
    let typed = mk_spec(json!([{"type": "cluster", "value": {
        "name": "backend", "connect_timeout": "1s", "type": "STATIC",
    }}]));
    let legacy: EnvoyConfigSpec = serde_json::from_value(json!({
        "nodeID": "proxy",
        "envoyResources": {"clusters": [{"value":
            "{\"name\": \"backend\", \"connectTimeout\": \"1s\", \"type\": \"STATIC\"}"}]},
    }))
    .unwrap();
    assert_eq!(
        validate_config(&typed).unwrap(),
        validate_config(&legacy).unwrap()
    );
    assert_ne!(typed.version(), legacy.version());
}

#[test]
fn both_fields_at_once_are_refused_naming_both() {
    let mut spec = mk_spec(json!([{"type": "cluster", "value": {"name": "a"}}]));
    spec.envoy_resources =
        serde_json::from_value(json!({"clusters": [{"value": "{\"name\": \"b\"}"}]})).unwrap();
    assert_eq!(
        messages(&spec),
        [
            "spec: spec.envoyResources and spec.resources are both set; use only one \
          (spec.resources replaces the deprecated spec.envoyResources)"
        ]
    );
    // An empty `envoyResources: {}` (the old CRD's default) is no conflict.
    spec.envoy_resources = Default::default();
    assert!(validate_config(&spec).is_ok());
}

#[test]
fn bad_values_name_their_entry() {
    let spec = mk_spec(json!([
        {"type": "cluster", "value": {"name": "a", "connect_timeout": "1s"}},
        {"type": "route", "value": {"name": "r"}},
        {"type": "listener", "value": {"name": "l", "adress": {}}},
        {"type": "listener", "value": {"name": "backend", "connect_timeout": "1s",
                                        "type": "STATIC"}},
        {"type": "runtime", "value": "name: rt"},
        {"type": "cluster", "value": {"name": "a"}},
    ]));
    assert_eq!(
        messages(&spec),
        [
            "spec.resources[2].value: unknown field \"adress\"",
            "spec.resources[3].value: this is an envoy.config.cluster.v3.Cluster resource, \
             not envoy.config.listener.v3.Listener as `type` says; set `type: cluster` \
             (unknown field \"connect_timeout\")",
            "spec.resources[4].value: must be an object (the \
             envoy.service.runtime.v3.Runtime resource itself), not a string",
            "spec.resources[5]: duplicate cluster name \"a\" (also in spec.resources[0])",
        ]
    );
}

#[test]
fn each_type_takes_only_its_own_fields() {
    let spec = mk_spec(json!([
        {"type": "secret"},
        {"type": "secret", "value": {"name": "s"}, "generateFromTlsSecret": "s"},
        {"type": "secret", "generateFromTlsSecret": "s",
         "generateFromOpaqueSecret": {"name": "o", "key": "k", "alias": "a"}},
        {"type": "secret", "generateFromOpaqueSecret": {"name": "o", "key": "k k", "alias": ""},
         "blueprint": "validationContext"},
        {"type": "endpoint"},
        {"type": "endpoint", "value": {"cluster_name": "c"},
         "generateFromEndpointSlices": {"selector": {"matchLabels": {"a": "b"}},
                                        "clusterName": "c", "targetPort": "http"}},
        {"type": "endpoint", "generateFromEndpointSlices": {"selector": {},
                                        "clusterName": "", "targetPort": ""}},
        {"type": "endpoint", "generateFromEndpointSlices": {"selector": {"matchExpressions": [
            {"key": "app", "operator": "Equals", "values": ["x"]}]},
            "clusterName": "c", "targetPort": "http"}},
        {"type": "listener", "generateFromTlsSecret": "Not_A_Name", "blueprint": "tlsCertificate"},
        {"type": "secret", "generateFromTlsSecret": "Not_A_Name"},
    ]));
    let errors = messages(&spec);
    let expected_starts = [
        "spec.resources[0]: type secret needs generateFromTlsSecret or generateFromOpaqueSecret",
        "spec.resources[1].value: not allowed for type secret",
        "spec.resources[2]: generateFromTlsSecret and generateFromOpaqueSecret are both set",
        "spec.resources[3].blueprint: only allowed with generateFromTlsSecret",
        "spec.resources[3].generateFromOpaqueSecret.key: \"k k\" is not a Secret key",
        "spec.resources[3].generateFromOpaqueSecret.alias: must not be empty",
        "spec.resources[4]: type endpoint needs value or generateFromEndpointSlices",
        "spec.resources[5]: value and generateFromEndpointSlices are both set; use one",
        "spec.resources[6].generateFromEndpointSlices.selector: must not be empty",
        "spec.resources[6].generateFromEndpointSlices.clusterName: must not be empty",
        "spec.resources[6].generateFromEndpointSlices.targetPort: must not be empty",
        "spec.resources[7].generateFromEndpointSlices.selector.matchExpressions[0].operator: \
         \"Equals\" is not one of In, NotIn, Exists, DoesNotExist",
        "spec.resources[8].generateFromTlsSecret: only allowed for type secret, not listener",
        "spec.resources[8].blueprint: only allowed for type secret, not listener",
        "spec.resources[8].value: must be set for type listener",
        "spec.resources[9].generateFromTlsSecret: ",
    ];
    assert_eq!(errors.len(), expected_starts.len(), "{errors:#?}");
    for (got, want) in errors.iter().zip(expected_starts) {
        assert!(got.starts_with(want), "{got:?} should start with {want:?}");
    }
}

#[test]
fn selectors_render_and_match_as_the_api_server_does() {
    let selector: marin3r_api::LabelSelector = serde_json::from_value(json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
            {"key": "zone", "operator": "NotIn", "values": ["x"]},
            {"key": "owner", "operator": "Exists"},
        ],
    }))
    .unwrap();
    assert_eq!(
        selector.to_query().unwrap(),
        "app=web,tier in (a,b),!canary,zone notin (x),owner"
    );
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert!(selector.matches(&labels(&[("app", "web"), ("tier", "a"), ("owner", "me")])));
    assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "c"), ("owner", "me")])));
    assert!(!selector.matches(&labels(&[
        ("app", "web"),
        ("tier", "a"),
        ("owner", "me"),
        ("canary", "1")
    ])));
    assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "a")])));
    assert!(!selector.matches(&labels(&[
        ("app", "web"),
        ("tier", "a"),
        ("owner", "me"),
        ("zone", "x")
    ])));
}

fn data(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
        .collect()
}

fn decoded(resource: &Resource) -> Secret {
    Secret::decode(resource.body.clone()).unwrap()
}

#[test]
fn secrets_are_built_by_blueprint_and_key() {
    let spec = mk_spec(json!([
        {"type": "secret", "generateFromTlsSecret": "cert"},
        {"type": "secret", "generateFromTlsSecret": "ca", "blueprint": "validationContext"},
        {"type": "secret", "generateFromOpaqueSecret":
            {"name": "oauth", "key": "hmac", "alias": "oauth_hmac"}},
    ]));
    let sources = secret_sources(&spec.envoy_resources, &spec.resources);
    let tls = data(&[("tls.crt", b"CERT"), ("tls.key", b"KEY")]);
    let cert = secret_resource(&sources[0], Some("kubernetes.io/tls"), &tls).unwrap();
    assert_eq!(cert.name, "cert");
    assert!(matches!(
        decoded(&cert).r#type,
        Some(Type::TlsCertificate(_))
    ));
    let ca = secret_resource(&sources[1], Some("kubernetes.io/tls"), &tls).unwrap();
    match decoded(&ca).r#type {
        Some(Type::ValidationContext(v)) => {
            let trusted = v.trusted_ca.unwrap().specifier.unwrap();
            assert_eq!(
                trusted,
                envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(
                    b"CERT".to_vec()
                )
            );
        }
        other => panic!("a validation context expected, got {other:?}"),
    }
    let opaque = data(&[("hmac", b"s3cret"), ("other", b"x")]);
    let hmac = secret_resource(&sources[2], Some("Opaque"), &opaque).unwrap();
    assert_eq!(hmac.name, "oauth_hmac");
    match decoded(&hmac).r#type {
        Some(Type::GenericSecret(g)) => assert_eq!(
            g.secret.unwrap().specifier.unwrap(),
            envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(
                b"s3cret".to_vec()
            )
        ),
        other => panic!("a generic secret expected, got {other:?}"),
    }
    // What cannot be built says why.
    assert_eq!(
        secret_resource(&sources[0], Some("Opaque"), &tls)
            .unwrap_err()
            .to_string(),
        "its type is \"Opaque\", not kubernetes.io/tls"
    );
    assert_eq!(
        secret_resource(&sources[2], Some("Opaque"), &data(&[("other", b"x")]))
            .unwrap_err()
            .to_string(),
        "it has no key \"hmac\" (it has: other)"
    );
    let unusable = secret_resource(&sources[1], Some("kubernetes.io/tls"), &data(&[])).unwrap_err();
    assert_eq!(unusable.to_string(), "it cannot be served");
    let cause = std::error::Error::source(&unusable).map(ToString::to_string);
    assert!(cause.is_some_and(|c| c.contains("tls.crt is empty")));
}
