use serde_json::json;

use super::fixture as ed;
use super::*;

#[test]
fn defaults_are_the_originals() {
    let r = ed(json!({})).resolve().unwrap();
    assert_eq!(r.image, DEFAULT_ENVOY_IMAGE);
    assert_eq!(r.admin_port, 9901);
    assert_eq!(r.readiness_port, 9902);
    assert_eq!(r.admin_access_log_path, None);
    assert_eq!(r.client_duration, Duration::from_secs(48 * 3600));
    assert_eq!(r.replicas, Replicas::Static(1));
    assert_eq!(r.liveness, DEFAULT_LIVENESS);
    assert_eq!(r.readiness, DEFAULT_READINESS);
    assert_eq!(r.pod_disruption_budget, None);
    assert_eq!(r.shutdown_manager, None);
    assert!(r.ports.is_empty() && r.extra_args.is_empty());
    assert!(!r.init_manager);
}

#[test]
fn a_spec_setting_every_optional_field_resolves() {
    let r = ed(json!({
        "ports": [{"name": "grpc", "port": 9443}, {"name": "metrics-udp", "port": 9125, "protocol": "UDP"}],
        "extraArgs": ["--concurrency", "4"],
        "adminAccessLogPath": "/dev/stderr",
        "resources": {"requests": {"memory": "32Mi", "cpu": "20m"}, "limits": {"memory": "96Mi"}},
        "replicas": {"dynamic": {"minReplicas": 3, "maxReplicas": 7, "metrics": [{
            "type": "Resource",
            "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "80Mi"}},
        }]}},
        "podDisruptionBudget": {"maxUnavailable": "30%"},
        "shutdownManager": {"drainTime": 45, "drainStrategy": "immediate", "serverPort": 8095},
        "initManager": {"image": "registry.example.com/tools/init:2.1"},
    }))
    .resolve()
    .unwrap();
    assert_eq!(r.ports[0].port, 9443);
    assert_eq!(r.ports[0].protocol, Protocol::Tcp);
    assert_eq!(r.ports[1].protocol, Protocol::Udp);
    assert_eq!(r.extra_args, ["--concurrency", "4"]);
    assert_eq!(r.admin_access_log_path.as_deref(), Some("/dev/stderr"));
    assert!(
        matches!(r.replicas, Replicas::Dynamic(ref d) if d.min_replicas == Some(3) && d.max_replicas == 7)
    );
    let m = r.shutdown_manager.unwrap();
    assert_eq!(
        (m.port, m.drain_time, m.drain_strategy),
        (8095, 45, DrainStrategy::Immediate)
    );
    assert!(r.init_manager);
}

#[test]
fn bad_fields_are_named() {
    let probe = |success: i32| {
        json!({"initialDelaySeconds": 0, "timeoutSeconds": 1, "periodSeconds": 1,
               "successThreshold": success, "failureThreshold": 1})
    };
    for (spec, want) in [
        (
            json!({"replicas": {"static": 2, "dynamic": {"maxReplicas": 3}}}),
            "only one of 'spec.replicas.static' or 'spec.replicas.dynamic' is allowed",
        ),
        (json!({"replicas": {}}), "spec.replicas: one of"),
        (json!({"replicas": {"static": -1}}), "spec.replicas.static"),
        (
            json!({"replicas": {"dynamic": {"minReplicas": 3, "maxReplicas": 2}}}),
            "spec.replicas.dynamic.maxReplicas",
        ),
        (
            json!({"replicas": {"dynamic": {"minReplicas": 0, "maxReplicas": 2}}}),
            "spec.replicas.dynamic.minReplicas",
        ),
        (
            json!({"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": "10%"}}),
            "only one of 'spec.podDisruptionBudget.minAvailable' or 'spec.podDisruptionBudget.maxUnavailable' is allowed",
        ),
        (
            json!({"podDisruptionBudget": {"maxUnavailable": "120%"}}),
            "spec.podDisruptionBudget.maxUnavailable",
        ),
        (json!({"duration": "2d"}), "spec.duration"),
        (json!({"duration": "10s"}), "spec.duration"),
        (json!({"adminPort": 0}), "spec.adminPort"),
        (json!({"adminPort": 70000}), "spec.adminPort"),
        (
            json!({"ports": [{"name": "http", "port": 9902}]}),
            "spec.ports[0].port: 9902 is the readiness listener's port",
        ),
        (
            json!({"ports": [{"name": "Http", "port": 8080}]}),
            "spec.ports[0].name",
        ),
        (
            json!({"ports": [{"name": "a", "port": 8080}, {"name": "a", "port": 8081}]}),
            "spec.ports[1].name",
        ),
        (
            json!({"ports": [{"name": "a", "port": 8080, "protocol": "HTTP"}]}),
            "spec.ports[0].protocol",
        ),
        (
            json!({"shutdownManager": {}, "ports": [{"name": "a", "port": 8090}]}),
            "spec.ports[0].port: 8090 is the shutdown manager's port",
        ),
        (
            json!({"shutdownManager": {"drainStrategy": "slow"}}),
            "spec.shutdownManager.drainStrategy",
        ),
        (
            json!({"shutdownManager": {"drainTime": -1}}),
            "spec.shutdownManager.drainTime",
        ),
        (json!({"extraArgs": ["-c", "/tmp/x"]}), "spec.extraArgs"),
        (
            json!({"shutdownManager": {}, "extraArgs": ["--drain-time-s=5"]}),
            "spec.extraArgs",
        ),
        (
            json!({"livenessProbe": probe(2)}),
            "spec.livenessProbe.successThreshold",
        ),
        (
            json!({"readinessProbe": probe(0)}),
            "spec.readinessProbe.successThreshold",
        ),
        (
            json!({"adminAccessLogPath": "log.txt"}),
            "spec.adminAccessLogPath",
        ),
        (
            json!({"envoyConfigRef": "Not_A_Name"}),
            "spec.envoyConfigRef",
        ),
        (json!({"clusterID": ""}), "spec.clusterID"),
        (json!({"image": ""}), "spec.image"),
    ] {
        let err = ed(spec.clone()).resolve().unwrap_err();
        assert!(err.contains(want), "{spec}: {err}");
    }
}
