//! One running Pod: its network namespace, volume and hosts files, and a supervisor task per
//! container (`lifecycle` orders them: init containers and sidecars, then the app) that
//! starts the process, runs its probes, restarts it and stops it. Status is published on a watch
//! channel; the owner decides where it goes (the API server, or a test).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::launcher::{self, Launch, Mount};
use super::lifecycle::run_pod;
use super::net::PodNetwork;
use super::runtime::{self, ContainerRuntime, PodFacts, State};
use super::supervisor::signal_group;
use super::{Node, Objects, env, hosts, volumes};

/// A container of the pod: one of `spec.initContainers` or of `spec.containers`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Which {
    Init(usize),
    Main(usize),
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const SERVICE_ACCOUNT_VOLUME: &str = "..kube-api-access";

pub(super) struct PodShared {
    pub(super) node: Arc<Node>,
    pub(super) objects: Arc<dyn Objects>,
    pub(super) pod: Mutex<Pod>,
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) dir: PathBuf,
    pub(super) log_dir: PathBuf,
    pub(super) net: Mutex<Option<PodNetwork>>,
    pub(super) ip: String,
    pub(super) started_at: jiff::Timestamp,
    pub(super) init: Mutex<Vec<ContainerRuntime>>,
    pub(super) containers: Mutex<Vec<ContainerRuntime>>,
    pub(super) status_tx: watch::Sender<PodStatus>,
    /// Serialises volume and hosts writes between the supervisors and refreshes.
    pub(super) files: Mutex<()>,
    /// The pod's service-account token, issued on first mount.
    pub(super) token: std::sync::OnceLock<String>,
    /// Per volume: since when its source differs from what is mounted, while a change waits
    /// for the node's `volume_update_delay`.
    pub(super) pending: Mutex<std::collections::BTreeMap<String, std::time::Instant>>,
}

/// A Pod running on this node. Dropping it kills its processes at once and removes its
/// namespace and files; `stop` does the same gracefully.
pub struct PodHandle {
    shared: Arc<PodShared>,
    tasks: Vec<JoinHandle<()>>,
    stop_tx: watch::Sender<Option<Duration>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodHandle {
    /// Creates the pod's network namespace and starts its containers. Must be called inside
    /// a tokio runtime.
    pub fn start(node: &Arc<Node>, pod: &Pod, objects: Arc<dyn Objects>) -> anyhow::Result<Self> {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().context("pod without a name")?;
        let spec = pod.spec.clone().context("pod without a spec")?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let dir = node
            .run_dir()
            .join("pods")
            .join(format!("{namespace}_{name}_{uid}"));
        let log_dir = node.log_dir();
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all(&log_dir)?;
        let net = node
            .network
            .attach()
            .with_context(|| format!("pod {namespace}/{name}: network"))?;
        let ip = net.ip().to_string();
        let runtimes = |list: &[Container]| -> Vec<ContainerRuntime> {
            list.iter()
                .map(|c| ContainerRuntime::new(&c.name, c.image.as_deref().unwrap_or("")))
                .collect()
        };
        let init = runtimes(spec.init_containers.as_deref().unwrap_or_default());
        let mut containers = runtimes(&spec.containers);
        if !init.is_empty() {
            for c in &mut containers {
                c.state = State::Waiting {
                    reason: "PodInitializing".into(),
                    message: String::new(),
                };
            }
        }
        let (status_tx, _) = watch::channel(PodStatus::default());
        let shared = Arc::new(PodShared {
            node: node.clone(),
            objects,
            pod: Mutex::new(pod.clone()),
            namespace,
            name,
            dir,
            log_dir,
            net: Mutex::new(Some(net)),
            ip,
            started_at: jiff::Timestamp::now(),
            init: Mutex::new(init),
            containers: Mutex::new(containers),
            status_tx,
            files: Mutex::new(()),
            token: std::sync::OnceLock::new(),
            pending: Mutex::new(std::collections::BTreeMap::new()),
        });
        shared.publish();
        let (stop_tx, _) = watch::channel(None);
        let init_count = spec.init_containers.as_ref().map_or(0, Vec::len);
        let tasks = vec![tokio::spawn(run_pod(
            shared.clone(),
            init_count,
            spec.containers.len(),
            stop_tx.subscribe(),
        ))];
        Ok(Self {
            shared,
            tasks,
            stop_tx,
        })
    }

    pub fn ip(&self) -> &str {
        &self.shared.ip
    }

    /// The pod's network namespace (`/var/run/netns/...`), while the pod has one.
    pub fn netns_path(&self) -> Option<String> {
        lock(&self.shared.net).as_ref().map(PodNetwork::netns_path)
    }

    pub fn namespace(&self) -> &str {
        &self.shared.namespace
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn uid(&self) -> Option<String> {
        lock(&self.shared.pod).metadata.uid.clone()
    }

    /// The latest status; changes arrive on `watch_status`.
    pub fn status(&self) -> PodStatus {
        self.shared.status_tx.borrow().clone()
    }

    pub fn watch_status(&self) -> watch::Receiver<PodStatus> {
        self.shared.status_tx.subscribe()
    }

    /// Waits until the pod is Ready, failing with its status and logs after `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let mut rx = self.watch_status();
        let ready = |s: &PodStatus| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        };
        let wait = rx.wait_for(|s| ready(s));
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            _ => anyhow::bail!(
                "pod {}/{} not ready after {timeout:?}: {}\nlogs:\n{}",
                self.shared.namespace,
                self.shared.name,
                serde_json::to_string(&self.status()).unwrap_or_default(),
                self.logs()
            ),
        }
    }

    /// A container's log file (stdout and stderr, every run appended).
    pub fn log_path(&self, container: &str) -> PathBuf {
        self.shared.log_path(container)
    }

    /// All containers' logs, for failure messages.
    pub fn logs(&self) -> String {
        let pod = lock(&self.shared.pod).clone();
        pod.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .map(|c| {
                let log = std::fs::read_to_string(self.log_path(&c.name)).unwrap_or_default();
                format!("--- {} ---\n{log}", c.name)
            })
            .collect()
    }

    /// The host folder behind a volume (its atomic-writer root).
    pub fn volume_dir(&self, volume: &str) -> PathBuf {
        self.shared.dir.join("volumes").join(volume)
    }

    /// Takes in a newer version of the Pod (labels and annotations, for the downward API on
    /// the next start) and rewrites volumes and hosts files from the current objects.
    pub fn refresh(&self, pod: Option<&Pod>) {
        if let Some(pod) = pod {
            *lock(&self.shared.pod) = pod.clone();
        }
        if let Err(e) = self.shared.sync_volumes() {
            tracing::debug!(pod = %self.shared.name, "volumes not ready: {e}");
        }
        if self.shared.has_pending_volumes() {
            // Look again once the delayed change is due.
            let shared = Arc::downgrade(&self.shared);
            let delay = self.shared.node.config.volume_update_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(shared) = shared.upgrade()
                    && let Err(e) = shared.sync_volumes()
                {
                    tracing::debug!(pod = %shared.name, "volumes not ready: {e}");
                }
            });
        }
        self.shared.write_hosts();
    }

    /// The fault "kill a pod's process": SIGKILL to a container's processes. The container is
    /// then restarted by the pod's restart policy, as after a crash.
    pub fn kill_container(&self, container: &str) -> anyhow::Result<()> {
        let all: Vec<ContainerRuntime> = lock(&self.shared.init)
            .iter()
            .chain(lock(&self.shared.containers).iter())
            .cloned()
            .collect();
        let pid = all
            .iter()
            .find(|c| c.name == container)
            .with_context(|| format!("pod {} has no container {container:?}", self.shared.name))?
            .pid()
            .with_context(|| format!("container {container:?} is not running"))?;
        signal_group(pid, rustix::process::Signal::KILL);
        Ok(())
    }

    /// Stops every container (SIGTERM, SIGKILL after `grace`), then removes the namespace
    /// and files.
    pub async fn stop(mut self, grace: Duration) {
        let _ = self.stop_tx.send(Some(grace));
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
        self.teardown();
    }

    fn teardown(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let net = lock(&self.shared.net).take();
        drop(net);
        let _ = std::fs::remove_dir_all(&self.shared.dir);
    }
}

impl Drop for PodHandle {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl PodShared {
    pub(super) fn log_path(&self, container: &str) -> PathBuf {
        super::container_log_path(&self.log_dir, &self.namespace, &self.name, container)
    }

    pub(super) fn set(&self, which: Which, f: impl FnOnce(&mut ContainerRuntime)) {
        let (list, index) = match which {
            Which::Init(i) => (&self.init, i),
            Which::Main(i) => (&self.containers, i),
        };
        if let Some(c) = lock(list).get_mut(index) {
            f(c);
        }
        self.publish();
    }

    pub(super) fn publish(&self) {
        let pod = lock(&self.pod).clone();
        let init = lock(&self.init).clone();
        let containers = lock(&self.containers).clone();
        let host_ip = self.node.host_ip().to_string();
        self.status_tx.send_if_modified(|current| {
            let facts = PodFacts {
                pod: &pod,
                pod_ip: &self.ip,
                host_ip: &host_ip,
                started_at: self.started_at,
                init_containers: &init,
                containers: &containers,
                failure: None,
            };
            let next = runtime::pod_status(&facts, Some(current));
            let changed = next != *current;
            if changed {
                *current = next;
            }
            changed
        });
    }

    pub(super) fn service_account(&self, pod: &Pod) -> bool {
        self.node.cluster_access().is_some()
            && pod
                .spec
                .as_ref()
                .and_then(|s| s.automount_service_account_token)
                != Some(false)
    }

    /// Writes every volume; the first error names the volume that could not be set up.
    pub(super) fn sync_volumes(&self) -> Result<(), String> {
        let _guard = lock(&self.files);
        let pod = lock(&self.pod).clone();
        let root = self.dir.join("volumes");
        let mut first_error = None;
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let dir = root.join(&volume.name);
            let result = match volumes::volume_files(&pod, volume, self.objects.as_ref()) {
                Ok(Some(files)) if self.update_is_due(&volume.name, &dir, &files) => {
                    volumes::write_atomic(&dir, &files)
                        .map(|_| ())
                        .map_err(|e| format!("volume {:?}: {e}", volume.name))
                }
                Ok(Some(_)) => Ok(()),
                Ok(None) => std::fs::create_dir_all(&dir).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        if let (true, Some(access)) = (self.service_account(&pod), self.node.cluster_access()) {
            let account = pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".to_owned());
            let token = self
                .token
                .get_or_init(|| access.tokens.issue(&self.namespace, &account));
            let files = volumes::service_account_files(access, &self.namespace, token);
            volumes::write_atomic(&root.join(SERVICE_ACCOUNT_VOLUME), &files)
                .map_err(|e| format!("service account volume: {e}"))?;
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether `files` may be written to the volume now: at once when first mounted or
    /// unchanged, else once the change has waited the node's `volume_update_delay`.
    fn update_is_due(&self, volume: &str, dir: &std::path::Path, files: &volumes::Files) -> bool {
        let delay = self.node.config.volume_update_delay;
        let mut pending = lock(&self.pending);
        let mounted = volumes::current_payload(dir);
        if delay.is_zero() || mounted.is_none() || mounted.as_ref() == Some(files) {
            pending.remove(volume);
            return true;
        }
        let since = *pending
            .entry(volume.to_owned())
            .or_insert_with(std::time::Instant::now);
        if since.elapsed() >= delay {
            pending.remove(volume);
            return true;
        }
        false
    }

    /// Whether a change waits for the node's `volume_update_delay`.
    pub(super) fn has_pending_volumes(&self) -> bool {
        !lock(&self.pending).is_empty()
    }

    pub(super) fn write_hosts(&self) {
        let _guard = lock(&self.files);
        let pods = self.objects.pods();
        let services = self.objects.services();
        let network = &self.node.network;
        let virtual_ip = |s: &k8s_openapi::api::core::v1::Service| {
            network.service_ip(
                s.metadata.namespace.as_deref().unwrap_or("default"),
                s.metadata.name.as_deref().unwrap_or_default(),
            )
        };
        let content = hosts::render(
            &self.namespace,
            &self.name,
            &self.ip,
            &services,
            &pods,
            &virtual_ip,
        );
        let containers: Vec<String> = lock(&self.init)
            .iter()
            .chain(lock(&self.containers).iter())
            .map(|c| c.name.clone())
            .collect();
        for c in containers {
            let path = self.dir.join("containers").join(&c).join("hosts");
            // Rewritten in place: the file is bind-mounted, so its inode must stay the same.
            if std::fs::read_to_string(&path).ok().as_deref() != Some(content.as_str()) {
                if let Some(parent) = path.parent() {
                    let _ = std::fs::create_dir_all(parent);
                }
                let _ = std::fs::write(&path, &content);
            }
        }
    }

    /// Everything needed to start a container, or the waiting reason and message.
    /// (The container still runs as this process's user; only the checks are kubelet's.)
    pub(super) fn prepare(
        &self,
        which: Which,
    ) -> Result<(tokio::process::Command, String), (String, String)> {
        let pod = lock(&self.pod).clone();
        let spec = pod.spec.clone().unwrap_or_default();
        let container = match which {
            Which::Init(i) => spec.init_containers.as_ref().and_then(|l| l.get(i)),
            Which::Main(i) => spec.containers.get(i),
        };
        let Some(container) = container.cloned() else {
            return Err(("CreateContainerError".into(), "no such container".into()));
        };
        let image_name = container.image.clone().unwrap_or_default();
        let image = self
            .node
            .config
            .images
            .resolve(&image_name)
            .map_err(|m| ("ErrImagePull".to_owned(), m))?;
        let config_error = |m: String| ("CreateContainerConfigError".to_owned(), m);
        verify_run_as_non_root(&pod, &container, image.user).map_err(config_error)?;
        self.sync_volumes()
            .map_err(|m| ("ContainerCreating".to_owned(), m))?;
        self.write_hosts();
        let mut vars = Vec::new();
        if let Some(access) = self.node.cluster_access() {
            vars.push(("KUBERNETES_SERVICE_HOST".to_owned(), access.host.clone()));
            vars.push((
                "KUBERNETES_SERVICE_PORT".to_owned(),
                access.port.to_string(),
            ));
            vars.push((
                "KUBERNETES_SERVICE_PORT_HTTPS".to_owned(),
                access.port.to_string(),
            ));
        }
        vars.push(("HOSTNAME".to_owned(), self.name.clone()));
        let node_name = self.node.config.node_name.clone();
        vars.extend(
            env::container_env(
                &pod,
                &container,
                &env::Placement {
                    pod_ip: &self.ip,
                    host_ip: &self.node.host_ip().to_string(),
                    node_name: &node_name,
                },
                self.objects.as_ref(),
            )
            .map_err(config_error)?,
        );
        if !vars.iter().any(|(k, _)| k == "PATH") {
            vars.push(("PATH".into(), DEFAULT_PATH.into()));
        }
        let argv = env::argv(&container, &image, &vars);
        let mut mounts = self.mounts(&pod, &container).map_err(config_error)?;
        mounts.extend(image.files.iter().map(|(path, source)| Mount {
            source: std::fs::canonicalize(source).unwrap_or_else(|_| source.clone()),
            target: path.clone(),
            read_only: true,
        }));
        let cdir = self.dir.join("containers").join(&container.name);
        let launch = Launch {
            mounts,
            hosts_file: cdir.join("hosts"),
            scratch: cdir.join("scratch"),
            working_dir: container.working_dir.clone(),
            hostname: self.name.clone(),
        };
        let script = launcher::script(&launch).map_err(config_error)?;
        let script_path = cdir.join("launch.sh");
        let _ = std::fs::remove_dir_all(&launch.scratch);
        std::fs::write(&script_path, script).map_err(|e| config_error(e.to_string()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(&container.name))
            .map_err(|e| config_error(format!("log file: {e}")))?;
        let log_err = log.try_clone().map_err(|e| config_error(e.to_string()))?;
        let netns = lock(&self.net)
            .as_ref()
            .map(PodNetwork::netns_path)
            .unwrap_or_default();
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--net={netns}"))
            .args([
                "--",
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
            ])
            .arg(&script_path)
            .args(&argv)
            .env_clear()
            .envs(vars)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .process_group(0)
            .kill_on_drop(true);
        Ok((cmd, image.path.to_string_lossy().into_owned()))
    }

    pub(super) fn mounts(&self, pod: &Pod, container: &Container) -> Result<Vec<Mount>, String> {
        let root = self.dir.join("volumes");
        let mut mounts = Vec::new();
        let declared = |name: &str| {
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| v.name == name)
        };
        for m in container.volume_mounts.iter().flatten() {
            if !declared(&m.name) {
                return Err(format!(
                    "volumeMount {:?}: no volume of that name in the pod",
                    m.name
                ));
            }
            mounts.push(Mount {
                source: volumes::mount_source(&root.join(&m.name), m.sub_path.as_deref())?,
                target: PathBuf::from(&m.mount_path),
                read_only: m.read_only == Some(true),
            });
        }
        let sa_target = Path::new(volumes::SERVICE_ACCOUNT_PATH);
        if self.service_account(pod) && !mounts.iter().any(|m| m.target == sa_target) {
            mounts.push(Mount {
                source: root.join(SERVICE_ACCOUNT_VOLUME),
                target: sa_target.to_owned(),
                read_only: true,
            });
        }
        Ok(mounts)
    }
}

/// Kubelet's `runAsNonRoot` check: the container's (else the pod's) `runAsNonRoot: true`
/// refuses a container whose user, `runAsUser` or else the image's, is root.
pub(super) fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_user: i64,
) -> Result<(), String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if !non_root {
        return Ok(());
    }
    let who = format!(
        "(pod: \"{}_{}({})\", container: {})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
        container.name
    );
    match sc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user))
    {
        Some(0) => Err(format!(
            "container's runAsUser breaks non-root policy {who}"
        )),
        Some(_) => Ok(()),
        None if image_user == 0 => Err(format!(
            "container has runAsNonRoot and image will run as root {who}"
        )),
        None => Ok(()),
    }
}
