//! The `EnvoyConfig` and `EnvoyConfigRevision` controllers against the local cluster's API
//! server, feeding an in-process xDS server that real Envoy processes (product bootstrap,
//! client certificates of their namespace) connect to: publishing, updates, re-applied
//! specs, NACK-driven rollback, invalid specs, Secrets served by SDS and reloaded when they
//! change, namespaces sharing a node id, the revision limit and deletion.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, CustomResourceExt};
use marin3r_certs::{CertificateRequest, IssuedCertificate, Usage};
use marin3r_discovery::api::envoy_config_revision::REVISION_TAINTED;
use marin3r_discovery::api::{EnvoyConfig, EnvoyConfigRevision};
use marin3r_discovery::bootstrap::AdsMode;
use marin3r_discovery::controllers::{self, Readiness};
use marin3r_discovery::xds::{Cache, Server, server_config};
use marin3r_e2e::apiserver::{ApiServer, ApiServerConfig};
use serde_json::json;
use support::{Pki, Proxy, free_port};

/// The local cluster, the xDS server and the controllers, on their own runtime.
struct Plane {
    rt: tokio::runtime::Runtime,
    _api: ApiServer,
    client: Client,
    cache: Cache,
    xds_port: u16,
    pki: Pki,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Plane {
    fn start(namespaces: &[&str]) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let pki = Pki::new();
        let (api, client) = rt.block_on(async {
            let api = ApiServer::start(ApiServerConfig::default()).await.unwrap();
            let client = api.kube_client().await.unwrap();
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            for crd in [EnvoyConfig::crd(), EnvoyConfigRevision::crd()] {
                let name = crd.metadata.name.clone().unwrap();
                crds.create(&PostParams::default(), &crd).await.unwrap();
                let established =
                    await_condition(crds.clone(), &name, conditions::is_crd_established());
                tokio::time::timeout(Duration::from_secs(10), established)
                    .await
                    .unwrap()
                    .unwrap();
            }
            let nss: Api<Namespace> = Api::all(client.clone());
            for ns in namespaces {
                let ns: Namespace =
                    serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
                nss.create(&PostParams::default(), &ns).await.unwrap();
            }
            (api, client)
        });
        let cache = Cache::new();
        let (server, nacks) = Server::builder(cache.clone()).build();
        let tls = {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("tls.crt"), &pki.server.cert_pem).unwrap();
            std::fs::write(dir.path().join("tls.key"), &pki.server.key_pem).unwrap();
            std::fs::write(dir.path().join("ca.crt"), pki.ca_pem()).unwrap();
            server_config(&marin3r_discovery::xds::TlsFiles::in_dir(dir.path())).unwrap()
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
        let tasks = vec![
            rt.spawn({
                let stopped = stopped.clone();
                async move {
                    server.serve(listener, tls, stopped).await.unwrap();
                }
            }),
            rt.spawn(controllers::run(
                client.clone(),
                controllers::Config::default(),
                cache.clone(),
                nacks,
                readiness.clone(),
                stopped,
            )),
        ];
        let plane = Self {
            rt,
            _api: api,
            client,
            cache,
            xds_port,
            pki,
            stop: Some(stop),
            tasks,
        };
        wait("the controllers to sync", Duration::from_secs(10), || {
            readiness.ready().then_some(())
        });
        plane
    }

    fn configs(&self, ns: &str) -> Api<EnvoyConfig> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn revisions(&self, ns: &str) -> Api<EnvoyConfigRevision> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Creates or replaces an EnvoyConfig (server-side apply).
    fn apply(&self, ns: &str, name: &str, spec: serde_json::Value) {
        let body = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        });
        self.rt
            .block_on(self.configs(ns).patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(body),
            ))
            .unwrap();
    }

    fn get(&self, ns: &str, name: &str) -> EnvoyConfig {
        self.rt.block_on(self.configs(ns).get(name)).unwrap()
    }

    fn list_revisions(&self, ns: &str) -> Vec<EnvoyConfigRevision> {
        self.rt
            .block_on(self.revisions(ns).list(&ListParams::default()))
            .unwrap()
            .items
    }

    /// Waits until the config's status satisfies `f`; panics with the last status.
    fn wait_status(
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
    fn wait_in_sync(&self, ns: &str, name: &str) -> EnvoyConfig {
        self.wait_status(ns, name, "InSync", |ec| {
            let version = ec.spec.envoy_resources.version();
            ec.status.as_ref().is_some_and(|s| {
                s.cache_state.as_deref() == Some("InSync")
                    && s.published_version.as_deref() == Some(version.as_str())
            })
        })
    }

    fn client_cert(&self, ns: &str) -> IssuedCertificate {
        self.pki.client(Some(ns))
    }

    fn proxy(&self, ns: &str, node: &str, mode: AdsMode) -> Proxy {
        Proxy::start_on(
            self.xds_port,
            &self.client_cert(ns),
            node,
            &format!("{node}-pod"),
            mode,
        )
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

fn wait<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    support::wait_for(what, timeout, &mut f)
}

/// A listener on 127.0.0.1:`port` answering `body`, in YAML as users write it.
fn listener_yaml(port: u16, body: &str, router_not_last: bool) -> String {
    let extra = if router_not_last {
        "\n        - name: second_router\n          typed_config:\n            \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    } else {
        ""
    };
    format!(
        r#"name: http
address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
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

const RUNTIME: &str = "name: runtime\nlayer: { marin3r.test: 1 }\n";

fn spec(node: &str, port: u16, body: &str) -> serde_json::Value {
    json!({
        "nodeID": node,
        "serialization": "yaml",
        "envoyResources": {
            "listeners": [{"name": "http", "value": listener_yaml(port, body, false)}],
            "runtime": [{"name": "runtime", "value": RUNTIME}],
        }
    })
}

fn nacked_spec(node: &str, port: u16, body: &str) -> serde_json::Value {
    let mut s = spec(node, port, body);
    s["envoyResources"]["listeners"][0]["value"] = listener_yaml(port, body, true).into();
    s
}

fn revision_versions(ec: &EnvoyConfig) -> Vec<String> {
    ec.status
        .as_ref()
        .unwrap()
        .revisions
        .iter()
        .map(|r| r.version.clone())
        .collect()
}

fn condition<'a>(
    ec: &'a EnvoyConfig,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    ec.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

const NS: &str = "team-a";

#[test]
fn publishes_updates_republishes_and_rolls_back_on_nack() {
    let plane = Plane::start(&[NS]);
    let port = free_port();
    let node = "gateway";

    // Apply: one revision, published, InSync; Envoy serves it.
    plane.apply(NS, "gw", spec(node, port, "v1"));
    let ec = plane.wait_in_sync(NS, "gw");
    let v1 = ec.spec.envoy_resources.version();
    assert_eq!(revision_versions(&ec), std::slice::from_ref(&v1));
    let revisions = plane.list_revisions(NS);
    assert_eq!(revisions.len(), 1);
    let r1 = &revisions[0];
    assert_eq!(
        r1.metadata.name.as_deref(),
        Some(format!("{node}-{v1}").as_str())
    );
    let labels = r1.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["marin3r.3scale.net/node-id"], node);
    assert_eq!(labels["marin3r.3scale.net/config-version"], v1);
    assert!(r1.is_published());
    assert!(r1.status.as_ref().unwrap().last_published_at.is_some());
    let proxy = plane.proxy(NS, node, AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "v1");

    // Update: a second revision, published; Envoy follows.
    plane.apply(NS, "gw", spec(node, port, "v2"));
    let ec = plane.wait_in_sync(NS, "gw");
    let v2 = ec.spec.envoy_resources.version();
    assert_eq!(revision_versions(&ec), [v1.clone(), v2.clone()]);
    proxy.wait_for_body(port, "v2");

    // Re-applying the first spec republishes its revision; no third one.
    plane.apply(NS, "gw", spec(node, port, "v1"));
    let ec = plane.wait_in_sync(NS, "gw");
    assert_eq!(revision_versions(&ec), [v2.clone(), v1.clone()]);
    assert_eq!(plane.list_revisions(NS).len(), 2);
    proxy.wait_for_body(port, "v1");

    // An invalid spec never reaches Envoy and says why; what was published stays.
    let mut invalid = spec(node, port, "never");
    invalid["envoyResources"]["listeners"][0]["value"] =
        format!("{}no_such_field: 1\n", listener_yaml(port, "never", false)).into();
    plane.apply(NS, "gw", invalid);
    let ec = plane.wait_status(NS, "gw", "the InvalidSpec condition", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.listeners[0].value")
            && message.contains("no_such_field"),
        "{message}"
    );
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(
        status.desired_version,
        Some(ec.spec.envoy_resources.version())
    );
    assert_eq!(plane.list_revisions(NS).len(), 2);
    proxy.wait_for_body(port, "v1");

    // A config Envoy rejects: tainted with Envoy's message, rolled back, Envoy keeps v1.
    plane.apply(NS, "gw", nacked_spec(node, port, "bad"));
    let ec = plane.wait_status(NS, "gw", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state.as_deref()) == Some("Rollback")
    });
    let bad = ec.spec.envoy_resources.version();
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(
        revision_versions(&ec),
        [v2.clone(), v1.clone(), bad.clone()]
    );
    let nack = status.last_nack_message.as_deref().unwrap();
    assert!(nack.contains("router"), "{nack}");
    let out_of_sync = condition(&ec, "CacheOutOfSync").unwrap();
    assert_eq!(
        (out_of_sync.status.as_str(), out_of_sync.reason.as_str()),
        ("True", "Rollback")
    );
    let tainted = plane
        .list_revisions(NS)
        .into_iter()
        .find(|r| r.spec.version == bad)
        .unwrap();
    assert!(tainted.is_tainted() && !tainted.is_published());
    let c = tainted
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == REVISION_TAINTED)
        .unwrap();
    assert!(c.message.contains("router"), "{}", c.message);
    proxy.wait_for_body(port, "v1");

    // A fixed spec is InSync again.
    plane.apply(NS, "gw", spec(node, port, "v3"));
    plane.wait_in_sync(NS, "gw");
    proxy.wait_for_body(port, "v3");
}

#[test]
fn with_no_good_revision_the_rollback_fails_until_the_spec_is_fixed() {
    let plane = Plane::start(&[NS]);
    let port = free_port();
    plane.apply(NS, "edge", nacked_spec("edge", port, "bad"));
    plane.wait_status(NS, "edge", "the bad revision published", |ec| {
        ec.status
            .as_ref()
            .and_then(|s| s.published_version.clone())
            .is_some()
    });
    let proxy = plane.proxy(NS, "edge", AdsMode::Delta);
    let ec = plane.wait_status(NS, "edge", "RollbackFailed", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state.as_deref()) == Some("RollbackFailed")
    });
    let bad = ec.spec.envoy_resources.version();
    let status = ec.status.as_ref().unwrap();
    // The failing revision stays published until the user fixes the spec.
    assert_eq!(status.published_version.as_deref(), Some(bad.as_str()));
    let failed = condition(&ec, "RollbackFailed").unwrap();
    assert_eq!(failed.status, "True");
    assert!(
        status
            .last_nack_message
            .as_deref()
            .unwrap()
            .contains("router")
    );

    plane.apply(NS, "edge", spec("edge", port, "fixed"));
    let ec = plane.wait_in_sync(NS, "edge");
    assert_eq!(condition(&ec, "RollbackFailed").unwrap().status, "False");
    assert_eq!(condition(&ec, "CacheOutOfSync").unwrap().status, "False");
    assert!(ec.status.as_ref().unwrap().last_nack_message.is_none());
    proxy.wait_for_body(port, "fixed");
}

#[test]
fn the_same_node_id_in_two_namespaces_gets_each_namespace_its_own_config() {
    let plane = Plane::start(&["ns-one", "ns-two"]);
    let (p1, p2) = (free_port(), free_port());
    plane.apply("ns-one", "cfg", spec("shared", p1, "one"));
    plane.apply("ns-two", "cfg", spec("shared", p2, "two"));
    plane.wait_in_sync("ns-one", "cfg");
    plane.wait_in_sync("ns-two", "cfg");
    let one = plane.proxy("ns-one", "shared", AdsMode::StateOfTheWorld);
    let two = plane.proxy("ns-two", "shared", AdsMode::Delta);
    one.wait_for_body(p1, "one");
    two.wait_for_body(p2, "two");
    // Neither got the other's listener.
    assert!(
        marin3r_e2e::envoy::get_body(&format!("http://127.0.0.1:{p2}/")).unwrap_or_default()
            == "two"
    );
    let listeners = one.envoy.admin_get("/listeners").unwrap();
    assert!(!listeners.contains(&p2.to_string()), "{listeners}");
}

#[test]
fn eleven_updates_keep_ten_revisions_and_deleting_the_config_clears_the_cache() {
    let plane = Plane::start(&[NS]);
    let port = free_port();
    let mut versions = Vec::new();
    for i in 0..11 {
        plane.apply(NS, "many", spec("many", port, &format!("body {i}")));
        versions.push(
            plane
                .wait_in_sync(NS, "many")
                .spec
                .envoy_resources
                .version(),
        );
    }
    let ec = plane.get(NS, "many");
    assert_eq!(revision_versions(&ec), versions[1..]);
    let revisions = wait("the oldest revision to go", Duration::from_secs(10), || {
        let r = plane.list_revisions(NS);
        (r.len() == 10).then_some(r)
    });
    assert!(revisions.iter().all(|r| r.spec.version != versions[0]));
    assert_eq!(revisions.iter().filter(|r| r.is_published()).count(), 1);
    assert!(plane.cache.snapshot(NS, "many").is_some());

    plane
        .rt
        .block_on(plane.configs(NS).delete("many", &DeleteParams::default()))
        .unwrap();
    wait(
        "the revisions to be deleted",
        Duration::from_secs(10),
        || plane.list_revisions(NS).is_empty().then_some(()),
    );
    wait(
        "the cache entry to be cleared",
        Duration::from_secs(10),
        || plane.cache.snapshot(NS, "many").is_none().then_some(()),
    );
}

/// The base64 body of a PEM certificate, to compare with what a TLS server presented.
fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// The certificate a TLS server on 127.0.0.1:`port` presents for `localhost`.
fn served_certificate(rt: &tokio::runtime::Runtime, port: u16, ca_pem: &str) -> Option<Vec<u8>> {
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

fn tls_secret(name: &str, cert: &IssuedCertificate) -> Secret {
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

fn https_spec(node: &str, port: u16, secret_ref: serde_json::Value) -> serde_json::Value {
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
    json!({
        "nodeID": node,
        "serialization": "yaml",
        "envoyResources": {
            "secrets": [{"name": "my-certificate", "ref": secret_ref}],
            "listeners": [{"name": "https", "value": listener}],
            "runtimes": [{"name": "runtime", "value": RUNTIME}],
        }
    })
}

#[test]
fn secrets_are_served_by_sds_and_a_changed_secret_reaches_envoy() {
    let plane = Plane::start(&[NS, "elsewhere"]);
    let port = free_port();
    let issue = |cn: &str| {
        plane
            .pki
            .ca
            .issue(
                &CertificateRequest::new(cn, Usage::Server, Duration::from_secs(86_400))
                    .with_hosts(["localhost"]),
            )
            .unwrap()
    };
    let (first, second) = (issue("first"), issue("second"));
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), NS);
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &tls_secret("web-cert", &first)))
        .unwrap();

    plane.apply(
        NS,
        "tls",
        https_spec("tls", port, json!({"name": "web-cert", "namespace": NS})),
    );
    let ec = plane.wait_in_sync(NS, "tls");
    let version = ec.spec.envoy_resources.version();
    let _proxy = plane.proxy(NS, "tls", AdsMode::StateOfTheWorld);
    let want = pem_der(&first.cert_pem);
    wait(
        "Envoy to serve the first certificate",
        Duration::from_secs(20),
        || {
            (served_certificate(&plane.rt, port, plane.pki.ca_pem()).as_ref() == Some(&want))
                .then_some(())
        },
    );

    // The Secret changes, the EnvoyConfig does not: Envoy serves the new certificate.
    plane
        .rt
        .block_on(secrets.replace("web-cert", &PostParams::default(), &{
            let mut s = tls_secret("web-cert", &second);
            s.metadata.resource_version = plane
                .rt
                .block_on(secrets.get("web-cert"))
                .unwrap()
                .metadata
                .resource_version;
            s
        }))
        .unwrap();
    let want = pem_der(&second.cert_pem);
    wait(
        "Envoy to serve the second certificate",
        Duration::from_secs(20),
        || {
            (served_certificate(&plane.rt, port, plane.pki.ca_pem()).as_ref() == Some(&want))
                .then_some(())
        },
    );
    let ec = plane.get(NS, "tls");
    assert_eq!(ec.status.as_ref().unwrap().published_version, Some(version));
    assert_eq!(plane.list_revisions(NS).len(), 1);

    // A reference to another namespace's Secret is refused, naming the field.
    plane.apply(
        NS,
        "tls",
        https_spec(
            "tls",
            port,
            json!({"name": "web-cert", "namespace": "elsewhere"}),
        ),
    );
    let ec = plane.wait_status(NS, "tls", "the cross-namespace refusal", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.secrets[0].ref.namespace"),
        "{message}"
    );
    assert_eq!(plane.list_revisions(NS).len(), 1);
}

/// The design seed's example, as written for the original MARIN3R (v2 type URLs and all).
const SEED_EXAMPLE: &str = r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata:
  name: test
  namespace: team-a
spec:
  nodeID: my-proxy
  serialization: yaml
  envoyResources:
    secrets:
      - name: my-certificate
        ref:
          name: my-certificate-secret-resource
          namespace: team-a
    listeners:
      - name: https
        value: |
          name: https
          address: { socket_address: { address: 0.0.0.0, port_value: 1443 }}
          filter_chains:
            - filters:
              - name: envoy.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager
                  stat_prefix: ingress_http
                  route_config:
                    name: local_route
                    virtual_hosts:
                      - name: my-proxy
                        domains: ["*"]
                        routes:
                          - match: { prefix: "/" }
                            direct_response: { status: 200, body: { inline_string: ok }}
                  http_filters: [ name: envoy.router ]
"#;

#[test]
fn kubectl_applies_the_crds_and_original_manifests_and_prints_the_columns() {
    let plane = Plane::start(&[NS]);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    plane._api.write_kubeconfig(&kubeconfig).unwrap();
    let k = marin3r_e2e::kubectl::Kubectl::new(&kubeconfig).unwrap();
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
    for file in [
        "marin3r.3scale.net_envoyconfigs.yaml",
        "marin3r.3scale.net_envoyconfigrevisions.yaml",
    ] {
        // The checked-in CRDs apply over the ones the plane installed from the types.
        let path = crds.join(file);
        plane
            .rt
            .block_on(k.ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                path.to_str().unwrap(),
            ]))
            .unwrap();
    }

    // The original manifest applies unchanged; its Envoy v2 resources are refused in status.
    plane
        .rt
        .block_on(k.ok_with(&["apply", "--server-side", "-f", "-"], SEED_EXAMPLE))
        .unwrap();
    let ec = plane.wait_status(NS, "test", "the v2 resources to be refused", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.listeners[0].value"),
        "{message}"
    );
    assert!(plane.list_revisions(NS).is_empty());

    let port = free_port();
    plane.apply(NS, "good", spec("good", port, "ok"));
    let ec = plane.wait_in_sync(NS, "good");
    let version = ec.spec.envoy_resources.version();
    let table = plane.rt.block_on(k.ok(&["get", "ec", "-n", NS])).unwrap();
    let header = table.lines().next().unwrap();
    for column in [
        "NODE ID",
        "ENVOY API",
        "DESIRED VERSION",
        "PUBLISHED VERSION",
        "CACHE STATE",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = table.lines().find(|l| l.starts_with("good ")).unwrap();
    assert!(row.contains(&version) && row.contains("InSync"), "{table}");
    let table = plane.rt.block_on(k.ok(&["get", "ecr", "-n", NS])).unwrap();
    let header = table.lines().next().unwrap();
    for column in [
        "NODE ID",
        "VERSION",
        "PUBLISHED",
        "CREATED AT",
        "LAST PUBLISHED AT",
        "TAINTED",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("good-{version}")))
        .unwrap();
    assert!(row.contains("true"), "{table}");
}

#[test]
fn a_missing_or_wrong_secret_is_reported_on_the_revision_until_it_is_fixed() {
    let plane = Plane::start(&[NS]);
    let port = free_port();
    plane.apply(
        NS,
        "late",
        https_spec("late", port, json!({"name": "later"})),
    );
    let ec = plane.wait_in_sync(NS, "late");
    let version = ec.spec.envoy_resources.version();
    let name = format!("late-{version}");
    let out_of_sync = |reason: &str| {
        let reason = reason.to_owned();
        wait(
            &format!("ResourcesOutOfSync {reason}"),
            Duration::from_secs(20),
            || {
                let r = plane.rt.block_on(plane.revisions(NS).get(&name)).unwrap();
                r.status?
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "ResourcesOutOfSync" && c.reason == reason)
            },
        )
    };
    let c = out_of_sync("LoadFailed");
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("Secret team-a/later not found"),
        "{}",
        c.message
    );
    assert!(plane.cache.snapshot(NS, "late").is_none());

    // An Opaque Secret is not a certificate.
    let secrets: Api<Secret> = Api::namespaced(plane.client.clone(), NS);
    let mut opaque = tls_secret("later", &plane.pki.server);
    opaque.type_ = Some("Opaque".into());
    plane
        .rt
        .block_on(secrets.create(&PostParams::default(), &opaque))
        .unwrap();
    wait("the type to be refused", Duration::from_secs(20), || {
        let r = plane.rt.block_on(plane.revisions(NS).get(&name)).unwrap();
        r.status?.conditions.into_iter().find(|c| {
            c.type_ == "ResourcesOutOfSync" && c.message.contains("not kubernetes.io/tls")
        })
    });

    // With a TLS Secret it loads, with no change to the config.
    plane
        .rt
        .block_on(secrets.delete("later", &DeleteParams::default()))
        .unwrap();
    plane
        .rt
        .block_on(secrets.create(
            &PostParams::default(),
            &tls_secret("later", &plane.pki.server),
        ))
        .unwrap();
    let c = out_of_sync("ResourcesLoaded");
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains(&format!("secrets version {version}-")),
        "{}",
        c.message
    );
    assert!(plane.cache.snapshot(NS, "late").is_some());
}
