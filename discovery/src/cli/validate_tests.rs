//! `marin3r validate` on manifest texts: verdicts, positions, several documents.

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
