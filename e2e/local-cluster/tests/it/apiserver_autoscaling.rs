//! Real kubectl against the local API server: `kubectl scale` through a Deployment's
//! `scale` subresource (and RBAC on `deployments/scale`), autoscaling/v2
//! HorizontalPodAutoscalers defaulted and validated as kube-apiserver does, and policy/v1
//! PodDisruptionBudgets refused when kube-apiserver refuses them.

use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use marin3r_testkit::kubectl::Kubectl;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: app, image: probe-server}]}
"#;

const HPA: &str = r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  maxReplicas: 4
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scales_deployments_and_the_server_judges_autoscalers_and_budgets() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();
    kubectl
        .ok_with(&["apply", "-f", "-"], DEPLOYMENT)
        .await
        .unwrap();

    // kubectl scale writes the scale subresource; the Deployment's replicas follow.
    kubectl
        .ok(&["scale", "deployment/web", "--replicas=3"])
        .await
        .unwrap();
    let replicas = kubectl
        .ok(&[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .await
        .unwrap();
    assert_eq!(replicas.trim(), "3");
    let scale = kubectl
        .ok(&[
            "get",
            "--raw",
            "/apis/apps/v1/namespaces/default/deployments/web/scale",
        ])
        .await
        .unwrap();
    let scale: serde_json::Value = serde_json::from_str(&scale).unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "app=web");
    let out = kubectl
        .run(&["scale", "deployment/web", "--replicas=-1"])
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");

    // An autoscaler is defaulted (minReplicas, the 80% CPU metric) and served with its
    // short name.
    kubectl.ok_with(&["apply", "-f", "-"], HPA).await.unwrap();
    let hpa = kubectl
        .ok(&["get", "hpa", "web", "-o", "json"])
        .await
        .unwrap();
    let hpa: serde_json::Value = serde_json::from_str(&hpa).unwrap();
    assert_eq!(hpa["spec"]["minReplicas"], 1);
    assert_eq!(
        hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        80
    );
    let bad = HPA.replace("maxReplicas: 4", "maxReplicas: 4\n  minReplicas: 5");
    let out = kubectl.run_with(&["apply", "-f", "-"], &bad).await.unwrap();
    assert!(!out.success);
    assert!(
        out.stderr.contains(
            "spec.maxReplicas: Invalid value: 4: must be greater than or equal to `minReplicas`"
        ),
        "{out:?}"
    );
    let bad = HPA.replace(
        "maxReplicas: 4",
        "maxReplicas: 4\n  metrics: [{type: Resource, resource: {name: cpu, target: {type: Utilization}}}]",
    );
    let out = kubectl.run_with(&["apply", "-f", "-"], &bad).await.unwrap();
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("must set either a target raw value or a target utilization"),
        "{out:?}"
    );

    let pdb = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 1
  maxUnavailable: 1
  selector: {matchLabels: {app: web}}
"#;
    let out = kubectl.run_with(&["apply", "-f", "-"], pdb).await.unwrap();
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("minAvailable and maxUnavailable cannot be both set"),
        "{out:?}"
    );
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &pdb.replace("  maxUnavailable: 1\n", ""),
        )
        .await
        .unwrap();
}
