//! `marin3r check` on the real cluster (`hack/cluster`), marin3r installed from `manifests/`
//! as a user installs it, a DiscoveryService of this run in the operator's namespace and the
//! scenario's namespace labelled for it: every check passes, a certificate with renewal off included until it is near expiry; then, with the
//! shared operator stopped so nothing is repaired behind the test's back, each part the test
//! breaks is named with what to do (the webhook's CA bundle, the namespace's client
//! certificate Secret, the discovery pods); once the operator runs again and repairs them,
//! every check passes again. `marin3r check` looks at the whole cluster and the test stops
//! the one operator every scenario uses, so it holds the cluster alone; what another test
//! process left failing on purpose (a DiscoveryService it made invalid) is told apart by
//! its names, and only this run's checks must pass.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL;
use marin3r_e2e::real::{OPERATOR_NAMESPACE as OPS, Scenario};
use serde_json::json;

/// Runs `marin3r check`; its exit status and output.
async fn check(kubeconfig: &Path) -> (bool, String) {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
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

/// This run's objects in `marin3r check`'s report: the scenario's namespace and the
/// DiscoveryService serving it.
#[derive(Clone, Copy)]
struct Ours<'a> {
    ns: &'a str,
    ds: &'a str,
}

impl Ours<'_> {
    /// The `[FAIL]` lines of `out` about another scenario's objects on the shared cluster (a
    /// DiscoveryService of another name or namespace, its pods, webhooks, CA, served
    /// namespaces or certificates). The cluster-wide parts (CRDs, the operator, the lists)
    /// are never another's.
    fn others_failures<'o>(&self, out: &'o str) -> Vec<&'o str> {
        const PER_OBJECT: [&str; 6] = [
            "[FAIL] DiscoveryService ",
            "[FAIL] discovery pods of ",
            "[FAIL] webhook",
            "[FAIL] CA of ",
            "[FAIL] namespace ",
            "[FAIL] certificate ",
        ];
        out.lines()
            .filter(|l| PER_OBJECT.iter().any(|p| l.starts_with(p)))
            .filter(|l| !l.contains(self.ns) && !l.contains(self.ds))
            .collect()
    }

    /// Whether every check passed but those of other scenarios' objects (another test may
    /// hold a DiscoveryService it made invalid on purpose): every `[FAIL]` line is theirs.
    fn passed(&self, exit_ok: bool, out: &str) -> bool {
        let failures = out.lines().filter(|l| l.starts_with("[FAIL] ")).count();
        exit_ok || failures == self.others_failures(out).len()
    }
}

/// Waits until `marin3r check` passes (this run's checks all, see [`Ours::passed`]) or fails
/// as `pass` says, its output naming every one of `names`.
async fn check_until(kubeconfig: &Path, ours: Ours<'_>, pass: bool, names: &[&str]) -> String {
    let mut last = String::new();
    let found = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let (ok, out) = check(kubeconfig).await;
            let outcome = if pass { ours.passed(ok, &out) } else { !ok };
            if outcome && names.iter().all(|n| out.contains(n)) {
                let others = ours.others_failures(&out);
                if pass && !others.is_empty() {
                    println!("other scenarios' objects failing meanwhile: {others:#?}");
                }
                return out;
            }
            last = out;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!("marin3r check never passed ({pass}) naming {names:?}; last:\n{last}")
    })
}

/// A self-signed DiscoveryServiceCertificate with renewal off, in the scenario's namespace.
fn certificate(name: &str, valid_for: u32) -> String {
    format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryServiceCertificate
metadata: {{name: {name}}}
spec:
  commonName: {name}
  validFor: {valid_for}
  signer: {{selfSigned: {{}}}}
  secretRef: {{name: {name}}}
  certificateRenewal: {{enabled: false}}
"
    )
}

/// `kubectl patch` of the replicas of Deployment `OPS/name`.
fn scale(kubeconfig: &Path, name: &str, replicas: u32) -> std::io::Result<std::process::Output> {
    let kubectl = marin3r_testkit::tools::kubectl().map_err(std::io::Error::other)?;
    std::process::Command::new(kubectl)
        .args(["patch", "deployment", name, "-n", OPS, "--type=merge", "-p"])
        .arg(format!(r#"{{"spec":{{"replicas":{replicas}}}}}"#))
        .env("KUBECONFIG", kubeconfig)
        .output()
}

/// Starts the operator again however the test ends: every other scenario needs it.
struct OperatorBack(PathBuf);

impl Drop for OperatorBack {
    fn drop(&mut self) {
        let _ = scale(&self.0, "marin3r-operator", 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn check_passes_then_names_each_broken_part() {
    let scenario = Scenario::start_alone("check", &[]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.as_str());
    let kubeconfig = scenario.cluster.kubeconfig().to_path_buf();
    let ds = scenario.operator_discovery_service("ck").unwrap();
    let ds = ds.as_str();
    scenario
        .kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
                 metadata: {{name: {ds}, namespace: {OPS}}}\nspec: {{}}\n"
            ),
        )
        .await
        .unwrap();
    scenario
        .discovery_service_ready_in(OPS, ds, Duration::from_secs(120))
        .await
        .unwrap();
    let ours = Ours { ns, ds };
    scenario
        .kubectl
        .ok(&[
            "label",
            "namespace",
            ns,
            &format!("{DISCOVERY_SERVICE_LABEL}={ds}"),
        ])
        .await
        .unwrap();

    let out = check_until(
        &kubeconfig,
        ours,
        true,
        &[&format!("[ok]   namespace {ns}")],
    )
    .await;
    for part in [
        "CRD envoyconfigs.marin3r.3scale.net",
        "operator leader",
        "webhook ",
        &format!("discovery pods of {OPS}/{ds}"),
    ] {
        assert!(out.contains(part), "{part} not checked:\n{out}");
    }

    // Certificates with renewal off have no renewal time: issued, they pass; one with less
    // than a fifth of its lifetime left fails as near expiry, renewal off or not.
    scenario
        .apply(&certificate("long-lived", 86400))
        .await
        .unwrap();
    let out = check_until(&kubeconfig, ours, true, &[]).await;
    assert!(!out.contains("long-lived"), "{out}");
    scenario
        .apply(&certificate("short-lived", 30))
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        ours,
        false,
        &[&format!(
            "[FAIL] certificate {ns}/short-lived: near expiry: "
        )],
    )
    .await;
    scenario
        .kubectl
        .ok(&["delete", "dsc", "short-lived", "-n", ns])
        .await
        .unwrap();
    check_until(&kubeconfig, ours, true, &[]).await;

    // The operator stopped (its Deployment's replicas patched; the real Deployment controller
    // deletes its pod): nothing repairs what follows.
    let _back = OperatorBack(kubeconfig.clone());
    let out = scale(&kubeconfig, "marin3r-operator", 0).unwrap();
    assert!(out.status.success(), "{out:?}");
    check_until(
        &kubeconfig,
        ours,
        false,
        &[&format!(
            "[FAIL] operator {OPS}/marin3r-operator: 0/0 replicas ready"
        )],
    )
    .await;

    // A webhook that trusts another CA: the API server could not call it.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let owned = marin3r_operator::build::owner_selector(ds, OPS);
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
        ours,
        false,
        &[&format!("caBundle is not the CA of {OPS}/{ds}")],
    )
    .await;

    // A namespace without its client certificate.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .delete("envoy-sidecar-client-cert", &DeleteParams::default())
        .await
        .unwrap();
    check_until(
        &kubeconfig,
        ours,
        false,
        &[&format!(
            "[FAIL] namespace {ns}: no client certificate Secret envoy-sidecar-client-cert"
        )],
    )
    .await;

    // The discovery pods down.
    let out = scale(&kubeconfig, &format!("marin3r-{ds}"), 0).unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = check_until(
        &kubeconfig,
        ours,
        false,
        &[&format!("[FAIL] discovery pods of {OPS}/{ds}: 0/0 ready")],
    )
    .await;
    assert!(out.contains("-> "), "each failure says what to do:\n{out}");

    // The operator back: it repairs everything, and every check passes again.
    let out = scale(&kubeconfig, "marin3r-operator", 1).unwrap();
    assert!(out.status.success(), "{out:?}");
    check_until(&kubeconfig, ours, true, &[]).await;
}
