//! Pod Security admission on the local cluster, through real kubectl: a namespace labelled
//! `pod-security.kubernetes.io/enforce: restricted` refuses a pod that violates the level with
//! Kubernetes' message, accepts one that meets it, and (as a real server, which only warns
//! about templates) accepts a Deployment whatever its template; an unlabelled namespace
//! accepts everything.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use marin3r_e2e::apiserver::{ApiServer, ApiServerConfig};
use marin3r_e2e::kubectl::Kubectl;

const BARE_POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: bare, namespace: NS}
spec:
  containers: [{name: app, image: busybox}]
";

const RESTRICTED_POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: good, namespace: NS}
spec:
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: app
    image: busybox
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
";

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: NS}
spec:
  selector: {matchLabels: {app: d}}
  template:
    metadata: {labels: {app: d}}
    spec:
      containers: [{name: app, image: busybox}]
";

#[tokio::test]
async fn a_restricted_namespace_refuses_pods_that_violate_it() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();
    for ns in ["locked", "open"] {
        kubectl.ok(&["create", "namespace", ns]).await.unwrap();
    }
    kubectl
        .ok(&[
            "label",
            "namespace",
            "locked",
            "pod-security.kubernetes.io/enforce=restricted",
        ])
        .await
        .unwrap();

    let apply = |manifest: &str, ns: &str| manifest.replace("NS", ns);
    let out = kubectl
        .run_with(&["apply", "-f", "-"], &apply(BARE_POD, "locked"))
        .await
        .unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains(
            r#"pods "bare" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "app" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "app" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "app" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "app" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
        ),
        "{}",
        out.stderr
    );
    kubectl
        .ok_with(&["apply", "-f", "-"], &apply(RESTRICTED_POD, "locked"))
        .await
        .unwrap();
    kubectl
        .ok_with(&["apply", "-f", "-"], &apply(DEPLOYMENT, "locked"))
        .await
        .unwrap();
    kubectl
        .ok_with(&["apply", "-f", "-"], &apply(BARE_POD, "open"))
        .await
        .unwrap();
    let pods = kubectl
        .ok(&["get", "pods", "-n", "locked", "-o", "name"])
        .await
        .unwrap();
    assert_eq!(pods.trim(), "pod/good");
}
