//! The injected sidecar's command line runs in a real Envoy: `--service-node`,
//! `--service-cluster`, and the `--config-yaml` overlay (node metadata from the downward API,
//! admin address and admin access log) all reach Envoy as the webhook intends. The bootstrap
//! here is a minimal stand-in for the rendered one, which has no `admin` of its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use marin3r_e2e::envoy::Envoy;
use marin3r_webhook::{InjectionConfig, sidecar_command_line};
use serde_json::{Value, json};

/// A bootstrap without `admin` (as the renderer should write it) and one with its own admin
/// address and node metadata: the overlay's admin wins and the metadata merges.
const BOOTSTRAPS: [&str; 2] = [
    r#"{"static_resources": {}}"#,
    r#"{"admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "node": {"metadata": {"from_bootstrap": "kept"}}}"#,
];

#[test]
fn the_sidecar_command_line_configures_a_real_envoy() {
    for bootstrap in BOOTSTRAPS {
        run_sidecar(bootstrap);
    }
}

fn run_sidecar(bootstrap: &str) {
    let dir = tempfile::tempdir().unwrap();
    let access_log = dir.path().join("admin-access.log");
    let admin_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "generateName": "kuard-",
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "kuard",
                "marin3r.3scale.net/cluster-id": "edge",
                "marin3r.3scale.net/admin.port": admin_port.to_string(),
                "marin3r.3scale.net/admin.access-log-path": access_log.to_str().unwrap(),
                "marin3r.3scale.net/envoy-extra-args": "--log-level info --file-flush-interval-msec 100",
            },
        },
        "spec": {"containers": [{"name": "app", "image": "kuard"}]},
    }))
    .unwrap();
    // Tests only talk to loopback: the cluster default (not an annotation, which refuses
    // loopback because kubelet probes from outside the pod) binds the admin there.
    let config = InjectionConfig {
        admin_bind_address: "127.0.0.1".parse().unwrap(),
        ..InjectionConfig::default()
    };
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
