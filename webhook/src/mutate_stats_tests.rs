//! Envoy's stats on an injected pod: the named `envoy-stats` port, the `prometheus.io/*`
//! annotations (never over the user's, and off by annotation or cluster default), and the
//! admin port a pod may declare once the admin is off loopback.

use serde_json::json;

use super::*;

/// A labelled pod with `annotations` (its application container declares port 8080).
fn mk_pod(annotations: Value) -> Value {
    super::tests::mk_pod(annotations, json!({}))
}

fn patched(pod: &Value, config: &InjectionConfig) -> Value {
    let mut out = pod.clone();
    let (_, warnings) = inject_json(&mut out, config).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    out
}

const PROMETHEUS: [&str; 3] = [
    "prometheus.io/scrape",
    "prometheus.io/port",
    "prometheus.io/path",
];

fn prometheus_annotations(pod: &Value) -> Vec<(String, String)> {
    PROMETHEUS
        .iter()
        .filter_map(|name| {
            let value = pod["metadata"]["annotations"][*name].as_str()?;
            Some(((*name).to_owned(), value.to_owned()))
        })
        .collect()
}

#[test]
fn an_injected_pod_is_annotated_for_envoys_stats_on_its_readiness_port() {
    let out = patched(
        &mk_pod(json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/readiness.port": "15021",
        })),
        &InjectionConfig::default(),
    );
    assert_eq!(
        prometheus_annotations(&out),
        [
            ("prometheus.io/scrape".to_owned(), "true".to_owned()),
            ("prometheus.io/port".to_owned(), "15021".to_owned()),
            (
                "prometheus.io/path".to_owned(),
                "/stats/prometheus".to_owned()
            ),
        ]
    );
    assert_eq!(
        out["spec"]["containers"][1]["ports"],
        json!([{"name": "envoy-stats", "containerPort": 15021, "protocol": "TCP"}])
    );
}

#[test]
fn the_users_prometheus_annotations_are_left_alone() {
    // Any one of the three: the pod's scraping is the user's (their application's, here).
    for name in PROMETHEUS {
        let pod = mk_pod(json!({"marin3r.3scale.net/node-id": "kuard", name: "8080"}));
        let out = patched(&pod, &InjectionConfig::default());
        assert_eq!(
            prometheus_annotations(&out),
            [(name.to_owned(), "8080".to_owned())],
            "{name}"
        );
    }
}

#[test]
fn the_annotations_are_off_by_pod_annotation_or_cluster_default() {
    let off = mk_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/prometheus-annotations": "false",
    }));
    assert!(prometheus_annotations(&patched(&off, &InjectionConfig::default())).is_empty());
    let cluster_off = InjectionConfig {
        prometheus_annotations: false,
        ..InjectionConfig::default()
    };
    let plain = mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"}));
    assert!(prometheus_annotations(&patched(&plain, &cluster_off)).is_empty());
    // The pod's annotation wins over the cluster's default, both ways.
    let on = mk_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/prometheus-annotations": "true",
    }));
    assert_eq!(prometheus_annotations(&patched(&on, &cluster_off)).len(), 3);
    // Whatever the annotations, the stats port is named: PodMonitors select it.
    let out = patched(&off, &InjectionConfig::default());
    assert_eq!(
        out["spec"]["containers"][1]["ports"][0]["name"],
        "envoy-stats"
    );
}

/// The original's ratelimit example: the admin on every pod address, declared as
/// `envoy-metrics:9901`. Allowed then; on loopback it is denied (annotations/tests.rs).
#[test]
fn the_admin_port_may_be_declared_when_the_admin_is_off_loopback() {
    for bind in ["0.0.0.0", "::", "10.1.2.3"] {
        let pod = mk_pod(json!({
            "marin3r.3scale.net/node-id": "kuard",
            "marin3r.3scale.net/ports": "http:8080,envoy-metrics:9901",
            "marin3r.3scale.net/admin.bind-address": bind,
        }));
        let out = patched(&pod, &InjectionConfig::default());
        let names: Vec<(&str, i64)> = out["spec"]["containers"][1]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap(),
                    p["containerPort"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("http", 8080),
                ("envoy-metrics", 9901),
                ("envoy-stats", 9902)
            ],
            "{bind}"
        );
    }
    // The readiness port stays the listener's own, wherever the admin is.
    let pod = mk_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/ports": "metrics:9902",
        "marin3r.3scale.net/admin.bind-address": "0.0.0.0",
    }));
    let denial = super::tests::denial(&pod);
    assert!(
        denial.contains("readiness listener's port clashes"),
        "{denial}"
    );
}
