//! Envoy's stats on an injected pod: the named `envoy-stats` port, the `prometheus.io/*`
//! annotations (never over the user's, and off by annotation or cluster default), and the
//! admin port a pod may declare: the admin itself off loopback, Envoy's stats alone on it.

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

/// The sidecar container's `--config-yaml` overlay, parsed.
fn overlay(pod: &Value) -> Value {
    let args = pod["spec"]["containers"][1]["args"].as_array().unwrap();
    let at = args.iter().position(|a| a == "--config-yaml").unwrap();
    serde_json::from_str(args[at + 1].as_str().unwrap()).unwrap()
}

/// The original's ratelimit example as it is written: `envoy-metrics:9901` declared, the
/// admin left where marin3r puts it, on loopback. Admitted, with a warning: the declared port
/// serves, on the pod's addresses, what `envoy-stats` serves (a second address of the
/// readiness listener, which shares the port with the admin by `SO_REUSEPORT`), and the admin
/// stays on loopback (what a real Envoy makes of it: e2e/tests/it/webhook_sidecar_envoy.rs).
#[test]
fn the_admin_port_declared_on_a_loopback_admin_serves_the_stats_alone() {
    let mut pod = mk_pod(json!({
        "marin3r.3scale.net/node-id": "kuard",
        "marin3r.3scale.net/ports": "envoy-http:38080,envoy-metrics:9901",
    }));
    let (_, warnings) = inject_json(&mut pod, &InjectionConfig::default()).unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(r#""envoy-metrics" is Envoy's admin port 9901"#)
            && warnings[0].contains("serves only GET /ready and GET /stats/prometheus"),
        "{warnings:?}"
    );
    assert_eq!(
        pod["spec"]["containers"][1]["ports"],
        json!([
            {"name": "envoy-http", "containerPort": 38080, "protocol": "TCP"},
            {"name": "envoy-metrics", "containerPort": 9901, "protocol": "TCP"},
            {"name": "envoy-stats", "containerPort": 9902, "protocol": "TCP"},
        ])
    );
    let overlay = overlay(&pod);
    let admin = &overlay["admin"];
    assert_eq!(
        admin["address"]["socket_address"],
        json!({"address": "127.0.0.1", "port_value": 9901})
    );
    assert_eq!(
        admin["socket_options"],
        crate::readiness::admin_sharing_its_port()
    );
    let listener = &overlay["static_resources"]["listeners"][0];
    assert_eq!(listener["name"], crate::readiness::READINESS_LISTENER);
    assert_eq!(
        listener["additional_addresses"][0]["address"]["socket_address"]["port_value"],
        9901
    );
    assert_eq!(
        listener["address"]["socket_address"]["port_value"], 9902,
        "the readiness port stays"
    );
    // Without the declaration, neither.
    let plain = patched(
        &mk_pod(json!({"marin3r.3scale.net/node-id": "kuard"})),
        &InjectionConfig::default(),
    );
    let overlay = self::overlay(&plain);
    assert!(overlay["admin"].get("socket_options").is_none());
    assert!(
        overlay["static_resources"]["listeners"][0]
            .get("additional_addresses")
            .is_none()
    );
}

/// The original's ratelimit example with the admin on every pod address, as the original
/// put it: the declared port is the admin itself.
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
