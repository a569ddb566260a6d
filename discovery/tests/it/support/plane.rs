//! The xDS server and the discovery service's controllers on one runtime, on the real
//! cluster's API server, for the EnvoyConfig tests, with helpers to write specs and check what
//! Envoy serves. Each plane serves namespaces of its own under a discovery-service name of its
//! own, so that planes of other tests (and processes) never serve each other's.

use marin3r_api::envoy_config::CacheState;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL;
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};
use marin3r_api_faults::{FaultProxy, Faults};
use marin3r_certs::IssuedCertificate;
use marin3r_discovery::controllers::{self, Readiness};
use marin3r_testkit::cluster::Cluster;
use marin3r_testkit::kubectl::Kubectl;
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::{Cache, Server, server_config};
use serde_json::json;

use super::{Pki, Proxy};
use marin3r_testkit::namespaces::{Namespaces, cluster, unique};

/// The xDS server and the controllers, on their own runtime, on the real cluster.
pub struct Plane {
    /// The controllers' metrics.
    pub registry: prometheus_client::registry::Registry,
    pub rt: tokio::runtime::Runtime,
    pub cluster: Cluster,
    /// The test's own client, straight to the API server.
    pub client: Client,
    /// The fault proxy the controllers (`controllers`) and the replicas (each by its name)
    /// reach the API server through.
    pub proxy: FaultProxy,
    /// The controllers' endpoint, whose log is what their client has sent.
    controllers: marin3r_api_faults::Endpoint,
    pub cache: Cache,
    pub xds_port: u16,
    pub pki: Pki,
    /// The discovery service name the plane's controllers serve (its namespaces are labelled
    /// for it): unique per plane.
    pub discovery_service: String,
    /// Its controllers' replica name (the key of their NACK and sync reports): unique per
    /// plane, as pods' names are.
    pub replica: String,
    /// The namespaces it serves, by the prefix the test named them with.
    namespaces: BTreeMap<String, String>,
    _space: Namespaces,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a plane's `configure` may use before the controllers start.
pub struct Setup<'a> {
    pub client: &'a Client,
    pub rt: &'a tokio::runtime::Runtime,
    namespaces: &'a BTreeMap<String, String>,
}

impl Setup<'_> {
    /// The namespace the test named `prefix`.
    pub fn ns(&self, prefix: &str) -> &str {
        namespace(self.namespaces, prefix)
    }
}

fn namespace<'a>(namespaces: &'a BTreeMap<String, String>, prefix: &str) -> &'a str {
    namespaces
        .get(prefix)
        .unwrap_or_else(|| panic!("the plane has no namespace {prefix:?}"))
}

/// The two-thread runtime the plane's tests drive everything on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

impl Plane {
    /// A plane serving one namespace per prefix (`<prefix>-<pid>-<millis>-<n>`; see
    /// [`Plane::ns`]).
    pub fn start(namespaces: &[&str]) -> Self {
        Self::start_with(namespaces, |_, _| {})
    }

    /// A plane whose controllers' configuration `configure` adjusts (leader election, the
    /// replica's name); it may also prepare objects in the namespaces, which exist by then,
    /// before the controllers start.
    pub fn start_with(
        prefixes: &[&str],
        configure: impl FnOnce(&mut controllers::Config, &Setup<'_>),
    ) -> Self {
        Self::start_holding(prefixes, false, configure)
    }

    /// [`Plane::start`] with the cluster held exclusively, for a test that changes what every
    /// other test uses (the CRDs).
    pub fn start_alone(prefixes: &[&str]) -> Self {
        Self::start_holding(prefixes, true, |_, _| {})
    }

    fn start_holding(
        prefixes: &[&str],
        alone: bool,
        configure: impl FnOnce(&mut controllers::Config, &Setup<'_>),
    ) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let rt = runtime();
        let pki = Pki::new();
        let cluster = cluster();
        let discovery_service = unique("plane");
        let (client, space, namespaces) = rt.block_on(async {
            let client = cluster.client().await.unwrap();
            let space = Namespaces::held(&cluster, &client, alone).await;
            // Every namespace is served the way the operator sets it up: labelled for this
            // discovery service (so Secrets are watched per namespace, never cluster-wide).
            let mut namespaces = BTreeMap::new();
            for prefix in prefixes {
                let name = space
                    .create(prefix, &[(DISCOVERY_SERVICE_LABEL, &discovery_service)])
                    .await;
                namespaces.insert((*prefix).to_owned(), name);
            }
            (client, space, namespaces)
        });
        let (proxy, controllers_client, controllers) = rt.block_on(async {
            let proxy = FaultProxy::start(cluster.config().await.unwrap())
                .await
                .unwrap();
            let endpoint = proxy.endpoint("controllers").await.unwrap();
            let client = endpoint.client().unwrap();
            (proxy, client, endpoint)
        });
        let cache = Cache::new();
        let (server, nacks) = Server::builder(cache.clone()).build();
        let tls = {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("tls.crt"), &pki.server.cert_pem).unwrap();
            std::fs::write(dir.path().join("tls.key"), &pki.server.key_pem).unwrap();
            std::fs::write(dir.path().join("ca.crt"), pki.ca_pem()).unwrap();
            server_config(&marin3r_xds::TlsFiles::in_dir(dir.path())).unwrap()
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let xds_port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = futures::FutureExt::shared(async move {
            let _ = stopped.await;
        });
        let readiness = Readiness::default();
        let mut registry = prometheus_client::registry::Registry::default();
        let mut config = controllers::Config {
            discovery_service: Some(discovery_service.clone()),
            replica: format!("{discovery_service}-0"),
            proxies: server.status_registry(),
            ..Default::default()
        };
        configure(
            &mut config,
            &Setup {
                client: &client,
                rt: &rt,
                namespaces: &namespaces,
            },
        );
        let replica = config.replica.clone();
        config.metrics.register(&mut registry);
        let tasks = vec![
            rt.spawn({
                let stopped = stopped.clone();
                async move {
                    server.serve(listener, tls, stopped).await.unwrap();
                }
            }),
            rt.spawn(controllers::run(
                controllers_client,
                config,
                cache.clone(),
                nacks,
                readiness.clone(),
                stopped,
            )),
        ];
        let plane = Self {
            rt,
            cluster,
            client,
            proxy,
            controllers,
            cache,
            xds_port,
            pki,
            discovery_service,
            replica,
            namespaces,
            _space: space,
            registry,
            stop: Some(stop),
            tasks,
        };
        wait("the controllers to sync", Duration::from_secs(20), || {
            readiness.ready().then_some(())
        });
        plane
    }

    /// The faults of the proxy between the controllers and the API server.
    pub fn faults(&self) -> Arc<Faults> {
        self.proxy.faults()
    }

    /// A client through a new endpoint of the proxy whose requests count as `user`'s, built
    /// on `rt`.
    pub fn client_as(&self, user: &str, rt: &tokio::runtime::Runtime) -> Client {
        let endpoint = self.rt.block_on(self.proxy.endpoint(user)).unwrap();
        rt.block_on(async move { endpoint.client() }).unwrap()
    }

    /// Every request the plane's controllers have sent, as `METHOD path?query`, in order.
    pub fn requests(&self) -> Vec<String> {
        self.controllers.requests()
    }

    /// The namespace the test named `prefix` when it started the plane.
    pub fn ns(&self, prefix: &str) -> &str {
        namespace(&self.namespaces, prefix)
    }

    /// kubectl on the cluster, as its administrator.
    pub fn kubectl(&self) -> Kubectl {
        self.cluster.kubectl().unwrap()
    }

    /// Applies the checked-in CRDs (manifests/crds) with `kubectl apply`, as
    /// `kubectl apply -k manifests/` does.
    pub fn apply_checked_in_crds(&self, k: &Kubectl) {
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
        self.rt
            .block_on(k.ok(&["apply", "-f", crds.to_str().unwrap()]))
            .unwrap();
    }

    /// The value of one sample line of the controllers' metrics (0 when absent).
    pub fn metric(&self, sample: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        super::metric_value(&text, sample)
    }

    /// Waits until one sample line reads `value`. A count is written after the API answered
    /// the write it counts, which other watchers (and so the test) may see first.
    pub fn wait_metric(&self, sample: &str, value: f64) {
        wait_metric(sample, value, || self.metric(sample));
    }

    pub fn configs(&self, ns: &str) -> Api<EnvoyConfig> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn revisions(&self, ns: &str) -> Api<EnvoyConfigRevision> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates or replaces an EnvoyConfig (server-side apply).
    pub fn apply(&self, ns: &str, name: &str, spec: serde_json::Value) {
        let body = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        // Retried: a fault test may have queued errors for any request.
        retry(|| {
            self.rt.block_on(self.configs(ns).patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(body.clone()),
            ))
        });
    }

    pub fn get(&self, ns: &str, name: &str) -> EnvoyConfig {
        retry(|| self.rt.block_on(self.configs(ns).get(name)))
    }

    pub fn list_revisions(&self, ns: &str) -> Vec<EnvoyConfigRevision> {
        retry(|| {
            self.rt
                .block_on(self.revisions(ns).list(&ListParams::default()))
        })
        .items
    }

    /// Waits until the config's status satisfies `f`; panics with the last status.
    pub fn wait_status(
        &self,
        ns: &str,
        name: &str,
        what: &str,
        f: impl Fn(&EnvoyConfig) -> bool,
    ) -> EnvoyConfig {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ec = self.get(ns, name);
            if f(&ec) {
                return ec;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; status: {:#?}\nrevisions: {:#?}",
                ec.status,
                self.list_revisions(ns)
                    .iter()
                    .map(|r| (&r.metadata.name, &r.status))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the desired version of the current spec is published and in sync.
    pub fn wait_in_sync(&self, ns: &str, name: &str) -> EnvoyConfig {
        self.wait_status(ns, name, "InSync", |ec| {
            let version = ec.spec.version();
            ec.status.as_ref().is_some_and(|s| {
                s.cache_state == Some(CacheState::InSync)
                    && s.published_version.as_deref() == Some(version.as_str())
            })
        })
    }

    pub fn client_cert(&self, ns: &str) -> IssuedCertificate {
        self.pki.client(Some(ns))
    }

    pub fn proxy(&self, ns: &str, node: &str, mode: AdsMode) -> Proxy {
        Proxy::start_on(
            self.xds_port,
            &self.client_cert(ns),
            node,
            &format!("{node}-pod"),
            mode,
        )
    }
}

/// Another discovery replica beside a plane: its own runtime (its process), xDS server and
/// cache, and its own controllers on the same API server, sharing nothing with the plane but
/// the API.
pub struct Replica {
    pub xds_port: u16,
    pub cache: Cache,
    pub registry: prometheus_client::registry::Registry,
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Replica {
    pub fn metric(&self, sample: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        super::metric_value(&text, sample)
    }

    /// Waits until one sample line reads `value`. A count is written after the API answered
    /// the write it counts, which other watchers (and so the test) may see first.
    pub fn wait_metric(&self, sample: &str, value: f64) {
        wait_metric(sample, value, || self.metric(sample));
    }

    /// Kills it, as a crashed process: its runtime goes with every task, nothing released.
    pub fn kill(&mut self) {
        self.stop.take();
        self.tasks.clear();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Plane {
    /// Starts another replica named `name`, configured by `configure`.
    pub fn replica(&self, name: &str, configure: impl FnOnce(&mut controllers::Config)) -> Replica {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cache = Cache::new();
        let (server, nacks) = Server::builder(cache.clone())
            .control_plane_id(name)
            .build();
        let tls = {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("tls.crt"), &self.pki.server.cert_pem).unwrap();
            std::fs::write(dir.path().join("tls.key"), &self.pki.server.key_pem).unwrap();
            std::fs::write(dir.path().join("ca.crt"), self.pki.ca_pem()).unwrap();
            server_config(&marin3r_xds::TlsFiles::in_dir(dir.path())).unwrap()
        };
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let xds_port = listener.local_addr().unwrap().port();
        // Its own connections, gone with its runtime.
        let client = self.client_as(name, &rt);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = futures::FutureExt::shared(async move {
            let _ = stopped.await;
        });
        let readiness = Readiness::default();
        let mut registry = prometheus_client::registry::Registry::default();
        let mut config = controllers::Config {
            discovery_service: Some(self.discovery_service.clone()),
            replica: name.into(),
            proxies: server.status_registry(),
            ..Default::default()
        };
        configure(&mut config);
        config.metrics.register(&mut registry);
        let tasks = vec![
            rt.spawn({
                let stopped = stopped.clone();
                async move {
                    server.serve(listener, tls, stopped).await.unwrap();
                }
            }),
            rt.spawn(controllers::run(
                client,
                config,
                cache.clone(),
                nacks,
                readiness.clone(),
                stopped,
            )),
        ];
        wait(
            "the replica's controllers to sync",
            Duration::from_secs(10),
            || readiness.ready().then_some(()),
        );
        Replica {
            xds_port,
            cache,
            registry,
            rt: Some(rt),
            stop: Some(stop),
            tasks,
        }
    }

    /// A real Envoy of `ns`/`node` connected to the xDS port `xds_port`.
    pub fn proxy_on(&self, xds_port: u16, ns: &str, node: &str, pod: &str, mode: AdsMode) -> Proxy {
        Proxy::start_on(xds_port, &self.client_cert(ns), node, pod, mode)
    }
}

impl Drop for Plane {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for task in self.tasks.drain(..) {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(15), task).await });
        }
    }
}

/// Runs an API call until it succeeds (a few times at most).
pub fn retry<T>(mut call: impl FnMut() -> Result<T, kube::Error>) -> T {
    let mut last = None;
    for _ in 0..20 {
        match call() {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("API call kept failing: {last:?}");
}

fn wait_metric(sample: &str, value: f64, read: impl Fn() -> f64) {
    let mut last = read();
    let deadline = Instant::now() + Duration::from_secs(20);
    while last != value {
        assert!(
            Instant::now() < deadline,
            "{sample} never read {value}; last {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
        last = read();
    }
}

pub fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    super::wait_for(what, timeout, &mut f)
}

/// A listener on 127.0.0.1:`port` answering `body`, in YAML as users write it.
pub fn listener_yaml(port: u16, body: &str, router_not_last: bool) -> String {
    listener_yaml_on("127.0.0.1", port, body, router_not_last)
}

/// [`listener_yaml`] on `address`.
pub fn listener_yaml_on(address: &str, port: u16, body: &str, router_not_last: bool) -> String {
    let extra = if router_not_last {
        "\n        - name: second_router\n          typed_config:\n            \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    } else {
        ""
    };
    format!(
        r#"name: http
address: {{ socket_address: {{ address: {address}, port_value: {port} }} }}
filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: ingress
        route_config:
          name: local
          virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
                - match: {{ prefix: "/" }}
                  direct_response: {{ status: 200, body: {{ inline_string: "{body}" }} }}
        http_filters:
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router{extra}
"#
    )
}

pub const RUNTIME: &str = "name: runtime\nlayer: { marin3r.test: 1 }\n";

pub fn spec(node: &str, port: u16, body: &str) -> serde_json::Value {
    json!({
        "nodeID": node,
        "serialization": "yaml",
        "envoyResources": {
            "listeners": [{"name": "http", "value": listener_yaml(port, body, false)}],
            "runtime": [{"name": "runtime", "value": RUNTIME}],
        }
    })
}

pub fn nacked_spec(node: &str, port: u16, body: &str) -> serde_json::Value {
    let mut s = spec(node, port, body);
    s["envoyResources"]["listeners"][0]["value"] = listener_yaml(port, body, true).into();
    s
}

pub fn revision_versions(ec: &EnvoyConfig) -> Vec<String> {
    ec.status
        .as_ref()
        .unwrap()
        .revisions
        .iter()
        .map(|r| r.version.clone())
        .collect()
}

pub fn condition<'a>(
    ec: &'a EnvoyConfig,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    ec.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The prefix of the namespace most tests use.
pub const NS: &str = "team-a";

/// The base64 body of a PEM certificate, to compare with what a TLS server presented.
pub fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// The certificate a TLS server on 127.0.0.1:`port` presents for `localhost`.
pub fn served_certificate(
    rt: &tokio::runtime::Runtime,
    port: u16,
    ca_pem: &str,
) -> Option<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_der(ca_pem).into()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
        let tls = tokio::time::timeout(Duration::from_secs(2), connector.connect(name, tcp))
            .await
            .ok()?
            .ok()?;
        let (_, session) = tls.get_ref();
        Some(session.peer_certificates()?.first()?.to_vec())
    })
}

pub fn tls_secret(name: &str, cert: &IssuedCertificate) -> Secret {
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.into());
    secret.type_ = Some("kubernetes.io/tls".into());
    secret.data = Some(
        [
            (
                "tls.crt".to_owned(),
                ByteString(cert.cert_pem.clone().into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(cert.key_pem.clone().into_bytes()),
            ),
        ]
        .into(),
    );
    secret
}

pub fn https_spec(node: &str, port: u16, secret_ref: serde_json::Value) -> serde_json::Value {
    let listener = format!(
        r#"name: https
address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: https
        route_config:
          name: local
          virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
                - match: {{ prefix: "/" }}
                  direct_response: {{ status: 200, body: {{ inline_string: secure }} }}
        http_filters:
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
        common_tls_context:
          tls_certificate_sds_secret_configs:
            - name: my-certificate
              sds_config: {{ ads: {{}}, resource_api_version: V3 }}
"#
    );
    // `null`: no `ref`, the original MARIN3R's way of naming the Secret `my-certificate`.
    let secret = if secret_ref.is_null() {
        json!({"name": "my-certificate"})
    } else {
        json!({"name": "my-certificate", "ref": secret_ref})
    };
    json!({
        "nodeID": node,
        "serialization": "yaml",
        "envoyResources": {
            "secrets": [secret],
            "listeners": [{"name": "https", "value": listener}],
            "runtimes": [{"name": "runtime", "value": RUNTIME}],
        }
    })
}
