//! A native sidecar through the whole local cluster, as a user sees it through the API and
//! kubectl: `initContainerStatuses` with `started`, `ready`, `restartCount` and state, the
//! READY column counting the sidecar, a killed sidecar restarted. Needs root and python3.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Namespace, Pod};
use kube::api::{Api, PostParams};
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_local_cluster::kubelet::{ImageMap, PROBE_SERVER_PY};
use marin3r_testkit::wait::until;
use serde_json::json;

const LONG: Duration = Duration::from_secs(30);

fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for the pod runner tests");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn sidecar_status(pod: &Pod) -> Option<ContainerStatus> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "proxy")
        .cloned()
}

fn ready(pod: &Pod) -> bool {
    marin3r_local_cluster::cluster::pod_ready(pod)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecars_status_reads_through_the_api_and_kubectl_as_on_a_real_cluster() {
    let cluster = LocalCluster::start(LocalClusterConfig {
        images: ImageMap::new().with("probe-server", python()),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let ns = format!("sidecar-{}", uuid::Uuid::new_v4().simple());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"terminationGracePeriodSeconds": 5,
            "initContainers": [{"name": "proxy", "image": "probe-server", "restartPolicy": "Always",
                "command": ["python3", "-c", PROBE_SERVER_PY],
                "env": [{"name": "PORT", "value": "9901"}],
                "startupProbe": {"tcpSocket": {"port": 9901}, "periodSeconds": 1, "failureThreshold": 30},
                "readinessProbe": {"httpGet": {"path": "/", "port": 9901}, "periodSeconds": 1}}],
            "containers": [{"name": "app", "image": "probe-server",
                "command": ["python3", "-c", PROBE_SERVER_PY]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let up = until("the pod Ready through the API", LONG, || async {
        Some(pods.get("web").await.ok()?).filter(ready)
    })
    .await;
    let proxy = sidecar_status(&up).unwrap();
    assert_eq!(
        (proxy.started, proxy.ready, proxy.restart_count),
        (Some(true), true, 0)
    );
    assert!(proxy.state.unwrap().running.is_some());
    // The sidecar's admin port answers on the pod's loopback, as Envoy's would.
    let answer = cluster
        .get_in_pod(&ns, "web", "http://127.0.0.1:9901/")
        .unwrap();
    assert!(answer.starts_with("ok"), "{answer}");

    let kubeconfig = tempfile::NamedTempFile::new().unwrap();
    cluster.api().write_kubeconfig(kubeconfig.path()).unwrap();
    let kubectl = marin3r_testkit::kubectl::Kubectl::new(kubeconfig.path()).unwrap();
    let table = kubectl
        .ok(&["get", "pod", "web", "-n", &ns, "--no-headers"])
        .await
        .unwrap();
    let columns: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(columns[..4], ["web", "2/2", "Running", "0"], "{table}");

    // A killed sidecar is restarted, and the API shows it.
    cluster.kill_container(&ns, "web", "proxy").unwrap();
    until("the sidecar restarted and ready", LONG, || async {
        let p = pods.get("web").await.ok()?;
        let proxy = sidecar_status(&p)?;
        (proxy.restart_count == 1 && proxy.ready && ready(&p)).then_some(())
    })
    .await;
    pods.delete("web", &Default::default()).await.unwrap();
    until("the pod gone", LONG, || async {
        pods.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    cluster.shutdown(Duration::from_secs(5)).await;
}
