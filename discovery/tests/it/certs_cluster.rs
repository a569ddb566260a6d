//! Managing a certificate the way a user does: real kubectl (`apply`, `wait`, `get` with the
//! printer columns) and `marin3r certs status|renew` against the real cluster, with the
//! certificate controller running (in the test, the in-cluster operator stopped meanwhile).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;
use marin3r_certs::CertificateInfo;

use marin3r_testkit::namespaces::{Namespaces, cluster};

const CERTIFICATE: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryServiceCertificate
metadata:
  name: my-cert
spec:
  commonName: my-cert
  server: true
  validFor: 86400
  hosts: [my-service, my-service.default.svc]
  signer:
    selfSigned: {}
  secretRef:
    name: my-cert-tls
"#;

async fn marin3r(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn serial(client: &Client, ns: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets.get("my-cert-tls").await.unwrap();
    let pem = String::from_utf8(secret.data.unwrap()["tls.crt"].0.clone()).unwrap();
    CertificateInfo::from_pem(&pem).unwrap().serial
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_and_marin3r_certs_manage_a_certificate() {
    let cluster = cluster();
    // The certificate controller reconciles every certificate of the cluster: the in-cluster
    // operator's must not at the same time.
    let operator_stopped = marin3r_testkit::namespaces::operator_stopped(&cluster).await;
    let client = cluster.client().await.unwrap();
    let space = Namespaces::holding(&cluster, &client, None).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(marin3r_certs::controller::run(
        client.clone(),
        Default::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let kubeconfig = space.kubeconfig().to_path_buf();
    let kubectl = space.kubectl();
    let ns = space.create("certs-cli", &[]).await;

    kubectl
        .ok_with(&["apply", "-n", &ns, "-f", "-"], CERTIFICATE)
        .await
        .unwrap();
    kubectl
        .ok(&[
            "wait",
            "-n",
            &ns,
            "--for=condition=Ready",
            "dsc/my-cert",
            "--timeout=30s",
        ])
        .await
        .unwrap();

    let table = kubectl.ok(&["get", "dsc", "-n", &ns]).await.unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "READY", "NOT", "BEFORE", "NOT", "AFTER", "RENEWAL", "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..2], ["my-cert", "true"], "{table}");
    // Not Before, Not After and Renewal are timestamps (an age column cannot show a future
    // instant).
    for cell in &row[2..5] {
        assert!(cell.contains('T') && cell.ends_with('Z'), "{table}");
    }

    // `marin3r certs status` shows readiness, conditions, the Secret and the certificate.
    let (ok, out, err) = marin3r(&kubeconfig, &["certs", "status", "my-cert", "-n", &ns]).await;
    assert!(ok, "{err}");
    for want in [
        "Ready:         True",
        "Ready=True Issued",
        &format!(
            "Secret:        {ns}/my-cert-tls (type kubernetes.io/tls, keys: ca.crt, tls.crt, tls.key)"
        ),
        "  SANs:        DNS:my-service, DNS:my-service.default.svc",
        "  Usage:       server auth",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    // The same for scripts, as JSON and as YAML.
    let (ok, out, err) = marin3r(
        &kubeconfig,
        &["certs", "status", "my-cert", "-n", &ns, "-o", "json"],
    )
    .await;
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["name"], "my-cert", "{doc}");
    assert_eq!(doc["status"]["ready"], true, "{doc}");
    assert_eq!(doc["secret"]["name"], format!("{ns}/my-cert-tls"), "{doc}");
    assert_eq!(
        doc["secret"]["certificate"]["usage"],
        serde_json::json!(["server auth"])
    );
    assert_eq!(
        doc["secret"]["certificate"]["sans"],
        serde_json::json!(["DNS:my-service", "DNS:my-service.default.svc"])
    );
    let (ok, out, err) = marin3r(
        &kubeconfig,
        &["certs", "status", "my-cert", "-n", &ns, "-o", "yaml"],
    )
    .await;
    assert!(ok, "{err}");
    let yaml: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(yaml["secret"], doc["secret"]);

    // `marin3r certs renew` reissues once.
    let before = serial(&client, &ns).await;
    let (ok, out, err) = marin3r(&kubeconfig, &["certs", "renew", "my-cert", "-n", &ns]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&format!(
        "renewal requested for discoveryservicecertificate {ns}/my-cert"
    )));
    let deadline = Instant::now() + Duration::from_secs(10);
    while serial(&client, &ns).await == before {
        assert!(Instant::now() < deadline, "certs renew did not reissue");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The cluster may be named on the command line instead, as kubectl takes it; a context
    // the kubeconfig does not have is a clear error.
    let context = kube::config::Kubeconfig::read_from(&kubeconfig)
        .unwrap()
        .current_context
        .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["certs", "status", "my-cert", "-n", &ns, "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--context", &context])
        .env_remove("KUBECONFIG")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Ready:         True"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, _, err) = marin3r(
        &kubeconfig,
        &[
            "certs",
            "renew",
            "my-cert",
            "-n",
            &ns,
            "--context",
            "elsewhere",
        ],
    )
    .await;
    assert!(!ok && err.contains("elsewhere"), "{err}");

    // Unknown names are clear errors.
    let (ok, _, err) = marin3r(&kubeconfig, &["certs", "status", "nope", "-n", &ns]).await;
    assert!(
        !ok && err.contains(&format!("reading discoveryservicecertificate {ns}/nope")),
        "{err}"
    );
    let (ok, _, err) = marin3r(&kubeconfig, &["certs", "renew", "nope", "-n", &ns]).await;
    assert!(
        !ok && (err.contains("NotFound") || err.contains("not found")),
        "{err}"
    );

    let _ = stop.send(());
    controller.abort();
    drop(space);
    drop(operator_stopped);
}
