//! `local-cluster` runs pods as a user drives it with kubectl: a Deployment applied with
//! `kubectl apply --server-side` becomes a running, ready pod answering on its IP, and
//! SIGTERM stops it and removes the pod network. Needs root and python3.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use marin3r_local_cluster::kubelet::net;

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello, namespace: default}
spec:
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      containers:
      - name: server
        image: registry.example/probe-server:1
        command: ["python3", "-m", "http.server", "8080", "--directory", "/etc/hello"]
        volumeMounts: [{name: content, mountPath: /etc/hello, readOnly: true}]
        readinessProbe: {httpGet: {path: /index.html, port: 8080}}
      volumes:
      - name: content
        configMap: {name: hello}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: hello, namespace: default}
data: {index.html: "hello from a pod"}
"#;

#[test]
fn local_cluster_runs_a_deployment_applied_with_kubectl_and_cleans_up() {
    let python = String::from_utf8(
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed")
            .stdout,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_local-cluster"))
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--logs", dir.path().join("logs").to_str().unwrap()])
        .args(["--image", &format!("probe-server={}", python.trim())])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let mut stdout = BufReader::new(child.0.stdout.take().unwrap());
    let mut printed = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !printed.contains("KUBECONFIG=") {
        assert!(Instant::now() < deadline, "no usage printed: {printed}");
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "local-cluster exited: {printed}"
        );
        printed.push_str(&line);
    }
    let bridge = printed
        .split("pod network on bridge ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no bridge printed: {printed}"))
        .to_owned();
    let prefix = bridge.trim_end_matches("br").to_owned();

    let manifest = dir.path().join("hello.yaml");
    std::fs::write(&manifest, DEPLOYMENT).unwrap();
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
    kubectl(&["apply", "--server-side", "-f", manifest.to_str().unwrap()]);
    kubectl(&[
        "wait",
        "--for=condition=Available",
        "deployment/hello",
        "--timeout=60s",
    ]);
    kubectl(&["rollout", "status", "deployment/hello", "--timeout=30s"]);
    let ip = kubectl(&[
        "get",
        "pods",
        "-l",
        "app=hello",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    ]);
    let body = marin3r_testkit::envoy::get_body(&format!("http://{ip}:8080/index.html")).unwrap();
    assert_eq!(body, "hello from a pod");
    assert!(net::netns_names().iter().any(|n| n.starts_with(&prefix)));
    // kubectl logs reads the container's log file: http.server logs each request.
    let pod = kubectl(&[
        "get",
        "pods",
        "-l",
        "app=hello",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let logs = kubectl(&["logs", &pod]);
    assert!(logs.contains("GET /index.html"), "{logs}");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(20);
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
        !net::netns_names().iter().any(|n| n.starts_with(&prefix)),
        "pod namespaces left"
    );
    assert!(
        !net::link_names().iter().any(|n| n.starts_with(&prefix)),
        "links left"
    );
    assert!(
        !std::env::temp_dir().join(&prefix).exists(),
        "run folder left"
    );
    let log = std::fs::read_dir(dir.path().join("logs")).unwrap().count();
    assert_eq!(log, 1, "one container log kept");
}
