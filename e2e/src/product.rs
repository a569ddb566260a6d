//! What ties the product to the local cluster, which knows no product: the image map that
//! runs this build's `marin3r` image (and no other marin3r image), carrying the installed
//! Envoy as the product's image does, and the installed Envoy, the example manifests, and reading a DiscoveryService's readiness.

use std::path::PathBuf;

use marin3r_discovery::judge::IMAGE_ENVOY;
use marin3r_local_cluster::kubelet::ImageMap;
use marin3r_testkit::tools;

/// The built `marin3r`: `MARIN3R_BIN`, else the workspace's `target/debug` or
/// `target/release` build, whichever is newer.
pub fn marin3r_bin() -> Option<PathBuf> {
    let from_env = std::env::var_os("MARIN3R_BIN").map(PathBuf::from);
    let target = tools::repo_root().join("target");
    let built = ["debug", "release"]
        .iter()
        .map(|profile| target.join(profile).join("marin3r"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    from_env.or(built).filter(|p| p.is_file())
}

/// What this machine has: the installed Envoy for `envoyproxy/envoy*` images, and the given
/// `marin3r` (else [`marin3r_bin`]) for exactly this build's image
/// ([`marin3r_discovery::IMAGE`], the name `manifests/` and the operator use), run as the
/// image's user; any other marin3r image fails to pull. Missing binaries leave their images
/// failing to pull, saying why.
///
/// The marin3r image carries the installed Envoy at [`IMAGE_ENVOY`], as the `Dockerfile`
/// builds it, so the validating webhook and the EnvoyConfig controller judge with Envoy in
/// every scenario; a scenario that needs a config Envoy NACKs applies one only a running
/// Envoy refuses ([`crate::rejected`]).
pub fn images_with(marin3r: Option<PathBuf>) -> ImageMap {
    let mut map = ImageMap::new();
    if let Ok(envoy) = tools::envoy() {
        map = map
            .with_envoy(&envoy)
            .with_file("marin3r", IMAGE_ENVOY, envoy);
    }
    let binary = marin3r.or_else(marin3r_bin).ok_or_else(|| {
        "no marin3r binary configured for the local cluster (build it with \
         `cargo build -p marin3r-discovery`, or set MARIN3R_BIN)"
            .to_owned()
    });
    map.pin(
        marin3r_discovery::IMAGE,
        binary,
        marin3r_discovery::IMAGE_USER,
    )
}

/// [`images_with`] the built `marin3r`.
pub fn images() -> ImageMap {
    images_with(None)
}

/// An example manifest of `manifests/examples/` with its namespace (`demo`) replaced by `ns`.
pub fn example_in(file: &str, ns: &str) -> std::io::Result<String> {
    let path = tools::repo_root().join("manifests/examples").join(file);
    let text = std::fs::read_to_string(path)?;
    Ok(text.replace("namespace: demo", &format!("namespace: {ns}")))
}

/// A DiscoveryService's `Ready` condition: (status, reason, message).
pub fn discovery_service_ready(
    ds: &marin3r_discovery::api::discovery_service::DiscoveryService,
) -> Option<(String, String, String)> {
    ready_condition(&ds.status.as_ref()?.conditions)
}

/// The `Ready` condition among `conditions`: (status, reason, message).
pub fn ready_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    let c = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The path of this machine's `python3`, which the local cluster runs for the pod images
/// the tests map to it (`probe-server`); `python3` itself when it cannot be asked (the pod
/// then fails to start, saying so).
pub fn python3() -> String {
    std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|path| path.trim().to_owned())
        .filter(|path| !path.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// A local cluster with marin3r installed from `manifests/` as a user installs it, and
/// kubectl pointed at it.
pub struct Installed {
    pub cluster: marin3r_local_cluster::cluster::LocalCluster,
    pub client: kube::Client,
    pub kubectl: marin3r_testkit::kubectl::Kubectl,
    _kubeconfig: tempfile::TempDir,
}

/// Starts a local cluster running `images` (its pod logs in `MARIN3R_E2E_LOG_DIR` when set)
/// and applies `manifests/` with kubectl.
pub async fn install(images: ImageMap) -> anyhow::Result<Installed> {
    use anyhow::Context as _;
    images
        .resolve(marin3r_discovery::IMAGE)
        .map_err(anyhow::Error::msg)
        .context("build the marin3r binary first: cargo build -p marin3r-discovery")?;
    let cluster = marin3r_local_cluster::cluster::LocalCluster::start(
        marin3r_local_cluster::cluster::LocalClusterConfig {
            images,
            log_dir: std::env::var_os("MARIN3R_E2E_LOG_DIR").map(PathBuf::from),
            ..Default::default()
        },
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.api().write_kubeconfig(&kubeconfig)?;
    let kubectl = marin3r_testkit::kubectl::Kubectl::new(&kubeconfig)?;
    let manifests = tools::repo_root().join("manifests");
    kubectl
        .ok(&["apply", "--server-side", "-k", &manifests.to_string_lossy()])
        .await?;
    Ok(Installed {
        client: cluster.client(),
        cluster,
        kubectl,
        _kubeconfig: dir,
    })
}

impl Installed {
    /// The kubeconfig kubectl uses, for other clients (`marin3r`).
    pub fn kubeconfig(&self) -> PathBuf {
        self._kubeconfig.path().join("kubeconfig")
    }

    /// `kubectl apply --server-side` of a manifest text.
    pub async fn apply(&self, manifest: &str) -> anyhow::Result<()> {
        self.kubectl
            .ok_with(&["apply", "--server-side", "-f", "-"], manifest)
            .await
            .map(|_| ())
    }

    /// Waits until the DiscoveryService `namespace/name` is Ready.
    pub async fn discovery_service_ready(&self, namespace: &str, name: &str) {
        use marin3r_discovery::api::discovery_service::DiscoveryService;
        let dss: kube::Api<DiscoveryService> =
            kube::Api::namespaced(self.client.clone(), namespace);
        marin3r_testkit::wait::until(
            "the DiscoveryService to be Ready",
            std::time::Duration::from_secs(120),
            || async {
                let ds = dss.get(name).await.ok()?;
                (discovery_service_ready(&ds)?.0 == "True").then_some(())
            },
        )
        .await;
    }
}
