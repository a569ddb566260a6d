//! What ties the product to a real cluster (`hack/cluster`, or the one
//! `MARIN3R_E2E_KUBECONFIG` names): this build's images written by `hack/image` and loaded,
//! marin3r installed from `manifests/` as the seed's journey does it, and a scenario's own
//! namespace beside the other scenarios'.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use marin3r_testkit::cluster::{Cluster, Held};
use marin3r_testkit::kubectl::Kubectl;
use marin3r_testkit::tools;

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
    _held: Held,
}

impl Scenario {
    /// Starts a scenario whose namespace begins with `prefix`, with the `hack/image` images
    /// it runs (`marin3r` and `envoy` always).
    pub async fn start(prefix: &str, images: &[&str]) -> anyhow::Result<Self> {
        let cluster = tokio::task::spawn_blocking(Cluster::start_or_attach).await??;
        let held = tokio::task::spawn_blocking({
            let cluster = cluster.clone();
            move || cluster.shared()
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
        for args in [
            &[
                "delete",
                "discoveryservices",
                "--all",
                "-n",
                &self.ns,
                "--timeout=60s",
            ][..],
            &["delete", "namespace", &self.ns, "--wait=false"][..],
        ] {
            let _ = Command::new(&kubectl)
                .args(args)
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

/// The images of `hack/image` a scenario asks for (`marin3r`, `envoy`, `python`...), the
/// marin3r one holding this build's `marin3r` ([`crate::product::marin3r_bin`]), written (or
/// kept when unchanged) and loaded into the cluster; pods running an older marin3r image are
/// started again on this one. An attached cluster must have them already.
pub fn load_images(cluster: &Cluster, images: &[&str]) -> anyhow::Result<()> {
    if !cluster.is_local() {
        return Ok(());
    }
    let marin3r = crate::product::marin3r_bin()
        .context("no built marin3r for the image (cargo build -p marin3r-discovery)")?;
    let out = Command::new(tools::repo_root().join("hack/image"))
        .args(images)
        .arg("--marin3r")
        .arg(&marin3r)
        .output()
        .context("running hack/image")?;
    if !out.status.success() {
        bail!(
            "hack/image {images:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for archive in String::from_utf8_lossy(&out.stdout).lines() {
        cluster.load(&PathBuf::from(archive))?;
    }
    Ok(())
}

/// `kubectl apply -k manifests/`, then waits until the operator's Deployment has rolled out.
pub async fn install(cluster: &Cluster) -> anyhow::Result<()> {
    let kubectl = cluster.kubectl()?;
    let manifests = tools::repo_root().join("manifests");
    kubectl
        .ok(&["apply", "-k", &manifests.to_string_lossy()])
        .await?;
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
        let services: kube::Api<marin3r_discovery::api::discovery_service::DiscoveryService> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let ds = services.get_opt(name).await?;
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
                    "the DiscoveryService {}/{name} is not Ready after {timeout:?}: {ready:?}",
                    self.ns
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
