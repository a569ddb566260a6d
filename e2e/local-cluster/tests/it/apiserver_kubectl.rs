//! Real kubectl (installed by `hack/install-tools`) against the local cluster over HTTPS:
//! server-side apply of a CRD and a custom resource, `get -o yaml`, table output with the
//! CRD's printer columns, `get -w` until a change, merge and JSON patches, `wait
//! --for=condition=...`, `delete`.

use std::process::Stdio;
use std::time::Duration;

use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.marin3r.io
spec:
  group: test.marin3r.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
"#;

/// The library's kubectl runner with the server's kubeconfig, unwrapping for brevity.
struct Kubectl {
    inner: marin3r_testkit::kubectl::Kubectl,
    _dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(server: &ApiServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Self {
            inner: marin3r_testkit::kubectl::Kubectl::new(&kubeconfig).unwrap(),
            _dir: dir,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        self.inner.command(args).unwrap()
    }

    /// Runs kubectl with `stdin`, returning (success, stdout, stderr).
    async fn run_with(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        let out = self.inner.run_with(args, stdin).await.unwrap();
        (out.success, out.stdout, out.stderr)
    }

    async fn ok(&self, args: &[&str]) -> String {
        self.inner.ok(args).await.unwrap()
    }

    async fn ok_with(&self, args: &[&str], stdin: &str) -> String {
        self.inner.ok_with(args, stdin).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_the_local_cluster() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let k = Kubectl::new(&server);
    let ns = format!("kubectl-{}", std::process::id());

    k.ok_with(&["apply", "--server-side", "-f", "-"], CRD).await;
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.test.marin3r.io",
        "--timeout=10s",
    ])
    .await;
    k.ok_with(
        &["apply", "--server-side", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"),
    )
    .await;
    let widget = |spec: &str| {
        format!(
            "apiVersion: test.marin3r.io/v1\nkind: Widget\nmetadata: {{name: w1, namespace: {ns}}}\nspec: {spec}\n"
        )
    };
    let apply = ["apply", "--server-side", "-f", "-"];
    let out = k.ok_with(&apply, &widget("{size: 3, color: red}")).await;
    assert!(
        out.contains("widget.test.marin3r.io/w1 serverside-applied"),
        "{out}"
    );
    // Re-applying without a field removes it (the field was kubectl's).
    k.ok_with(&apply, &widget("{size: 3}")).await;

    let yaml = k
        .ok(&["get", "widget", "w1", "-n", &ns, "-o", "yaml"])
        .await;
    let obj: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(obj["spec"]["size"], 3);
    assert_eq!(obj["spec"], serde_json::json!({"size": 3}), "{yaml}");
    assert_eq!(obj["metadata"]["generation"], 2);
    assert!(obj["metadata"]["uid"].is_string(), "{yaml}");

    // Table output carries the CRD's printer columns, and no Age the CRD does not declare
    // (kube-apiserver adds Age only to a version that declares no columns).
    let table = k.ok(&["get", "wd", "-n", &ns]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "READY"], "{table}");
    assert!(table.lines().nth(1).unwrap().starts_with("w1"), "{table}");

    // `get -w` prints the current state, then each change.
    let mut watch = k
        .command(&["get", "widgets", "-n", &ns, "-w", "--no-headers"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // Table rows (kubectl asks for Table watch events): the second column is SIZE.
    let mut next_line = async || {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        line.split_whitespace().nth(1).unwrap().to_owned()
    };
    assert_eq!(next_line().await, "3");
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"spec":{"size":4}}"#,
    ])
    .await;
    assert_eq!(next_line().await, "4");
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        &ns,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/size","value":5}]"#,
    ])
    .await;
    assert_eq!(next_line().await, "5");
    watch.kill().await.unwrap();

    // `wait --for=condition=Ready` returns once the status says so.
    let waiting = k
        .command(&[
            "wait",
            "--for=condition=Ready",
            "widget/w1",
            "-n",
            &ns,
            "--timeout=20s",
        ])
        .output();
    let waiting = tokio::spawn(waiting);
    k.ok(&[
        "patch",
        "widget",
        "w1",
        "-n",
        &ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"True"}]}}"#,
    ])
    .await;
    let waited = waiting.await.unwrap().unwrap();
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let table = k.ok(&["get", "wd", "w1", "-n", &ns, "--no-headers"]).await;
    assert_eq!(
        table.split_whitespace().take(3).collect::<Vec<_>>(),
        ["w1", "5", "True"],
        "{table}"
    );

    // Pods print as kubectl's own printer would, with the IP in the wide output.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p1, namespace: {ns}}}\nspec: {{containers: [{{name: main, image: busybox}}]}}\n"
    );
    k.ok_with(&apply, &pod).await;
    let table = k.ok(&["get", "pods", "-n", &ns]).await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["p1", "0/1", "Pending", "0"], "{table}");
    let wide = k.ok(&["get", "pods", "-n", &ns, "-o", "wide"]).await;
    assert!(wide.lines().next().unwrap().contains("IP"), "{wide}");
    // `kubectl logs` reads the file the pod runner names (here, one the test writes).
    let logs_dir = tempfile::tempdir().unwrap();
    let log_file = logs_dir.path().join("p1-main.log");
    std::fs::write(&log_file, "first\nsecond\n").unwrap();
    let served = log_file.clone();
    let wanted = ns.clone();
    server.set_pod_logs(std::sync::Arc::new(move |n: &str, pod: &str, c: &str| {
        (n == wanted && pod == "p1" && c == "main").then(|| served.clone())
    }));
    assert_eq!(k.ok(&["logs", "p1", "-n", &ns]).await, "first\nsecond\n");
    assert_eq!(
        k.ok(&["logs", "p1", "-n", &ns, "--tail=1"]).await,
        "second\n"
    );
    let (ok, _, err) = k
        .run_with(&["logs", "p1", "-n", &ns, "-c", "nope"], "")
        .await;
    assert!(
        !ok && err.contains("container nope is not valid for pod p1"),
        "{err}"
    );
    let mut follow = k
        .command(&["logs", "-f", "p1", "-n", &ns])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut followed = BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut next_log = async || {
        tokio::time::timeout(Duration::from_secs(10), followed.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert_eq!(next_log().await, "first");
    assert_eq!(next_log().await, "second");
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log_file)
            .unwrap();
        writeln!(f, "third").unwrap();
    }
    assert_eq!(next_log().await, "third");
    follow.kill().await.unwrap();

    // kubectl patches built-in kinds with a strategic merge patch by default.
    k.ok(&[
        "patch",
        "pod",
        "p1",
        "-n",
        &ns,
        "-p",
        r#"{"metadata":{"labels":{"patched":"yes"}}}"#,
    ])
    .await;
    let labels = k
        .ok(&[
            "get",
            "pod",
            "p1",
            "-n",
            &ns,
            "-o",
            "jsonpath={.metadata.labels.patched}",
        ])
        .await;
    assert_eq!(labels, "yes");

    // kubectl's imperative generators send protobuf bodies.
    let generated = format!("{ns}-gen");
    k.ok(&["create", "namespace", &generated]).await;
    let n = &generated;
    k.ok(&["create", "configmap", "c1", "-n", n, "--from-literal=k=v"])
        .await;
    k.ok(&[
        "create",
        "secret",
        "generic",
        "s1",
        "-n",
        n,
        "--from-literal=user=admin",
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca = marin3r_local_cluster::pki::Ca::new("test-ca")
        .unwrap()
        .server("test", &[])
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), &ca.cert_pem).unwrap();
    std::fs::write(dir.path().join("tls.key"), &ca.key_pem).unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    k.ok(&[
        "create",
        "secret",
        "tls",
        "t1",
        "-n",
        n,
        &format!("--cert={}", crt.display()),
        &format!("--key={}", key.display()),
    ])
    .await;
    k.ok(&["create", "serviceaccount", "sa1", "-n", n]).await;
    k.ok(&[
        "create",
        "deployment",
        "d1",
        "-n",
        n,
        "--image=nginx",
        "--replicas=2",
        "--port=8080",
        "--",
        "/bin/server",
        "--flag",
    ])
    .await;
    let get = |what: &'static str| {
        let k = &k;
        async move {
            let out = k.ok(&["get", what, "-n", n, "-o", "json"]).await;
            serde_json::from_str::<serde_json::Value>(&out).unwrap()
        }
    };
    assert_eq!(
        get("configmap/c1").await["data"],
        serde_json::json!({"k": "v"})
    );
    let s1 = get("secret/s1").await;
    assert_eq!(
        (s1["type"].as_str(), s1["data"]["user"].as_str()),
        (Some("Opaque"), Some("YWRtaW4="))
    );
    let t1 = get("secret/t1").await;
    assert_eq!(t1["type"], "kubernetes.io/tls");
    assert!(
        t1["data"]["tls.crt"].is_string() && t1["data"]["tls.key"].is_string(),
        "{t1}"
    );
    assert_eq!(get("serviceaccount/sa1").await["metadata"]["name"], "sa1");
    let d1 = get("deployment/d1").await;
    assert_eq!(d1["spec"]["replicas"], 2);
    let container = &d1["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx");
    assert_eq!(
        container["command"],
        serde_json::json!(["/bin/server", "--flag"])
    );
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    // A generator whose protobuf this server does not decode is refused, saying what to do.
    let (ok, _, err) = k
        .run_with(
            &[
                "create",
                "service",
                "clusterip",
                "svc",
                "-n",
                n,
                "--tcp=80:8080",
            ],
            "",
        )
        .await;
    assert!(!ok && err.contains("send JSON (kubectl apply -f)"), "{err}");
    k.ok(&["delete", "namespace", n, "--wait=true", "--timeout=10s"])
        .await;

    // Errors come back with the server's reason and message.
    let (ok, _, err) = k.run_with(&["get", "widget", "nope", "-n", &ns], "").await;
    assert!(
        !ok && err.contains(r#"widgets.test.marin3r.io "nope" not found"#),
        "{err}"
    );

    k.ok(&["delete", "widget", "w1", "-n", &ns]).await;
    let (ok, _, err) = k.run_with(&["get", "widget", "w1", "-n", &ns], "").await;
    assert!(!ok && err.contains("NotFound"), "{err}");
    k.ok(&["delete", "namespace", &ns, "--wait=true", "--timeout=10s"])
        .await;
}
