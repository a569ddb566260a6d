//! The pure mutation: the patch for an injected pod, the conflicts that deny one, the drain.

use serde_json::json;

use super::*;

pub(super) fn mk_pod(annotations: Value, extra_spec: Value) -> Value {
    let mut spec = json!({
        "containers": [{"name": "app", "image": "kuard:1", "ports": [{"containerPort": 8080}]}],
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "kuard",
            "namespace": "shop",
            "labels": {"app": "kuard", "marin3r.3scale.net/status": "enabled"},
            "annotations": annotations,
        },
        "spec": spec,
    })
}

fn typed(v: &Value) -> Pod {
    serde_json::from_value(v.clone()).unwrap()
}

fn patched(v: &Value, config: &InjectionConfig) -> Value {
    let patch = mutate(&typed(v), config).unwrap();
    let mut out = v.clone();
    json_patch::patch(&mut out, &patch.0).unwrap();
    out
}

pub(super) fn denial(v: &Value) -> String {
    mutate(&typed(v), &InjectionConfig::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn the_sidecar_is_added_with_everything_spec_4_lists() {
    let pod = mk_pod(
        json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/ports": "http:8081,stats:9000:UDP",
            "marin3r.3scale.net/host-port-mappings": "http:30080",
            "marin3r.3scale.net/resources.requests.cpu": "50m",
            "marin3r.3scale.net/resources.limits.memory": "128Mi",
            "marin3r.3scale.net/envoy-extra-args": "--log-level debug",
            "marin3r.3scale.net/admin.access-log-path": "/dev/stdout",
        }),
        json!({}),
    );
    let out = patched(&pod, &InjectionConfig::default());
    assert_eq!(out["metadata"]["annotations"][INJECTED], "true");
    assert_eq!(out["spec"]["containers"][0], pod["spec"]["containers"][0]);
    let probe = json!({
        "httpGet": {"path": "/ready", "port": 9902, "scheme": "HTTP"},
        "successThreshold": 1,
        "timeoutSeconds": 1,
    });
    let with = |p: &Value, extra: Value| {
        let mut p = p.clone();
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        p
    };
    // Compared parsed: key order inside the overlay is serde_json's business.
    let mut sidecar = out["spec"]["containers"][1].clone();
    let mut overlay: Value = serde_json::from_str(sidecar["args"][7].as_str().unwrap()).unwrap();
    // The readiness listener on every address, proxying to the admin on loopback (what it
    // serves is proven with a real Envoy in e2e/tests/it/webhook_sidecar_envoy.rs).
    let statics = overlay
        .as_object_mut()
        .unwrap()
        .remove("static_resources")
        .unwrap();
    let listener = &statics["listeners"][0];
    assert_eq!(listener["name"], "marin3r_sidecar_readiness");
    assert_eq!(
        listener["address"],
        crate::sidecar::any_address(9902, crate::sidecar::ipv6_available())
    );
    let cluster = &statics["clusters"][0];
    assert_eq!(cluster["name"], "marin3r_sidecar_admin");
    assert_eq!(
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"],
        json!({"socket_address": {"address": "127.0.0.1", "port_value": 9901}})
    );
    assert_eq!(
        overlay,
        json!({
            "node": {"metadata": {"pod_name": "$(POD_NAME)", "pod_namespace": "$(POD_NAMESPACE)", "stats_port": 9902}},
            "admin": {
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9901}},
                "access_log": [{
                    "name": "envoy.access_loggers.file",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                        "path": "/dev/stdout",
                    },
                }],
            },
        })
    );
    sidecar["args"][7] = json!("<overlay>");
    let config_yaml = "<overlay>";
    assert_eq!(
        sidecar,
        json!({
            "name": "envoy-sidecar",
            "image": "envoyproxy/envoy:v1.40.0",
            "command": ["envoy"],
            "args": [
                "-c", "/etc/envoy/bootstrap/config.json",
                "--service-node", "kuard",
                "--service-cluster", "kuard",
                "--config-yaml", config_yaml,
                "--log-level", "debug",
            ],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
            ],
            "ports": [
                {"name": "http", "containerPort": 8081, "hostPort": 30080, "protocol": "TCP"},
                {"name": "stats", "containerPort": 9000, "protocol": "UDP"},
                {"name": "envoy-stats", "containerPort": 9902, "protocol": "TCP"},
            ],
            "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "128Mi"}},
            "readinessProbe": with(&probe, json!({"initialDelaySeconds": 0, "periodSeconds": 5, "failureThreshold": 3})),
            "livenessProbe": with(&probe, json!({"initialDelaySeconds": 30, "periodSeconds": 10, "failureThreshold": 10})),
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 101,
                "runAsGroup": 101,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": "envoy-sidecar-bootstrap", "mountPath": "/etc/envoy/bootstrap", "readOnly": true},
                {"name": "envoy-sidecar-tls", "mountPath": "/etc/envoy/tls/client", "readOnly": true},
            ],
        })
    );
    assert_eq!(
        out["spec"]["volumes"],
        json!([
            {"name": "envoy-sidecar-bootstrap", "configMap": {"name": "envoy-sidecar-bootstrap"}},
            {"name": "envoy-sidecar-tls", "secret": {"secretName": "envoy-sidecar-client-cert"}},
        ])
    );
}

#[test]
fn volumes_are_appended_to_existing_ones_and_named_by_annotations() {
    let pod = mk_pod(
        json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/config-volume": "boot",
            "marin3r.3scale.net/tls-volume": "certs",
            "marin3r.3scale.net/client-certificate": "other-cert",
        }),
        json!({"volumes": [{"name": "data", "emptyDir": {}}]}),
    );
    let config = InjectionConfig {
        bootstrap_config_map: "custom-bootstrap".into(),
        ..InjectionConfig::default()
    };
    let out = patched(&pod, &config);
    assert_eq!(
        out["spec"]["volumes"],
        json!([
            {"name": "data", "emptyDir": {}},
            {"name": "boot", "configMap": {"name": "custom-bootstrap"}},
            {"name": "certs", "secret": {"secretName": "other-cert"}},
        ])
    );
    let mounts: Vec<&str> = out["spec"]["containers"][1]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["boot", "certs"]);
}

#[test]
fn an_empty_volume_list_is_replaced() {
    let pod = mk_pod(
        json!({"marin3r.3scale.net/node-id": "kuard"}),
        json!({"volumes": []}),
    );
    let out = patched(&pod, &InjectionConfig::default());
    assert_eq!(out["spec"]["volumes"].as_array().unwrap().len(), 2);
}

#[test]
fn injecting_twice_changes_nothing() {
    let pod = mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"}), json!({}));
    let once = patched(&pod, &InjectionConfig::default());
    assert_eq!(selection(&typed(&once)), Selection::AlreadyInjected);
    assert!(
        mutate(&typed(&once), &InjectionConfig::default())
            .unwrap()
            .0
            .is_empty()
    );
    assert_eq!(patched(&once, &InjectionConfig::default()), once);
}

#[test]
fn pods_not_labelled_are_left_alone() {
    let mut pod = mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"}), json!({}));
    pod["metadata"]["labels"]["marin3r.3scale.net/status"] = json!("disabled");
    assert_eq!(selection(&typed(&pod)), Selection::NotSelected);
    assert!(
        mutate(&typed(&pod), &InjectionConfig::default())
            .unwrap()
            .0
            .is_empty()
    );
}

#[test]
fn a_labelled_pod_without_node_id_is_denied() {
    let pod = mk_pod(json!({}), json!({}));
    assert_eq!(
        denial(&pod),
        r#"marin3r.3scale.net/node-id: "": the annotation is required to inject the Envoy sidecar"#
    );
    let mut pod = pod;
    pod["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert!(denial(&pod).starts_with("marin3r.3scale.net/node-id"));
}

#[test]
fn existing_names_are_conflicts_not_clobbered() {
    let node = json!({"marin3r.3scale.net/node-id": "kuard"});
    let cases = [
        (
            mk_pod(
                node.clone(),
                json!({"containers": [{"name": "envoy-sidecar", "image": "x"}]}),
            ),
            r#"the pod already has a container named "envoy-sidecar"; set marin3r.3scale.net/container-name to another name for the Envoy sidecar"#,
        ),
        (
            mk_pod(
                node.clone(),
                json!({"initContainers": [{"name": "envoy-sidecar", "image": "x"}]}),
            ),
            r#"the pod already has a container named "envoy-sidecar"; set marin3r.3scale.net/container-name to another name for the Envoy sidecar"#,
        ),
        (
            mk_pod(
                node.clone(),
                json!({"volumes": [{"name": "envoy-sidecar-bootstrap", "emptyDir": {}}]}),
            ),
            r#"the pod already has a volume named "envoy-sidecar-bootstrap"; set marin3r.3scale.net/config-volume to another name for the sidecar's volume"#,
        ),
        (
            mk_pod(
                node.clone(),
                json!({"volumes": [{"name": "envoy-sidecar-tls", "emptyDir": {}}]}),
            ),
            r#"the pod already has a volume named "envoy-sidecar-tls"; set marin3r.3scale.net/tls-volume to another name for the sidecar's volume"#,
        ),
        (
            mk_pod(
                json!({
                    "marin3r.3scale.net/node-id": "kuard",
                    "marin3r.3scale.net/ports": "http:8081",
                    "marin3r.3scale.net/host-port-mappings": "http:8080",
                }),
                json!({"containers": [{"name": "app", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
            ),
            "marin3r.3scale.net/host-port-mappings: host port 8080/TCP is already used by another container of the pod",
        ),
    ];
    for (pod, want) in cases {
        assert_eq!(denial(&pod), want);
    }
}

#[test]
fn the_command_line_is_the_args_with_the_downward_api_expanded() {
    let pod = mk_pod(
        json!({"marin3r.3scale.net/node-id": "kuard", "marin3r.3scale.net/cluster-id": "edge"}),
        json!({}),
    );
    let args = sidecar_command_line(
        &typed(&pod),
        &InjectionConfig::default(),
        "kuard-7d4b9",
        "shop",
    )
    .unwrap();
    assert_eq!(
        args[..6],
        [
            "-c",
            "/etc/envoy/bootstrap/config.json",
            "--service-node",
            "kuard",
            "--service-cluster",
            "edge"
        ]
    );
    assert_eq!(args[6], "--config-yaml");
    let overlay: Value = serde_json::from_str(&args[7]).unwrap();
    assert_eq!(
        overlay["node"]["metadata"],
        json!({"pod_name": "kuard-7d4b9", "pod_namespace": "shop", "stats_port": 9902})
    );
    assert_eq!(args.len(), 8);
}

#[test]
fn a_dollar_in_the_access_log_path_survives_kubelet_expansion() {
    let pod = mk_pod(
        json!({"marin3r.3scale.net/node-id": "kuard", "marin3r.3scale.net/admin.access-log-path": "/tmp/$(HOME)/a$b"}),
        json!({}),
    );
    let args = sidecar_command_line(&typed(&pod), &InjectionConfig::default(), "p", "n").unwrap();
    let overlay: Value = serde_json::from_str(&args[7]).unwrap();
    assert_eq!(
        overlay["admin"]["access_log"][0]["typed_config"]["path"],
        "/tmp/$(HOME)/a$b"
    );
}

#[test]
fn offline_injection_keeps_unknown_fields() {
    let mut pod = mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"}), json!({}));
    pod["spec"]["futureField"] = json!({"x": 1});
    let selected = inject_json(&mut pod, &InjectionConfig::default()).unwrap();
    assert_eq!(selected, (Selection::Inject, Vec::new()));
    assert_eq!(pod["spec"]["futureField"], json!({"x": 1}));
    assert_eq!(pod["spec"]["containers"][1]["name"], "envoy-sidecar");
}

fn drain_pod(annotations: Value, extra_spec: Value) -> Value {
    let mut all = json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/shutdown-manager.enabled": "true",
    });
    all.as_object_mut()
        .unwrap()
        .extend(annotations.as_object().unwrap().clone());
    mk_pod(all, extra_spec)
}

#[test]
fn the_shutdown_manager_drains_envoy_before_the_pod_stops() {
    let pod = drain_pod(
        json!({
            "marin3r.3scale.net/shutdown-manager.drain-time": "60",
            "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app,worker,ghost",
            "marin3r.3scale.net/envoy-extra-args": "--log-level info",
        }),
        json!({"containers": [
            {"name": "app", "image": "kuard:1"},
            {"name": "worker", "image": "kuard:1", "lifecycle": {"postStart": {"exec": {"command": ["true"]}}}},
            {"name": "cron", "image": "kuard:1"},
        ]}),
    );
    let m = mutation(&typed(&pod), &InjectionConfig::default()).unwrap();
    assert_eq!(
        m.warnings,
        [
            r#"marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks: "ghost" not a container of the pod; ignored"#
        ]
    );
    let mut out = pod.clone();
    json_patch::patch(&mut out, &m.patch.0).unwrap();
    let containers = out["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 5);
    // Every hook presents the pod's own token, which the manager reads from its environment.
    let token = containers[4]["env"][0]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(token.len(), 32, "{token}");
    assert_eq!(
        containers[4]["env"],
        json!([{"name": "MARIN3R_SHUTDOWN_MANAGER_TOKEN", "value": token}])
    );
    let auth = json!([{"name": "Authorization", "value": format!("Bearer {token}")}]);
    let hook = |path: &str| {
        json!({"preStop": {"httpGet": {
            "path": path, "port": 8090, "scheme": "HTTP", "httpHeaders": auth,
        }}})
    };
    let drain_hook = hook("/drain");
    // The named containers wait for the drain; the user's postStart is kept; others untouched.
    assert_eq!(containers[0]["lifecycle"], drain_hook);
    assert_eq!(
        containers[1]["lifecycle"],
        json!({
            "postStart": {"exec": {"command": ["true"]}},
            "preStop": drain_hook["preStop"],
        })
    );
    assert_eq!(containers[2], pod["spec"]["containers"][2]);
    // Envoy drains for the drain time with the strategy, and its preStop drains then stops it.
    let envoy = &containers[3];
    assert_eq!(envoy["name"], "envoy-sidecar");
    let args: Vec<&str> = envoy["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args[8..],
        [
            "--drain-time-s",
            "60",
            "--drain-strategy",
            "gradual",
            "--log-level",
            "info"
        ]
    );
    assert_eq!(envoy["lifecycle"], hook("/shutdown"));
    assert_eq!(
        containers[4],
        json!({
            "name": "envoy-shtdn-mgr",
            "image": crate::config::DEFAULT_SHUTDOWN_MANAGER_IMAGE,
            "args": [
                "shutdown-manager",
                "--port=8090",
                "--envoy-admin-address=127.0.0.1:9901",
                "--drain-time=60",
            ],
            "env": [{"name": "MARIN3R_SHUTDOWN_MANAGER_TOKEN", "value": token}],
            "ports": [{"name": "shtdn-mgr", "containerPort": 8090, "protocol": "TCP"}],
            "resources": {
                "requests": {"cpu": "5m", "memory": "25Mi"},
                "limits": {"cpu": "50m", "memory": "50Mi"},
            },
            "readinessProbe": {
                "httpGet": {"path": "/healthz", "port": 8090, "scheme": "HTTP"},
                "periodSeconds": 10,
                "timeoutSeconds": 1,
            },
            "lifecycle": drain_hook,
            "securityContext": {
                "runAsNonRoot": true,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
        })
    );
    // The grace period covers the drain and Envoy's exit.
    assert_eq!(out["spec"]["terminationGracePeriodSeconds"], 75);
    // Another pod gets another token.
    let again = mutation(&typed(&pod), &InjectionConfig::default()).unwrap();
    let mut other = pod.clone();
    json_patch::patch(&mut other, &again.patch.0).unwrap();
    assert_ne!(
        other["spec"]["containers"][4]["env"][0]["value"],
        token.as_str()
    );
}

#[test]
fn the_drain_follows_the_admin_address_and_keeps_a_longer_grace_period() {
    let config = InjectionConfig {
        shutdown_manager_image: "registry.local/marin3r:v2".into(),
        ..InjectionConfig::default()
    };
    let pod = drain_pod(
        json!({
            "marin3r.3scale.net/admin.bind-address": "::",
            "marin3r.3scale.net/admin.port": "15000",
            "marin3r.3scale.net/shutdown-manager.port": "15090",
            "marin3r.3scale.net/shutdown-manager.drain-strategy": "Immediate",
        }),
        json!({"terminationGracePeriodSeconds": 900}),
    );
    let out = patched(&pod, &config);
    let manager = &out["spec"]["containers"][2];
    assert_eq!(manager["image"], "registry.local/marin3r:v2");
    assert_eq!(
        manager["args"],
        json!([
            "shutdown-manager",
            "--port=15090",
            "--envoy-admin-address=[::1]:15000",
            "--drain-time=300",
        ])
    );
    let envoy_args = out["spec"]["containers"][1]["args"].as_array().unwrap();
    assert_eq!(
        envoy_args[8..],
        [
            json!("--drain-time-s"),
            json!("300"),
            json!("--drain-strategy"),
            json!("immediate")
        ]
    );
    assert_eq!(out["spec"]["terminationGracePeriodSeconds"], 900);
    // A discovery pod logging JSON passes it on to the managers it injects.
    let json_logs = InjectionConfig {
        json_logs: true,
        ..config.clone()
    };
    let out = patched(&pod, &json_logs);
    let args = out["spec"]["containers"][2]["args"].as_array().unwrap();
    assert_eq!(args.last().unwrap(), "--log-format=json");
    // Without the manager nothing of it is added.
    let plain = patched(
        &mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"}), json!({})),
        &config,
    );
    assert_eq!(plain["spec"]["containers"].as_array().unwrap().len(), 2);
    assert!(plain["spec"]["containers"][1].get("lifecycle").is_none());
    assert!(plain["spec"].get("terminationGracePeriodSeconds").is_none());
}

#[test]
fn the_shutdown_manager_never_clobbers_the_pod() {
    let cases = [
        (
            drain_pod(
                json!({"marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app"}),
                json!({"containers": [{"name": "app", "image": "kuard", "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}}}]}),
            ),
            r#"marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks: the container "app" already has a preStop hook, which the drain's would replace; remove it from one of the two"#,
        ),
        (
            drain_pod(
                json!({}),
                json!({"containers": [{"name": "app", "image": "kuard", "ports": [{"containerPort": 8090}]}]}),
            ),
            r#"marin3r.3scale.net/shutdown-manager.port: port 8090 is already used by the container "app"; set marin3r.3scale.net/shutdown-manager.port to a free port"#,
        ),
        (
            drain_pod(
                json!({}),
                json!({"containers": [{"name": "envoy-shtdn-mgr", "image": "kuard"}]}),
            ),
            r#"the pod already has a container named "envoy-shtdn-mgr", the name of the shutdown manager marin3r injects"#,
        ),
    ];
    for (pod, want) in cases {
        assert_eq!(denial(&pod), want);
    }
    // A UDP port of the same number is no clash.
    let udp = drain_pod(
        json!({}),
        json!({"containers": [{"name": "app", "image": "kuard", "ports": [{"containerPort": 8090, "protocol": "UDP"}]}]}),
    );
    assert!(mutate(&typed(&udp), &InjectionConfig::default()).is_ok());
}

#[test]
fn ads_configmap_names_the_mounted_bootstrap() {
    let pod = mk_pod(
        json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/ads-configmap": "edge-bootstrap",
        }),
        json!({}),
    );
    let out = patched(&pod, &InjectionConfig::default());
    assert_eq!(
        out["spec"]["volumes"][0],
        json!({"name": "envoy-sidecar-bootstrap", "configMap": {"name": "edge-bootstrap"}})
    );
}

#[test]
fn a_pod_for_another_discovery_service_is_denied_by_this_one() {
    let config = InjectionConfig {
        discovery_service: Some("edge".into()),
        ..InjectionConfig::default()
    };
    let pod = mk_pod(
        json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/discovery-service.name": "internal",
        }),
        json!({}),
    );
    let err = mutate(&typed(&pod), &config).unwrap_err().to_string();
    assert!(
        err.starts_with(r#"marin3r.3scale.net/discovery-service.name: "internal": the pod's namespace is served by the DiscoveryService "edge""#),
        "{err}"
    );
}
