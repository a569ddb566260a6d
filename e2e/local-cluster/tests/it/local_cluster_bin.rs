//! The `local-cluster` binary as a user runs it: it writes a kubeconfig once the API
//! answers, kubectl works with it, and SIGTERM stops it and removes the kubeconfig.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn local_cluster_serves_kubectl_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("nested/kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_local-cluster"))
        .args(["--kubeconfig", kubeconfig.to_str().unwrap(), "--plain-http"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut printed = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !printed.contains("KUBECONFIG=") {
        assert!(Instant::now() < deadline, "no usage printed: {printed}");
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "local-cluster exited: {printed}"
        );
        printed.push_str(&line);
    }
    assert!(kubeconfig.is_file(), "{printed}");

    let kubectl = |args: &[&str]| {
        let out = Command::new(marin3r_testkit::tools::kubectl().unwrap())
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("HOME", dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let namespaces = kubectl(&["get", "namespaces", "-o", "name"]);
    assert!(namespaces.contains("namespace/default"), "{namespaces}");
    let version = kubectl(&["version", "-o", "json"]);
    assert!(version.contains("\"minor\": \"37\""), "{version}");

    // The plain HTTP port answers too.
    let http = printed
        .lines()
        .find_map(|l| l.strip_prefix("plain HTTP (loopback only) at "))
        .unwrap()
        .trim()
        .to_owned();
    let body = ureq::get(format!("{http}/api/v1/namespaces/default"))
        .call()
        .unwrap()
        .into_body()
        .read_to_string()
        .unwrap();
    assert!(body.contains("\"name\":\"default\""), "{body}");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "local-cluster did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    assert!(
        !kubeconfig.exists(),
        "the kubeconfig of a stopped cluster is left behind"
    );
}
