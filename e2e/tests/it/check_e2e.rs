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
    check_with(kubeconfig, &[]).await
}

/// Runs `marin3r check ARGS...`; its exit status and output (stdout, then stderr).
async fn check_with(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let out = tokio::process::Command::new(marin3r)
        .arg("check")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}{stderr}");
    let line = marin3r_testkit::readable::debug_line(&all);
    assert_eq!(
        line, None,
        "check {args:?} printed Debug formatting:\n{all}"
    );
    (out.status.success(), all)
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

/// Deletes the pod-mutating webhook configuration the `--pre` test made.
struct WebhookGone(kube::Client, String);

impl Drop for WebhookGone {
    fn drop(&mut self) {
        let (client, name) = (self.0.clone(), self.1.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                let api: Api<MutatingWebhookConfiguration> = Api::all(client);
                let _ = api.delete(&name, &DeleteParams::default()).await;
            })
        })
        .join();
    }
}

/// The checks of a `-o json` report, by name: (result, detail).
fn results(out: &str) -> std::collections::BTreeMap<String, (String, String)> {
    let doc: serde_json::Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    doc["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("no checks: {out}"))
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (text("check"), (text("result"), text("detail")))
        })
        .collect()
}

/// `marin3r check --pre`, as someone about to install would run it, on the cluster where
/// marin3r is installed: the cluster's version passes and a cluster administrator may
/// install, what is there already is warned of (never failed: the exit code is 0), and
/// another webhook that mutates pods is named. As a ServiceAccount with no permission, it
/// fails and names what the install would be refused.
#[tokio::test(flavor = "multi_thread")]
async fn check_pre_says_what_an_install_would_meet() {
    let scenario = Scenario::start("precheck", &[]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.as_str());
    let kubeconfig = scenario.cluster.kubeconfig().to_path_buf();

    // A webhook of another product on pod creation, which matches no namespace (so it
    // changes nothing for the other scenarios) and is ignored if unreachable.
    let name = format!("{ns}-injector");
    let _gone = WebhookGone(client.clone(), name.clone());
    scenario
        .kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\n\
                 metadata: {{name: {name}}}\nwebhooks:\n- name: inject.example.com\n  \
                 admissionReviewVersions: [v1]\n  sideEffects: None\n  failurePolicy: Ignore\n  \
                 clientConfig: {{url: 'https://127.0.0.1:1/inject'}}\n  \
                 namespaceSelector: {{matchLabels: {{{ns}: never}}}}\n  \
                 rules: [{{apiGroups: [''], apiVersions: [v1], resources: [pods], operations: [CREATE]}}]\n"
            ),
        )
        .await
        .unwrap();

    let (ok, out) = check_with(&kubeconfig, &["--pre", "-o", "json"]).await;
    let checks = results(&out);
    assert!(ok, "a warning does not fail --pre:\n{out}");
    let result = |check: &str| {
        checks
            .get(check)
            .cloned()
            .unwrap_or_else(|| panic!("{check} not checked: {out}"))
    };
    let (verdict, detail) = result("Kubernetes version");
    assert_eq!(verdict, "pass", "{detail}");
    assert!(detail.starts_with("v1."), "{detail}");
    assert_eq!(result("permissions to install").0, "pass", "{out}");
    assert_eq!(
        result("permissions the operator is granted").0,
        "pass",
        "{out}"
    );
    let (verdict, detail) = result("CRDs");
    assert_eq!(verdict, "warn", "{detail}");
    assert!(detail.contains("already installed"), "{detail}");
    let (verdict, detail) = result("webhooks mutating pods");
    assert_eq!(verdict, "warn", "{detail}");
    assert!(detail.contains(&name), "{detail}");

    // The same report for people, and as YAML.
    let (ok, out) = check_with(&kubeconfig, &["--pre"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("[warn] webhooks mutating pods: {name}")),
        "{out}"
    );
    assert!(out.contains(" checks passed; "), "{out}");
    let (_, out) = check_with(&kubeconfig, &["--pre", "-o", "yaml"]).await;
    assert!(out.starts_with("checks:\n"), "{out}");

    // A ServiceAccount that may do nothing: the install would be refused, and it says what.
    scenario
        .kubectl
        .ok(&["create", "serviceaccount", "installer", "-n", ns])
        .await
        .unwrap();
    let (_, dir) = scenario.kubectl_as(ns, "installer").await.unwrap();
    let (ok, out) = check_with(&dir.path().join("kubeconfig"), &["--pre", "-o", "json"]).await;
    assert!(!ok, "{out}");
    let checks = results(&out);
    let (verdict, detail) = &checks["permissions to install"];
    assert_eq!(verdict, "fail", "{detail}");
    for refused in [
        "create customresourcedefinitions.apiextensions.k8s.io",
        "create clusterroles.rbac.authorization.k8s.io",
        "create deployments.apps in marin3r-system",
    ] {
        assert!(detail.contains(refused), "{refused}: {detail}");
    }
    let (verdict, detail) = &checks["permissions the operator is granted"];
    assert_eq!(verdict, "fail", "{detail}");
    assert!(detail.contains("mutatingwebhookconfigurations"), "{detail}");
}
