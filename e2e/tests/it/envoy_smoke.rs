//! The Envoy that `hack/install-tools` installs is real and works: it starts with a minimal
//! static config, answers on its admin port, and serves a direct response on a listener.

use marin3r_testkit::envoy::{Envoy, get_body};

const BOOTSTRAP: &str = r#"
admin:
  address:
    socket_address: { address: 127.0.0.1, port_value: 0 }
static_resources:
  listeners:
  - name: smoke
    address:
      socket_address: { address: 127.0.0.1, port_value: 0 }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: smoke
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                direct_response: { status: 200, body: { inline_string: "hello from envoy" } }
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

#[test]
fn installed_envoy_starts_and_serves() {
    let envoy = Envoy::start(BOOTSTRAP, &[]).unwrap();

    let info: serde_json::Value =
        serde_json::from_str(&envoy.admin_get("/server_info").unwrap()).unwrap();
    assert_eq!(info["state"], "LIVE", "{info}");
    let version = info["version"].as_str().unwrap();
    assert!(
        version.contains("/1.40."),
        "unexpected Envoy version {version}"
    );

    let listeners: serde_json::Value =
        serde_json::from_str(&envoy.admin_get("/listeners?format=json").unwrap()).unwrap();
    let port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap_or_else(|| panic!("no listener port in {listeners}"));
    assert_eq!(
        get_body(&format!("http://127.0.0.1:{port}/")).unwrap(),
        "hello from envoy"
    );
}

#[test]
fn a_broken_bootstrap_fails_with_envoys_reason() {
    let err = match Envoy::start("admin: {address: nowhere}\n", &[]) {
        Ok(_) => panic!("envoy started with a broken bootstrap"),
        Err(err) => format!("{err:#}"),
    };
    assert!(err.contains("exited"), "{err}");
}
