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
                stats_on_port: false,
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
                        stats_on_port: false,
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

#[path = "denial_tests.rs"]
mod denials;
