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

/// An autoscaler with two misspelt fields, one nested.
const MISSPELT_HPA: &str = r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: typo, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplica: 2
  maxReplicas: 4
  behavior:
    scaleUp: {stabilisationWindowSeconds: 30}
"#;

const MISSPELT: [&str; 2] = [
    r#"unknown field "spec.behavior.scaleUp.stabilisationWindowSeconds""#,
    r#"unknown field "spec.minReplica""#,
];

async fn get_json(kubectl: &Kubectl, what: &str) -> serde_json::Value {
    let out = kubectl.ok(&["get", what, "-o", "json"]).await.unwrap();
    serde_json::from_str(&out).unwrap()
}

/// kubectl asks for `fieldValidation=Strict` by default: a misspelt field of a built-in kind
/// is refused on create, client-side apply (a strategic merge patch once the object exists)
/// and server-side apply, as a real server's strict decoding refuses it; `--validate=warn`
/// stores the object without it and says so; `--validate=false` drops it silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_refuses_misspelt_fields_of_built_in_kinds() {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();
    let strict = [
        vec!["create", "-f", "-"],
        vec!["apply", "-f", "-"],
        vec!["apply", "--server-side", "-f", "-"],
    ];
    for args in &strict {
        let out = kubectl.run_with(args, MISSPELT_HPA).await.unwrap();
        assert!(!out.success, "{args:?}: {out:?}");
        assert!(
            out.stderr.contains(
                "HorizontalPodAutoscaler in version \"v2\" cannot be handled as a \
                 HorizontalPodAutoscaler: strict decoding error: "
            ) && MISSPELT.iter().all(|m| out.stderr.contains(m)),
            "{args:?}: {}",
            out.stderr
        );
    }
    let out = kubectl.run(&["get", "hpa", "typo"]).await.unwrap();
    assert!(!out.success, "nothing was stored: {out:?}");

    // Warn: stored without the fields, one warning each.
    let out = kubectl
        .run_with(&["apply", "--validate=warn", "-f", "-"], MISSPELT_HPA)
        .await
        .unwrap();
    assert!(out.success, "{out:?}");
    for m in MISSPELT {
        assert!(
            out.stderr.contains(&format!("Warning: {m}")),
            "{}",
            out.stderr
        );
    }
    let hpa = get_json(&kubectl, "hpa/typo").await;
    assert_eq!(hpa["spec"]["minReplicas"], 1, "defaulted, not 2: {hpa}");
    assert!(hpa["spec"].get("minReplica").is_none(), "{hpa}");
    assert!(
        hpa["spec"]["behavior"]["scaleUp"]
            .get("stabilisationWindowSeconds")
            .is_none()
    );

    // Client-side apply to the existing object sends a strategic merge patch: still strict.
    let out = kubectl
        .run_with(&["apply", "-f", "-"], MISSPELT_HPA)
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    assert!(out.stderr.contains(MISSPELT[1]), "{}", out.stderr);

    // Ignore: dropped without a word.
    let budget = "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: typo, \
                  namespace: default}\nspec:\n  maxUnavailible: 1\n  selector: {matchLabels: \
                  {app: web}}\n";
    let out = kubectl
        .run_with(&["apply", "-f", "-"], budget)
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr
            .contains(r#"unknown field "spec.maxUnavailible""#),
        "{}",
        out.stderr
    );
    let out = kubectl
        .run_with(&["apply", "--validate=false", "-f", "-"], budget)
        .await
        .unwrap();
    assert!(out.success && !out.stderr.contains("Warning"), "{out:?}");
    let pdb = get_json(&kubectl, "pdb/typo").await;
    assert!(pdb["spec"].get("maxUnavailible").is_none(), "{pdb}");

    // Every built-in kind with a type: a Deployment's pod template too.
    let deployment = DEPLOYMENT.replace(
        "image: probe-server",
        "image: probe-server, imagePullPolice: Always",
    );
    let out = kubectl
        .run_with(&["apply", "-f", "-"], &deployment)
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr
            .contains(r#"unknown field "spec.template.spec.containers[0].imagePullPolice""#),
        "{}",
        out.stderr
    );
}
