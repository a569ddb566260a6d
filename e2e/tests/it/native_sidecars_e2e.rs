//! Where the sidecar goes, on the local cluster, through the operator a user installs: a
//! DiscoveryService with sidecar defaults (`spec.sidecar`) injects native sidecars (the local
//! API server is 1.37), so a Job's pod (`restartPolicy: Never`) whose application makes one
//! request through its Envoy and exits gets its answer from the EnvoyConfig on the first try,
//! reaches `Succeeded`, and has its Envoy stopped after the application. In the classic layout
//! with `hold-application-until-proxy-starts`, the application's first request succeeds too.
//! Needs root (pod runner), python3 and the built `marin3r` binary.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use marin3r_e2e::product::{install, python3};
use marin3r_local_cluster::cluster::{LocalCluster, create_restricted_namespace};
use marin3r_testkit::wait::until;
use serde_json::json;

const NS: &str = "batch";
const BODY: &str = "configured by marin3r";
/// The sidecar image the DiscoveryService defaults to: a mirror of Envoy's.
const MIRROR: &str = "mirror.local/envoyproxy/envoy:v1.40.0";

/// The application: one request through Envoy's listener, no retry. It exits 0 only when the
/// answer is the EnvoyConfig's, so a request sent before Envoy had its config fails the pod.
const FIRST_REQUEST_PY: &str = r#"
import sys, urllib.request
try:
    body = urllib.request.urlopen("http://127.0.0.1:8080/", timeout=5).read().decode()
except Exception as e:
    print("first request failed:", e, flush=True)
    sys.exit(1)
print("first request answered:", body, flush=True)
sys.exit(0 if body == "configured by marin3r" else 2)
"#;

const DISCOVERY_SERVICE: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: instance, namespace: batch}
spec:
  sidecar:
    image: mirror.local/envoyproxy/envoy:v1.40.0
    resources:
      requests: {cpu: 10m, memory: 32Mi}
      limits: {memory: 256Mi}
    imagePullSecrets: [{name: mirror-credentials}]
"#;

const ENVOY_CONFIG: &str = r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {name: job, namespace: batch}
spec:
  nodeID: job
  serialization: yaml
  envoyResources:
    listeners:
      - name: http
        value: |
          name: http
          address: { socket_address: { address: 0.0.0.0, port_value: 8080 }}
          filter_chains:
            - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: local
                    virtual_hosts:
                      - name: job
                        domains: ["*"]
                        routes:
                          - match: { prefix: "/" }
                            direct_response: { status: 200, body: { inline_string: "configured by marin3r" }}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

/// The pod a Job creates: `restartPolicy: Never`, one application container, Pod Security
/// `restricted`.
fn job_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut all = serde_json::Map::new();
    all.insert("marin3r.3scale.net/node-id".into(), "job".into());
    for (k, v) in annotations {
        all.insert((*k).into(), (*v).into());
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"marin3r.3scale.net/status": "enabled", "job-name": name},
            "annotations": all,
        },
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "app",
                "image": "probe-server",
                "command": ["python3", "-c", FIRST_REQUEST_PY],
                "securityContext": {
                    "runAsNonRoot": true,
                    "runAsUser": 1000,
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .unwrap()
}

fn status<'a>(list: Option<&'a Vec<ContainerStatus>>, name: &str) -> &'a ContainerStatus {
    list.into_iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status for container {name}"))
}

fn finished_at(c: &ContainerStatus) -> Time {
    let t = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    let t = t.unwrap_or_else(|| panic!("{} has not terminated: {c:?}", c.name));
    t.finished_at.clone().expect("finishedAt")
}

fn logs(cluster: &LocalCluster, pod: &str, containers: &[&str]) -> String {
    containers
        .iter()
        .filter_map(|c| Some((c, cluster.log_path(NS, pod, c)?)))
        .map(|(c, path)| {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            format!("--- {c}\n{log}")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_pod_with_a_native_sidecar_completes_and_its_first_request_is_served() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let images = marin3r_e2e::product::images()
        .with(MIRROR, envoy)
        .with("probe-server", python3());
    let installed = install(images).await.unwrap();
    let (cluster, client) = (&installed.cluster, installed.client.clone());
    create_restricted_namespace(&client, NS).await.unwrap();
    installed.apply(DISCOVERY_SERVICE).await.unwrap();
    installed.discovery_service_ready(NS, "instance").await;
    installed.apply(ENVOY_CONFIG).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let created = pods
        .create(&PostParams::default(), &job_pod("native", &[]))
        .await
        .unwrap();
    let spec = created.spec.clone().unwrap();
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["envoy-sidecar"], "{spec:?}");
    let envoy_spec = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(envoy_spec.restart_policy.as_deref(), Some("Always"));
    // The DiscoveryService's defaults: image, resources, pull Secret.
    assert_eq!(envoy_spec.image.as_deref(), Some(MIRROR));
    let resources = serde_json::to_value(&envoy_spec.resources).unwrap();
    assert_eq!(
        resources,
        json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
    );
    let secrets: Vec<&str> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["mirror-credentials"]);

    let done = until(
        "the Job's pod to reach Succeeded",
        Duration::from_secs(120),
        || async {
            let p = pods.get("native").await.ok()?;
            match p.status.as_ref()?.phase.as_deref() {
                Some("Succeeded") => Some(Ok(p)),
                Some("Failed") => Some(Err(p)),
                _ => None,
            }
        },
    )
    .await
    .unwrap_or_else(|p| {
        panic!(
            "the pod failed: {:?}\n{}",
            p.status,
            logs(cluster, "native", &["app", "envoy-sidecar"])
        )
    });
    let s = done.status.unwrap();
    let app = status(s.container_statuses.as_ref(), "app");
    let envoy = status(s.init_container_statuses.as_ref(), "envoy-sidecar");
    let app_log = logs(cluster, "native", &["app"]);
    assert!(
        app_log.contains(&format!("first request answered: {BODY}")),
        "{app_log}"
    );
    // Envoy ran until the application was done, then was stopped.
    assert!(
        finished_at(envoy) >= finished_at(app),
        "Envoy stopped before the application: {envoy:?} {app:?}"
    );

    // The classic layout, holding the application until Envoy is ready.
    let held = job_pod(
        "held",
        &[
            ("marin3r.3scale.net/native-sidecar", "false"),
            (
                "marin3r.3scale.net/hold-application-until-proxy-starts",
                "true",
            ),
        ],
    );
    let created = pods.create(&PostParams::default(), &held).await.unwrap();
    let names: Vec<String> = created
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["envoy-sidecar", "marin3r-hold", "app"]);
    let exit = until(
        "the held application to finish",
        Duration::from_secs(120),
        || async {
            let p = pods.get("held").await.ok()?;
            let s = p.status?;
            let app = s
                .container_statuses?
                .into_iter()
                .find(|c| c.name == "app")?;
            Some(app.state?.terminated?.exit_code)
        },
    )
    .await;
    assert_eq!(
        exit,
        0,
        "the held application's first request failed:\n{}",
        logs(cluster, "held", &["app", "marin3r-hold", "envoy-sidecar"])
    );
    pods.delete("held", &DeleteParams::default()).await.unwrap();
}
