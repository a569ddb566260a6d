//! The real cluster the controller tests run on (`hack/cluster`, or the one
//! `MARIN3R_E2E_KUBECONFIG` names), shared with the other tests of this process and with other
//! processes: the checked-in CRDs applied as users apply them, every object a test makes named
//! for this run ([`unique`]), and its namespaces deleted when it ends ([`Namespaces`]). Shared
//! by the integration tests of the discovery and operator crates.
#![allow(clippy::unwrap_used, clippy::panic)] // test code: a failed step fails the test

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;

use crate::cluster::{Cluster, Held, OperatorStopped};
use crate::kubectl::Kubectl;

/// The CRDs of `manifests/crds/`, by name.
const CRDS: [&str; 5] = [
    "envoyconfigs.marin3r.3scale.net",
    "envoyconfigrevisions.marin3r.3scale.net",
    "discoveryservices.operator.marin3r.3scale.net",
    "discoveryservicecertificates.operator.marin3r.3scale.net",
    "envoydeployments.operator.marin3r.3scale.net",
];

/// Whether this process has applied `manifests/crds/` yet (once, so that the CRDs proved are
/// this checkout's even where another checkout installed its own).
static APPLIED: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// `<prefix>-<pid>-<milliseconds>-<n>`: a name no other test of this run or of another
/// process uses.
pub fn unique(prefix: &str) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{millis}-{n}", std::process::id())
}

/// The cluster, started or attached to (once per process: `Cluster::start` remembers it).
pub fn cluster() -> Cluster {
    Cluster::start_or_attach().unwrap_or_else(|e| {
        panic!("the controller tests run on the real cluster (hack/cluster up --reuse): {e:#}")
    })
}

/// The in-cluster operator stopped until the guard drops ([`Cluster::operator_stopped`], which
/// blocks, on a blocking thread): a test running its own controllers must not share the
/// cluster's objects with it.
pub async fn operator_stopped(cluster: &Cluster) -> OperatorStopped {
    let cluster = cluster.clone();
    let test = crate::cluster::current_test();
    tokio::task::spawn_blocking(move || cluster.operator_stopped_for(test))
        .await
        .unwrap()
        .unwrap()
}

/// The checked-in CRDs (`manifests/crds/`), applied with `kubectl apply -f` as
/// `kubectl apply -k manifests/` does: once per process, and again whenever one is missing
/// (a scenario of another process uninstalled marin3r); established before it returns.
pub async fn ensure_crds(cluster: &Cluster, client: &kube::Client) {
    let mut applied = APPLIED.lock().await;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut present = true;
    for name in CRDS {
        let established = api.get_opt(name).await.ok().flatten().is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        present &= established;
    }
    if *applied && present {
        return;
    }
    let crds = crate::tools::repo_root().join("manifests/crds");
    let crds = crds.to_str().unwrap();
    let kubectl = cluster.kubectl().unwrap();
    kubectl.ok(&["apply", "-f", crds]).await.unwrap();
    kubectl
        .ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            crds,
        ])
        .await
        .unwrap();
    *applied = true;
}

/// The namespaces a test made, deleted (without waiting for them to go) when it drops, with
/// the cluster held [`Cluster::shared`]ly until then when it was made by [`Namespaces::new`].
pub struct Namespaces {
    cluster: Cluster,
    client: kube::Client,
    names: Mutex<Vec<String>>,
    _held: Option<Held>,
}

impl Namespaces {
    /// Holds the cluster shared, and ensures the CRDs.
    pub async fn new(cluster: &Cluster, client: &kube::Client) -> Self {
        Self::held(cluster, client, false).await
    }

    /// Holds the cluster [`Cluster::exclusive`]ly (or shared), and ensures the CRDs.
    pub async fn held(cluster: &Cluster, client: &kube::Client, alone: bool) -> Self {
        let test = crate::cluster::current_test();
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
        .await
        .unwrap()
        .unwrap();
        Self::holding(cluster, client, Some(held)).await
    }

    /// With the cluster held already (by `held`, e.g. [`Cluster::operator_stopped`]'s).
    pub async fn holding(cluster: &Cluster, client: &kube::Client, held: Option<Held>) -> Self {
        ensure_crds(cluster, client).await;
        Self {
            cluster: cluster.clone(),
            client: client.clone(),
            names: Mutex::default(),
            _held: held,
        }
    }

    /// Creates a namespace named [`unique`]`(prefix)` with `labels`; returns its name.
    pub async fn create(&self, prefix: &str, labels: &[(&str, &str)]) -> String {
        let name = unique(prefix);
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        self.names.lock().unwrap().push(name.clone());
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        name
    }

    pub fn kubeconfig(&self) -> &std::path::Path {
        self.cluster.kubeconfig()
    }

    pub fn kubectl(&self) -> Kubectl {
        self.cluster.kubectl().unwrap()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let Ok(kubectl) = crate::tools::kubectl() else {
            return;
        };
        let names = std::mem::take(&mut *self.names.lock().unwrap_or_else(|e| e.into_inner()));
        if names.is_empty() {
            return;
        }
        let _ = Command::new(kubectl)
            .args(["delete", "namespace", "--ignore-not-found", "--wait=false"])
            .args(&names)
            .env("KUBECONFIG", self.cluster.kubeconfig())
            .output();
    }
}

/// This machine's IPv4 address towards the cluster's API server (on `hack/cluster`, the
/// node's): where a test serves what an EndpointSlice points at, which may not be loopback.
pub async fn local_address(cluster: &Cluster) -> std::net::IpAddr {
    let config = cluster.config().await.unwrap();
    let url = &config.cluster_url;
    let host = url.host().unwrap().to_owned();
    let port = url.port_u16().unwrap_or(443);
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0)).unwrap();
    socket.connect((host.as_str(), port)).unwrap();
    let ip = socket.local_addr().unwrap().ip();
    assert!(
        !ip.is_loopback(),
        "the API server at {url} is reached over loopback"
    );
    ip
}
