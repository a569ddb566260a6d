//! The CRDs checked into `manifests/crds/` are exactly the ones generated from the Rust types.
//! To refresh them: `cargo run -p marin3r-discovery -- crds --out-dir manifests/crds`.

use std::collections::BTreeSet;
use std::path::Path;

use marin3r_discovery::crds;

#[test]
fn checked_in_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
    let mut expected = BTreeSet::new();
    for crd in crds::all() {
        let name = crds::file_name(&crd);
        let want = crds::to_yaml(&crd).unwrap();
        let have = std::fs::read_to_string(dir.join(&name))
            .unwrap_or_else(|e| panic!("manifests/crds/{name}: {e}; regenerate the CRDs"));
        assert!(
            have == want,
            "manifests/crds/{name} is stale: run `cargo run -p marin3r-discovery -- crds --out-dir manifests/crds`"
        );
        expected.insert(name);
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    assert_eq!(
        present, expected,
        "manifests/crds/ holds CRDs that no type generates"
    );
}

#[test]
fn the_certificate_crd_has_the_original_names_and_columns() {
    let crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == "DiscoveryServiceCertificate")
        .unwrap();
    assert_eq!(crd.spec.group, "operator.marin3r.3scale.net");
    assert_eq!(crd.spec.names.short_names, Some(vec!["dsc".to_owned()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Ready", "Not Before", "Not After", "Renewal", "Age"]
    );
    let spec = serde_json::to_value(&version.schema).unwrap();
    let props = &spec["openAPIV3Schema"]["properties"]["spec"]["properties"];
    for field in [
        "commonName",
        "server",
        "isCA",
        "validFor",
        "hosts",
        "signer",
        "secretRef",
        "certificateRenewal",
        // v0.6 manifests carry it; a pruning server must keep it and a strict one accept it.
        "certificateRenewalNotification",
        "keyAlgorithm",
    ] {
        assert!(
            props.get(field).is_some(),
            "spec.{field} missing from the schema"
        );
    }
    assert_eq!(props["validFor"]["minimum"].as_f64(), Some(1.0));
    // Exactly one signer, refused by the API server in our words.
    assert_eq!(
        props["signer"]["x-kubernetes-validations"][0]["message"],
        "set exactly one of selfSigned or caSigned"
    );
}

/// A structural schema may not put `additionalProperties` beside `properties`; the API server
/// refuses such a CRD.
fn assert_structural(path: &str, schema: &serde_json::Value) {
    if let Some(map) = schema.as_object() {
        assert!(
            !(map.contains_key("properties") && map.contains_key("additionalProperties")),
            "{path} has both properties and additionalProperties"
        );
        for (key, child) in map {
            assert_structural(&format!("{path}.{key}"), child);
        }
    } else if let Some(list) = schema.as_array() {
        for (i, child) in list.iter().enumerate() {
            assert_structural(&format!("{path}[{i}]"), child);
        }
    }
}

#[test]
fn the_envoy_config_crds_have_the_original_names_columns_and_fields() {
    let all = crds::all();
    let find = |kind: &str| all.iter().find(|c| c.spec.names.kind == kind).unwrap();
    for (kind, short, columns) in [
        (
            "EnvoyConfig",
            "ec",
            &[
                "Node ID",
                "Envoy API",
                "Desired Version",
                "Published Version",
                "Cache State",
                // Ours: how many connected proxies acknowledged the published version.
                "Synced",
                // Ours, `-o wide` only: the rollout's phase.
                "Rollout",
                // A CRD with printer columns gets no Age unless it declares one.
                "Age",
            ][..],
        ),
        (
            "EnvoyConfigRevision",
            "ecr",
            &[
                "Node ID",
                "Envoy API",
                "Version",
                "Published",
                "Created At",
                "Last Published At",
                "Tainted",
            ][..],
        ),
    ] {
        let crd = find(kind);
        assert_eq!(crd.spec.group, "marin3r.3scale.net");
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let names: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, columns);
        // Only the original's columns (and ours before rollouts) show by default: the rest
        // are priority 1, for `-o wide`.
        for column in version.additional_printer_columns.iter().flatten() {
            let wide = column.name == "Rollout";
            assert_eq!(column.priority, wide.then_some(1), "{kind} {}", column.name);
        }
        let schema = serde_json::to_value(&version.schema).unwrap();
        assert_structural(kind, &schema);
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for field in ["nodeID", "serialization", "envoyAPI", "envoyResources"] {
            assert!(spec.get(field).is_some(), "{kind} spec lacks {field}");
        }
        let resources = &spec["envoyResources"]["properties"];
        for field in [
            "endpoints",
            "clusters",
            "routes",
            "scopedRoutes",
            "listeners",
            "runtimes",
            "runtime",
            "secrets",
            "extensionConfigs",
        ] {
            assert!(
                resources.get(field).is_some(),
                "{kind} envoyResources lacks {field}"
            );
        }
        let secret = &resources["secrets"]["items"]["properties"];
        assert!(secret["ref"]["properties"].get("namespace").is_some());
    }
    let status = serde_json::to_value(&find("EnvoyConfig").spec.versions[0].schema).unwrap();
    let status = &status["openAPIV3Schema"]["properties"]["status"]["properties"];
    for field in [
        "cacheState",
        "publishedVersion",
        "desiredVersion",
        "conditions",
        "revisions",
        "lastNackMessage",
    ] {
        assert!(
            status.get(field).is_some(),
            "EnvoyConfig status lacks {field}"
        );
    }
}

/// Every field path of `schema` below `path` that has no description. Items of arrays of
/// plain values (strings, numbers) have nothing of their own to describe; `metadata` is
/// Kubernetes' own.
fn undescribed(path: &str, schema: &serde_json::Value, out: &mut Vec<String>) {
    let is_object = schema.get("properties").is_some();
    if schema.get("description").is_none() && !path.ends_with("[]")
        || is_object && schema.get("description").is_none()
    {
        out.push(path.to_owned());
    }
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, child) in props {
            if path.is_empty() && name == "metadata" {
                continue;
            }
            undescribed(&format!("{path}.{name}"), child, out);
        }
    }
    if let Some(items) = schema.get("items") {
        undescribed(&format!("{path}[]"), items, out);
    }
}

#[test]
fn every_crd_is_in_the_marin3r_category_with_a_short_name_and_every_field_is_described() {
    for crd in crds::all() {
        let name = crd.metadata.name.clone().unwrap();
        let names = &crd.spec.names;
        assert_eq!(
            names.categories.as_deref(),
            Some(&["marin3r".to_owned()][..]),
            "{name}"
        );
        assert!(
            names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
            "{name}"
        );
        for version in &crd.spec.versions {
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
            let root = schema["description"].as_str().unwrap_or_default();
            assert!(
                !root.is_empty() && !root.contains("Auto-generated"),
                "{name}: `kubectl explain` would print {root:?}"
            );
            let mut missing = Vec::new();
            undescribed("", &schema, &mut missing);
            missing.retain(|p| !p.is_empty() && !p.contains(".conditions[]."));
            assert!(
                missing.is_empty(),
                "{name}: fields without a description: {missing:?}"
            );
        }
    }
}
