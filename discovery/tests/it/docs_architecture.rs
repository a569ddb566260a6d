//! `docs/architecture.md` says what the code has: every repository path it writes in
//! backticks or links exists, every crate of the workspace is on it, and every controller
//! (each call of `marin3r_controller::run` in the product) is in its table of components.

use std::path::{Path, PathBuf};

const PAGE: &str = "docs/architecture.md";
/// The folders a path on the page starts with.
const TOP: [&str; 9] = [
    "certs/",
    "controller/",
    "discovery/",
    "docs/",
    "e2e/",
    "hack/",
    "manifests/",
    "webhook/",
    "xds/",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn page() -> String {
    std::fs::read_to_string(repo().join(PAGE)).unwrap()
}

/// The text between backticks, each span once.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Repository paths the page names: backticked ones under a top-level folder, and the
/// targets of its relative links (resolved from `docs/`).
fn named_paths(text: &str) -> Vec<String> {
    let mut paths: Vec<String> = code_spans(text)
        .into_iter()
        .filter(|s| TOP.iter().any(|top| s.starts_with(top)) && !s.contains(' '))
        .map(str::to_owned)
        .collect();
    for link in text.split("](").skip(1) {
        let target = link.split([')', '#']).next().unwrap_or_default();
        if !target.is_empty() && !target.contains("://") {
            paths.push(format!("docs/{target}"));
        }
    }
    paths
}

#[test]
fn every_path_the_architecture_page_names_exists() {
    let text = page();
    let paths = named_paths(&text);
    assert!(
        paths.len() > 20,
        "only {} paths found on {PAGE}",
        paths.len()
    );
    let missing: Vec<&String> = paths.iter().filter(|p| !repo().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "{PAGE} names paths that do not exist: {missing:?}"
    );
}

/// The workspace's members, from the root Cargo.toml.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let start = manifest.find("members = [").unwrap();
    let end = start + manifest[start..].find(']').unwrap();
    manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_crate_of_the_workspace_is_on_the_architecture_page() {
    let text = page();
    let spans = code_spans(&text);
    let members = members();
    assert!(members.len() >= 8, "members: {members:?}");
    let absent: Vec<&String> = members
        .iter()
        .filter(|m| {
            let dir = format!("{m}/");
            !spans.iter().any(|s| *s == m.as_str() || *s == dir)
        })
        .collect();
    assert!(absent.is_empty(), "crates not on {PAGE}: {absent:?}");
}

/// Every product source file (not under e2e/, not a test) that runs a controller.
fn controllers(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !["tests", "target", "e2e", ".git", ".tools"].contains(&name.as_str()) {
                controllers(&path, found);
            }
        } else if name.ends_with(".rs")
            && !name.ends_with("tests.rs")
            && std::fs::read_to_string(&path)
                .unwrap()
                .contains("marin3r_controller::run(")
        {
            found.push(path);
        }
    }
}

#[test]
fn every_controller_is_in_the_table_of_components() {
    let text = page();
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("## Components"))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with('|'))
        .collect();
    let spans: Vec<&str> = table.iter().flat_map(|l| code_spans(l)).collect();
    let root = repo().canonicalize().unwrap();
    let mut found = Vec::new();
    for top in TOP
        .iter()
        .filter(|t| !["docs/", "e2e/", "hack/", "manifests/"].contains(t))
    {
        controllers(&root.join(top), &mut found);
    }
    assert!(found.len() >= 6, "controllers found: {found:?}");
    let absent: Vec<String> = found
        .iter()
        .map(|p| {
            p.strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|file| {
            // The file, its folder, or (for a crate's lib.rs) the crate's folder.
            let folder = file.rsplit_once('/').map_or("", |(d, _)| d).to_owned() + "/";
            let krate = folder.strip_suffix("src/").unwrap_or(&folder).to_owned();
            !spans
                .iter()
                .any(|s| *s == file || *s == folder || (file.ends_with("/lib.rs") && *s == krate))
        })
        .collect();
    assert!(
        absent.is_empty(),
        "controllers missing from {PAGE}'s components: {absent:?}"
    );
}
