//! The pod runner and Deployment controller driven through the local cluster's API, as a
//! user (or marin3r) drives them: Deployments roll, pods get statuses, Secrets propagate,
//! in-cluster credentials work, and nothing is left behind. Needs root and python3.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_local_cluster::kubelet::{ImageMap, PROBE_SERVER_PY, net};
use serde_json::json;

fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for the pod runner tests");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn cluster() -> LocalCluster {
    LocalCluster::start(LocalClusterConfig {
        images: ImageMap::new()
            .with_envoy(marin3r_testkit::tools::envoy().unwrap())
            .with("probe-server", python()),
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn namespace(client: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
    )
    .await
    .unwrap();
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

use marin3r_testkit::wait::until;

fn get(url: &str) -> String {
    marin3r_testkit::envoy::get_body(url).unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

fn deployment(version: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "demo"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "server", "image": "probe-server",
                    "command": ["python3", "-c", PROBE_SERVER_PY],
                    "env": [
                        {"name": "VERSION", "value": version},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
                    ],
                    "volumeMounts": [{"name": "creds", "mountPath": "/etc/m3r-test/creds", "readOnly": true}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
                }],
                "volumes": [{"name": "creds", "secret": {"secretName": "creds"}}]}
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_rolls_its_pod_new_ready_before_old_gone() {
    let cluster = cluster().await;
    let prefix = cluster.node().unwrap().prefix();
    let client = cluster.client();
    namespace(&client, "demo").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "demo");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "creds"}, "stringData": {"token": "one"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    // The pods run as the namespace's `default` ServiceAccount, which RBAC lets read pods
    // only (below, its token is refused Secrets).
    let roles: Api<Role> = Api::namespaced(client.clone(), "demo");
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}))
                .unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "demo");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "pod-reader"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"}, "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "demo"}]}))
                .unwrap(),
        )
        .await
        .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "demo");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "demo");
    let services: Api<Service> = Api::namespaced(client.clone(), "demo");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 8080}]}}))
                .unwrap(),
        )
        .await
        .unwrap();
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(deployment("v1")).unwrap(),
        )
        .await
        .unwrap();
    let first: Pod = until(
        "the first pod to be ready",
        Duration::from_secs(30),
        || async {
            pods.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(is_ready)
        },
    )
    .await;
    let ip = first.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let name = first.metadata.name.clone().unwrap();
    assert!(name.starts_with("web-"), "{name}");
    assert_eq!(get(&format!("http://{ip}:8080/")), format!("ok {name} v1"));
    assert_eq!(get(&format!("http://{ip}:8080/env/TOKEN")), "one");
    let status = first.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.ready && cs.state.as_ref().unwrap().running.is_some());
    // In-cluster credentials: the pod calls the API over HTTPS with the mounted CA and token.
    let answer = get(&format!(
        "http://{ip}:8080/api/api/v1/namespaces/demo/pods/{name}"
    ));
    assert!(
        answer.starts_with("200 ") && answer.contains(&name),
        "{answer}"
    );
    let denied = get(&format!(
        "http://{ip}:8080/api/api/v1/namespaces/demo/secrets"
    ));
    assert!(denied.contains("403"), "{denied}");
    assert_eq!(
        get(&format!(
            "http://{ip}:8080/file/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        )),
        "demo"
    );

    let d = until(
        "the deployment to be available",
        Duration::from_secs(20),
        || async {
            let d = deployments.get("web").await.unwrap();
            let s = d.status.clone()?;
            (s.ready_replicas == Some(1) && s.observed_generation == d.metadata.generation)
                .then_some(d)
        },
    )
    .await;
    let conditions = d.status.unwrap().conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")));

    // A Secret change reaches the mounted files through the ..data swap.
    secrets
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": "two"}})),
        )
        .await
        .unwrap();
    until(
        "the secret update in the container",
        Duration::from_secs(10),
        || async {
            (get(&format!("http://{ip}:8080/file/etc/m3r-test/creds/token")) == "two").then_some(())
        },
    )
    .await;

    // The kill fault: the container restarts and the API shows it.
    cluster.kill_container("demo", &name, "server").unwrap();
    until(
        "the restart in the pod status",
        Duration::from_secs(20),
        || async {
            let p = pods.get(&name).await.unwrap();
            let cs = &p.status.as_ref()?.container_statuses.as_ref()?[0];
            (cs.restart_count == 1 && cs.ready).then_some(())
        },
    )
    .await;

    // Roll: record every pod event from now on.
    let events = tokio::spawn({
        let pods = pods.clone();
        async move {
            let mut seen = Vec::new();
            let stream = watcher::watcher(pods, watcher::Config::default());
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        seen.push((p.metadata.name.clone().unwrap(), is_ready(&p), false));
                    }
                    watcher::Event::Delete(p) => {
                        seen.push((p.metadata.name.clone().unwrap(), false, true))
                    }
                    _ => {}
                }
                if seen.iter().any(|(_, _, deleted)| *deleted) {
                    return seen;
                }
            }
            seen
        }
    });
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{
            "name": "server", "image": "probe-server",
            "command": ["python3", "-c", PROBE_SERVER_PY],
            "env": [
                {"name": "VERSION", "value": "v2"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
            ],
            "volumeMounts": [{"name": "creds", "mountPath": "/etc/m3r-test/creds", "readOnly": true}],
            "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
        }]}}}})))
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(40), events)
        .await
        .expect("the old pod was deleted")
        .unwrap();
    let deleted_at = seen
        .iter()
        .position(|(n, _, d)| *d && n == &name)
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert!(
        seen[..deleted_at]
            .iter()
            .any(|(n, ready, _)| n != &name && *ready),
        "the new pod was ready before the old one went: {seen:?}"
    );
    let d = until(
        "the rolled deployment status",
        Duration::from_secs(20),
        || async {
            let d = deployments.get("web").await.unwrap();
            let s = d.status.clone()?;
            let done = s.replicas == Some(1)
                && s.updated_replicas == Some(1)
                && s.ready_replicas == Some(1)
                && s.observed_generation == d.metadata.generation
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"));
            done.then_some(d)
        },
    )
    .await;
    assert_eq!(d.status.unwrap().available_replicas, Some(1));
    let remaining = pods.list(&ListParams::default()).await.unwrap().items;
    let pods_seen: Vec<_> = remaining
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone(),
                p.status.as_ref().and_then(|s| s.pod_ip.clone()),
            )
        })
        .collect();
    assert_eq!(remaining.len(), 1);
    let new_ip = remaining[0]
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .clone()
        .unwrap();
    assert!(get(&format!("http://{new_ip}:8080/")).ends_with(" v2"));
    // The Service name is the Service's virtual IP, which now reaches the new pod.
    let vip = get(&format!(
        "http://{new_ip}:8080/resolve/web.demo.svc.cluster.local"
    ));
    assert_ne!(vip, new_ip, "a virtual IP, not a pod's");
    assert_eq!(get(&format!("http://{new_ip}:8080/resolve/web")), vip);
    until(
        "the Service's virtual IP to reach the new pod",
        Duration::from_secs(10),
        || async {
            get(&format!("http://{vip}:8080/"))
                .ends_with(" v2")
                .then_some(())
        },
    )
    .await;

    cluster.shutdown(Duration::from_secs(5)).await;
    let left: Vec<String> = net::netns_names()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "{left:?} of {:?}", pods_seen);
    assert!(!net::link_names().iter().any(|n| n.starts_with(&prefix)));
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&prefix)
    );
    assert!(!std::env::temp_dir().join(&prefix).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_statuses_show_pull_errors_and_missing_secrets() {
    let cluster = cluster().await;
    let client = cluster.client();
    namespace(&client, "errs").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "errs");
    // The kubelet and the controller survive dropped watches and failing requests.
    cluster.api().faults().drop_watches();
    cluster
        .api()
        .faults()
        .fail_next(3, 500, marin3r_local_cluster::apiserver::FaultScope::Watch);
    let pod = |name: &str, image: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image, "command": ["python3", "-c", PROBE_SERVER_PY],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "later", "key": "x"}}}]}]}
        }))
        .unwrap()
    };
    pods.create(&PostParams::default(), &pod("nginx", "nginx:1.27"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("waits", "probe-server"))
        .await
        .unwrap();
    let waiting = |p: &Pod| {
        p.status.as_ref()?.container_statuses.as_ref()?[0]
            .state
            .as_ref()?
            .waiting
            .as_ref()
            .map(|w| {
                (
                    w.reason.clone().unwrap_or_default(),
                    w.message.clone().unwrap_or_default(),
                )
            })
    };
    // ContainerCreating comes first (as on a real node); the pull error follows.
    let (reason, message) = until("a pull error", Duration::from_secs(10), || async {
        waiting(&pods.get("nginx").await.unwrap()).filter(|(r, _)| r != "ContainerCreating")
    })
    .await;
    assert_eq!(reason, "ErrImagePull");
    assert!(message.contains("nginx:1.27"), "{message}");
    let (reason, message) = until("a config error", Duration::from_secs(10), || async {
        waiting(&pods.get("waits").await.unwrap())
            .filter(|(r, _)| r == "CreateContainerConfigError")
    })
    .await;
    assert!(message.contains("later"), "{reason}: {message}");
    // The Secret appears: the container starts.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "errs");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "later"}, "stringData": {"x": "1"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    until("the pod to run", Duration::from_secs(20), || async {
        let p = pods.get("waits").await.unwrap();
        is_ready(&p).then_some(())
    })
    .await;
    // The kubelet recorded what happened as Events.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), "errs");
    until("the kubelet's events", Duration::from_secs(10), || async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        let about = |pod: &str, reason: &str| {
            list.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pod)
                    && e.reason.as_deref() == Some(reason)
            })
        };
        (about("nginx", "Failed") && about("waits", "Failed") && about("waits", "Started"))
            .then_some(())
    })
    .await;
    // Deleting a pod stops its process and frees its namespace.
    let uid_ns_count = net::netns_names()
        .iter()
        .filter(|n| n.starts_with(&cluster.node().unwrap().prefix()))
        .count();
    pods.delete("waits", &Default::default()).await.unwrap();
    until(
        "the pod's namespace to go",
        Duration::from_secs(20),
        || async {
            let now = net::netns_names()
                .iter()
                .filter(|n| n.starts_with(&cluster.node().unwrap().prefix()))
                .count();
            (now < uid_ns_count).then_some(())
        },
    )
    .await;
    cluster.shutdown(Duration::from_secs(5)).await;
}

/// A running pod's deletion is graceful, as on a real cluster: the pod stays, terminating
/// (`deletionTimestamp` at the end of its grace period), while its preStop hook runs and its
/// processes stop, and the kubelet removes it then; a zero grace period removes it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pod_terminates_before_it_goes() {
    let cluster = cluster().await;
    let client = cluster.client();
    namespace(&client, "grace").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "grace");
    for name in ["slow", "forced"] {
        let pod = json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 20,
                "containers": [{
                    "name": "server", "image": "probe-server",
                    "command": ["python3", "-c", PROBE_SERVER_PY],
                    "lifecycle": {"preStop": {"sleep": {"seconds": 2}}},
                }],
            },
        });
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
    }
    until("both pods to run", Duration::from_secs(30), || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        (list.items.len() == 2 && list.items.iter().all(is_ready)).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    let deleted = pods.delete("slow", &Default::default()).await.unwrap();
    let terminating = deleted.left().expect("the pod stays while it terminates");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(20));
    let pod = pods.get("slow").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some(), "{pod:?}");
    // A second deletion does not restart the clock; `kubectl get` says Terminating.
    pods.delete("slow", &Default::default()).await.unwrap();
    assert_eq!(
        pods.get("slow").await.unwrap().metadata.deletion_timestamp,
        pod.metadata.deletion_timestamp
    );
    until("the pod to go", Duration::from_secs(30), || async {
        pods.get_opt("slow").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "gone before its 2 s preStop hook ended: {:?}",
        started.elapsed()
    );
    // A zero grace period (`kubectl delete --grace-period=0 --force`) removes it at once.
    let forced = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("forced", &forced).await.unwrap();
    assert!(pods.get_opt("forced").await.unwrap().is_none());
    cluster.shutdown(Duration::from_secs(5)).await;
}
