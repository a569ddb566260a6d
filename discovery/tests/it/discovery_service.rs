//! `marin3r discovery-service` as a process against the real cluster's API server (through a
//! kubeconfig naming a fault proxy in front of it): it starts, `/readyz` turns ready once its servers listen, its controllers
//! synced and every published revision is loaded, an Envoy gets its namespace's EnvoyConfig
//! through it, EnvoyConfigs (and Secrets) of namespaces not labelled for it are left alone
//! until the label is added, `/sync-status` is on the admin address only, the webhook answers
//! on the same certificate, and SIGTERM drains: not ready and no new connection at once, the
//! connected Envoy still served until the grace period ends, then a clean exit.

use crate::support;

use marin3r_api::envoy_config::CacheState;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use marin3r_api::EnvoyConfig;
use marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL;
use marin3r_api_faults::FaultProxy;
use marin3r_testkit::envoy::get_body;
use marin3r_testkit::namespaces::{Namespaces, cluster, unique};
use marin3r_webhook::bootstrap::AdsMode;
use serde_json::json;
use support::plane::pem_der;
use support::{Pki, Proxy, free_port, wait_for};

/// The real cluster held, a fault proxy in front of its API server, and a kubeconfig (in
/// `dir`) for a child process that reaches it through the proxy and a request log.
struct ThroughProxy {
    space: Namespaces,
    client: kube::Client,
    proxy: FaultProxy,
    kubeconfig: std::path::PathBuf,
    /// The child's endpoint, whose log is what it asked.
    endpoint: marin3r_api_faults::Endpoint,
}

async fn through_proxy(dir: &std::path::Path) -> ThroughProxy {
    let cluster = cluster();
    let client = cluster.client().await.unwrap();
    let space = Namespaces::new(&cluster, &client).await;
    let proxy = FaultProxy::start(cluster.config().await.unwrap())
        .await
        .unwrap();
    let endpoint = proxy.endpoint("discovery-service").await.unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, endpoint.kubeconfig(None)).unwrap();
    ThroughProxy {
        space,
        client,
        proxy,
        kubeconfig,
        endpoint,
    }
}

/// The discovery service process; killed on drop if the test did not stop it.
struct Process(Option<Child>);

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

const RUNTIME: &str = "name: runtime\nlayer: { marin3r.test: 1 }\n";

fn spec(port: u16, body: &str) -> serde_json::Value {
    let listener = format!(
        r#"name: http
address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: ingress
        route_config:
          virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
                - match: {{ prefix: "/" }}
                  direct_response: {{ status: 200, body: {{ inline_string: "{body}" }} }}
        http_filters:
        - name: envoy.filters.http.router
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    );
    json!({
        "nodeID": "sidecar",
        "serialization": "yaml",
        "envoyResources": {
            "listeners": [{"name": "http", "value": listener}],
            "runtimes": [{"name": "runtime", "value": RUNTIME}],
        }
    })
}

#[test]
fn the_discovery_service_serves_envoy_configs_of_its_namespaces() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ds = unique("ds");
    let (api, served, ignored) = rt.block_on(async {
        let api = through_proxy(dir.path()).await;
        let served = api
            .space
            .create("served", &[(DISCOVERY_SERVICE_LABEL, &ds)])
            .await;
        let ignored = api.space.create("ignored", &[]).await;
        (api, served, ignored)
    });
    let (served, ignored) = (served.as_str(), ignored.as_str());
    let client = api.client.clone();
    let kubeconfig = api.kubeconfig.clone();
    let pki = Pki::new();
    let certs = dir.path().join("server-cert");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), &pki.server.cert_pem).unwrap();
    std::fs::write(certs.join("tls.key"), &pki.server.key_pem).unwrap();
    std::fs::write(certs.join("ca.crt"), pki.ca_pem()).unwrap();
    let (xds, metrics, webhook, admin) = (free_port(), free_port(), free_port(), free_port());
    let probe = free_port();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args([
            "discovery-service",
            "--no-leader-election",
            "--server-cert-dir",
        ])
        .arg(&certs)
        .args(["--xds-port", &xds.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .args(["--webhook-port", &webhook.to_string()])
        .args(["--probe-port", &probe.to_string()])
        .args([
            "--discovery-service-name",
            &ds,
            "--bind-address",
            "127.0.0.1",
            "--shutdown-grace-period",
            "1",
        ])
        .args(["--admin-address", &format!("127.0.0.1:{admin}")])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut process = Process(Some(child));
    let log = || std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();

    let readyz = format!("http://127.0.0.1:{metrics}/readyz");
    let deadline = Instant::now() + Duration::from_secs(20);
    while get_body(&readyz).ok().as_deref() != Some("ready\n") {
        assert!(
            Instant::now() < deadline,
            "/readyz never turned ready: {:?}\n{}",
            get_body(&readyz),
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let port = free_port();
    for ns in [ignored, served] {
        let body = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": "cfg", "namespace": ns},
            "spec": spec(port, ns),
        });
        let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), ns);
        rt.block_on(configs.patch("cfg", &PatchParams::apply("test"), &Patch::Apply(body)))
            .unwrap();
    }
    let served_configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), served);
    wait_for(
        "the served config to be InSync",
        Duration::from_secs(20),
        || {
            let ec = rt.block_on(served_configs.get("cfg")).unwrap();
            (ec.status.and_then(|s| s.cache_state) == Some(CacheState::InSync)).then_some(())
        },
    );
    let proxy = Proxy::start_on(
        xds,
        &pki.client(Some(served)),
        "sidecar",
        "sidecar-pod",
        AdsMode::Delta,
    );
    proxy.wait_for_body(port, served);
    let ignored_configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), ignored);
    let ec = rt.block_on(ignored_configs.get("cfg")).unwrap();
    assert!(ec.status.is_none(), "{:?}", ec.status);

    // Secrets are watched only in the namespace served.
    let secret_requests = |ns: &str| {
        api.endpoint
            .requests()
            .into_iter()
            .filter(|r| r.contains(&format!("/namespaces/{ns}/secrets")))
            .collect::<Vec<_>>()
    };
    assert!(
        secret_requests(served)
            .iter()
            .any(|r| r.contains("watch=true")),
        "{:#?}",
        api.endpoint.requests()
    );
    assert_eq!(secret_requests(ignored), Vec::<String>::new());

    // Labelling the namespace for this discovery service takes effect without touching the
    // config.
    let nss: Api<Namespace> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {DISCOVERY_SERVICE_LABEL: ds}}});
    rt.block_on(nss.patch(ignored, &PatchParams::default(), &Patch::Merge(label)))
        .unwrap();
    wait_for(
        "the newly labelled namespace's config to be InSync",
        Duration::from_secs(20),
        || {
            let ec = rt.block_on(ignored_configs.get("cfg")).unwrap();
            (ec.status.and_then(|s| s.cache_state) == Some(CacheState::InSync)).then_some(())
        },
    );

    // ...and its Secrets are watched from then on; never any cluster-wide.
    wait_for(
        "a Secret watch in the newly labelled namespace",
        Duration::from_secs(10),
        || {
            secret_requests(ignored)
                .iter()
                .any(|r| r.contains("watch=true"))
                .then_some(())
        },
    );
    let cluster_wide: Vec<String> = api
        .endpoint
        .requests()
        .into_iter()
        .filter(|r| r.contains(" /api/v1/secrets"))
        .collect();
    assert!(cluster_wide.is_empty(), "{cluster_wide:#?}");

    // /sync-status is on the admin address, not on the metrics port.
    let status: serde_json::Value =
        serde_json::from_str(&get_body(&format!("http://127.0.0.1:{admin}/sync-status")).unwrap())
            .unwrap();
    assert_eq!(status["proxies"][0]["pod"], "sidecar-pod", "{status}");
    assert_eq!(
        get_status(&format!("http://127.0.0.1:{metrics}/sync-status")),
        404
    );

    // The controllers' metrics are on the metrics port with the xDS server's.
    let metrics_text = get_body(&format!("http://127.0.0.1:{metrics}/metrics")).unwrap();
    for sample in [
        r#"marin3r_controller_reconciles_total{controller="envoyconfig",result="ok"}"#,
        "marin3r_xds_connected_proxies",
        "marin3r_webhook_admission_duration_seconds_count",
    ] {
        assert!(
            metrics_text.contains(sample),
            "{sample} missing:\n{metrics_text}"
        );
    }

    // The webhook answers over TLS with the same server certificate.
    let presented = webhook_certificate(&rt, webhook, pki.ca_pem());
    assert_eq!(presented, pem_der(&pki.server.cert_pem));

    // SIGTERM: a clean exit.
    let mut child = process.0.take().unwrap();
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "no exit after SIGTERM\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(proxy);
    assert!(status.success(), "{status:?}\n{}", log());
}

/// The certificate the webhook presents, after checking it answers `/healthz` with 200.
fn webhook_certificate(rt: &tokio::runtime::Runtime, port: u16, ca_pem: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pem_der(ca_pem).into()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    rt.block_on(async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        tls.read_to_string(&mut response).await.unwrap_or_default();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    })
}

#[test]
fn a_missing_server_certificate_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .unwrap();
    let missing = dir.path().join("no-such-dir");
    let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args([
            "discovery-service",
            "--no-leader-election",
            "--server-cert-dir",
        ])
        .arg(&missing)
        .args([
            "--xds-port",
            "0",
            "--metrics-port",
            "0",
            "--webhook-port",
            "0",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--server-cert-dir") && stderr.contains("no-such-dir"),
        "{stderr}"
    );
}

/// The HTTP status of a GET of `url`.
fn get_status(url: &str) -> u16 {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    agent.get(url).call().unwrap().status().as_u16()
}

/// The ports of one discovery service process.
struct Ports {
    xds: u16,
    metrics: u16,
    probe: u16,
    webhook: u16,
    admin: u16,
}

/// Starts `marin3r discovery-service` for `ds` with its log in `dir/<log>`.
/// `GET path` over HTTPS to `(ip, port)` as `localhost`, trusting only `ca_pem`: the
/// answer's head and body.
async fn https_get(ca_pem: &str, (ip, port): (&str, u16), path: &str) -> Result<String, String> {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((ip, port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

fn start_process(
    dir: &std::path::Path,
    ds: &str,
    kubeconfig: &std::path::Path,
    certs: &std::path::Path,
    log: &str,
    (delay_seconds, grace_seconds): (u64, u64),
) -> (Process, Ports) {
    let ports = Ports {
        xds: free_port(),
        metrics: free_port(),
        probe: free_port(),
        webhook: free_port(),
        admin: free_port(),
    };
    let log = std::fs::File::create(dir.join(log)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args([
            "discovery-service",
            "--no-leader-election",
            "--server-cert-dir",
        ])
        .arg(certs)
        .args(["--xds-port", &ports.xds.to_string()])
        .args(["--metrics-port", &ports.metrics.to_string()])
        .args(["--probe-port", &ports.probe.to_string()])
        .args(["--webhook-port", &ports.webhook.to_string()])
        .args(["--admin-address", &format!("127.0.0.1:{}", ports.admin)])
        .args(["--shutdown-delay", &delay_seconds.to_string()])
        .args(["--shutdown-grace-period", &grace_seconds.to_string()])
        // No --bind-address: the default, both IP families.
        .args(["--discovery-service-name", ds])
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    (Process(Some(child)), ports)
}

fn readyz(ports: &Ports) -> String {
    get_body(&format!("http://127.0.0.1:{}/readyz", ports.metrics)).unwrap_or_default()
}

#[test]
fn readiness_waits_for_published_revisions_and_sigterm_drains() {
    use k8s_openapi::api::core::v1::Secret;
    use marin3r_certs::{CertificateRequest, Usage};
    use support::plane::{https_spec, runtime, tls_secret};

    let rt = runtime();
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let ds = unique("ds");
    let (api, served) = rt.block_on(async {
        let api = through_proxy(dir.path()).await;
        let served = api
            .space
            .create("served", &[(DISCOVERY_SERVICE_LABEL, &ds)])
            .await;
        let cert = pki
            .ca
            .issue(
                &CertificateRequest::new("web", Usage::Server, Duration::from_secs(86_400))
                    .with_hosts(["localhost"]),
            )
            .unwrap();
        Api::<Secret>::namespaced(api.client.clone(), &served)
            .create(&Default::default(), &tls_secret("web-cert", &cert))
            .await
            .unwrap();
        (api, served)
    });
    let served = served.as_str();
    let client = api.client.clone();
    let kubeconfig = api.kubeconfig.clone();
    let certs = dir.path().join("server-cert");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), &pki.server.cert_pem).unwrap();
    std::fs::write(certs.join("tls.key"), &pki.server.key_pem).unwrap();
    std::fs::write(certs.join("ca.crt"), pki.ca_pem()).unwrap();
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();

    // The first process publishes two configs, one of them with an SDS Secret.
    const DELAY: u64 = 3;
    const GRACE: u64 = 8;
    let (mut first, ports) = start_process(
        dir.path(),
        &ds,
        &kubeconfig,
        &certs,
        "first",
        (DELAY, GRACE),
    );
    wait_for("the first process ready", Duration::from_secs(20), || {
        (readyz(&ports) == "ready\n").then_some(())
    });
    // The probe port (spec.probePort) answers the health paths as the metrics port does, and
    // nothing else.
    let probe_url = |path: &str| format!("http://127.0.0.1:{}{path}", ports.probe);
    assert_eq!(get_body(&probe_url("/readyz")).unwrap(), "ready\n");
    assert_eq!(get_body(&probe_url("/healthz")).unwrap(), "ok\n");
    assert_eq!(get_status(&probe_url("/metrics")), 404);
    // The default bind address serves both IP families: kubelet and the API server reach the
    // pod over IPv6 on IPv6-only and dual-stack clusters, over IPv4 elsewhere.
    for host in ["127.0.0.1", "[::1]"] {
        let get = |port: u16, path: &str| get_body(&format!("http://{host}:{port}{path}"));
        assert_eq!(get(ports.probe, "/readyz").unwrap(), "ready\n", "{host}");
        assert_eq!(get(ports.metrics, "/healthz").unwrap(), "ok\n", "{host}");
        let ip = host.trim_matches(['[', ']']);
        let webhook = rt.block_on(https_get(pki.ca_pem(), (ip, ports.webhook), "/healthz"));
        assert!(
            webhook
                .as_ref()
                .is_ok_and(|a| a.starts_with("HTTP/1.1 200")),
            "the webhook on {host}: {webhook:?}"
        );
        assert!(
            std::net::TcpStream::connect((ip, ports.xds)).is_ok(),
            "xDS on {host}"
        );
    }
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), served);
    let apply = |name: &str, spec: serde_json::Value| {
        let body = json!({
            "apiVersion": "marin3r.3scale.net/v1alpha1",
            "kind": "EnvoyConfig",
            "metadata": {"name": name, "namespace": served},
            "spec": spec,
        });
        rt.block_on(configs.patch(name, &PatchParams::apply("test"), &Patch::Apply(body)))
            .unwrap();
    };
    let in_sync = |name: &str, version: Option<&str>| {
        wait_for(&format!("{name} InSync"), Duration::from_secs(20), || {
            let ec = rt.block_on(configs.get(name)).unwrap();
            let status = ec.status?;
            (status.cache_state == Some(marin3r_api::envoy_config::CacheState::InSync)
                && version.is_none_or(|v| status.published_version.as_deref() == Some(v)))
            .then_some(())
        })
    };
    let (port, tls_port) = (free_port(), free_port());
    apply("cfg", spec(port, "one"));
    apply(
        "tls",
        https_spec("tls", tls_port, json!({"name": "web-cert"})),
    );
    in_sync("cfg", None);
    in_sync("tls", None);
    let proxy = Proxy::start_on(
        ports.xds,
        &pki.client(Some(served)),
        "sidecar",
        "sidecar-pod",
        AdsMode::Delta,
    );
    proxy.wait_for_body(port, "one");

    // SIGTERM: not ready at once, while new connections are still accepted for the delay
    // (the endpoints drop the pod meanwhile), then refused...
    let child = first.0.as_mut().unwrap();
    let pid = child.id().to_string();
    // Before the signal: the process may act on it before `kill` returns.
    let term = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    wait_for("/readyz to turn 503", Duration::from_secs(5), || {
        (get_status(&format!("http://127.0.0.1:{}/readyz", ports.metrics)) == 503).then_some(())
    });
    assert_eq!(get_status(&probe_url("/readyz")), 503, "the probe port too");
    assert_eq!(
        get_body(&probe_url("/readyz")).unwrap_or_default(),
        "not ready: shutting down\n"
    );
    // A webhook call arriving in the delay is still answered (HTTPS, as the API server
    // calls it), and a new proxy still connects.
    let healthz = rt.block_on(https_get(
        pki.ca_pem(),
        ("127.0.0.1", ports.webhook),
        "/healthz",
    ));
    assert!(
        healthz
            .as_ref()
            .is_ok_and(|answer| answer.starts_with("HTTP/1.1 200"))
            && term.elapsed() < Duration::from_secs(DELAY),
        "the webhook during the delay: {healthz:?} after {:?}\n{}",
        term.elapsed(),
        log("first")
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", ports.xds)).is_ok());
    for (what, port) in [("xDS", ports.xds), ("webhook", ports.webhook)] {
        wait_for(
            &format!("new {what} connections to be refused"),
            Duration::from_secs(DELAY + 5),
            || {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .is_err()
                    .then_some(())
            },
        );
        assert!(
            term.elapsed() >= Duration::from_secs(DELAY),
            "{what} refused {:?} after SIGTERM, before the delay",
            term.elapsed()
        );
    }
    // ...while the connected Envoy still gets a new config.
    apply("cfg", spec(port, "two"));
    proxy.wait_for_body(port, "two");
    assert!(
        child.try_wait().unwrap().is_none() && term.elapsed() < Duration::from_secs(DELAY + GRACE),
        "the push came after the grace period ({:?})\n{}",
        term.elapsed(),
        log("first")
    );
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            term.elapsed() < Duration::from_secs(DELAY + GRACE + 15),
            "no exit after the grace period\n{}",
            log("first")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}\n{}", log("first"));
    // What `kubectl logs` shows: the shutdown said, and no terminal colour codes in a file.
    let first_log = log("first");
    assert!(
        first_log.contains("shutting down: not ready") && !first_log.contains('\u{1b}'),
        "{first_log:?}"
    );
    assert!(
        term.elapsed() >= Duration::from_secs(DELAY + GRACE),
        "exited {:?} after SIGTERM, before the grace period\n{}",
        term.elapsed(),
        log("first")
    );
    drop(proxy);

    // A new process with the revision's Secret slow to read: not ready until it is loaded.
    let held = format!("/api/v1/namespaces/{served}/secrets/web-cert");
    let held = held.as_str();
    api.proxy.faults().hold(held);
    let (_second, ports) = start_process(dir.path(), &ds, &kubeconfig, &certs, "second", (0, 1));
    wait_for(
        "/readyz to wait for the revision controller only",
        Duration::from_secs(20),
        || (readyz(&ports) == "not ready: EnvoyConfigRevision controller\n").then_some(()),
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        readyz(&ports),
        "not ready: EnvoyConfigRevision controller\n",
        "{}",
        log("second")
    );
    api.proxy.faults().release(held);
    let released = Instant::now();
    while readyz(&ports) != "ready\n" {
        assert!(
            released.elapsed() < Duration::from_secs(20),
            "/readyz not ready 20 s after the Secret was released: {:?}\n{}",
            readyz(&ports),
            log("second")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
