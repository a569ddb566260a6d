//! What the conversion encodes is what a real Envoy runs: an EnvoyConfig's resources, parsed
//! from YAML and encoded by `marin3r_envoyconfig::convert`, become the static resources of a
//! binary-protobuf bootstrap; Envoy starts with it, serves the listener's route, loads the
//! TLS secret built from PEM data, and shows the runtime layer.

use std::time::Duration;

use envoy_types::pb::envoy::config::bootstrap::v3::{
    Admin, Bootstrap, LayeredRuntime, RuntimeLayer, bootstrap::StaticResources,
    runtime_layer::LayerSpecifier,
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, SocketAddress, address, socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::service::runtime::v3::Runtime;
use marin3r_api::EnvoyConfigSpec;
use marin3r_certs::{CertificateInfo, CertificateRequest, Usage, issue_self_signed};
use marin3r_envoyconfig::convert::{tls_secret, validate_config};
use marin3r_testkit::envoy::{Envoy, get_body};
use marin3r_xds::resource::{Resource, ResourceType};
use prost::Message as _;

/// A user's spec: a plain HTTP listener with a direct response, a TLS listener whose
/// certificate comes from SDS secret `server-cert`, a cluster, and a runtime layer.
const SPEC: &str = r#"
nodeID: convert-test
serialization: yaml
envoyResources:
  secrets:
    - name: server-cert
      ref: { name: server-cert-secret }
  clusters:
    - value: |
        name: backend
        connect_timeout: 1s
        type: STATIC
        load_assignment:
          cluster_name: backend
          endpoints:
            - lb_endpoints:
                - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 9 } } }
  listeners:
    - value: |
        name: http
        address: { socket_address: { address: 127.0.0.1, port_value: 0 } }
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: local
                    virtual_hosts:
                      - name: all
                        domains: ["*"]
                        routes:
                          - match: { prefix: "/backend" }
                            route: { cluster: backend }
                          - match: { prefix: "/" }
                            direct_response: { status: 200, body: { inline_string: "converted by marin3r" } }
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - value: |
        name: https
        address: { socket_address: { address: 127.0.0.1, port_value: 0 } }
        filter_chains:
          - transport_socket:
              name: envoy.transport_sockets.tls
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
                common_tls_context:
                  tls_certificate_sds_secret_configs: [ { name: server-cert } ]
            filters:
              - name: envoy.filters.network.tcp_proxy
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
                  stat_prefix: https
                  cluster: backend
  runtimes:
    - value: |
        name: marin3r-layer
        layer:
          marin3r.test_key: converted
"#;

fn decode_all<M: prost::Message + Default>(resources: &[Resource], kind: ResourceType) -> Vec<M> {
    resources
        .iter()
        .filter(|r| r.kind == kind)
        .map(|r| M::decode(r.body.clone()).unwrap())
        .collect()
}

#[test]
fn envoy_runs_the_converted_resources() {
    let spec: EnvoyConfigSpec = serde_saphyr::from_str(SPEC).unwrap();
    let resources = validate_config(&spec).unwrap_or_else(|errors| panic!("{errors:?}"));
    // The revision controller turns the referenced Kubernetes Secret's data into this.
    let issued = issue_self_signed(
        &CertificateRequest::new("convert-test", Usage::Server, Duration::from_secs(3600))
            .with_hosts(["localhost"]),
    )
    .unwrap();
    let secret = tls_secret(
        &spec.envoy_resources.secrets[0].name,
        issued.cert_pem.as_bytes(),
        issued.key_pem.as_bytes(),
    )
    .unwrap();

    let runtime: Vec<Runtime> = decode_all(&resources, ResourceType::Runtime);
    let bootstrap = Bootstrap {
        admin: Some(Admin {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: "127.0.0.1".into(),
                    port_specifier: Some(PortSpecifier::PortValue(0)),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
        static_resources: Some(StaticResources {
            listeners: decode_all(&resources, ResourceType::Listener),
            clusters: decode_all(&resources, ResourceType::Cluster),
            secrets: decode_all(&[secret], ResourceType::Secret),
        }),
        layered_runtime: Some(LayeredRuntime {
            layers: runtime
                .into_iter()
                .map(|r| RuntimeLayer {
                    name: r.name,
                    layer_specifier: Some(LayerSpecifier::StaticLayer(r.layer.unwrap())),
                })
                .collect(),
        }),
        ..Default::default()
    };
    let dir = tempfile::Builder::new()
        .prefix("marin3r-convert-")
        .tempdir()
        .unwrap();
    // `.pb`: Envoy reads the bootstrap as binary protobuf, so it sees our exact bytes.
    let path = dir.path().join("bootstrap.pb");
    std::fs::write(&path, bootstrap.encode_to_vec()).unwrap();
    let envoy = Envoy::start_with_file(dir, &path, &[]).unwrap();

    // Listeners on port 0: the admin interface tells where they were bound.
    let listeners = envoy.admin_get("/listeners").unwrap();
    let http = listeners
        .lines()
        .find_map(|l| l.strip_prefix("http::"))
        .unwrap_or_else(|| panic!("no http listener in {listeners}"));
    assert_eq!(
        get_body(&format!("http://{http}/")).unwrap(),
        "converted by marin3r"
    );
    assert!(
        listeners.lines().any(|l| l.starts_with("https::")),
        "{listeners}"
    );

    let serial = CertificateInfo::from_pem(&issued.cert_pem)
        .unwrap()
        .serial
        .replace(':', "")
        .to_lowercase();
    let certs = envoy.admin_get("/certs").unwrap().to_lowercase();
    assert!(
        certs.contains(&serial),
        "serial {serial} not in /certs: {certs}"
    );

    let runtime = envoy.admin_get("/runtime").unwrap();
    assert!(
        runtime.contains("marin3r.test_key") && runtime.contains("converted"),
        "{runtime}"
    );
    let clusters = envoy.admin_get("/clusters").unwrap();
    assert!(clusters.contains("backend::127.0.0.1:9"), "{clusters}");
}

const LISTENER: &str = r#"name: http
address: { socket_address: { address: 127.0.0.1, port_value: 8080 } }
filter_chains:
  - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: http
          route_config:
            virtual_hosts:
              - name: all
                domains: ["*"]
                routes:
                  - match: { prefix: "/" }
                    direct_response: { status: 200 }
          http_filters:
            - name: envoy.filters.http.router
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

const CLUSTER: &str = "name: backend\nconnect_timeout: 1s\ntype: STATIC\n";

/// Runs `envoy --mode validate` on a YAML bootstrap holding one static resource, so Envoy
/// parses and checks the user's text itself. Returns whether it passed, and its output.
fn envoy_validates(list: &str, resource_yaml: &str) -> (bool, String) {
    let mut bootstrap = format!("static_resources:\n  {list}:\n");
    for (i, line) in resource_yaml.lines().enumerate() {
        bootstrap.push_str(if i == 0 { "  - " } else { "    " });
        bootstrap.push_str(line);
        bootstrap.push('\n');
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootstrap.yaml");
    std::fs::write(&path, bootstrap).unwrap();
    let out = std::process::Command::new(marin3r_testkit::tools::envoy().unwrap())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The validation rules marin3r checks locally are ones Envoy enforces: Envoy refuses each
/// of these values, and so does the conversion, before anything reaches a proxy.
#[test]
fn local_validation_rules_agree_with_envoy() {
    use marin3r_api::Serialization;
    use marin3r_envoyconfig::convert::convert_value;

    let good = [
        ("listeners", ResourceType::Listener, LISTENER.to_owned()),
        ("clusters", ResourceType::Cluster, CLUSTER.to_owned()),
    ];
    let bad = [
        (
            "listeners",
            ResourceType::Listener,
            LISTENER.replace("port_value: 8080", "port_value: 70000"),
            "port_value",
        ),
        (
            "listeners",
            ResourceType::Listener,
            LISTENER.replace("stat_prefix: http", "stat_prefix: \"\""),
            "stat_prefix",
        ),
        (
            "listeners",
            ResourceType::Listener,
            LISTENER.replace("status: 200", "status: 99"),
            "status",
        ),
        (
            "clusters",
            ResourceType::Cluster,
            CLUSTER.replace("1s", "0s"),
            "connect_timeout",
        ),
    ];
    for (list, kind, value) in good {
        let (ok, output) = envoy_validates(list, &value);
        assert!(ok, "envoy refused the good {kind}: {output}");
        convert_value(kind, &value, Serialization::Yaml).unwrap();
    }
    for (list, kind, value, field) in bad {
        let (ok, output) = envoy_validates(list, &value);
        assert!(!ok, "envoy accepted {value}");
        assert!(
            output.contains("Proto constraint validation failed"),
            "{output}"
        );
        let errors = convert_value(kind, &value, Serialization::Yaml).unwrap_err();
        assert!(
            errors.iter().any(|e| e.path.ends_with(field)),
            "{field}: {errors:?}"
        );
    }
}
