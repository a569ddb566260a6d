//! The kubelet's side of the API: watches Pods, Secrets, ConfigMaps and Services, runs every
//! Pod on the `Node`, stops the ones deleted (and then removes from the API those whose
//! deletion was graceful, as kubelet does once their containers have stopped), rewrites volumes and hosts files when what they
//! show changes, and writes each Pod's status as a minimal merge patch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::tasks::{AbortOnDrop, watch_into_store};
use tokio::task::JoinHandle;

use super::{Node, Objects, PodHandle};

/// The RFC 7386 merge patch that turns `old` into `new` (`None` when they are equal).
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, nv) {
                            patch.insert(k.clone(), d);
                        }
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => (old != new).then(|| new.clone()),
    }
}

/// The Events a kubelet records for a status change (type, reason, note), as `kubectl
/// describe pod` shows them: containers started, failing to start, backing off, unready.
pub fn container_events(
    pod: &str,
    old: &k8s_openapi::api::core::v1::PodStatus,
    new: &k8s_openapi::api::core::v1::PodStatus,
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    let old_statuses = old.container_statuses.as_deref().unwrap_or_default();
    let all_new = new
        .init_container_statuses
        .iter()
        .flatten()
        .chain(new.container_statuses.iter().flatten());
    for c in all_new {
        let before = old_statuses
            .iter()
            .chain(old.init_container_statuses.iter().flatten())
            .find(|o| o.name == c.name);
        let state = |s: Option<&k8s_openapi::api::core::v1::ContainerStatus>| {
            s.and_then(|s| s.state.clone())
        };
        let (now, was) = (
            state(Some(c)).unwrap_or_default(),
            state(before).unwrap_or_default(),
        );
        let name = &c.name;
        if let Some(running) = &now.running
            && was.running.as_ref().map(|r| &r.started_at) != Some(&running.started_at)
        {
            events.push((
                EventType::Normal,
                "Started".into(),
                format!("Started container {name}"),
            ));
        }
        if let Some(waiting) = &now.waiting {
            let reason = waiting.reason.clone().unwrap_or_default();
            let changed =
                was.waiting.as_ref().and_then(|w| w.reason.clone()) != Some(reason.clone());
            let message = waiting.message.clone().unwrap_or_default();
            match reason.as_str() {
                "ErrImagePull"
                | "CreateContainerConfigError"
                | "CreateContainerError"
                | "RunContainerError"
                    if changed =>
                {
                    events.push((
                        EventType::Warning,
                        "Failed".into(),
                        format!("Error: {message}"),
                    ));
                }
                "CrashLoopBackOff" if changed => events.push((
                    EventType::Warning,
                    "BackOff".into(),
                    format!("Back-off restarting failed container {name} in pod {pod}"),
                )),
                _ => {}
            }
        }
        let was_ready = before.is_some_and(|b| b.ready);
        if was_ready && !c.ready && now.running.is_some() {
            events.push((
                EventType::Warning,
                "Unhealthy".into(),
                format!("Readiness probe failed for container {name}"),
            ));
        }
    }
    events
}

/// What pods read from the cluster, served from the watches' caches.
struct Cached {
    pods: Store<Pod>,
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    services: Store<Service>,
}

impl Objects for Cached {
    fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.secrets
            .get(&ObjectRef::new(name).within(namespace))
            .map(|s| (*s).clone())
    }
    fn config_map(&self, namespace: &str, name: &str) -> Option<ConfigMap> {
        self.config_maps
            .get(&ObjectRef::new(name).within(namespace))
            .map(|c| (*c).clone())
    }
    fn services(&self) -> Vec<Service> {
        self.services
            .state()
            .iter()
            .map(|s| (**s).clone())
            .collect()
    }
    fn pods(&self) -> Vec<Pod> {
        self.pods.state().iter().map(|p| (**p).clone()).collect()
    }
}

struct Running {
    handle: PodHandle,
    grace: Duration,
    _status_writer: AbortOnDrop,
}

/// The pods this kubelet runs, by uid, and the stops under way. Once `closed`, nothing new
/// is started (shutdown may race a reconcile pass on another thread).
#[derive(Default)]
struct RunState {
    pods: BTreeMap<String, Running>,
    stopping: Vec<JoinHandle<()>>,
    closed: bool,
}

type RunningPods = Arc<Mutex<RunState>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pod runner connected to an API server. Dropping it kills every pod at once;
/// `shutdown` stops them gracefully.
pub struct Kubelet {
    running: RunningPods,
    tasks: Vec<AbortOnDrop>,
}

impl Kubelet {
    /// Starts watching and returns once the caches are filled; pods start right after.
    pub async fn start(node: Arc<Node>, client: Client) -> anyhow::Result<Self> {
        let trigger = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let cached = Arc::new(Cached {
            pods: watch_into_store(
                Api::all(client.clone()),
                trigger.clone(),
                &mut tasks,
                "kubelet",
            ),
            secrets: watch_into_store(
                Api::all(client.clone()),
                trigger.clone(),
                &mut tasks,
                "kubelet",
            ),
            config_maps: watch_into_store(
                Api::all(client.clone()),
                trigger.clone(),
                &mut tasks,
                "kubelet",
            ),
            services: watch_into_store(
                Api::all(client.clone()),
                trigger.clone(),
                &mut tasks,
                "kubelet",
            ),
        });
        let ready = async {
            cached.pods.wait_until_ready().await?;
            cached.secrets.wait_until_ready().await?;
            cached.config_maps.wait_until_ready().await?;
            cached.services.wait_until_ready().await
        };
        tokio::time::timeout(Duration::from_secs(30), ready)
            .await
            .map_err(|_| anyhow::anyhow!("the kubelet's watches did not sync within 30 s"))??;
        let running: RunningPods = Arc::default();
        let state = running.clone();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "kubelet".into(),
                instance: Some(node.config().node_name.clone()),
            },
        );
        let objects: Arc<dyn Objects> = cached.clone();
        let services = super::service_proxy::ServiceProxy::new(node.clone(), objects)?;
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            loop {
                // Virtual IPs first: the pods' hosts files, rewritten next, point at them.
                services.sync();
                reconcile(&node, &client, &recorder, &cached, &state);
                trigger.notified().await;
                // Coalesce a burst of events into one pass.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })));
        Ok(Self { running, tasks })
    }

    /// The fault "kill a pod's process": SIGKILL to one container of a running pod; it is
    /// restarted by the pod's restart policy (and its restart count goes up).
    pub fn kill_container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> anyhow::Result<()> {
        let running = lock(&self.running);
        let found = running
            .pods
            .values()
            .find(|r| r.handle.namespace() == namespace && r.handle.name() == pod)
            .ok_or_else(|| anyhow::anyhow!("pod {namespace}/{pod} is not running on this node"))?;
        found.handle.kill_container(container)
    }

    /// A container's log file, while its pod runs.
    pub fn log_path(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<std::path::PathBuf> {
        lock(&self.running)
            .pods
            .values()
            .find(|r| r.handle.namespace() == namespace && r.handle.name() == pod)
            .map(|r| r.handle.log_path(container))
    }

    /// What the API server's `pods/portforward` connects through: the pods running here,
    /// without keeping them alive (the kubelet still owns them).
    pub fn pod_ports(&self) -> Arc<dyn crate::apiserver::PodPorts> {
        Arc::new(PodPorts(Arc::downgrade(&self.running)))
    }

    /// A running pod's network namespace.
    pub fn netns_path(&self, namespace: &str, pod: &str) -> Option<String> {
        lock(&self.running)
            .pods
            .values()
            .find(|r| r.handle.namespace() == namespace && r.handle.name() == pod)
            .and_then(|r| r.handle.netns_path())
    }

    /// Stops watching, then stops every pod, waiting at most `grace` for each.
    pub async fn shutdown(mut self, grace: Duration) {
        self.tasks.clear();
        let (pods, stopping) = {
            let mut state = lock(&self.running);
            state.closed = true;
            (
                std::mem::take(&mut state.pods),
                std::mem::take(&mut state.stopping),
            )
        };
        let stops = pods
            .into_values()
            .map(|r| r.handle.stop(r.grace.min(grace)));
        futures::future::join_all(stops).await;
        for task in stopping {
            let _ = task.await;
        }
    }
}

struct PodPorts(std::sync::Weak<Mutex<RunState>>);

impl crate::apiserver::PodPorts for PodPorts {
    fn connect(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> std::io::Result<std::net::TcpStream> {
        let netns = self
            .0
            .upgrade()
            .and_then(|running| {
                lock(&running)
                    .pods
                    .values()
                    .find(|r| r.handle.namespace() == namespace && r.handle.name() == pod)
                    .and_then(|r| r.handle.netns_path())
            })
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("pod {namespace}/{pod} is not running on this node"),
                )
            })?;
        super::net::connect_in_netns(&netns, port)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.tasks.clear();
        let pods = {
            let mut state = lock(&self.running);
            state.closed = true;
            std::mem::take(&mut state.pods)
        };
        // Dropping a handle kills its processes and removes its namespace at once.
        drop(pods);
    }
}

fn grace_of(pod: &Pod) -> Duration {
    let secs = pod
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

fn reconcile(
    node: &Arc<Node>,
    client: &Client,
    recorder: &Recorder,
    cached: &Arc<Cached>,
    running: &RunningPods,
) {
    let desired: BTreeMap<String, Arc<Pod>> = cached
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.metadata.uid.clone()?, p)))
        .collect();
    {
        let mut state = lock(running);
        if state.closed {
            return;
        }
        let uids: Vec<String> = state
            .pods
            .keys()
            .filter(|u| !desired.contains_key(*u))
            .cloned()
            .collect();
        for uid in uids {
            if let Some(r) = state.pods.remove(&uid) {
                tracing::info!(pod = %r.handle.name(), "stopping");
                // A graceful deletion's own grace period, else the pod's.
                let terminating = cached
                    .pods
                    .state()
                    .into_iter()
                    .find(|p| p.metadata.uid.as_ref() == Some(&uid));
                let grace = terminating.as_deref().map_or(r.grace, grace_of);
                let api: Api<Pod> = Api::namespaced(client.clone(), r.handle.namespace());
                let name = r.handle.name().to_owned();
                state.stopping.push(tokio::spawn(async move {
                    r.handle.stop(grace).await;
                    if terminating.is_some() {
                        remove_stopped(&api, &name, uid).await;
                    }
                }));
            }
        }
        state.stopping.retain(|t| !t.is_finished());
    }
    let objects: Arc<dyn Objects> = cached.clone();
    for (uid, pod) in &desired {
        if let Some(r) = lock(running).pods.get(uid) {
            r.handle.refresh(Some(pod));
            continue;
        }
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
            && pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .is_none()
        {
            // A pod this node could not start: not retried.
            continue;
        }
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        match PodHandle::start(node, pod, objects.clone()) {
            Ok(handle) => {
                tracing::info!(pod = %name, ip = %handle.ip(), "started");
                let base = pod
                    .status
                    .as_ref()
                    .and_then(|s| serde_json::to_value(s).ok())
                    .unwrap_or_else(|| json!({}));
                let events = (recorder.clone(), pod.object_ref(&()));
                let writer =
                    tokio::spawn(write_status(api, name, base, events, handle.watch_status()));
                let mut state = lock(running);
                if state.closed {
                    // Shut down meanwhile: dropping the handle kills the pod again.
                    return;
                }
                state.pods.insert(
                    uid.clone(),
                    Running {
                        grace: grace_of(pod),
                        handle,
                        _status_writer: AbortOnDrop(writer),
                    },
                );
            }
            Err(e) => {
                tracing::warn!(pod = %name, "cannot start: {e:#}");
                let message = format!("{e:#}");
                tokio::spawn(async move {
                    let patch = json!({"status": {"phase": "Failed", "reason": "NodeError", "message": message}});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await;
                });
            }
        }
    }
}

/// Removes a pod whose graceful deletion this kubelet has carried out: a zero grace period,
/// for exactly this pod (its uid), so a pod recreated under the same name is left alone.
async fn remove_stopped(api: &Api<Pod>, name: &str, uid: String) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => tracing::info!(pod = %name, "stopped and removed"),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
        Err(e) => tracing::warn!(pod = %name, "cannot remove the stopped pod: {e}"),
    }
}

/// Writes every status change as the merge patch from what the server last had.
async fn write_status(
    api: Api<Pod>,
    name: String,
    mut base: Value,
    (recorder, reference): (Recorder, k8s_openapi::api::core::v1::ObjectReference),
    mut rx: tokio::sync::watch::Receiver<k8s_openapi::api::core::v1::PodStatus>,
) {
    let mut last = k8s_openapi::api::core::v1::PodStatus::default();
    loop {
        let status = rx.borrow_and_update().clone();
        for (type_, reason, note) in container_events(&name, &last, &status) {
            let event = Event {
                type_,
                reason,
                note: Some(note),
                action: "Sync".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(pod = %name, "recording an event: {e}");
            }
        }
        last = status.clone();
        let new = serde_json::to_value(&status).unwrap_or_else(|_| json!({}));
        let mut retry = false;
        if let Some(diff) = merge_diff(&base, &new) {
            let patch = Patch::Merge(json!({ "status": diff }));
            match api
                .patch_status(&name, &PatchParams::default(), &patch)
                .await
            {
                Ok(pod) => {
                    base = pod
                        .status
                        .and_then(|s| serde_json::to_value(s).ok())
                        .unwrap_or(new);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return,
                Err(e) => {
                    tracing::warn!(pod = %name, "writing status: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if let Ok(pod) = api.get_status(&name).await {
                        base = pod
                            .status
                            .and_then(|s| serde_json::to_value(s).ok())
                            .unwrap_or_else(|| json!({}));
                    }
                    retry = true;
                }
            }
        }
        if !retry && rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_diffs_set_changed_fields_and_null_removed_ones() {
        let old = json!({"phase": "Pending", "state": {"waiting": {"reason": "X"}}, "keep": 1});
        let new = json!({"phase": "Running", "state": {"running": {"startedAt": "t"}}, "keep": 1});
        assert_eq!(
            merge_diff(&old, &new),
            Some(
                json!({"phase": "Running", "state": {"running": {"startedAt": "t"}, "waiting": null}})
            )
        );
        assert_eq!(merge_diff(&new, &new), None);
        assert_eq!(
            merge_diff(&json!({"a": [1]}), &json!({"a": [2]})),
            Some(json!({"a": [2]}))
        );
    }

    fn status(state: serde_json::Value, ready: bool) -> k8s_openapi::api::core::v1::PodStatus {
        serde_json::from_value(json!({"containerStatuses": [
            {"name": "c", "image": "i", "imageID": "", "ready": ready, "restartCount": 0, "state": state}
        ]}))
        .unwrap()
    }

    #[test]
    fn status_changes_become_kubelet_events_once() {
        let none = k8s_openapi::api::core::v1::PodStatus::default();
        let pull = status(
            json!({"waiting": {"reason": "ErrImagePull", "message": "no binary"}}),
            false,
        );
        let events = container_events("p", &none, &pull);
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].1.as_str(), events[0].2.as_str()),
            ("Failed", "Error: no binary")
        );
        assert!(container_events("p", &pull, &pull).is_empty());
        let running = status(
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
            true,
        );
        let events = container_events("p", &pull, &running);
        assert_eq!(events[0].1, "Started");
        let unready = status(
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
            false,
        );
        assert_eq!(container_events("p", &running, &unready)[0].1, "Unhealthy");
        let backoff = status(json!({"waiting": {"reason": "CrashLoopBackOff"}}), false);
        assert_eq!(container_events("p", &running, &backoff)[0].1, "BackOff");
    }
}
