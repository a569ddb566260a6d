//! `kubectl marin3r`: the real kubectl (1.37, `.tools/bin`) finds `kubectl-marin3r` on `PATH`
//! (a link to this build's `marin3r`, as docs/user-guide.md tells users to make) and runs it
//! with the words after `marin3r`; help and errors then name the command `kubectl marin3r`.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the real kubectl with `dir` first on `PATH` and no kubeconfig to read.
fn kubectl(dir: &Path, args: &[&str]) -> Output {
    let kubectl = marin3r_testkit::tools::kubectl().expect("kubectl (hack/install-tools)");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![dir.to_path_buf()];
    paths.extend(std::env::split_paths(&path));
    Command::new(kubectl)
        .args(args)
        .env("PATH", std::env::join_paths(paths).unwrap())
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .output()
        .expect("run kubectl")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn kubectl_runs_marin3r_as_its_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-marin3r");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_marin3r"), &plugin).unwrap();

    let out = kubectl(dir.path(), &["plugin", "list"]);
    assert!(
        text(&out).contains(&plugin.display().to_string()),
        "{}",
        text(&out)
    );

    // The words after `marin3r` reach it: a command that reads, as JSON.
    let out = kubectl(
        dir.path(),
        &["marin3r", "version", "--client", "-o", "json"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["client"]["version"], env!("CARGO_PKG_VERSION"));

    // Help and errors name the command as the user typed it.
    let out = kubectl(dir.path(), &["marin3r", "--help"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("Usage: kubectl marin3r <COMMAND>"),
        "{}",
        text(&out)
    );
    let out = kubectl(dir.path(), &["marin3r", "check", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("Usage: kubectl marin3r check"),
        "{}",
        text(&out)
    );

    // Run by its own name, it is `marin3r`.
    let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        text(&out).contains("Usage: marin3r <COMMAND>"),
        "{}",
        text(&out)
    );
}
