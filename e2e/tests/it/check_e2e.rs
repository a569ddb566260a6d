//! `marin3r check` on the local cluster, installed as a user installs it: every check passes,
//! a certificate with renewal off included until it is near expiry; then, with the operator stopped so nothing is repaired behind the test's back, each part a
//! test breaks is named with what to do (the webhook's CA bundle, a namespace's client
//! certificate Secret, the discovery pods); once the operator runs again and repairs them,
//! every check passes again. Needs root and the built `marin3r` binary.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use marin3r_e2e::product::install;
use serde_json::json;

const NS: &str = "checked";

/// Runs `marin3r check`; its exit status and stdout.
async fn check(kubeconfig: &std::path::Path) -> (bool, String) {
    let marin3r = marin3r_e2e::product::marin3r_bin().expect("the built marin3r binary");
    let out = tokio::process::Command::new(marin3r)
        .arg("check")
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.success(), format!("{stdout}{stderr}"))
}

/// Waits until `marin3r check` exits with `success` and its output has every one of `names`.
async fn check_until(kubeconfig: &std::path::Path, success: bool, names: &[&str]) -> String {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let (ok, out) = check(kubeconfig).await;
            if ok == success && names.iter().all(|n| out.contains(n)) {
                return out;
            }
            last = out;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!("marin3r check never exited {success} naming {names:?}; last:\n{last}")
    })
}

/// A self-signed DiscoveryServiceCertificate in [`NS`] with renewal off.
fn certificate(name: &str, valid_for: u32) -> String {
    format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryServiceCertificate
metadata: {{name: {name}, namespace: {NS}}}
spec:
  commonName: {name}
  validFor: {valid_for}
  signer: {{selfSigned: {{}}}}
  secretRef: {{name: {name}}}
  certificateRenewal: {{enabled: false}}
"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_then_names_each_broken_part() {
    let installed = install(marin3r_e2e::product::images()).await.unwrap();
    let (client, kubeconfig) = (installed.client.clone(), installed.kubeconfig());
    let example = std::fs::read_to_string(
        marin3r_testkit::tools::repo_root().join("manifests/examples/discoveryservice.yaml"),
    )
    .unwrap();
    installed.apply(&example).await.unwrap();
    installed
        .discovery_service_ready("marin3r-system", "instance")
        .await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {
        "name": NS,
        "labels": {"marin3r.3scale.net/discovery-service": "instance"},
    }}))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();

    let out = check_until(
        &kubeconfig,
        true,
        &[&format!("[ok]   namespace {NS}"), "All "],
    )
    .await;
    for part in [
        "CRD envoyconfigs.marin3r.3scale.net",
        "operator leader",
        "webhook ",
        "discovery pods of marin3r-system/instance",
    ] {
        assert!(out.contains(part), "{part} not checked:\n{out}");
    }

    // Certificates with renewal off have no renewal time: issued, they pass; one with less
    // than a fifth of its lifetime left fails as near expiry, renewal off or not.
    installed
        .apply(&certificate("long-lived", 86400))
        .await
        .unwrap();
    let out = check_until(&kubeconfig, true, &["All "]).await;
    assert!(!out.contains("long-lived"), "{out}");
    installed
        .apply(&certificate("short-lived", 30))
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        false,
        &[&format!(
            "[FAIL] certificate {NS}/short-lived: near expiry: "
        )],
    )
    .await;
    installed
        .kubectl
        .ok(&["delete", "dsc", "short-lived", "-n", NS])
        .await
        .unwrap();
    check_until(&kubeconfig, true, &["All "]).await;

    // The operator stopped (the Deployment's replicas patched; `kubectl scale` needs the scale
    // subresource): nothing repairs what follows.
    installed
        .kubectl
        .ok(&[
            "patch",
            "deployment",
            "marin3r-operator",
            "-n",
            "marin3r-system",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":0}}"#,
        ])
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        false,
        &["[FAIL] operator marin3r-system/marin3r-operator: 0/0 replicas ready"],
    )
    .await;

    // A webhook that trusts another CA: the API server could not call it.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let owned = marin3r_discovery::operator::build::owner_selector("instance", "marin3r-system");
    let list = webhooks
        .list(&ListParams::default().labels(&owned))
        .await
        .unwrap();
    let config = list
        .items
        .first()
        .expect("the injection webhook configuration");
    let mut hooks = config.webhooks.clone().unwrap_or_default();
    let elsewhere = marin3r_testkit::pki::Pki::new();
    hooks[0].client_config.ca_bundle = Some(k8s_openapi::ByteString(
        elsewhere.ca_pem().as_bytes().to_vec(),
    ));
    let name = kube::ResourceExt::name_any(config);
    webhooks
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"webhooks": hooks})),
        )
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        false,
        &["caBundle is not the CA of marin3r-system/instance"],
    )
    .await;

    // A namespace without its client certificate.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    secrets
        .delete("envoy-sidecar-client-cert", &DeleteParams::default())
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        false,
        &[&format!(
            "[FAIL] namespace {NS}: no client certificate Secret envoy-sidecar-client-cert"
        )],
    )
    .await;

    // The discovery pods down.
    installed
        .kubectl
        .ok(&[
            "patch",
            "deployment",
            "marin3r-instance",
            "-n",
            "marin3r-system",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":0}}"#,
        ])
        .await
        .unwrap();
    let out = check_until(
        &kubeconfig,
        false,
        &["[FAIL] discovery pods of marin3r-system/instance: 0/0 ready"],
    )
    .await;
    assert!(out.contains("-> "), "each failure says what to do:\n{out}");

    // The operator back: it repairs everything, and every check passes again.
    installed
        .kubectl
        .ok(&[
            "patch",
            "deployment",
            "marin3r-operator",
            "-n",
            "marin3r-system",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":1}}"#,
        ])
        .await
        .unwrap();
    check_until(&kubeconfig, true, &["All "]).await;
}
