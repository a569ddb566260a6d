//! Annotations denied or warned about: each bad value named with its annotation, every one
//! at once, and bounded warnings for unknown ones (a child of the reader's tests, whose
//! helpers it uses).

use super::*;

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
