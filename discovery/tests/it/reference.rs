//! The API reference checked into `docs/reference/` is exactly the one rendered from the CRDs
//! the Rust types generate. To refresh it:
//! `cargo run -p marin3r-discovery -- crds --reference docs/reference`.

use std::collections::BTreeSet;
use std::path::Path;

use marin3r_api::reference;
use marin3r_discovery::crds;

const REFRESH: &str = "run `cargo run -p marin3r-discovery -- crds --reference docs/reference`";

#[test]
fn checked_in_reference_matches_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference");
    let all = crds::all();
    let mut pages: Vec<(String, String)> = all
        .iter()
        .map(|crd| (reference::file_name(crd), reference::render(crd)))
        .collect();
    pages.push(("README.md".to_owned(), reference::index(&all)));
    let mut expected = BTreeSet::new();
    for (name, want) in pages {
        let have = std::fs::read_to_string(dir.join(&name))
            .unwrap_or_else(|e| panic!("docs/reference/{name}: {e}; {REFRESH}"));
        assert!(have == want, "docs/reference/{name} is stale: {REFRESH}");
        expected.insert(name);
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    assert_eq!(
        present, expected,
        "docs/reference/ holds pages no CRD generates: {REFRESH}"
    );
}

#[test]
fn every_crd_has_a_page_naming_its_spec_fields() {
    for crd in crds::all() {
        let page = reference::render(&crd);
        assert!(page.starts_with(&format!("# {}\n", crd.spec.names.kind)));
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let spec = schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_object()
            .unwrap();
        assert!(
            !spec.is_empty(),
            "{} has no spec fields",
            crd.spec.names.kind
        );
        for field in spec.keys() {
            assert!(
                page.contains(&format!("| `spec.{field}` |")),
                "{}: spec.{field} missing from its reference page",
                crd.spec.names.kind
            );
        }
    }
}
