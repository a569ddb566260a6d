//! `hack/check-structure`, which `hack/test` runs after `cargo fmt --check`: it fails on a
//! product source file over 600 lines and on an import circle between the files of one
//! product crate, naming the files (and the lines that close the circle), and on a product
//! crate outside the workspace's lints; it leaves test files and the e2e/ crates alone, and
//! passes on this repository.

use std::fs;
use std::path::Path;
use std::process::Command;

use marin3r_testkit::tools::repo_root;

/// Runs the script on `root`: whether it passed, and its stderr.
fn check(root: &Path) -> (bool, String) {
    let out = Command::new(repo_root().join("hack/check-structure"))
        .arg(root)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `files` (path under `root`, text) and their folders.
fn write(root: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let path = root.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
}

const MANIFEST: &str =
    "[package]\nname = \"t\"\nversion = \"0.1.0\"\n\n[lints]\nworkspace = true\n";

#[test]
fn the_repository_passes() {
    let (passed, stderr) = check(&repo_root());
    assert!(passed, "{stderr}");
}

#[test]
fn a_product_file_over_600_lines_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (lines_601, lines_600, lines_900) = (
        "// a line\n".repeat(601),
        "// a line\n".repeat(600),
        "// a line\n".repeat(900),
    );
    write(
        dir.path(),
        &[
            ("svc/Cargo.toml", MANIFEST),
            ("svc/src/lib.rs", "mod big;\nmod exact;\n"),
            ("svc/src/big.rs", &lines_601),
            ("svc/src/exact.rs", &lines_600),
            // Test code and the e2e/ crates are no product.
            ("svc/src/big_tests.rs", &lines_900),
            ("svc/src/tests.rs", &lines_900),
            ("svc/src/proto_fuzz.rs", &lines_900),
            ("svc/tests/it/main.rs", &lines_900),
            ("e2e/Cargo.toml", MANIFEST),
            ("e2e/src/lib.rs", &lines_900),
        ],
    );
    let (passed, stderr) = check(dir.path());
    assert!(!passed, "{stderr}");
    assert!(stderr.contains("svc/src/big.rs: 601 lines"), "{stderr}");
    for not_named in ["exact.rs", "tests", "fuzz", "e2e/"] {
        assert!(!stderr.contains(not_named), "{not_named}: {stderr}");
    }
    fs::write(dir.path().join("svc/src/big.rs"), &lines_600).unwrap();
    let (passed, stderr) = check(dir.path());
    assert!(passed, "{stderr}");
}

#[test]
fn a_product_crate_outside_the_workspace_lints_fails_naming_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &[
            (
                "svc/Cargo.toml",
                "[package]\nname = \"t\"\nversion = \"0.1.0\"\n",
            ),
            ("svc/src/lib.rs", "pub struct S;\n"),
        ],
    );
    let (passed, stderr) = check(dir.path());
    assert!(!passed, "{stderr}");
    assert!(
        stderr.contains("svc/Cargo.toml: no `[lints] workspace = true`"),
        "{stderr}"
    );
}

#[test]
fn an_import_circle_between_two_files_fails_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    // A crate inside a product folder, as the discovery/ crates are, is checked too.
    write(
        dir.path(),
        &[
            ("discovery/api/Cargo.toml", MANIFEST),
            (
                "discovery/api/src/lib.rs",
                "mod a;\nmod b;\nmod c;\nmod p;\n",
            ),
            (
                "discovery/api/src/a.rs",
                "use crate::b::B;\nuse crate::c::C;\npub struct A;\n",
            ),
            (
                "discovery/api/src/b.rs",
                "pub struct B;\n\npub fn f() -> super::a::A {\n    crate::a::A\n}\n",
            ),
            // Test code that names a file back is no circle.
            (
                "discovery/api/src/c.rs",
                "pub struct C;\n\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
            ),
            // Nor is a module naming its own child, which reads its parent.
            (
                "discovery/api/src/p/mod.rs",
                "mod child;\npub use child::X;\npub struct Y;\n",
            ),
            (
                "discovery/api/src/p/child.rs",
                "use super::Y;\npub struct X(Y);\n",
            ),
        ],
    );
    let (passed, stderr) = check(dir.path());
    assert!(!passed, "{stderr}");
    assert!(
        stderr.contains(
            "discovery/api/src/a.rs:1 -> discovery/api/src/b.rs:3 -> discovery/api/src/a.rs"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.matches("import circle").count(), 1, "{stderr}");

    // The circle broken (b no longer names a): the crate passes.
    fs::write(dir.path().join("discovery/api/src/b.rs"), "pub struct B;\n").unwrap();
    let (passed, stderr) = check(dir.path());
    assert!(passed, "{stderr}");
}
