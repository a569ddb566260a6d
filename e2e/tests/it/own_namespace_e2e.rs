//! A DiscoveryService in an application namespace (the original MARIN3R's model) on the
//! local cluster, driven through kubectl: a namespace admin, who may only manage
//! DiscoveryServices and workloads in their namespace, creates one; it serves that namespace
//! (an annotated pod there is injected and its real Envoy gets its config over mTLS xDS),
//! reaches nothing outside it (pods elsewhere are not sent to its webhook, its discovery pod
//! cannot read other namespaces' Secrets), and one listing another namespace is refused.
//! Needs root (pod runner) and the built `marin3r` binary (`cargo build -p
//! marin3r-discovery`).

use marin3r_testkit::wait::until;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_discovery::api::discovery_service::DiscoveryService;
use marin3r_e2e::product::{discovery_service_ready, example_in};
use marin3r_local_cluster::cluster::create_restricted_namespace;
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_testkit::kubectl::Kubectl;
use serde_json::json;

const APP: &str = "shop";
const BODY: &str = "hello from marin3r";

fn repo() -> PathBuf {
    marin3r_testkit::tools::repo_root()
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

/// What a namespace admin of `ns` may do there: DiscoveryServices, EnvoyConfigs and
/// workloads, nothing cluster-wide.
fn namespace_admin(ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: admin, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: admin, namespace: {ns}}}
rules:
  - apiGroups: [operator.marin3r.3scale.net]
    resources: [discoveryservices]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [marin3r.3scale.net]
    resources: [envoyconfigs]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: admin, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: admin}}
subjects:
  - {{kind: ServiceAccount, name: admin, namespace: {ns}}}
"#
    )
}

/// `kubectl` with `args` (as the namespace admin), `manifest` on standard input.
async fn apply_as_admin_text(kubectl: &Kubectl, args: &[String], manifest: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl.ok_with(&args, manifest).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_service_in_its_own_namespace_serves_that_namespace_only() {
    let images = marin3r_e2e::product::images();
    images
        .resolve(marin3r_discovery::IMAGE)
        .expect("build the marin3r binary first: cargo build -p marin3r-discovery");
    let cluster = LocalCluster::start(LocalClusterConfig {
        images,
        log_dir: std::env::var_os("MARIN3R_E2E_LOG_DIR").map(PathBuf::from),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.api().write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();
    let manifests = repo().join("manifests");
    kubectl
        .ok(&["apply", "--server-side", "-k", manifests.to_str().unwrap()])
        .await
        .unwrap();
    for ns in [APP, "other", "team-y", "team-z"] {
        create_restricted_namespace(&client, ns).await.unwrap();
    }
    kubectl
        .ok_with(&["apply", "-f", "-"], &namespace_admin(APP))
        .await
        .unwrap();
    let token = cluster.api().service_account_token(APP, "admin");
    let token_flag = format!("--token={token}");
    let as_admin = |args: &[&str]| {
        let mut all = vec![token_flag.as_str()];
        all.extend_from_slice(args);
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };

    // The namespace admin creates the discovery service, then (once its webhooks answer) the
    // config and the workload.
    let apply_as_admin = |file: &'static str| {
        let args = as_admin(&["apply", "--server-side", "-f", "-"]);
        let kubectl = &kubectl;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl
                .ok_with(&args, &example_in(file, APP).unwrap())
                .await
                .unwrap();
        }
    };
    apply_as_admin("discoveryservice-own-namespace.yaml").await;
    // ...who may not reach into the operator's namespace (a check that RBAC is on for them).
    let args = as_admin(&["get", "secrets", "-n", "marin3r-system"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kubectl.run(&args).await.unwrap();
    assert!(!out.success);
    assert!(out.stderr.contains("forbidden"), "{out:?}");

    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), APP);
    let ds = until(
        "the DiscoveryService to be Ready",
        Duration::from_secs(120),
        || async {
            let ds = dss.get("instance").await.ok()?;
            (discovery_service_ready(&ds)?.0 == "True").then_some(ds)
        },
    )
    .await;
    assert_eq!(ds.status.unwrap().enabled_namespaces, [APP]);
    let out = kubectl
        .ok(&["get", "discoveryservices", "-n", APP])
        .await
        .unwrap();
    assert!(out.contains("instance") && out.contains("True"), "{out}");
    apply_as_admin("envoyconfig.yaml").await;
    apply_as_admin("deployment.yaml").await;

    // Its validating webhook judges the EnvoyConfigs of its namespace, and only those.
    let typo = example_in("envoyconfig.yaml", APP)
        .unwrap()
        .replace("name: demo-proxy", "name: typo")
        .replace("stat_prefix: http", "stat_prefx: http");
    let args = as_admin(&["apply", "--server-side", "-f", "-"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refused = kubectl.run_with(&args, &typo).await.unwrap();
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused.stderr.contains(
            "admission webhook \"instance.shop.envoyconfig-validator.marin3r.3scale.net\" denied the request: spec.envoyResources.listeners[0].value: "
        ) && refused.stderr.contains("stat_prefx"),
        "{refused:?}"
    );
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &typo.replace("namespace: shop", "namespace: other"),
        )
        .await
        .unwrap();

    // An annotated pod there is injected and its real Envoy serves the EnvoyConfig.
    let pods: Api<Pod> = Api::namespaced(client.clone(), APP);
    let pod = until(
        "the injected pod to serve its config",
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=demo"))
                .await
                .unwrap();
            list.items.into_iter().find(|p| {
                marin3r_local_cluster::cluster::pod_ready(p)
                    && marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", pod_ip(p)))
                        .ok()
                        .as_deref()
                        == Some(BODY)
            })
        },
    )
    .await;
    // The local API server is 1.37: Envoy is a native sidecar, an init container.
    let names = |list: &[k8s_openapi::api::core::v1::Container]| -> Vec<String> {
        list.iter().map(|c| c.name.clone()).collect()
    };
    let injected = pod.spec.clone().unwrap();
    assert_eq!(names(&injected.containers), ["app"]);
    assert_eq!(
        names(injected.init_containers.as_deref().unwrap_or_default()),
        ["envoy-sidecar"]
    );

    // Its webhook sees only its namespace: the same pod elsewhere is created as it is.
    let mut spec = pod.spec.clone().unwrap();
    spec.containers.retain(|c| c.name == "app");
    spec.init_containers = None;
    spec.volumes = None;
    spec.node_name = None;
    let elsewhere: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "probe",
            "namespace": "other",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {"marin3r.3scale.net/node-id": "demo-proxy"},
        },
        "spec": spec,
    }))
    .unwrap();
    let created = Api::<Pod>::namespaced(client.clone(), "other")
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &elsewhere,
        )
        .await
        .unwrap();
    let created = created.spec.unwrap();
    assert_eq!(created.containers.len(), 1);
    assert!(created.init_containers.is_none());

    // A second DiscoveryService in the namespace is refused, naming the one that serves it,
    // and a pod cannot choose it: one owner for the namespace's configs and certificate.
    apply_as_admin_text(
        &kubectl,
        &as_admin(&["apply", "--server-side", "-f", "-"]),
        "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
         metadata: {name: second, namespace: shop}\nspec: {}\n",
    )
    .await;
    let (status, reason, message) = until(
        "the second DiscoveryService to be refused",
        Duration::from_secs(60),
        || async { discovery_service_ready(&dss.get("second").await.ok()?) },
    )
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NamespaceAlreadyServed")
    );
    assert!(
        message.contains("DiscoveryService \"instance\""),
        "{message}"
    );
    let mut choosing = elsewhere.clone();
    choosing.metadata.namespace = Some(APP.into());
    choosing.annotations_mut().insert(
        "marin3r.3scale.net/discovery-service.name".into(),
        "second".into(),
    );
    let denied = pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &choosing,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        denied.contains("a namespace has one DiscoveryService"),
        "{denied}"
    );
    dss.delete("second", &DeleteParams::default())
        .await
        .unwrap();

    // Its discovery pod's identity reads its own namespace only.
    let sa = cluster.api().service_account_token(APP, "marin3r-instance");
    let sa_flag = format!("--token={sa}");
    let out = kubectl
        .run(&[&sa_flag, "get", "secrets", "-n", "marin3r-system"])
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    let out = kubectl
        .run(&[&sa_flag, "get", "envoyconfigs", "-A"])
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    let out = kubectl
        .ok(&[&sa_flag, "get", "envoyconfigs", "-n", APP])
        .await
        .unwrap();
    assert!(out.contains("demo-proxy"), "{out}");

    // A discovery service in team-y listing team-z is refused, and nothing reaches team-z.
    let reaching = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: reach, namespace: team-y}
spec:
  enabledNamespaces: [team-y, team-z]
"#;
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], reaching)
        .await
        .unwrap();
    let refused: Api<DiscoveryService> = Api::namespaced(client.clone(), "team-y");
    let (_, _, message) = until(
        "the reaching DiscoveryService refused",
        Duration::from_secs(60),
        || async {
            let ds = refused.get("reach").await.ok()?;
            discovery_service_ready(&ds)
                .filter(|(status, reason, _)| status == "False" && reason == "ForbiddenNamespace")
        },
    )
    .await;
    assert!(
        message.starts_with("spec.enabledNamespaces[1]: \"team-z\" is another namespace"),
        "{message}"
    );
    let out = kubectl
        .ok(&["describe", "discoveryservice", "reach", "-n", "team-y"])
        .await
        .unwrap();
    assert!(out.contains("ForbiddenNamespace"), "{out}");
    assert!(
        Api::<Secret>::namespaced(client.clone(), "team-z")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Deleted: its webhook configurations go with it.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let gone = || async {
        webhooks
            .get_opt("marin3r-ns.shop.instance")
            .await
            .unwrap()
            .is_none()
            && validating
                .get_opt("marin3r-ns.shop.instance")
                .await
                .unwrap()
                .is_none()
    };
    assert!(
        webhooks
            .get_opt("marin3r-ns.shop.instance")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        validating
            .get_opt("marin3r-ns.shop.instance")
            .await
            .unwrap()
            .is_some()
    );
    dss.delete("instance", &DeleteParams::default())
        .await
        .unwrap();
    until(
        "the webhook configurations removed",
        Duration::from_secs(60),
        || async { gone().await.then_some(()) },
    )
    .await;
    let names: Vec<String> = webhooks
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(names.iter().all(|n| !n.contains("team-y")), "{names:?}");
    cluster.shutdown(Duration::from_secs(5)).await;
}
