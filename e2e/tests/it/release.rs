//! `hack/release VERSION`, with this build's `marin3r` (no release build in the suite): every
//! artifact is written, `SHA256SUMS` verifies, the chart package lints with the real helm and
//! names the version, install.yaml parses into the install, the digest is the image
//! archive's manifest (and that manifest's own sha256), and the notes are the changelog's.
//! Bad input is refused before anything is written.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::helm_chart::{helm, objects};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn release(args: &[&str], marin3r: &Path) -> Output {
    let repo = marin3r_testkit::tools::repo_root();
    Command::new(repo.join("hack/release"))
        .args(args)
        .env("MARIN3R_BIN", marin3r)
        .output()
        .unwrap()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn hack_release_writes_checked_artifacts() {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("a built marin3r");
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("release");
    let out = release(
        &[
            VERSION,
            "--out",
            &out_dir.to_string_lossy(),
            "--image",
            "registry.example/team/marin3r",
        ],
        &marin3r,
    );
    assert!(
        out.status.success(),
        "hack/release failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = |name: &str| out_dir.join(name);
    let chart = format!("marin3r-{VERSION}.tgz");
    let archive = format!("marin3r-v{VERSION}.tar");
    let digest_file = format!("marin3r-v{VERSION}.digest");
    let mut names: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut want = vec![
        "CHANGELOG.md".to_owned(),
        "SHA256SUMS".to_owned(),
        "install.yaml".to_owned(),
        chart.clone(),
        digest_file.clone(),
        archive.clone(),
    ];
    want.sort();
    assert_eq!(names, want);

    // Every file is summed, and the sums verify.
    let sums = std::fs::read_to_string(file("SHA256SUMS")).unwrap();
    assert_eq!(sums.lines().count(), 5, "{sums}");
    let check = Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&out_dir)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // The chart package lints, names the version and the release's image.
    let lint = Command::new(helm())
        .args(["lint", "--strict"])
        .arg(file(&chart))
        .output()
        .unwrap();
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let shown = Command::new(helm())
        .args(["show", "all"])
        .arg(file(&chart))
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(&format!("version: {VERSION}")), "{shown}");
    assert!(
        shown.contains("repository: registry.example/team/marin3r"),
        "{shown}"
    );
    // The links into manifests/ were packaged as files: the CRDs are in it.
    assert!(
        shown.contains("name: envoyconfigs.marin3r.3scale.net"),
        "{shown}"
    );

    // install.yaml is the install, at the release's image.
    let install = std::fs::read_to_string(file("install.yaml")).unwrap();
    let objects = objects(&install);
    let deployment = &objects["Deployment marin3r-system/marin3r-operator"];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("registry.example/team/marin3r:v{VERSION}")
    );
    assert_eq!(
        objects
            .keys()
            .filter(|k| k.starts_with("CustomResourceDefinition "))
            .count(),
        5
    );

    // The digest is the one manifest of the archive's index, whose blob hashes to it.
    let digest = std::fs::read_to_string(file(&digest_file)).unwrap();
    let digest = digest.trim();
    let extract = tempfile::tempdir().unwrap();
    let untar = Command::new("tar")
        .arg("-xf")
        .arg(file(&archive))
        .arg("-C")
        .arg(extract.path())
        .output()
        .unwrap();
    assert!(untar.status.success());
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(extract.path().join("index.json")).unwrap())
            .unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest);
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        format!("v{VERSION}")
    );
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    assert_eq!(sha256(&extract.path().join("blobs/sha256").join(hex)), hex);

    // The notes are the changelog's section for the version.
    let notes = std::fs::read_to_string(file("CHANGELOG.md")).unwrap();
    assert!(notes.starts_with(&format!("## [{VERSION}]\n")), "{notes}");
    let changelog =
        std::fs::read_to_string(marin3r_testkit::tools::repo_root().join("CHANGELOG.md")).unwrap();
    let body = notes
        .split_once('\n')
        .map(|(_, b)| b.trim())
        .unwrap_or_default();
    assert!(body.len() > 100 && changelog.contains(body), "{notes}");
}

#[test]
fn hack_release_refuses_bad_input() {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("a built marin3r");
    let dir = tempfile::tempdir().unwrap();
    let not_empty = dir.path().join("not-empty");
    std::fs::create_dir(&not_empty).unwrap();
    std::fs::write(not_empty.join("keep.txt"), "mine").unwrap();
    let out = dir.path().join("out").to_string_lossy().into_owned();
    for (args, says) in [
        (vec![], "hack/release VERSION"),
        (vec!["9.9.9", "--out", &out], "not the workspace's"),
        (vec![VERSION, "--bogus"], "unknown option --bogus"),
        (
            vec![VERSION, "--out", &not_empty.to_string_lossy()],
            "holds no earlier release",
        ),
    ] {
        let run = release(&args, &marin3r);
        let stderr = String::from_utf8_lossy(&run.stderr);
        let stdout = String::from_utf8_lossy(&run.stdout);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(says) || stdout.contains(says),
            "{args:?}: {stdout}{stderr}"
        );
    }
    assert!(not_empty.join("keep.txt").is_file());
    assert!(!Path::new(&out).exists());
}
