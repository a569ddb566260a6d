//! What the API server refuses around native sidecars, as a real one does and in its words:
//! `restartPolicy` on an app container or other than `Always` on an init container, probes
//! and lifecycle hooks on a regular init container, a startup probe passing more than once.
//! Through kube-rs (the 422 and its causes) and the real kubectl (what a user reads).

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::{Api, Client};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use serde_json::{Value, json};

async fn setup() -> (ApiServer, Client, String) {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let ns = format!("sidecars-{}", uuid::Uuid::new_v4().simple());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    (server, client, ns)
}

fn mk_pod(name: &str, init: Value, containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"initContainers": init, "containers": containers}})
}

/// The API server's answer to creating `pod`: its message on a refusal.
async fn create(client: &Client, ns: &str, pod: Value) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(pod).unwrap();
    match pods.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => {
            assert_eq!(
                (s.code, s.reason.as_str()),
                (422, "Invalid"),
                "{}",
                s.message
            );
            Err(s.message)
        }
        Err(other) => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_probes_and_hooks_are_refused_where_a_real_api_server_refuses_them() {
    let (_server, client, ns) = setup().await;
    let app = json!([{"name": "app", "image": "x"}]);
    let probe = json!({"exec": {"command": ["true"]}});
    // A sidecar with every probe and a hook is fine.
    let sidecar = json!({"name": "proxy", "image": "x", "restartPolicy": "Always",
        "startupProbe": probe, "readinessProbe": probe, "livenessProbe": probe,
        "lifecycle": {"preStop": {"exec": {"command": ["true"]}}}});
    create(&client, &ns, mk_pod("fine", json!([sidecar]), app.clone()))
        .await
        .unwrap();

    let bad = mk_pod(
        "on-failure",
        json!([{"name": "setup", "image": "x", "restartPolicy": "OnFailure"}]),
        app.clone(),
    );
    assert_eq!(
        create(&client, &ns, bad).await.unwrap_err(),
        r#"Pod "on-failure" is invalid: spec.initContainers[0].restartPolicy: Unsupported value: "OnFailure": supported values: "Always""#
    );
    let bad = mk_pod(
        "app-policy",
        json!([]),
        json!([{"name": "app", "image": "x", "restartPolicy": "Always"}]),
    );
    assert_eq!(
        create(&client, &ns, bad).await.unwrap_err(),
        r#"Pod "app-policy" is invalid: spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers"#
    );
    let bad = mk_pod(
        "init-probes",
        json!([{"name": "setup", "image": "x", "startupProbe": probe,
            "lifecycle": {"postStart": {"exec": {"command": ["true"]}}}}]),
        app.clone(),
    );
    assert_eq!(
        create(&client, &ns, bad).await.unwrap_err(),
        "Pod \"init-probes\" is invalid: [\
         spec.initContainers[0].lifecycle: Forbidden: may not be set for init containers without restartPolicy=Always, \
         spec.initContainers[0].startupProbe: Forbidden: may not be set for init containers without restartPolicy=Always]"
    );
    let mut twice = probe.clone();
    twice["successThreshold"] = json!(2);
    let bad = mk_pod(
        "threshold",
        json!([{"name": "proxy", "image": "x", "restartPolicy": "Always", "startupProbe": twice}]),
        app.clone(),
    );
    assert_eq!(
        create(&client, &ns, bad).await.unwrap_err(),
        r#"Pod "threshold" is invalid: spec.initContainers[0].startupProbe.successThreshold: Invalid value: 2: must be 1"#
    );
    // A Deployment's pod template is validated the same way.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let bad: Deployment = serde_json::from_value(json!({"metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
            "metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "app", "image": "x", "restartPolicy": "Never"}]}}}}))
    .unwrap();
    let err = deployments
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "spec.template.spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers"
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_api_servers_words_for_a_bad_sidecar() {
    let (server, _client, ns) = setup().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = marin3r_testkit::kubectl::Kubectl::new(&kubeconfig).unwrap();
    let manifest = mk_pod(
        "bad-sidecar",
        json!([{"name": "proxy", "image": "x", "restartPolicy": "Never"}]),
        json!([{"name": "app", "image": "x"}]),
    );
    let out = kubectl
        .run_with(
            &["apply", "-n", &ns, "-f", "-"],
            &serde_json::to_string(&manifest).unwrap(),
        )
        .await
        .unwrap();
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr.contains(
            r#"The Pod "bad-sidecar" is invalid: spec.initContainers[0].restartPolicy: Unsupported value: "Never": supported values: "Always""#
        ),
        "{}",
        out.stderr
    );
}
