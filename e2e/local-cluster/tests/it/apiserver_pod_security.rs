//! Pod Security admission on the local cluster, through real kubectl: a namespace labelled
//! `pod-security.kubernetes.io/enforce: restricted` refuses a pod that violates the level with
//! Kubernetes' message, accepts one that meets it, and (as a real server, which only warns
//! about templates) accepts a Deployment whatever its template; an unlabelled namespace
//! accepts everything.

use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use marin3r_testkit::kubectl::Kubectl;

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

const PRIORITY_POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: open}
spec:
  priorityClassName: CLASS
  containers: [{name: app, image: busybox}]
";

/// The Priority admission plugin: a pod naming a PriorityClass that does not exist is refused
/// (a real server does; the operator's `podPriorityClass` depends on it), one naming an
/// existing class gets its value, and classes are validated as a real server does.
#[tokio::test]
async fn pods_take_their_priority_class_value_and_a_missing_class_is_refused() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();
    kubectl.ok(&["create", "namespace", "open"]).await.unwrap();
    let pod = |name: &str, class: &str| PRIORITY_POD.replace("NAME", name).replace("CLASS", class);

    let out = kubectl
        .run_with(&["apply", "-f", "-"], &pod("early", "high"))
        .await
        .unwrap();
    assert!(!out.success);
    assert!(
        out.stderr
            .contains(r#"pods "early" is forbidden: no PriorityClass with name high was found"#),
        "{}",
        out.stderr
    );

    for (bad, why) in [
        ("{name: high}", "value: Required value"),
        ("{name: system-mine}", "'system-' prefix are reserved"),
        ("{name: huge}", "maximum allowed value"),
    ] {
        let value = if bad.contains("huge") {
            "2000000000"
        } else {
            "1"
        };
        let class = format!(
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {bad}\n{}",
            if bad.contains("high") {
                String::new()
            } else {
                format!("value: {value}\n")
            }
        );
        let out = kubectl
            .run_with(&["apply", "-f", "-"], &class)
            .await
            .unwrap();
        assert!(
            !out.success && out.stderr.contains(why),
            "{class}: {}",
            out.stderr
        );
    }
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: high}\nvalue: 1000\n",
        )
        .await
        .unwrap();
    kubectl
        .ok_with(&["apply", "-f", "-"], &pod("later", "high"))
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &pod("critical", "system-cluster-critical"),
        )
        .await
        .unwrap();
    for (name, priority) in [("later", "1000"), ("critical", "2000000000")] {
        let got = kubectl
            .ok(&[
                "get",
                "pod",
                name,
                "-n",
                "open",
                "-o",
                "jsonpath={.spec.priority}",
            ])
            .await
            .unwrap();
        assert_eq!(got.trim(), priority, "{name}");
    }
}
