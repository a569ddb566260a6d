//! `kubectl explain` (the real kubectl 1.37) prints the descriptions written on the Rust
//! types, for every CRD and every object field, read from the real cluster's OpenAPI v3
//! documents, with the checked-in CRDs (`manifests/crds/`) applied. A description that
//! disappears from a type, from the generated CRD or from what the API server serves fails
//! here.

use marin3r_discovery::crds;
use serde_json::Value;

use marin3r_testkit::namespaces::{Namespaces, cluster};

/// Whitespace-insensitive: kubectl wraps long lines.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every field path below `path` whose schema has properties (what `kubectl explain` lists
/// FIELDS for), with its schema; through array items too, as kubectl navigates them.
fn objects<'a>(path: &str, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    let schema = schema.get("items").unwrap_or(schema);
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    out.push((path.to_owned(), schema));
    for (name, child) in props {
        // `metadata` is Kubernetes' own; conditions are the standard type.
        if name == "metadata" || name == "conditions" {
            continue;
        }
        objects(&format!("{path}.{name}"), child, out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_prints_every_description_of_every_crd() {
    let cluster = cluster();
    let client = cluster.client().await.unwrap();
    // The cluster held, with the CRDs applied.
    let space = Namespaces::new(&cluster, &client).await;
    let kubectl = space.kubectl();

    // The two the documentation points at, by short name and by kind.
    let out = kubectl
        .ok(&["explain", "envoyconfig.spec.resources"])
        .await
        .unwrap();
    assert!(out.contains("KIND:       EnvoyConfig"), "{out}");
    assert!(
        words(&out).contains("The resources as a list of typed entries"),
        "{out}"
    );
    let out = kubectl.ok(&["explain", "dsc.spec"]).await.unwrap();
    assert!(
        out.contains("KIND:       DiscoveryServiceCertificate"),
        "{out}"
    );
    assert!(
        words(&out).contains("The certificate's subject common name."),
        "{out}"
    );

    let mut checked = 0;
    for crd in crds::all() {
        let plural = &crd.spec.names.plural;
        let group = &crd.spec.group;
        let version = &crd.spec.versions[0];
        let schema = serde_json::to_value(
            version
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        let mut nodes = Vec::new();
        objects("", &schema, &mut nodes);
        for (path, node) in nodes {
            let target = format!("{plural}{path}");
            let out = kubectl
                .ok(&[
                    "explain",
                    &target,
                    "--api-version",
                    &format!("{group}/{}", version.name),
                ])
                .await
                .unwrap_or_else(|e| panic!("kubectl explain {target}: {e:#}"));
            let printed = words(&out);
            if path.is_empty() {
                let root = schema["description"].as_str().unwrap();
                assert!(
                    printed.contains(&words(root)),
                    "{target}: {root:?} in\n{out}"
                );
            }
            for (name, child) in node["properties"].as_object().unwrap() {
                let description = child
                    .get("description")
                    .or_else(|| child.get("items").and_then(|i| i.get("description")))
                    .and_then(Value::as_str)
                    .unwrap_or_else(|| panic!("{target}.{name} has no description"));
                assert!(
                    printed.contains(&words(description)),
                    "kubectl explain {target}: the description of {name} ({description:?}) is missing from\n{out}"
                );
                checked += 1;
            }
        }
    }
    // Every CRD's fields, not a handful.
    assert!(checked > 100, "only {checked} descriptions checked");
    eprintln!("{checked} descriptions printed by kubectl explain");
}
