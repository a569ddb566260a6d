//! `marin3r validate` on manifest texts: verdicts, positions, several documents.

use serde_json::{Value, json};

use super::*;

const CLUSTER: &str = "name: backend\\nconnect_timeout: 1s";

fn mk_manifest(name: &str, clusters: &[&str]) -> String {
    let mut doc = format!(
        "apiVersion: {API_VERSION}\nkind: EnvoyConfig\nmetadata: {{ name: {name}, \
         namespace: default }}\nspec:\n  nodeID: proxy\n  serialization: yaml\n  \
         envoyResources:\n    clusters:\n"
    );
    for value in clusters {
        doc.push_str(&format!("      - value: \"{value}\"\n"));
    }
    doc
}

#[test]
fn every_document_gets_a_verdict() {
    let text = [
        mk_manifest("good", &[CLUSTER]),
        "apiVersion: v1\nkind: Secret\nmetadata: { name: s }\n".into(),
        mk_manifest("bad", &[CLUSTER, "name: x\\nconect_timeout: 1s"]),
        String::new(),
    ]
    .join("---\n");
    assert_eq!(
        validate_manifests(&text),
        [
            Document::Valid {
                object: "default/good".into(),
                summary: "node proxy, 1 resources: clusters 1".into(),
                warnings: vec![],
            },
            Document::Skipped {
                object: "Secret s".into(),
                notes: vec![],
            },
            Document::Invalid {
                object: "EnvoyConfig default/bad".into(),
                // A double-quoted value is not placed in the file: escapes shift it.
                errors: vec![
                    "spec.envoyResources.clusters[1].value: unknown field \
                     \"conect_timeout\" (line 2, column 1 of the value)"
                        .into()
                ]
            },
        ]
    );
}

/// The errors of the only document of `text`.
fn only_errors(text: &str) -> Vec<String> {
    match validate_manifests(text).as_slice() {
        [Document::Invalid { errors, .. }] => errors.iter().map(|p| p.text.clone()).collect(),
        other => panic!("one invalid document expected, got {other:?}"),
    }
}

#[test]
fn spec_shape_errors_name_their_path() {
    let text = mk_manifest("m", &[]).replace("    clusters:\n", "    clusters:\n      - name: x\n");
    let text = text.replace(
        "apiVersion: marin3r.3scale.net/v1alpha1",
        "apiVersion: marin3r.3scale.net/v1",
    );
    assert_eq!(
        only_errors(&text),
        [
            "apiVersion: marin3r.3scale.net/v1 is not marin3r.3scale.net/v1alpha1",
            "spec.envoyResources.clusters[0]: missing field `value`",
        ]
    );
    let early = mk_manifest("m", &[]).replace(
        "apiVersion: marin3r.3scale.net/v1alpha1",
        "apiVersion: envoy.marin3r.3scale.net/v1alpha1",
    );
    assert_eq!(
        only_errors(&early)[0],
        "apiVersion: envoy.marin3r.3scale.net/v1alpha1 is not marin3r.3scale.net/v1alpha1 \
         (the original MARIN3R's early group: the spec is the same, see docs/migrating.md)"
    );
    assert_eq!(
        only_errors("kind: EnvoyConfig\napiVersion: x\n: [").len(),
        1
    );
}

#[test]
fn unknown_spec_fields_are_reported_offline() {
    let text = mk_manifest("m", &[CLUSTER])
        .replace(
            "  nodeID: proxy\n",
            "  nodeID: proxy\n  envoyResource: {}\n",
        )
        .replace("    clusters:\n", "    listener: []\n    clusters:\n");
    assert_eq!(
        only_errors(&text),
        [
            "spec.envoyResource: unknown field (the API server would drop it)",
            "spec.envoyResources.listener: unknown field (the API server would drop it)",
        ]
    );
}

#[test]
fn errors_in_block_values_point_at_the_file_line() {
    let text = format!(
        "# a comment\n{}",
        mk_manifest("m", &[]).replace(
            "    clusters:\n",
            "    clusters:\n      - value: |\n          name: backend\n          \
             connect_timeout: 1s\n          lb_polcy: RANDOM\n",
        )
    );
    let docs = validate_manifests(&text);
    let [Document::Invalid { errors, .. }] = docs.as_slice() else {
        panic!("invalid expected: {docs:?}")
    };
    assert_eq!(
        errors,
        &[Problem {
            at: Some((13, 11)),
            text: "spec.envoyResources.clusters[0].value: unknown field \"lb_polcy\"".into()
        }]
    );
    assert_eq!(
        text.lines().nth(12).map(|l| l.find("lb_polcy")),
        Some(Some(10))
    );
}

/// The EnvoyConfig `ec` of namespace `shop` with `spec`, as the API server hands it over.
fn object(spec: Value) -> Value {
    let metadata = json!({"name": "ec", "namespace": "shop"});
    json!({"apiVersion": "marin3r.3scale.net/v1alpha1", "kind": "EnvoyConfig", "metadata": metadata, "spec": spec})
}

/// What the validating webhook says about the same object (the rules admission applies).
fn admission(object: &Value) -> Vec<String> {
    marin3r_envoyconfig::rules::envoy_config_problems("shop", object, false)
}

/// What `marin3r validate` says about the same object, as YAML on disk.
fn offline(object: &Value) -> Vec<String> {
    let text = serde_json::to_string(object).unwrap();
    match validate_manifests(&text).as_slice() {
        [Document::Valid { .. }] => Vec::new(),
        [Document::Invalid { errors, .. }] => errors.iter().map(|p| p.text.clone()).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn admission_refuses_what_marin3r_validate_refuses_with_the_same_paths() {
    let listener = "name: l\naddress: {socket_address: {address: 0.0.0.0, port_value: 8080}}";
    let cases = [
        json!({"nodeID": "proxy", "serialization": "yaml", "envoyResources": {"clusters": [{"value": "name: c\nconnect_timeout: 1s"}]}}),
        json!({"nodeID": "proxy", "serialization": "yaml", "envoyResources": {"clusters": [{"value": "name: c\nconect_timeout: 1s"}]}}),
        json!({"nodeID": "proxy", "resources": [
            {"type": "cluster", "value": {"name": "c", "connect_timeout": "1s"}},
            {"type": "listener", "value": {"name": "l", "adress": {}}},
            {"type": "listener", "value": {"name": "l2", "address": "nope"}},
        ]}),
        json!({"nodeID": "proxy", "serialization": "yaml", "envoyResources": {"listeners": [{"value": listener}]}, "resources": [{"type": "cluster", "value": {"name": "c"}}]}),
        json!({"nodeID": "Not_A_Node", "envoyAPI": "v2"}),
        json!({"nodeID": "proxy", "envoyResourcez": {}}),
        json!({"nodeID": 7}),
        json!({"nodeID": "proxy", "resources": [{"type": "listner", "value": {}}]}),
        // The two the issue found apart: an empty spec, a Secret of another namespace.
        json!({}),
        json!({"nodeID": "proxy", "envoyResources": {"secrets": [{"name": "cert", "ref": {"name": "cert", "namespace": "other"}}]}}),
    ];
    for spec in cases {
        let obj = object(spec.clone());
        assert_eq!(admission(&obj), offline(&obj), "{spec}");
    }
    // The refusals name their field paths.
    let bad = object(cases_bad_typed());
    let problems = admission(&bad);
    assert!(
        problems[0].starts_with("spec.resources[1].value: "),
        "{problems:?}"
    );
    assert_eq!(admission(&json!({"metadata": {}})), ["spec: missing"]);
}

fn cases_bad_typed() -> Value {
    json!({"nodeID": "proxy", "resources": [
        {"type": "cluster", "value": {"name": "c", "connect_timeout": "1s"}},
        {"type": "listener", "value": {"name": "l", "adress": {}}},
    ]})
}
