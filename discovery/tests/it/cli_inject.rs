//! `marin3r inject`, run as a user runs it: the built binary on YAML files on disk and on
//! standard input.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn marin3r(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run marin3r");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn documents(yaml: &[u8]) -> Vec<Value> {
    serde_saphyr::from_multiple(std::str::from_utf8(yaml).unwrap()).unwrap()
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: kuard
  namespace: shop
spec:
  replicas: 2
  selector:
    matchLabels: {app: kuard}
  template:
    metadata:
      labels:
        app: kuard
        marin3r.3scale.net/status: enabled
      annotations:
        marin3r.3scale.net/node-id: kuard
        marin3r.3scale.net/ports: "http:8081"
    spec:
      containers:
      - name: kuard
        image: gcr.io/kuar-demo/kuard-amd64:blue
---
apiVersion: v1
kind: ConfigMap
metadata: {name: untouched}
data: {a: b}
---
apiVersion: v1
kind: Pod
metadata:
  name: direct
  labels: {marin3r.3scale.net/status: enabled}
  annotations: {marin3r.3scale.net/node-id: direct}
spec:
  containers:
  - {name: app, image: busybox}
"#;

#[test]
fn a_deployment_template_and_a_pod_are_injected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.yaml");
    std::fs::write(&path, DEPLOYMENT).unwrap();
    let out = marin3r(&["inject", "-f", path.to_str().unwrap()], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = documents(&out.stdout);
    assert_eq!(docs.len(), 3);

    let template = &docs[0]["spec"]["template"];
    assert_eq!(docs[0]["spec"]["replicas"], 2);
    assert_eq!(
        template["metadata"]["annotations"]["marin3r.3scale.net/injected"],
        "true"
    );
    let sidecar = &template["spec"]["containers"][1];
    assert_eq!(sidecar["name"], "envoy-sidecar");
    assert_eq!(sidecar["image"], "envoyproxy/envoy:v1.40.0");
    assert_eq!(sidecar["command"][0], "envoy");
    assert_eq!(sidecar["args"][3], "kuard");
    assert_eq!(sidecar["ports"][0]["containerPort"], 8081);
    assert_eq!(
        template["spec"]["volumes"][0]["configMap"]["name"],
        "envoy-sidecar-bootstrap"
    );
    assert_eq!(
        template["spec"]["volumes"][1]["secret"]["secretName"],
        "envoy-sidecar-client-cert"
    );

    assert_eq!(
        docs[1],
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "untouched"}, "data": {"a": "b"}})
    );
    assert_eq!(docs[2]["spec"]["containers"][1]["args"][3], "direct");

    // Injecting the output again changes nothing.
    let again = marin3r(
        &["inject", "-f", "-"],
        Some(&String::from_utf8(out.stdout.clone()).unwrap()),
    );
    assert!(again.status.success());
    assert_eq!(documents(&again.stdout), docs);
    let notes = String::from_utf8(again.stderr).unwrap();
    assert!(
        notes.contains("note: document 1 (Deployment \"kuard\"): not injected: the pod carries the marin3r.3scale.net/injected annotation"),
        "{notes}"
    );
}

#[test]
fn the_envoy_image_flag_sets_the_default_image() {
    let out = marin3r(
        &[
            "inject",
            "-f",
            "-",
            "--envoy-image",
            "registry.local/envoy:v1.40.1",
        ],
        Some(DEPLOYMENT),
    );
    assert!(out.status.success());
    let docs = documents(&out.stdout);
    assert_eq!(
        docs[0]["spec"]["template"]["spec"]["containers"][1]["image"],
        "registry.local/envoy:v1.40.1"
    );
}

#[test]
fn a_denial_is_an_error_naming_document_annotation_and_value() {
    let bad = DEPLOYMENT.replace("\"http:8081\"", "\"http:99999\"");
    let out = marin3r(&["inject", "-f", "-"], Some(&bad));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: -: document 1 (Deployment \"kuard\"): marin3r.3scale.net/ports: \"http:99999\": port must be between 1 and 65535\n"
    );
}

#[test]
fn unreadable_and_invalid_input_are_errors() {
    let out = marin3r(&["inject", "-f", "/nonexistent/pod.yaml"], None);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: reading /nonexistent/pod.yaml: "),
        "{err}"
    );

    let out = marin3r(
        &["inject", "-f", "-"],
        Some("kind: Pod\nmetadata: [unclosed\n"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: -: input: not valid YAML: ") && err.contains("line 2"),
        "{err}"
    );

    let out = marin3r(
        &["inject", "-f", "-"],
        Some("kind: Pod\nmetadata: {name: x}\nspec: {containers: 3}\n"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("error: -: document 1 (Pod \"x\"): not a valid Pod: "),
        "{err}"
    );

    let out = marin3r(&["inject"], None);
    assert!(!out.status.success());
}

#[test]
fn a_pod_not_labelled_for_injection_is_printed_unchanged_with_a_note() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: plain\n  annotations: {marin3r.3scale.net/node-id: x}\nspec:\n  containers:\n  - {name: app, image: busybox}\n";
    let out = marin3r(&["inject", "-f", "-"], Some(pod));
    assert!(out.status.success());
    assert_eq!(documents(&out.stdout), documents(pod.as_bytes()));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "note: document 1 (Pod \"plain\"): not injected: the pod is not labelled marin3r.3scale.net/status=enabled\n"
    );
}

/// A CronJob's pods come from its job template: that is what gets the sidecar.
#[test]
fn a_cron_job_gets_the_sidecar_in_its_job_template() {
    let cron = r#"
apiVersion: batch/v1
kind: CronJob
metadata: {name: report}
spec:
  schedule: "0 * * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          labels: {marin3r.3scale.net/status: enabled}
          annotations: {marin3r.3scale.net/node-id: report}
        spec:
          restartPolicy: OnFailure
          containers:
          - {name: report, image: busybox}
"#;
    let out = marin3r(&["inject", "-f", "-"], Some(cron));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = documents(&out.stdout);
    let containers = docs[0]
        .pointer("/spec/jobTemplate/spec/template/spec/containers")
        .and_then(Value::as_array)
        .unwrap();
    let names: Vec<&str> = containers
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["report", "envoy-sidecar"]);
}

/// A Deployment written for the original with its drain annotations: the template gets the
/// shutdown manager (image from the flag), the hooks and the grace period; an annotation
/// without effect is a note on stderr, as the webhook's admission warning.
#[test]
fn the_original_drain_annotations_inject_the_shutdown_manager() {
    let yaml = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: kuard, namespace: shop}
spec:
  selector: {matchLabels: {app: kuard}}
  template:
    metadata:
      labels: {app: kuard, marin3r.3scale.net/status: enabled}
      annotations:
        marin3r.3scale.net/node-id: kuard
        marin3r.3scale.net/shutdown-manager.enabled: "true"
        marin3r.3scale.net/shutdown-manager.drain-time: "30"
        marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks: kuard
        marin3r.3scale.net/init-manager.image: quay.io/3scale/marin3r:v0.13.0
        marin3r.3scale.net/envoy-extra-args: --log-level debug  --log-format '%v'
    spec:
      containers:
      - {name: kuard, image: "gcr.io/kuar-demo/kuard-amd64:blue"}
"#;
    let out = marin3r(
        &[
            "inject",
            "-f",
            "-",
            "--shutdown-manager-image",
            "registry.local/marin3r:v1",
        ],
        Some(yaml),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.trim(),
        r#"note: document 1 (Deployment "kuard"): warning: marin3r.3scale.net/init-manager.image="quay.io/3scale/marin3r:v0.13.0" has no effect: marin3r injects no init container (the sidecar's per-pod settings travel on its command line)"#
    );
    let docs = documents(&out.stdout);
    let spec = &docs[0]["spec"]["template"]["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 45);
    let names: Vec<&str> = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kuard", "envoy-sidecar", "envoy-shtdn-mgr"]);
    assert_eq!(spec["containers"][2]["image"], "registry.local/marin3r:v1");
    assert_eq!(
        spec["containers"][0]["lifecycle"]["preStop"]["httpGet"]["path"],
        "/drain"
    );
    assert_eq!(
        spec["containers"][1]["lifecycle"]["preStop"]["httpGet"]["path"],
        "/shutdown"
    );
    let args: Vec<&str> = spec["containers"][1]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args[8..],
        [
            "--drain-time-s",
            "30",
            "--drain-strategy",
            "gradual",
            "--log-level",
            "debug",
            "--log-format",
            "'%v'"
        ]
    );
}
