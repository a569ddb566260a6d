//! Table-driven tests: every annotation with good and bad values, and the defaults.

use std::net::IpAddr;

use proptest::prelude::*;

use super::*;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m = BTreeMap::from([(NODE_ID.to_owned(), "kuard".to_owned())]);
    for (k, v) in pairs {
        m.insert((*k).to_owned(), (*v).to_owned());
    }
    m
}

fn parse_ok(pairs: &[(&str, &str)]) -> SidecarSpec {
    parse(&annotations(pairs), &InjectionConfig::default())
        .unwrap_or_else(|e| panic!("{pairs:?} refused: {e:?}"))
}

/// The single error for these annotations, as the user sees it.
fn parse_err(pairs: &[(&str, &str)]) -> String {
    let errors = parse(&annotations(pairs), &InjectionConfig::default())
        .expect_err(&format!("{pairs:?} accepted"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    errors[0].to_string()
}

fn node_id_err(value: &str) -> String {
    format!(
        "marin3r.3scale.net/node-id: {value:?}: must be lowercase letters, digits, '-' or '.', each \
         dot-separated part starting and ending with a letter or digit: it names the \
         EnvoyConfigRevision <node-id>-<version>"
    )
}

fn port(name: &str, port: u16, protocol: Protocol, host_port: Option<u16>) -> PortSpec {
    PortSpec {
        name: name.into(),
        port,
        protocol,
        host_port,
    }
}

#[test]
fn defaults_fill_in_everything_but_the_node_id() {
    let spec = parse_ok(&[]);
    assert_eq!(
        spec,
        SidecarSpec {
            node_id: "kuard".into(),
            cluster_id: "kuard".into(),
            container_name: "envoy-sidecar".into(),
            ports: vec![],
            envoy_image: "envoyproxy/envoy:v1.40.0".into(),
            config_volume: "envoy-sidecar-bootstrap".into(),
            tls_volume: "envoy-sidecar-tls".into(),
            client_certificate: "envoy-sidecar-client-cert".into(),
            extra_args: vec![],
            resources: Resources::default(),
            admin: Admin {
                port: 9901,
                bind_address: "127.0.0.1".parse().unwrap(),
                access_log_path: None,
            },
            readiness_port: 9902,
            bootstrap_config_map: "envoy-sidecar-bootstrap".into(),
            shutdown_manager: None,
            layout: Layout::Classic { hold: false },
            xds_protocol: crate::config::XdsProtocol::Sotw,
            prometheus_annotations: true,
            image_pull_secrets: vec![],
            warnings: vec![],
        }
    );
}

#[test]
fn cluster_level_defaults_come_from_the_config() {
    let config = InjectionConfig {
        envoy_image: "registry.local/envoy:v1.40.1".into(),
        container_name: "proxy".into(),
        admin_port: 15000,
        admin_access_log_path: Some("/tmp/admin.log".into()),
        ..InjectionConfig::default()
    };
    let spec = parse(&annotations(&[]), &config).unwrap();
    assert_eq!(spec.envoy_image, "registry.local/envoy:v1.40.1");
    assert_eq!(spec.container_name, "proxy");
    assert_eq!(spec.admin.port, 15000);
    assert_eq!(
        spec.admin.access_log_path.as_deref(),
        Some("/tmp/admin.log")
    );
}

#[test]
fn the_node_id_is_required() {
    let errors = parse(&BTreeMap::new(), &InjectionConfig::default()).unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        r#"marin3r.3scale.net/node-id: "": the annotation is required to inject the Envoy sidecar"#
    );
}

/// What a good case expects of the parsed spec.
type Check = Box<dyn Fn(&SidecarSpec)>;

#[test]
fn good_values_are_read() {
    use Protocol::*;
    let cases: Vec<(Vec<(&str, &str)>, Check)> = vec![
        (
            vec![(NODE_ID, "gw-1.eu-west")],
            Box::new(|s| {
                assert_eq!(
                    (s.node_id.as_str(), s.cluster_id.as_str()),
                    ("gw-1.eu-west", "gw-1.eu-west")
                )
            }),
        ),
        (
            vec![(CLUSTER_ID, "edge")],
            Box::new(|s| assert_eq!(s.cluster_id, "edge")),
        ),
        (
            vec![(CONTAINER_NAME, "proxy-1")],
            Box::new(|s| assert_eq!(s.container_name, "proxy-1")),
        ),
        (
            vec![(
                PORTS,
                "http:8080, https:8443:TCP,dns:53:udp,sig:9000:SCTP,dnstcp:53",
            )],
            Box::new(|s| {
                assert_eq!(
                    s.ports,
                    vec![
                        port("http", 8080, Tcp, None),
                        port("https", 8443, Tcp, None),
                        port("dns", 53, Udp, None),
                        port("sig", 9000, Sctp, None),
                        port("dnstcp", 53, Tcp, None),
                    ]
                )
            }),
        ),
        (
            vec![
                (PORTS, "http:8080,https:8443"),
                (HOST_PORT_MAPPINGS, "https:443, http:80"),
            ],
            Box::new(|s| {
                assert_eq!(
                    s.ports,
                    vec![
                        port("http", 8080, Tcp, Some(80)),
                        port("https", 8443, Tcp, Some(443))
                    ]
                )
            }),
        ),
        (
            vec![(ENVOY_IMAGE, "quay.io/me/envoy@sha256:0123abcd")],
            Box::new(|s| assert_eq!(s.envoy_image, "quay.io/me/envoy@sha256:0123abcd")),
        ),
        (
            vec![(CONFIG_VOLUME, "boot"), (TLS_VOLUME, "certs")],
            Box::new(|s| {
                assert_eq!(
                    (s.config_volume.as_str(), s.tls_volume.as_str()),
                    ("boot", "certs")
                )
            }),
        ),
        (
            vec![(CLIENT_CERTIFICATE, "my.client-cert")],
            Box::new(|s| assert_eq!(s.client_certificate, "my.client-cert")),
        ),
        (
            vec![(
                ENVOY_EXTRA_ARGS,
                "--log-level debug --component-log-level upstream:trace,http:info --drain-time-s 5",
            )],
            Box::new(|s| {
                assert_eq!(
                    s.extra_args,
                    [
                        "--log-level",
                        "debug",
                        "--component-log-level",
                        "upstream:trace,http:info",
                        "--drain-time-s",
                        "5"
                    ]
                )
            }),
        ),
        (
            vec![
                (REQUESTS_CPU, "100m"),
                (REQUESTS_MEMORY, "64Mi"),
                (LIMITS_CPU, "1"),
                (LIMITS_MEMORY, "0.5Gi"),
            ],
            Box::new(|s| {
                assert_eq!(
                    s.resources,
                    Resources {
                        requests_cpu: Some("100m".into()),
                        requests_memory: Some("64Mi".into()),
                        limits_cpu: Some("1".into()),
                        limits_memory: Some("0.5Gi".into()),
                    }
                )
            }),
        ),
        (
            vec![(LIMITS_CPU, "2")],
            Box::new(|s| assert_eq!(s.resources.limits_cpu.as_deref(), Some("2"))),
        ),
        (
            vec![
                (ADMIN_PORT, "15000"),
                (ADMIN_BIND_ADDRESS, "::"),
                (ADMIN_ACCESS_LOG_PATH, "/dev/stdout"),
            ],
            Box::new(|s| {
                assert_eq!(
                    s.admin,
                    Admin {
                        port: 15000,
                        bind_address: "::".parse::<IpAddr>().unwrap(),
                        access_log_path: Some("/dev/stdout".into()),
                    }
                )
            }),
        ),
        (
            // Loopback is the default; an address may open the admin, or keep it closed.
            vec![(ADMIN_BIND_ADDRESS, "127.0.0.1")],
            Box::new(|s| assert!(s.admin.bind_address.is_loopback())),
        ),
        (
            vec![(ADMIN_BIND_ADDRESS, "0.0.0.0")],
            Box::new(|s| assert!(s.admin.bind_address.is_unspecified())),
        ),
        (
            vec![(READINESS_PORT, "15021")],
            Box::new(|s| assert_eq!(s.readiness_port, 15021)),
        ),
        (
            // The admin may move onto the default readiness port only if readiness moves too.
            vec![(ADMIN_PORT, "9902"), (READINESS_PORT, "9901")],
            Box::new(|s| assert_eq!((s.admin.port, s.readiness_port), (9902, 9901))),
        ),
        (
            vec![(ENVOY_API_VERSION, "v3")],
            Box::new(|s| assert_eq!(s.node_id, "kuard")),
        ),
        (
            vec![(SHUTDOWN_MANAGER_ENABLED, "true")],
            Box::new(|s| {
                assert_eq!(
                    s.shutdown_manager,
                    Some(ShutdownManager {
                        port: 8090,
                        image: crate::config::DEFAULT_SHUTDOWN_MANAGER_IMAGE.into(),
                        drain_time: 300,
                        drain_strategy: DrainStrategy::Gradual,
                        extra_lifecycle_hooks: vec![],
                        token: String::new(),
                        json_logs: false,
                    })
                );
                assert!(s.warnings.is_empty(), "{:?}", s.warnings);
            }),
        ),
        (
            vec![
                (SHUTDOWN_MANAGER_ENABLED, "True"),
                (SHUTDOWN_MANAGER_PORT, "18090"),
                (SHUTDOWN_MANAGER_IMAGE, "registry.local/marin3r:v9"),
                (SHUTDOWN_MANAGER_DRAIN_TIME, "45"),
                (SHUTDOWN_MANAGER_DRAIN_STRATEGY, "immediate"),
                (SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS, "app, worker,,app"),
            ],
            Box::new(|s| {
                assert_eq!(
                    s.shutdown_manager,
                    Some(ShutdownManager {
                        port: 18090,
                        image: "registry.local/marin3r:v9".into(),
                        drain_time: 45,
                        drain_strategy: DrainStrategy::Immediate,
                        extra_lifecycle_hooks: vec!["app".into(), "worker".into()],
                        token: String::new(),
                        json_logs: false,
                    })
                )
            }),
        ),
        (
            // The original ignored the settings of a disabled manager: accepted, with a warning.
            vec![
                (SHUTDOWN_MANAGER_ENABLED, "false"),
                (SHUTDOWN_MANAGER_DRAIN_TIME, "not checked"),
                (SHUTDOWN_MANAGER_PORT, "8090"),
            ],
            Box::new(|s| {
                assert_eq!(s.shutdown_manager, None);
                assert_eq!(
                    s.warnings,
                    [
                        "marin3r.3scale.net/shutdown-manager.port, marin3r.3scale.net/shutdown-manager.drain-time have no effect unless marin3r.3scale.net/shutdown-manager.enabled is \"true\""
                    ]
                );
            }),
        ),
        (
            vec![(SHUTDOWN_MANAGER_IMAGE, "x:1")],
            Box::new(|s| {
                assert_eq!(s.shutdown_manager, None);
                assert_eq!(
                    s.warnings,
                    [
                        "marin3r.3scale.net/shutdown-manager.image has no effect unless marin3r.3scale.net/shutdown-manager.enabled is \"true\""
                    ]
                );
            }),
        ),
        (
            // Envoy's drain flags are the sidecar's own only when the manager sets them.
            vec![(
                ENVOY_EXTRA_ARGS,
                "--drain-time-s 10 --drain-strategy immediate",
            )],
            Box::new(|s| {
                assert_eq!(
                    s.extra_args,
                    ["--drain-time-s", "10", "--drain-strategy", "immediate"]
                )
            }),
        ),
        (
            vec![(INIT_MANAGER_IMAGE, "quay.io/3scale/marin3r:v0.13.0")],
            Box::new(|s| {
                assert_eq!(
                    s.warnings,
                    [
                        "marin3r.3scale.net/init-manager.image=\"quay.io/3scale/marin3r:v0.13.0\" has no effect: marin3r injects no init container (the sidecar's per-pod settings travel on its command line)"
                    ]
                )
            }),
        ),
        (
            vec![(ADS_CONFIGMAP, "my-bootstrap.v3")],
            Box::new(|s| {
                assert_eq!(s.bootstrap_config_map, "my-bootstrap.v3");
                assert!(s.warnings.is_empty());
            }),
        ),
        (
            // The original's v3 bootstrap is marin3r's one bootstrap.
            vec![(ADS_CONFIGMAP, "envoy-sidecar-bootstrap-v3")],
            Box::new(|s| {
                assert_eq!(s.bootstrap_config_map, "envoy-sidecar-bootstrap");
                assert_eq!(
                    s.warnings,
                    [
                        "marin3r.3scale.net/ads-configmap=\"envoy-sidecar-bootstrap-v3\" is the original MARIN3R's v3 bootstrap, which marin3r does not create: the sidecar mounts \"envoy-sidecar-bootstrap\", marin3r's bootstrap (v3)"
                    ]
                );
            }),
        ),
        (
            // Offline (no DiscoveryService known), any name is taken.
            vec![(DISCOVERY_SERVICE_NAME, "other")],
            Box::new(|s| assert!(s.warnings.is_empty())),
        ),
        (
            // The original's cluster id was any string.
            vec![(CLUSTER_ID, "-Edge Cluster/1")],
            Box::new(|s| assert_eq!(s.cluster_id, "-Edge Cluster/1")),
        ),
        (
            // The original ignored mappings of undeclared ports; ours warns.
            vec![
                (PORTS, "http:8080"),
                (HOST_PORT_MAPPINGS, "http:80,https:443,grpc:9000"),
            ],
            Box::new(|s| {
                assert_eq!(s.ports, vec![port("http", 8080, Protocol::Tcp, Some(80))]);
                assert_eq!(
                    s.warnings,
                    [
                        "marin3r.3scale.net/host-port-mappings: \"https\", \"grpc\" not declared in marin3r.3scale.net/ports; ignored"
                    ]
                );
            }),
        ),
    ];
    for (pairs, check) in cases {
        check(&parse_ok(&pairs));
    }
}

/// The hint of a declared port that is the admin's while the admin is on loopback.
const ADMIN_ON_LOOPBACK: &str = r#" (the admin listens on loopback, which no port of the pod can expose: marin3r.3scale.net/admin.bind-address "0.0.0.0" puts it on the pod's addresses, where any pod can reach the whole admin API; Envoy's stats alone are served on the "envoy-stats" port)"#;

#[test]
fn bad_values_are_denied_naming_annotation_and_value() {
    let long = "a".repeat(64);
    let cases: Vec<(Vec<(&str, &str)>, String)> = vec![
        (vec![(NODE_ID, "")], r#"marin3r.3scale.net/node-id: "": must not be empty"#.into()),
        (vec![(NODE_ID, "my node")], r#"marin3r.3scale.net/node-id: "my node": must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit"#.into()),
        (vec![(NODE_ID, "Gateway")], node_id_err("Gateway")),
        (vec![(NODE_ID, "my_node")], node_id_err("my_node")),
        (vec![(NODE_ID, "a..b")], node_id_err("a..b")),
        (vec![(NODE_ID, "a.-b")], node_id_err("a.-b")),
        (vec![(NODE_ID, &long)], format!("marin3r.3scale.net/node-id: {long:?}: must be at most 63 characters")),
        (vec![(CLUSTER_ID, "edge\0")], r#"marin3r.3scale.net/cluster-id: "edge\0": must not contain a NUL character"#.into()),
        (vec![(CONTAINER_NAME, "Envoy")], r#"marin3r.3scale.net/container-name: "Envoy": must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"#.into()),
        (vec![(PORTS, "http:99999")], r#"marin3r.3scale.net/ports: "http:99999": port must be between 1 and 65535"#.into()),
        (vec![(PORTS, "http:0")], r#"marin3r.3scale.net/ports: "http:0": port must be between 1 and 65535"#.into()),
        (vec![(PORTS, "http:80,admin:x")], r#"marin3r.3scale.net/ports: "admin:x": port "x" is not a number"#.into()),
        (vec![(PORTS, "http")], r#"marin3r.3scale.net/ports: "http": expected name:port or name:port:protocol"#.into()),
        (vec![(PORTS, "http:80:TCP:x")], r#"marin3r.3scale.net/ports: "http:80:TCP:x": expected name:port or name:port:protocol"#.into()),
        (vec![(PORTS, "http:80,")], r#"marin3r.3scale.net/ports: "": expected name:port or name:port:protocol"#.into()),
        (vec![(PORTS, "http:80:QUIC")], r#"marin3r.3scale.net/ports: "http:80:QUIC": protocol must be TCP, UDP or SCTP"#.into()),
        (vec![(PORTS, "HTTP:80")], r#"marin3r.3scale.net/ports: "HTTP:80": port name "HTTP" must be lower-case letters, digits and single '-' (not at either end), with at least one letter"#.into()),
        (vec![(PORTS, "a--b:80")], r#"marin3r.3scale.net/ports: "a--b:80": port name "a--b" must be lower-case letters, digits and single '-' (not at either end), with at least one letter"#.into()),
        (vec![(PORTS, "8080:80")], r#"marin3r.3scale.net/ports: "8080:80": port name "8080" must be lower-case letters, digits and single '-' (not at either end), with at least one letter"#.into()),
        (vec![(PORTS, "a-very-long-port-name:80")], r#"marin3r.3scale.net/ports: "a-very-long-port-name:80": port name "a-very-long-port-name" must be 1 to 15 characters"#.into()),
        (vec![(PORTS, "http:80,http:81")], r#"marin3r.3scale.net/ports: "http:81": port name "http" is declared twice"#.into()),
        (vec![(PORTS, "a:80,b:80:tcp")], r#"marin3r.3scale.net/ports: "b:80:tcp": port 80/TCP is declared twice"#.into()),
        (vec![(PORTS, "http:9901")], format!(r#"marin3r.3scale.net/admin.port: "9901": Envoy's admin port clashes with the port "http" declared in marin3r.3scale.net/ports{ADMIN_ON_LOOPBACK}"#)),
        (vec![(PORTS, "envoy-stats:8080")], r#"marin3r.3scale.net/ports: "envoy-stats:8080": "envoy-stats" names the sidecar's own port for Envoy's stats (its readiness listener); give this port another name"#.into()),
        (vec![(PROMETHEUS_ANNOTATIONS, "no")], r#"marin3r.3scale.net/prometheus-annotations: "no": must be true or false"#.into()),
        (vec![(PORTS, "http:80"), (HOST_PORT_MAPPINGS, "http:70000")], r#"marin3r.3scale.net/host-port-mappings: "http:70000": port must be between 1 and 65535"#.into()),
        (vec![(PORTS, "http:80"), (HOST_PORT_MAPPINGS, "http")], r#"marin3r.3scale.net/host-port-mappings: "http": expected name:hostPort"#.into()),
        (vec![(PORTS, "http:80"), (HOST_PORT_MAPPINGS, "http:80,http:81")], r#"marin3r.3scale.net/host-port-mappings: "http:81": port "http" is mapped twice"#.into()),
        (vec![(PORTS, "a:80,b:81"), (HOST_PORT_MAPPINGS, "a:8000,b:8000")], r#"marin3r.3scale.net/host-port-mappings: "b:8000": host port 8000/TCP is mapped twice"#.into()),
        (vec![(ENVOY_IMAGE, "")], r#"marin3r.3scale.net/envoy-image: "": the image must not be empty"#.into()),
        (vec![(ENVOY_IMAGE, "envoy proxy")], r#"marin3r.3scale.net/envoy-image: "envoy proxy": not a container image reference"#.into()),
        (vec![(CONFIG_VOLUME, "Boot")], r#"marin3r.3scale.net/config-volume: "Boot": must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"#.into()),
        (vec![(TLS_VOLUME, "tls_certs")], r#"marin3r.3scale.net/tls-volume: "tls_certs": must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"#.into()),
        (vec![(TLS_VOLUME, "envoy-sidecar-bootstrap")], r#"marin3r.3scale.net/tls-volume: "envoy-sidecar-bootstrap": the same volume name as marin3r.3scale.net/config-volume ("envoy-sidecar-bootstrap"); the two volumes need distinct names"#.into()),
        (vec![(CLIENT_CERTIFICATE, "my..cert")], r#"marin3r.3scale.net/client-certificate: "my..cert": must be an RFC 1123 subdomain (lower-case letters, digits, '-' and '.')"#.into()),
        (vec![(ENVOY_EXTRA_ARGS, "-c /tmp/other.yaml")], r#"marin3r.3scale.net/envoy-extra-args: "-c /tmp/other.yaml": -c is set by the injector and may not be given again"#.into()),
        (vec![(ENVOY_EXTRA_ARGS, "--service-node=x")], r#"marin3r.3scale.net/envoy-extra-args: "--service-node=x": --service-node is set by the injector and may not be given again"#.into()),
        (vec![(ENVOY_EXTRA_ARGS, "--config-yaml {}")], r#"marin3r.3scale.net/envoy-extra-args: "--config-yaml {}": --config-yaml is set by the injector and may not be given again"#.into()),
        (vec![(REQUESTS_CPU, "lots")], r#"marin3r.3scale.net/resources.requests.cpu: "lots": not a Kubernetes quantity (expected a number with an optional suffix such as m, Mi, G)"#.into()),
        (vec![(REQUESTS_MEMORY, "64MB")], r#"marin3r.3scale.net/resources.requests.memory: "64MB": unknown quantity suffix "MB" (expected one of n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent such as e3)"#.into()),
        (vec![(LIMITS_CPU, "-1")], r#"marin3r.3scale.net/resources.limits.cpu: "-1": a resource quantity must not be negative"#.into()),
        (vec![(LIMITS_MEMORY, "")], r#"marin3r.3scale.net/resources.limits.memory: "": a quantity must not be empty"#.into()),
        (vec![(REQUESTS_CPU, "2"), (LIMITS_CPU, "500m")], r#"marin3r.3scale.net/resources.requests.cpu: "2": the request is greater than the limit marin3r.3scale.net/resources.limits.cpu="500m""#.into()),
        (vec![(REQUESTS_MEMORY, "1Gi"), (LIMITS_MEMORY, "1G")], r#"marin3r.3scale.net/resources.requests.memory: "1Gi": the request is greater than the limit marin3r.3scale.net/resources.limits.memory="1G""#.into()),
        (vec![(ADMIN_PORT, "0")], r#"marin3r.3scale.net/admin.port: "0": port must be between 1 and 65535"#.into()),
        (vec![(ADMIN_PORT, "65536")], r#"marin3r.3scale.net/admin.port: "65536": port must be between 1 and 65535"#.into()),
        (vec![(ADMIN_PORT, " 9901")], r#"marin3r.3scale.net/admin.port: " 9901": port " 9901" is not a number"#.into()),
        (vec![(PORTS, "admin:15000"), (ADMIN_PORT, "15000")], format!(r#"marin3r.3scale.net/admin.port: "15000": Envoy's admin port clashes with the port "admin" declared in marin3r.3scale.net/ports{ADMIN_ON_LOOPBACK}"#)),
        (vec![(PORTS, "envoy-metrics:9901"), (ADMIN_BIND_ADDRESS, "::1")], format!(r#"marin3r.3scale.net/admin.port: "9901": Envoy's admin port clashes with the port "envoy-metrics" declared in marin3r.3scale.net/ports{ADMIN_ON_LOOPBACK}"#)),
        (vec![(ADMIN_BIND_ADDRESS, "localhost")], r#"marin3r.3scale.net/admin.bind-address: "localhost": not an IPv4 or IPv6 address"#.into()),
        (vec![(READINESS_PORT, "0")], r#"marin3r.3scale.net/readiness.port: "0": port must be between 1 and 65535"#.into()),
        (vec![(READINESS_PORT, "9901")], r#"marin3r.3scale.net/readiness.port: "9901": the readiness listener's port is Envoy's admin port"#.into()),
        (vec![(ADMIN_PORT, "9902")], r#"marin3r.3scale.net/readiness.port: "9902": the readiness listener's port is Envoy's admin port"#.into()),
        (vec![(PORTS, "http:9902")], r#"marin3r.3scale.net/readiness.port: "9902": the readiness listener's port clashes with the port "http" declared in marin3r.3scale.net/ports"#.into()),
        (vec![(ADMIN_ACCESS_LOG_PATH, "admin.log")], r#"marin3r.3scale.net/admin.access-log-path: "admin.log": must be an absolute path"#.into()),
        (vec![(ADMIN_ACCESS_LOG_PATH, "/tmp/a\nb")], r#"marin3r.3scale.net/admin.access-log-path: "/tmp/a\nb": must not contain control characters"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "True"), (ENVOY_EXTRA_ARGS, "--drain-time-s=10")], r#"marin3r.3scale.net/envoy-extra-args: "--drain-time-s=10": --drain-time-s is set from marin3r.3scale.net/shutdown-manager.drain-time when marin3r.3scale.net/shutdown-manager.enabled is true; set it there"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (ENVOY_EXTRA_ARGS, "--log-level info --drain-strategy immediate")], r#"marin3r.3scale.net/envoy-extra-args: "--log-level info --drain-strategy immediate": --drain-strategy is set from marin3r.3scale.net/shutdown-manager.drain-strategy when marin3r.3scale.net/shutdown-manager.enabled is true; set it there"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "yes")], r#"marin3r.3scale.net/shutdown-manager.enabled: "yes": must be true or false"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_PORT, "0")], r#"marin3r.3scale.net/shutdown-manager.port: "0": port must be between 1 and 65535"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_PORT, "9901")], r#"marin3r.3scale.net/shutdown-manager.port: "9901": the shutdown manager's port clashes with Envoy's admin port"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_PORT, "9902")], r#"marin3r.3scale.net/shutdown-manager.port: "9902": the shutdown manager's port clashes with the readiness listener's port"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (PORTS, "http:8090")], r#"marin3r.3scale.net/shutdown-manager.port: "8090": the shutdown manager's port clashes with the port "http" declared in marin3r.3scale.net/ports"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_IMAGE, "")], r#"marin3r.3scale.net/shutdown-manager.image: "": the image must not be empty"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_DRAIN_TIME, "5m")], r#"marin3r.3scale.net/shutdown-manager.drain-time: "5m": must be a whole number of seconds"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_DRAIN_TIME, "-1")], r#"marin3r.3scale.net/shutdown-manager.drain-time: "-1": must be a whole number of seconds"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_DRAIN_TIME, "604801")], r#"marin3r.3scale.net/shutdown-manager.drain-time: "604801": must be at most 604800 seconds (7 days)"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_DRAIN_STRATEGY, "slow")], r#"marin3r.3scale.net/shutdown-manager.drain-strategy: "slow": must be gradual or immediate"#.into()),
        (vec![(SHUTDOWN_MANAGER_ENABLED, "true"), (SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS, "app,Worker")], r#"marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks: "app,Worker": container name "Worker" must be lower-case letters, digits and '-', starting and ending with a letter or digit (RFC 1123 label)"#.into()),
        (vec![(ADS_CONFIGMAP, "My_Bootstrap")], r#"marin3r.3scale.net/ads-configmap: "My_Bootstrap": must be an RFC 1123 subdomain (lower-case letters, digits, '-' and '.')"#.into()),
        (vec![(ENVOY_API_VERSION, "v2")], r#"marin3r.3scale.net/envoy-api-version: "v2": Envoy's v2 API is gone from Envoy; only v3 is supported"#.into()),
    ];
    for (pairs, want) in cases {
        assert_eq!(parse_err(&pairs), want, "{pairs:?}");
    }
}

/// Every value the original split into a working command line means the same here; quoted
/// spans with spaces, which the original cut into pieces Envoy refused, are one argument.
#[test]
fn extra_args_are_split_as_the_original_split_them() {
    let cases: [(&str, &[&str]); 12] = [
        ("", &[]),
        ("--log-level debug", &["--log-level", "debug"]),
        (
            "--log-level=debug --concurrency 2",
            &["--log-level=debug", "--concurrency", "2"],
        ),
        // What the original passed on unchanged: quotes without spaces, backslashes.
        ("--log-format '%v'", &["--log-format", "'%v'"]),
        (
            r#"--component-log-level "upstream:trace""#,
            &["--component-log-level", r#""upstream:trace""#],
        ),
        (r"--log-path C:\logs", &["--log-path", r"C:\logs"]),
        (r#"--log-format it's"#, &["--log-format", "it's"]),
        (
            r#"--log-format "unclosed"#,
            &["--log-format", r#""unclosed"#],
        ),
        // What the original broke: runs of whitespace, quoted spans with spaces.
        (
            "  --log-level\tdebug \n --concurrency  2 ",
            &["--log-level", "debug", "--concurrency", "2"],
        ),
        (r#"--log-format "[%Y] %v""#, &["--log-format", "[%Y] %v"]),
        (
            r#"--log-format='%l: %v' --base-id 1"#,
            &["--log-format=%l: %v", "--base-id", "1"],
        ),
        (r#"--log-format 'a' "b c""#, &["--log-format", "'a'", "b c"]),
    ];
    for (value, want) in cases {
        let spec = parse_ok(&[(ENVOY_EXTRA_ARGS, value)]);
        assert_eq!(spec.extra_args, want, "{value:?}");
    }
}

#[test]
fn a_pod_naming_another_discovery_service_is_denied() {
    let config = InjectionConfig {
        discovery_service: Some("edge".into()),
        ..InjectionConfig::default()
    };
    let spec = parse(&annotations(&[(DISCOVERY_SERVICE_NAME, "edge")]), &config);
    assert!(spec.is_ok(), "{spec:?}");
    let errors = parse(
        &annotations(&[(DISCOVERY_SERVICE_NAME, "internal")]),
        &config,
    )
    .unwrap_err();
    assert_eq!(
        errors[0].to_string(),
        r#"marin3r.3scale.net/discovery-service.name: "internal": the pod's namespace is served by the DiscoveryService "edge", and a namespace has one DiscoveryService (it owns the namespace's EnvoyConfigs, revisions and rollbacks; the original let pods choose among several, see docs/migrating.md): remove the annotation, or serve the namespace from "internal" instead (for a central one, label the namespace marin3r.3scale.net/discovery-service=internal)"#
    );
}

#[test]
fn the_known_annotations_are_every_one_read_or_written() {
    // rustfmt puts a long constant's value on the next line.
    let source = include_str!("names.rs").replace("=\n    \"", "= \"");
    let declared: Vec<&str> = source
        .lines()
        .filter_map(|l| l.strip_prefix("pub const "))
        .filter_map(|l| l.split_once(": &str = \"").map(|(_, v)| v))
        .filter_map(|v| v.strip_suffix("\";"))
        .filter(|v| v.starts_with(PREFIX) && ![PREFIX, STATUS_LABEL].contains(v))
        .collect();
    assert!(declared.len() >= 28, "{declared:?}");
    for name in &declared {
        assert!(KNOWN.contains(name), "{name} is missing from KNOWN");
    }
    for name in KNOWN {
        assert!(name.starts_with(PREFIX), "{name}");
    }
}

#[test]
fn every_bad_annotation_is_reported_at_once() {
    let errors = parse(
        &annotations(&[(PORTS, "http:99999"), (ADMIN_PORT, "x"), (LIMITS_CPU, "?")]),
        &InjectionConfig::default(),
    )
    .unwrap_err();
    let names: Vec<&str> = errors.iter().map(|e| e.annotation).collect();
    assert_eq!(names, [PORTS, LIMITS_CPU, ADMIN_PORT]);
}

#[test]
fn a_mapping_is_not_blamed_for_a_bad_ports_annotation() {
    let errors = parse(
        &annotations(&[(PORTS, "http:99999"), (HOST_PORT_MAPPINGS, "http:80")]),
        &InjectionConfig::default(),
    )
    .unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].annotation, PORTS);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any string in any annotation is either accepted or refused with a message naming it.
    #[test]
    fn parsing_never_panics(
        key in prop::sample::select(vec![
            NODE_ID, CLUSTER_ID, CONTAINER_NAME, PORTS, HOST_PORT_MAPPINGS, ENVOY_IMAGE,
            CONFIG_VOLUME, TLS_VOLUME, CLIENT_CERTIFICATE, ENVOY_EXTRA_ARGS, REQUESTS_CPU,
            REQUESTS_MEMORY, LIMITS_CPU, LIMITS_MEMORY, ADMIN_PORT, ADMIN_BIND_ADDRESS,
            ADMIN_ACCESS_LOG_PATH, READINESS_PORT, ENVOY_API_VERSION, ADS_CONFIGMAP,
            DISCOVERY_SERVICE_NAME, INIT_MANAGER_IMAGE, SHUTDOWN_MANAGER_ENABLED,
            SHUTDOWN_MANAGER_PORT, SHUTDOWN_MANAGER_IMAGE, SHUTDOWN_MANAGER_DRAIN_TIME,
            SHUTDOWN_MANAGER_DRAIN_STRATEGY, SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
        ]),
        value in prop_oneof![
            any::<String>(),
            "[a-z0-9:,.\\- ]{0,40}",
            "[0-9]{0,8}(\\.[0-9]{0,3})?(m|Mi|Gi|k|e[0-9]|E-?[0-9]{1,5}|[a-zA-Z]{0,3})",
            "([a-z]{1,5}:[0-9]{1,6}(:(TCP|UDP|tcp|x))?,?){0,4}",
        ],
        ports in "([a-z]{1,5}:[0-9]{1,6},?){0,3}",
    ) {
        let a = annotations(&[(key, &value), (PORTS, &ports)]);
        match parse(&a, &InjectionConfig::default()) {
            Ok(spec) => prop_assert!(!spec.node_id.is_empty()),
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for e in errors {
                    prop_assert!(e.to_string().starts_with(PREFIX));
                }
            }
        }
    }

    /// Every annotation at once, each with a value shaped like what it expects (or not):
    /// either a spec whose node id can name a revision and label it, or one error per bad
    /// annotation, each naming it.
    #[test]
    fn many_annotations_at_once_never_panic(
        pairs in prop::collection::btree_map(
            prop::sample::select(vec![
                NODE_ID, CLUSTER_ID, CONTAINER_NAME, PORTS, HOST_PORT_MAPPINGS, ENVOY_IMAGE,
                CONFIG_VOLUME, TLS_VOLUME, CLIENT_CERTIFICATE, ENVOY_EXTRA_ARGS, REQUESTS_CPU,
                REQUESTS_MEMORY, LIMITS_CPU, LIMITS_MEMORY, ADMIN_PORT, ADMIN_BIND_ADDRESS,
                ADMIN_ACCESS_LOG_PATH, ENVOY_API_VERSION, ADS_CONFIGMAP, DISCOVERY_SERVICE_NAME,
                INIT_MANAGER_IMAGE, SHUTDOWN_MANAGER_ENABLED, SHUTDOWN_MANAGER_PORT,
                SHUTDOWN_MANAGER_IMAGE, SHUTDOWN_MANAGER_DRAIN_TIME,
                SHUTDOWN_MANAGER_DRAIN_STRATEGY, SHUTDOWN_MANAGER_EXTRA_LIFECYCLE_HOOKS,
            ]),
            prop_oneof![
                "[a-z0-9][a-z0-9.-]{0,20}[a-z0-9]",
                "[A-Za-z0-9_.-]{0,70}",
                "([a-z]{1,5}:[0-9]{1,6}(:(TCP|UDP))?,?){0,4}",
                "([a-z]{1,5}:[0-9]{1,6},?){0,3}",
                "[0-9]{1,4}(m|Mi|Gi)?",
                "(--[a-z-]{1,10}( [a-z0-9\"']{0,6})?){0,3}",
                "(127.0.0.1|0.0.0.0|::1|[0-9.]{0,15})",
                "(true|false|True|1|0|gradual|immediate|[a-z,]{0,12})",
                any::<String>(),
            ],
            0..12,
        )
    ) {
        let a: BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        match parse(&a, &InjectionConfig::default()) {
            Ok(spec) => {
                prop_assert!(node_id_value(&spec.node_id).is_ok(), "{:?}", spec.node_id);
                prop_assert_eq!(Some(&spec.node_id), a.get(NODE_ID));
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                let mut named = std::collections::BTreeSet::new();
                for e in &errors {
                    prop_assert!(e.to_string().starts_with(PREFIX));
                    prop_assert!(named.insert(e.annotation), "{} reported twice", e.annotation);
                    prop_assert!(e.annotation == NODE_ID || a.contains_key(e.annotation));
                }
            }
        }
    }
}

#[test]
fn unknown_marin3r_annotations_get_a_warning_with_the_likely_name() {
    let warnings = unknown_warnings(&annotations(&[
        (NODE_ID, "kuard"),
        (PORTS, "http:8080"),
        ("marin3r.3scale.net/envoy-extra-arg", "--log-level debug"),
        ("marin3r.3scale.net/admin-port", "9901"),
        ("marin3r.3scale.net/something-else-entirely", "x"),
        ("example.com/envoy-extra-arg", "ignored: not ours"),
        ("marin3r.3scale.netfoo", "not under the prefix"),
    ]));
    assert_eq!(
        warnings,
        [
            "annotation marin3r.3scale.net/admin-port is not a marin3r annotation and has no \
             effect; did you mean marin3r.3scale.net/admin.port?",
            "annotation marin3r.3scale.net/envoy-extra-arg is not a marin3r annotation and has \
             no effect; did you mean marin3r.3scale.net/envoy-extra-args?",
            "annotation marin3r.3scale.net/something-else-entirely is not a marin3r annotation \
             and has no effect",
        ]
    );
    // Every known annotation is silent, the injection marker included.
    let known: Vec<(&str, &str)> = KNOWN.iter().map(|k| (*k, "x")).collect();
    assert_eq!(unknown_warnings(&annotations(&known)), Vec::<String>::new());
}

#[test]
fn many_or_long_unknown_annotations_give_bounded_warnings() {
    let long = format!("marin3r.3scale.net/{}", "x".repeat(300));
    let mut pairs: Vec<(String, String)> = (0..25)
        .map(|i| (format!("marin3r.3scale.net/unknown-{i:02}"), String::new()))
        .collect();
    pairs.push((long, String::new()));
    let map: BTreeMap<String, String> = pairs.into_iter().collect();
    let warnings = unknown_warnings(&map);
    assert_eq!(warnings.len(), 11, "{warnings:#?}");
    assert!(warnings.iter().all(|w| w.len() < 300), "{warnings:#?}");
    assert_eq!(
        warnings[10],
        "16 more marin3r.3scale.net/ annotations are not marin3r annotations and have no effect"
    );
}
