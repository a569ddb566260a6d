//! What ties the product to a real cluster (`hack/cluster`, or the one
//! `MARIN3R_E2E_KUBECONFIG` names): this build's images written by `hack/image` and loaded,
//! marin3r installed from `manifests/` as the seed's journey does it, and a scenario's own
//! namespace beside the other scenarios'.

use std::collections::HashSet;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use marin3r_testkit::cluster::{Cluster, Held};
use marin3r_testkit::image::load_images;
use marin3r_testkit::kubectl::Kubectl;
use marin3r_testkit::tools;

/// The operator's namespace, as `manifests/` install it.
pub const OPERATOR_NAMESPACE: &str = "marin3r-system";

/// The images this test process has loaded already.
static LOADED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// A scenario on the real cluster, beside others: the cluster held [`Cluster::shared`]ly,
/// this build's images loaded (once per test process), marin3r installed from `manifests/`
/// (an apply that changes nothing when it is), and a namespace of its own under the
/// restricted Pod Security level. Dropping it deletes the namespace's DiscoveryServices (while
/// the operator runs, for their finalizer) and the namespace.
pub struct Scenario {
    pub cluster: Cluster,
    pub client: kube::Client,
    pub kubectl: Kubectl,
    /// The scenario's namespace: `<prefix>-<pid>-<milliseconds>`.
    pub ns: String,
    /// The other namespaces it made ([`Scenario::namespace`]), deleted with it.
    others: Mutex<Vec<String>>,
    /// The DiscoveryServices it named in the operator's namespace
    /// ([`Scenario::operator_discovery_service`]), deleted with it.
    trusted: Mutex<Vec<String>>,
    _held: Held,
}

impl Scenario {
    /// Starts a scenario whose namespace begins with `prefix`, with the `hack/image` images
    /// it runs (`marin3r` and `envoy` always).
    pub async fn start(prefix: &str, images: &[&str]) -> anyhow::Result<Self> {
        Self::start_holding(prefix, images, false).await
    }

    /// [`Scenario::start`] with the cluster held [`Cluster::exclusive`]ly, for a scenario that
    /// disturbs every other (restarting the cluster's parts).
    pub async fn start_alone(prefix: &str, images: &[&str]) -> anyhow::Result<Self> {
        Self::start_holding(prefix, images, true).await
    }

    async fn start_holding(prefix: &str, images: &[&str], alone: bool) -> anyhow::Result<Self> {
        let cluster = tokio::task::spawn_blocking(Cluster::start_or_attach).await??;
        let test = marin3r_testkit::cluster::current_test();
        let held = tokio::task::spawn_blocking({
            let cluster = cluster.clone();
            move || {
                if alone {
                    cluster.exclusive_for(test)
                } else {
                    cluster.shared_for(test)
                }
            }
        })
        .await??;
        let mut wanted: Vec<String> = ["marin3r", "envoy"]
            .iter()
            .chain(images)
            .map(|i| (*i).to_owned())
            .collect();
        wanted.sort();
        wanted.dedup();
        tokio::task::spawn_blocking({
            let cluster = cluster.clone();
            move || load_images_once(&cluster, &wanted)
        })
        .await??;
        install(&cluster).await?;
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let ns = format!("{prefix}-{}-{millis}", std::process::id());
        let kubectl = cluster.kubectl()?;
        kubectl.ok(&["create", "namespace", &ns]).await?;
        let scenario = Self {
            client: cluster.client().await?,
            kubectl,
            cluster,
            ns,
            others: Mutex::new(Vec::new()),
            trusted: Mutex::new(Vec::new()),
            _held: held,
        };
        scenario
            .kubectl
            .ok(&[
                "label",
                "namespace",
                &scenario.ns,
                "pod-security.kubernetes.io/enforce=restricted",
            ])
            .await?;
        Ok(scenario)
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let Ok(kubectl) = tools::kubectl() else {
            return;
        };
        let mut namespaces = vec![self.ns.clone()];
        if let Ok(others) = self.others.lock() {
            namespaces.extend(others.iter().cloned());
        }
        let trusted = self.trusted.lock().map(|t| t.clone()).unwrap_or_default();
        for name in &trusted {
            let _ = Command::new(&kubectl)
                .args(["delete", "discoveryservice", name, "-n", OPERATOR_NAMESPACE])
                .args(["--ignore-not-found", "--timeout=60s"])
                .env("KUBECONFIG", self.cluster.kubeconfig())
                .output();
        }
        for ns in &namespaces {
            let _ = Command::new(&kubectl)
                .args([
                    "delete",
                    "discoveryservices",
                    "--all",
                    "-n",
                    ns,
                    "--timeout=60s",
                ])
                .env("KUBECONFIG", self.cluster.kubeconfig())
                .output();
        }
        for ns in &namespaces {
            let _ = Command::new(&kubectl)
                .args(["delete", "namespace", ns, "--wait=false"])
                .env("KUBECONFIG", self.cluster.kubeconfig())
                .output();
        }
    }
}

/// [`load_images`] of the images this process has not loaded yet.
fn load_images_once(cluster: &Cluster, images: &[String]) -> anyhow::Result<()> {
    let mut loaded = LOADED
        .lock()
        .map_err(|_| anyhow::anyhow!("a scenario panicked while loading images"))?;
    let loaded = loaded.get_or_insert_with(HashSet::new);
    let missing: Vec<&str> = images
        .iter()
        .filter(|i| !loaded.contains(*i))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        load_images(cluster, &missing)?;
        loaded.extend(missing.iter().map(|i| (*i).to_owned()));
    }
    Ok(())
}

/// The cluster-scoped kinds an install of marin3r creates objects of, which an uninstall
/// must leave empty of them (see [`is_marin3rs`]).
pub const INSTALLED_KINDS: [&str; 6] = [
    "customresourcedefinitions",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "clusterroles",
    "clusterrolebindings",
    "namespaces",
];

/// Whether the object `name` of `kind` (one of [`INSTALLED_KINDS`]) is marin3r's or the
/// demo's: its CRDs, anything named `marin3r...`, its namespace and `demo`.
pub fn is_marin3rs(kind: &str, name: &str) -> bool {
    match kind {
        "customresourcedefinitions" => name.ends_with("marin3r.3scale.net"),
        "namespaces" => name == OPERATOR_NAMESPACE || name == "demo",
        _ => name.starts_with("marin3r"),
    }
}

/// `kubectl apply -k manifests/`, then waits until the operator's Deployment has rolled out.
///
/// After a scenario that uninstalls marin3r (the install guide, Helm's), the next scenarios
/// start at once and each installs it: two client-side applies then both find an object
/// missing and both create it, and the second is refused (`AlreadyExists`). So this process
/// installs one scenario at a time, and an apply refused that way (by another process's
/// apply) is made again: it then finds the object and changes nothing.
pub async fn install(cluster: &Cluster) -> anyhow::Result<()> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let kubectl = cluster.kubectl()?;
    let manifests = tools::repo_root().join("manifests");
    let manifests = manifests.to_string_lossy();
    let apply = ["apply", "-k", &manifests];
    let mut attempt = 0;
    loop {
        let out = kubectl.run(&apply).await?;
        if out.success {
            break;
        }
        attempt += 1;
        if attempt == 3 || !out.stderr.contains("(AlreadyExists)") {
            bail!("kubectl {apply:?} failed:\n{}{}", out.stdout, out.stderr);
        }
    }
    let mut last = String::new();
    for _ in 0..60 {
        let out = kubectl
            .run(&[
                "rollout",
                "status",
                "-n",
                "marin3r-system",
                "deployment/marin3r-operator",
                "--timeout=5s",
            ])
            .await?;
        if out.success {
            return Ok(());
        }
        last = out.stderr;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    bail!("the operator never rolled out: {last}")
}

impl Scenario {
    /// Another namespace of the scenario, `<its namespace>-<suffix>`, under the restricted Pod
    /// Security level, deleted with the scenario.
    pub async fn namespace(&self, suffix: &str) -> anyhow::Result<String> {
        let ns = format!("{}-{suffix}", self.ns);
        self.others
            .lock()
            .map_err(|_| anyhow::anyhow!("a scenario panicked while making a namespace"))?
            .push(ns.clone());
        self.kubectl.ok(&["create", "namespace", &ns]).await?;
        self.kubectl
            .ok(&[
                "label",
                "namespace",
                &ns,
                "pod-security.kubernetes.io/enforce=restricted",
            ])
            .await?;
        Ok(ns)
    }

    /// A name of this run for a DiscoveryService in the operator's namespace
    /// ([`OPERATOR_NAMESPACE`], where one may serve other namespaces): `<prefix>-<pid>-<the
    /// last 6 digits of the milliseconds>`. Short, since the operator names the client
    /// certificate of each namespace it serves `marin3r-client-<name>-<namespace>`, which
    /// `marin3r` before the fix of `owner_name_label` could not issue past 63 characters. The
    /// scenario deletes it, however the test ends.
    pub fn operator_discovery_service(&self, prefix: &str) -> anyhow::Result<String> {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let name = format!("{prefix}-{}-{:06}", std::process::id(), millis % 1_000_000);
        self.trusted
            .lock()
            .map_err(|_| anyhow::anyhow!("a scenario panicked while naming a DiscoveryService"))?
            .push(name.clone());
        Ok(name)
    }

    /// A token of ServiceAccount `ns/name`, from the API server's TokenRequest (`kubectl
    /// create token`), to act as it with `--token`.
    pub async fn token(&self, ns: &str, name: &str) -> anyhow::Result<String> {
        Ok(self
            .kubectl
            .ok(&["create", "token", name, "-n", ns, "--duration=1h"])
            .await?
            .trim()
            .to_owned())
    }

    /// kubectl acting as ServiceAccount `ns/name` alone: a kubeconfig of the cluster's address
    /// and CA with that account's token and no client certificate (the API server takes a
    /// client certificate before a token, so `--token` beside the admin's certificate would
    /// still act as the admin). The folder holding the kubeconfig lives as long as the
    /// returned guard.
    pub async fn kubectl_as(
        &self,
        ns: &str,
        name: &str,
    ) -> anyhow::Result<(Kubectl, tempfile::TempDir)> {
        let token = self.token(ns, name).await?;
        let view: serde_json::Value = serde_json::from_str(
            &self
                .kubectl
                .ok(&["config", "view", "--raw", "--minify", "-o", "json"])
                .await?,
        )?;
        let cluster = &view["clusters"][0]["cluster"];
        let server = cluster["server"]
            .as_str()
            .context("the kubeconfig names no server")?;
        let ca = cluster["certificate-authority-data"]
            .as_str()
            .context("the kubeconfig holds no CA data")?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kubeconfig");
        let config = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": {"server": server, "certificate-authority-data": ca}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "as", "context": {"cluster": "cluster", "user": name, "namespace": ns}}],
            "current-context": "as",
        });
        std::fs::write(&path, serde_json::to_vec(&config)?)?;
        Ok((Kubectl::new(&path)?, dir))
    }

    /// The answer of the Envoy admin API of `pod`'s sidecar in the scenario's namespace
    /// (`127.0.0.1:9901` inside the pod) to `GET path`, through the API server's pod
    /// port-forward as `marin3r proxy-config` reaches it.
    pub async fn envoy_admin(&self, pod: &str, path: &str) -> anyhow::Result<String> {
        marin3r_discovery::cli::port_forward::get(self.client.clone(), &self.ns, pod, 9901, path)
            .await
            .map(|(_, body)| body)
    }

    /// The pods of the scenario's namespace that `selector` picks, Ready and not being
    /// deleted.
    pub async fn ready_pods(&self, selector: &str) -> Vec<k8s_openapi::api::core::v1::Pod> {
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        pods.list(&kube::api::ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
            .collect()
    }
}

/// Whether `pod` has the condition Ready.
pub fn pod_ready(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `pod`'s IP, empty when it has none yet.
pub fn pod_ip(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// The body the example EnvoyConfig (`manifests/examples/envoyconfig.yaml`) answers with.
pub const EXAMPLE_BODY: &str = "hello from marin3r";

/// The example EnvoyConfig in namespace `ns`, answering `body` on port 8080.
pub fn example_config(ns: &str, body: &str) -> anyhow::Result<String> {
    let text = crate::product::example_in("envoyconfig.yaml", ns)?;
    anyhow::ensure!(
        text.contains(EXAMPLE_BODY),
        "the example EnvoyConfig no longer answers {EXAMPLE_BODY:?}"
    );
    Ok(text.replace(EXAMPLE_BODY, body))
}

impl Scenario {
    /// The examples served in the scenario's namespace: the DiscoveryService of that namespace
    /// (`discoveryservice-own-namespace.yaml`) once Ready, the EnvoyConfig answering `body`,
    /// and the Deployment, whose pod the webhook injects; returns that pod once Ready.
    pub async fn serve_examples(
        &self,
        body: &str,
    ) -> anyhow::Result<k8s_openapi::api::core::v1::Pod> {
        use marin3r_api::discovery_service::DiscoveryService;
        let ds = crate::product::example_in("discoveryservice-own-namespace.yaml", &self.ns)?;
        self.kubectl.ok_with(&["apply", "-f", "-"], &ds).await?;
        let services: kube::Api<DiscoveryService> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        marin3r_testkit::wait::poll(Duration::from_secs(120), Duration::from_millis(250), || {
            let services = services.clone();
            async move {
                let ds = services.get("instance").await?;
                Ok::<_, kube::Error>(
                    crate::product::discovery_service_ready(&ds)
                        .filter(|(status, _, _)| status == "True")
                        .map(|_| ()),
                )
            }
        })
        .await
        .map_err(|t| anyhow::anyhow!("the DiscoveryService was not Ready after {:?}", t.after))?;
        self.kubectl
            .ok_with(&["apply", "-f", "-"], &example_config(&self.ns, body)?)
            .await?;
        let deployment = crate::product::example_in("deployment.yaml", &self.ns)?;
        self.kubectl
            .ok_with(&["apply", "-f", "-"], &deployment)
            .await?;
        marin3r_testkit::wait::poll(
            Duration::from_secs(120),
            Duration::from_millis(250),
            || async {
                Ok::<_, std::convert::Infallible>(
                    self.ready_pods("app=demo").await.into_iter().next(),
                )
            },
        )
        .await
        .map_err(|t| anyhow::anyhow!("no injected pod was Ready after {:?}", t.after))
    }
}

/// Requests sent to one URL every 50 ms until [`Traffic::stop`]: how many were answered with
/// 200, and what each other answer or error was.
pub struct Traffic {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(u32, Vec<String>)>,
}

impl Traffic {
    pub fn start(url: &str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            let url = url.to_owned();
            async move {
                let (mut answered, mut failed) = (0u32, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match crate::demo::get(&url).await {
                        Ok(Some(_)) => answered += 1,
                        other => failed.push(format!("{other:?}")),
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (answered, failed)
            }
        });
        Self { stop, task }
    }

    /// Stops the requests; (answered, every failure).
    pub async fn stop(self) -> anyhow::Result<(u32, Vec<String>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

impl Scenario {
    /// `kubectl apply -n <the scenario's namespace> -f -` of `manifest` (whose objects name
    /// no namespace, or the scenario's). Tried again for up to 30 s while the API server finds
    /// no ready pod behind a webhook's Service: a discovery pod being replaced (when another
    /// test process loads a different marin3r image, `hack/cluster load --restart` deletes
    /// the pods of the older one) leaves its one-replica webhooks unreachable for a moment.
    pub async fn apply(&self, manifest: &str) -> anyhow::Result<String> {
        let args = ["apply", "-n", &self.ns, "-f", "-"];
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.kubectl.run_with(&args, manifest).await?;
            if out.success {
                return Ok(out.stdout);
            }
            let unreachable = out.stderr.contains("failed calling webhook")
                && out.stderr.contains("no endpoints available for service");
            if !unreachable || std::time::Instant::now() > deadline {
                bail!("kubectl {args:?} failed:\n{}", out.stderr);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until the DiscoveryService `name` of the scenario's namespace is Ready (its
    /// certificates issued, its discovery pod ready); an error after `timeout`.
    pub async fn discovery_service_ready(
        &self,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        self.discovery_service_ready_in(&self.ns, name, timeout)
            .await
    }

    /// [`Scenario::discovery_service_ready`] for the DiscoveryService `namespace/name` (one in
    /// the operator's namespace, say); a failed read is tried again until `timeout`.
    pub async fn discovery_service_ready_in(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let services: kube::Api<marin3r_api::discovery_service::DiscoveryService> =
            kube::Api::namespaced(self.client.clone(), namespace);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let ds = services.get_opt(name).await.ok().flatten();
            let ready = ds
                .as_ref()
                .and_then(crate::product::discovery_service_ready);
            if ready
                .as_ref()
                .is_some_and(|(status, _, _)| status == "True")
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "the DiscoveryService {namespace}/{name} is not Ready after {timeout:?}: {ready:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// `kubectl logs` of each of `containers` of `pod` in the scenario's namespace, headed by
    /// the container's name, for a failing assertion to show.
    pub async fn logs(&self, pod: &str, containers: &[&str]) -> String {
        let mut all = String::new();
        for c in containers {
            let out = self
                .kubectl
                .run(&["logs", "-n", &self.ns, pod, "-c", c])
                .await;
            let text = match out {
                Ok(o) => format!("{}{}", o.stdout, o.stderr),
                Err(e) => format!("{e:#}"),
            };
            all.push_str(&format!("--- {c}\n{text}\n"));
        }
        all
    }
}

/// A script for [`python_container`] that waits until SIGTERM and exits on it (a process
/// that is PID 1 ignores SIGTERM unless it handles it, and the kubelet then waits out the
/// grace period).
pub const IDLE_PY: &str = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(3600)\n";

/// The Pod `name`, labelled for injection and annotated with `node_id`, whose one container
/// idles ([`IDLE_PY`]): a sidecar with nothing in front of it, for tests of what the proxy
/// holds.
pub fn idle_injected_pod(
    name: &str,
    node_id: &str,
) -> serde_json::Result<k8s_openapi::api::core::v1::Pod> {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": name,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {"marin3r.3scale.net/node-id": node_id},
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [python_container(IDLE_PY)],
        },
    }))
}

/// The container `app` running `script` with `hack/image`'s python, as the restricted Pod
/// Security level wants it: user 65532, read-only root, no privilege, no capability.
pub fn python_container(script: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "app",
        "image": "marin3r-test/python:3",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", script],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
    })
}

/// A guide's example `file` (in `folder`, for the namespace `guide_ns`) as it runs in a
/// scenario's namespace `ns`, on the cluster's python image: the guides' end-to-end tests
/// apply their examples word for word but for these two.
pub fn guide_example(folder: &str, guide_ns: &str, file: &str, ns: &str) -> anyhow::Result<String> {
    let path = marin3r_testkit::tools::repo_root().join(folder).join(file);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let here = text
        .replace(
            &format!("namespace: {guide_ns}\n"),
            &format!("namespace: {ns}\n"),
        )
        .replace(&format!("  name: {guide_ns}\n"), &format!("  name: {ns}\n"))
        .replace("image: python:3.13-alpine", "image: marin3r-test/python:3");
    if here == text {
        bail!("{file} names no namespace {guide_ns}");
    }
    Ok(here)
}

/// A DiscoveryService `instance` with no spec, applied in a scenario's namespace
/// ([`Scenario::apply`]): it serves that namespace alone.
pub const DISCOVERY_SERVICE: &str = "apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: instance}
spec: {}
";
