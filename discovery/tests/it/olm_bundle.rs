//! The OLM bundle in `manifests/olm/` is exactly what `hack/render-olm` renders from the
//! kustomize install, and the operator-framework's own validators (`hack/olm-validate`, built
//! from github.com/operator-framework/api by `hack/install-olm-validate`) accept it, with no
//! warning; a broken copy is refused.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use marin3r_discovery::{crds, olm};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files_under(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.file_type().unwrap().is_dir() {
            files_under(&entry.path(), &format!("{name}/"), out);
        } else {
            out.insert(name);
        }
    }
}

#[test]
fn checked_in_olm_bundle_is_rendered_from_the_kustomize_install() {
    let sources = olm::Sources::read(&repo().join("manifests")).unwrap();
    let files = olm::render(&crds::all(), &sources, env!("CARGO_PKG_VERSION")).unwrap();
    let dir = repo().join("manifests/olm");
    for (name, want) in &files {
        let have = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("manifests/olm/{name}: {e}; run hack/render-olm"));
        assert!(
            &have == want,
            "manifests/olm/{name} is stale: run hack/render-olm"
        );
    }
    let mut present = BTreeSet::new();
    files_under(&dir, "", &mut present);
    let expected: BTreeSet<String> = files.into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        present, expected,
        "manifests/olm/ holds files hack/render-olm does not write"
    );
}

/// Runs the validators on `dir`, every warning an error: (success, what they printed).
fn validate(dir: &Path) -> (bool, String) {
    let tool = marin3r_testkit::tools::olm_validate().unwrap();
    let out = Command::new(&tool)
        .args(["--k8s-version", "1.36", "--warnings-as-errors"])
        .arg(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_operator_framework_validators_accept_the_bundle() {
    let (ok, out) = validate(&repo().join("manifests/olm"));
    assert!(ok, "olm-validate refused manifests/olm:\n{out}");
    assert!(out.contains("0 errors, 0 warnings"), "{out}");
}

/// A copy of the bundle whose CSV went through `edit`. An edit that changes nothing leaves
/// a bundle the validators accept (checked below), so a refusal is the edit's doing.
fn broken_copy(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = repo().join("manifests/olm");
    // Not tempfile's default `.tmpXXXX`: the validators' loader skips hidden folders.
    let tmp = tempfile::Builder::new()
        .prefix("olm-bundle-")
        .tempdir()
        .unwrap();
    let mut names = BTreeSet::new();
    files_under(&src, "", &mut names);
    for name in names {
        let to = tmp.path().join(&name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(&name), &to).unwrap();
    }
    let csv_path = tmp.path().join(olm::CSV_FILE);
    let mut csv: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&csv_path).unwrap()).unwrap();
    edit(&mut csv);
    // JSON is YAML too, and the validators' loader reads it.
    std::fs::write(&csv_path, serde_json::to_string_pretty(&csv).unwrap()).unwrap();
    tmp
}

#[test]
fn the_validators_refuse_a_broken_csv() {
    let tmp = broken_copy(|_| {});
    let (ok, out) = validate(tmp.path());
    assert!(ok, "the unedited copy is refused:\n{out}");

    // A CRD shipped in the bundle that the CSV does not own.
    let tmp = broken_copy(|csv| {
        csv["spec"]["customresourcedefinitions"]["owned"]
            .as_array_mut()
            .unwrap()
            .retain(|o| o["kind"] != "EnvoyConfig");
    });
    let (ok, out) = validate(tmp.path());
    assert!(!ok, "a CSV that does not own a shipped CRD passed:\n{out}");
    assert!(
        out.contains("Kind=EnvoyConfig") && out.contains("not defined in CSV"),
        "{out}"
    );

    // No install mode supported at all, and a minKubeVersion that is no version.
    let tmp = broken_copy(|csv| {
        for mode in csv["spec"]["installModes"].as_array_mut().unwrap() {
            mode["supported"] = false.into();
        }
        csv["spec"]["minKubeVersion"] = "one-point-twenty-nine".into();
    });
    let (ok, out) = validate(tmp.path());
    assert!(!ok, "a CSV without install modes passed:\n{out}");
    assert!(
        out.contains("none of InstallModeTypes are supported")
            && out.contains("MinKubeVersion has an invalid value"),
        "{out}"
    );
}
