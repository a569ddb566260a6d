//! The injected sidecar's command line runs in a real Envoy: `--service-node`,
//! `--service-cluster`, and the `--config-yaml` overlay (node metadata from the downward API,
//! admin address and admin access log) all reach Envoy as the webhook intends, over a bootstrap
//! with and without an `admin` of its own (the rendered one has one; the overlay wins). And the
//! command line with the real rendered bootstrap passes `envoy --mode validate`. The
//! readiness listener answers `GET /ready` and `GET /stats/prometheus` from the admin and
//! nothing else, also on the admin's port when a pod declares it with the admin on loopback.
//! (That the admin is unreachable from another pod is proven through the pod network in
//! operator_e2e.rs.)

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use marin3r_testkit::envoy::Envoy;
use marin3r_webhook::{InjectionConfig, sidecar_command_line};
use serde_json::{Value, json};

/// A bootstrap without `admin` (as the renderer should write it) and one with its own admin
/// address and node metadata: the overlay's admin wins and the metadata merges.
const BOOTSTRAPS: [&str; 2] = [
    r#"{"static_resources": {}}"#,
    r#"{"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "node": {"metadata": {"from_bootstrap": "kept"}}}"#,
];

/// A pod labelled for injection, with `annotations`, whose one container is `kuard`.
fn labelled_pod(annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "generateName": "kuard-",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "app", "image": "kuard"}]},
    }))
    .unwrap()
}

#[test]
fn the_sidecar_command_line_configures_a_real_envoy() {
    for bootstrap in BOOTSTRAPS {
        run_sidecar(bootstrap);
    }
}

fn run_sidecar(bootstrap: &str) {
    let dir = tempfile::tempdir().unwrap();
    let access_log = dir.path().join("admin-access.log");
    let free_port = marin3r_testkit::ports::free_port;
    let (admin_port, readiness_port) = (free_port(), free_port());
    let pod = labelled_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/cluster-id": "edge",
        "marin3r.3scale.net/admin.port": admin_port.to_string(),
        "marin3r.3scale.net/readiness.port": readiness_port.to_string(),
        "marin3r.3scale.net/admin.access-log-path": access_log.to_str().unwrap(),
        "marin3r.3scale.net/envoy-extra-args": "--log-level info --file-flush-interval-msec 100",
    }));
    // The default binds the admin to loopback.
    let config = InjectionConfig::default();
    let args = sidecar_command_line(&pod, &config, "kuard-7d4b9", "shop").unwrap();
    assert_eq!(args[..2], ["-c", "/etc/envoy/bootstrap/config.json"]);

    // Envoy::start supplies `-c` with this bootstrap in place of the mounted one.
    let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    let envoy = Envoy::start(bootstrap, &rest).unwrap();
    assert_eq!(envoy.admin_address(), format!("127.0.0.1:{admin_port}"));

    let info: Value = serde_json::from_str(&envoy.admin_get("/server_info").unwrap()).unwrap();
    let node = &info["node"];
    assert_eq!(node["id"], "kuard", "{info}");
    assert_eq!(node["cluster"], "edge");
    assert_eq!(node["metadata"]["pod_name"], "kuard-7d4b9");
    assert_eq!(node["metadata"]["pod_namespace"], "shop");
    if bootstrap.contains("from_bootstrap") {
        assert_eq!(node["metadata"]["from_bootstrap"], "kept");
    }
    assert_eq!(info["command_line_options"]["log_level"], "info");
    assert_eq!(envoy.admin_get("/ready").unwrap().trim(), "LIVE");

    // The readiness listener (every address) proxies `GET /ready` to the admin, and only it.
    let host = local_address();
    let ready = format!("http://{host}:{readiness_port}/ready");
    let (status, body) = marin3r_testkit::envoy::request("GET", &ready).unwrap();
    assert_eq!((status, body.trim()), (200, "LIVE"));
    for (method, path) in [
        ("POST", "/quitquitquit"),
        ("GET", "/config_dump"),
        ("GET", "/certs"),
        ("POST", "/healthcheck/fail"),
        ("POST", "/ready"),
        ("GET", "/ready/../quitquitquit"),
        ("GET", "/"),
    ] {
        let url = format!("http://{host}:{readiness_port}{path}");
        let (status, body) = marin3r_testkit::envoy::request(method, &url).unwrap();
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    assert_eq!(
        envoy.admin_get("/ready").unwrap().trim(),
        "LIVE",
        "Envoy still up"
    );
    scrape_stats(&host, readiness_port);
    assert_eq!(
        envoy.admin_get("/ready").unwrap().trim(),
        "LIVE",
        "Envoy still up"
    );

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = std::fs::read_to_string(&access_log).unwrap_or_default();
        if log.contains("/server_info") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no admin access log at {}: {log:?}",
            access_log.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The original's ratelimit example declares the admin's port (`envoy-metrics:9901`) with the
/// admin on loopback: a real Envoy binds both, the admin on loopback and the readiness
/// listener's second address on every address, and the kernel keeps them apart. The pod's
/// address on that port serves the stats alone; loopback (where `kubectl port-forward`
/// arrives) is the admin.
#[test]
fn the_admin_port_declared_on_a_loopback_admin_serves_the_stats_alone() {
    let free_port = marin3r_testkit::ports::free_port;
    let (admin_port, readiness_port) = (free_port(), free_port());
    let pod = labelled_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/ports": format!("envoy-http:38080,envoy-metrics:{admin_port}"),
        "marin3r.3scale.net/admin.port": admin_port.to_string(),
        "marin3r.3scale.net/readiness.port": readiness_port.to_string(),
    }));
    let args = sidecar_command_line(&pod, &InjectionConfig::default(), "kuard-1", "shop").unwrap();
    let rest: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    let envoy = Envoy::start(BOOTSTRAPS[0], &rest).unwrap();
    assert_eq!(envoy.admin_address(), format!("127.0.0.1:{admin_port}"));
    let info = envoy.admin_get("/server_info").unwrap();
    assert!(
        info.contains(r#""id": "kuard""#),
        "the admin on loopback: {info}"
    );

    let host = local_address();
    assert_ne!(
        host, "127.0.0.1",
        "this test needs an address besides loopback"
    );
    let url = |port: u16, path: &str| format!("http://{host}:{port}{path}");
    for port in [admin_port, readiness_port] {
        let (status, body) = marin3r_testkit::envoy::request("GET", &url(port, "/ready")).unwrap();
        assert_eq!((status, body.trim()), (200, "LIVE"), "port {port}");
        for (method, path) in [
            ("GET", "/config_dump"),
            ("GET", "/server_info"),
            ("POST", "/quitquitquit"),
            ("GET", "/"),
        ] {
            let (status, body) = marin3r_testkit::envoy::request(method, &url(port, path)).unwrap();
            assert_eq!(status, 404, "{method} {path} on port {port}: {body}");
        }
    }
    let (status, body) =
        marin3r_testkit::envoy::request("GET", &url(admin_port, "/stats/prometheus")).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE envoy_server_live gauge"), "{body}");
    assert!(
        envoy
            .admin_get("/config_dump")
            .unwrap()
            .contains("marin3r_sidecar_readiness"),
        "loopback still reaches the whole admin"
    );
}

/// Envoy's stats through the readiness listener: `GET /stats/prometheus` (a query string
/// still reaches the same admin handler) and nothing near it; scrapes past the burst get 429
/// while `/ready` stays unlimited.
fn scrape_stats(host: &str, port: u16) {
    let request = marin3r_testkit::envoy::request;
    let url = |path: &str| format!("http://{host}:{port}{path}");
    for path in [
        "/stats/prometheus",
        "/stats/prometheus?usedonly",
        "/stats/prometheus?format=json",
    ] {
        let (status, body) = request("GET", &url(path)).unwrap();
        assert_eq!(status, 200, "GET {path}: {body}");
        // Prometheus' text format, from Envoy's own stats, whatever the query.
        assert!(
            body.contains("# TYPE envoy_server_live gauge"),
            "GET {path}: {body}"
        );
        assert!(!body.trim_start().starts_with('{'), "GET {path}: {body}");
    }
    for (method, path) in [
        ("POST", "/stats/prometheus"),
        ("GET", "/stats"),
        ("GET", "/stats?format=prometheus"),
        ("GET", "/stats/prometheus/"),
        ("GET", "/stats/prometheus/../../config_dump"),
        ("GET", "/stats/prometheus/%2e%2e/%2e%2e/config_dump"),
        ("GET", "/stats/prometheus%3F/../../quitquitquit"),
        ("GET", "/STATS/PROMETHEUS"),
        ("GET", "//stats/prometheus"),
        ("POST", "/reset_counters"),
        ("GET", "/config_dump?include_eds"),
    ] {
        let (status, body) = request(method, &url(path)).unwrap();
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    let mut limited = 0;
    for _ in 0..30 {
        let (status, body) = request("GET", &url("/stats/prometheus")).unwrap();
        assert!(status == 200 || status == 429, "{status}: {body}");
        limited += usize::from(status == 429);
    }
    assert!(limited > 0, "30 scrapes in a row, none rate limited");
    let (status, body) = request("GET", &url("/ready")).unwrap();
    assert_eq!((status, body.trim()), (200, "LIVE"));
}

/// A non-loopback address of this machine (the readiness listener binds every address),
/// else loopback.
fn local_address() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    match socket.connect("192.0.2.1:9") {
        Ok(()) => socket.local_addr().unwrap().ip().to_string(),
        Err(_) => "127.0.0.1".into(),
    }
}

/// The sidecar's real command line with the real rendered bootstrap (the files the operator
/// puts in the `envoy-sidecar-bootstrap` ConfigMap) and a client certificate at the referenced
/// paths: Envoy accepts the whole configuration.
#[test]
fn the_sidecar_with_the_rendered_bootstrap_passes_envoy_validation() {
    use marin3r_certs::{CertificateAuthority, CertificateRequest, Usage, issue_self_signed};
    use marin3r_webhook::bootstrap::{BootstrapOptions, CONFIG_FILE, render};

    let dir = tempfile::tempdir().unwrap();
    let bootstrap_dir = dir.path().join("bootstrap");
    let cert_dir = dir.path().join("tls");
    std::fs::create_dir_all(&cert_dir).unwrap();
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("ca", day)).unwrap();
    let client = CertificateAuthority::from_issued(&ca)
        .unwrap()
        .issue(
            &CertificateRequest::new("envoy", Usage::Client, day)
                .with_hosts(["spiffe://cluster.local/ns/shop"]),
        )
        .unwrap();
    for (name, pem) in [
        ("tls.crt", &client.cert_pem),
        ("tls.key", &client.key_pem),
        ("ca.crt", &client.ca_pem),
    ] {
        std::fs::write(cert_dir.join(name), pem).unwrap();
    }
    let opts = BootstrapOptions {
        bootstrap_dir: bootstrap_dir.clone(),
        client_cert_dir: cert_dir,
        ..BootstrapOptions::new("marin3r-instance.default.svc", 18000)
    };
    render(&opts).unwrap().write_to(&bootstrap_dir).unwrap();

    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "kuard",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "kuard",
                "marin3r.3scale.net/ports": "http:8080",
                "marin3r.3scale.net/admin.port": "9901",
            },
        },
        "spec": {"containers": [{"name": "app", "image": "kuard"}]},
    }))
    .unwrap();
    let mut args =
        sidecar_command_line(&pod, &InjectionConfig::default(), "kuard", "shop").unwrap();
    assert_eq!(args[..2], ["-c", "/etc/envoy/bootstrap/config.json"]);
    // The pod runner mounts the ConfigMap there; here the rendered file stands in its place.
    args[1] = bootstrap_dir.join(CONFIG_FILE).to_str().unwrap().to_owned();
    let out = std::process::Command::new(marin3r_testkit::tools::envoy().unwrap())
        .args(["--mode", "validate", "--disable-hot-restart"])
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "envoy refused the sidecar configuration:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // And the check can fail: a broken overlay is refused.
    let broken: Vec<String> = args
        .iter()
        .map(|a| a.replace("\"pod_name\"", "\"pod_name\": {\"bad\""))
        .collect();
    let out = std::process::Command::new(marin3r_testkit::tools::envoy().unwrap())
        .args(["--mode", "validate", "--disable-hot-restart"])
        .args(&broken)
        .output()
        .unwrap();
    assert!(!out.status.success());
}
