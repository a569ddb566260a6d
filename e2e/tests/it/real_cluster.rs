//! The real cluster (`hack/cluster`) through the test kit: started or reused, attached to
//! through its kubeconfig as `MARIN3R_E2E_KUBECONFIG` does, an image archive written here and
//! loaded, a pod running it, `kubectl logs`, `get events` and `explain` answering as a real
//! cluster does, and an image that was never loaded failing on the closed loopback port
//! instead of reaching a registry.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use marin3r_testkit::cluster::Cluster;
use marin3r_testkit::kubectl::Kubectl;
use marin3r_testkit::tools::repo_root;
use marin3r_testkit::wait;

/// Deletes the test's namespace however the test ends.
struct Namespace {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if let Ok(kubectl) = marin3r_testkit::tools::kubectl() {
            let _ = Command::new(kubectl)
                .args(["delete", "namespace", &self.name, "--wait=false"])
                .env("KUBECONFIG", &self.kubeconfig)
                .output();
        }
    }
}

/// The pause image of `hack/image`, under another name: an image the cluster has never seen.
fn pause_archive(dir: &Path, name: &str) -> std::path::PathBuf {
    let out = Command::new(repo_root().join("hack/image"))
        .args(["pause", "--tag", name, "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/image pause --tag {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let archive = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(archive.starts_with(dir), "{}", archive.display());
    archive
}

fn pod(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: main\n    \
         image: {image}\n    imagePullPolicy: IfNotPresent\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_real_cluster_runs_a_loaded_image_and_never_pulls() {
    let local = tokio::task::spawn_blocking(Cluster::start)
        .await
        .unwrap()
        .unwrap();
    assert!(local.is_local());

    // Attached as MARIN3R_E2E_KUBECONFIG=PATH attaches, to a copy of the kubeconfig.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("kubeconfig");
    std::fs::copy(local.kubeconfig(), &copy).unwrap();
    let attached = Cluster::from_env_value(Some(copy.as_os_str())).unwrap();
    assert!(!attached.is_local());
    let client = attached.client().await.unwrap();
    let nodes = Api::<Node>::all(client)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(nodes.items.len(), 1, "one node");
    let info = nodes.items[0]
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .unwrap();
    assert_eq!(info.kubelet_version, "v1.36.3");
    assert!(
        info.container_runtime_version
            .starts_with("containerd://2.4."),
        "{info:?}"
    );

    let unique = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let ns = Namespace {
        name: format!("real-cluster-{}-{unique}", std::process::id()),
        kubeconfig: copy.clone(),
    };
    let kubectl = attached.kubectl().unwrap();
    kubectl
        .ok(&["create", "namespace", &ns.name])
        .await
        .unwrap();

    // An archive written here, loaded into the node's containerd, run.
    let image = format!("marin3r.test/loaded-{unique}:1");
    let archive = pause_archive(dir.path(), &image);
    tokio::task::spawn_blocking({
        let local = local.clone();
        move || local.load(&archive)
    })
    .await
    .unwrap()
    .unwrap();
    kubectl
        .ok_with(
            &["apply", "-n", &ns.name, "-f", "-"],
            &pod("loaded", &image),
        )
        .await
        .unwrap();
    kubectl
        .ok(&[
            "wait",
            "-n",
            &ns.name,
            "--for=condition=Ready",
            "pod/loaded",
            "--timeout=60s",
        ])
        .await
        .unwrap();
    // The pause program writes nothing: logs answer, empty.
    assert_eq!(
        kubectl
            .ok(&["logs", "-n", &ns.name, "loaded"])
            .await
            .unwrap(),
        ""
    );
    let events = kubectl
        .ok(&["get", "events", "-n", &ns.name])
        .await
        .unwrap();
    for reason in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(events.contains(reason), "no {reason} event:\n{events}");
    }
    let explained = kubectl
        .ok(&["explain", "pod.spec.initContainers.restartPolicy"])
        .await
        .unwrap();
    assert!(explained.contains("FIELD: restartPolicy"), "{explained}");

    // An image nobody loaded: the pull goes to the closed loopback port, never a registry.
    kubectl
        .ok_with(
            &["apply", "-n", &ns.name, "-f", "-"],
            &pod("never-loaded", "docker.io/library/marin3r-never-loaded:1"),
        )
        .await
        .unwrap();
    let failure = wait::until(
        "the pull of a never-loaded image to fail",
        Duration::from_secs(60),
        || events_of(&kubectl, &ns.name, "never-loaded"),
    )
    .await;
    assert!(failure.contains("127.0.0.1:1"), "{failure}");
    assert!(failure.contains("connection refused"), "{failure}");
}

async fn events_of(kubectl: &Kubectl, ns: &str, pod: &str) -> Option<String> {
    let out = kubectl
        .ok(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("involvedObject.name={pod},reason=Failed"),
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .await
        .ok()?;
    out.contains("Failed to pull").then_some(out)
}
