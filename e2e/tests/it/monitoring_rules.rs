//! `manifests/monitoring/` renders as a kustomize Component over `manifests/` (real kubectl),
//! and its PrometheusRule passes the real promtool: `promtool check rules`, and `promtool test
//! rules` with the alert unit tests of `manifests/monitoring/tests/alerts_test.yaml`, which
//! drive every alert. That the alerts fire on real metrics, and that the dashboard's queries
//! run, is monitoring_e2e.rs.

use std::collections::{BTreeMap, BTreeSet};

use marin3r_e2e::monitoring::{self, object, render, rules, run_promtool};
use marin3r_testkit::tools::repo_root;
use serde_json::{Value, json};

#[test]
fn the_component_renders_podmonitors_rules_and_a_dashboard() {
    let objects = render().unwrap();
    // The control plane's per-object gauges carry the object's `namespace`: honored.
    for (name, port, path, honor) in [
        ("marin3r-operator", "metrics", "/metrics", true),
        ("marin3r-discovery-service", "metrics", "/metrics", true),
        (
            "marin3r-envoy-sidecars",
            "envoy-stats",
            "/stats/prometheus",
            false,
        ),
        (
            "marin3r-envoy-gateways",
            "envoy-stats",
            "/stats/prometheus",
            false,
        ),
    ] {
        let monitor = object(&objects, "PodMonitor", name).unwrap();
        assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        assert_eq!(
            (&endpoint["port"], &endpoint["path"]),
            (&json!(port), &json!(path))
        );
        assert_eq!(endpoint["honorLabels"] == true, honor, "{name}");
    }
    let dashboard = object(&objects, "ConfigMap", "marin3r-grafana-dashboard").unwrap();
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert!(monitoring::dashboard_queries(&objects).unwrap().len() > 10);
    // The base is still all there.
    object(&objects, "Deployment", "marin3r-operator").unwrap();
}

/// Whether a PodMonitor's `matchLabels` select a pod labelled `labels`.
fn selects(monitor: &Value, labels: &BTreeMap<String, String>) -> bool {
    let wanted = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    wanted
        .iter()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
}

#[test]
fn gateway_pods_are_scraped_by_their_own_podmonitor_on_their_stats_port() {
    let objects = render().unwrap();
    let gateways = object(&objects, "PodMonitor", "marin3r-envoy-gateways").unwrap();
    let sidecars = object(&objects, "PodMonitor", "marin3r-envoy-sidecars").unwrap();
    // The labels the operator gives every gateway pod (the Deployment's selector).
    let pod = marin3r_operator::envoy_deployment::build::labels("front-door");
    assert!(selects(gateways, &pod), "{gateways}");
    assert!(!selects(sidecars, &pod), "{sidecars}");
    // ...and only them: not the operator's or a discovery pod's labels.
    for component in ["operator", "discovery-service"] {
        let other = BTreeMap::from([
            ("app.kubernetes.io/name".to_owned(), "marin3r".to_owned()),
            (
                "app.kubernetes.io/component".to_owned(),
                component.to_owned(),
            ),
        ]);
        assert!(!selects(gateways, &other), "{component}");
    }
    assert_eq!(gateways["spec"]["namespaceSelector"]["any"], true);
    let endpoint = &gateways["spec"]["podMetricsEndpoints"][0];
    assert_eq!(
        endpoint["port"],
        marin3r_webhook::readiness::STATS_PORT_NAME
    );
    assert_eq!(endpoint["relabelings"][0]["replacement"], "envoy-gateway");
    // The proxies' alert watches the gateways' job too.
    let spec = rules(&objects).unwrap();
    let not_in_sync = spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .find(|r| r["alert"] == "Marin3rProxyNotInSync")
        .unwrap();
    assert!(
        not_in_sync["expr"]
            .as_str()
            .unwrap()
            .contains("envoy-gateway"),
        "{not_in_sync}"
    );
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let spec = rules(&render().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), spec.to_string()).unwrap();
    let (ok, out) = run_promtool(dir.path(), &["check", "rules", "rules.yaml"]).unwrap();
    assert!(ok, "{out}");
    let alerts = alert_names(&spec);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{out}"
    );

    let tests = repo_root().join("manifests/monitoring/tests/alerts_test.yaml");
    std::fs::copy(&tests, dir.path().join("alerts_test.yaml")).unwrap();
    let (ok, out) = run_promtool(dir.path(), &["test", "rules", "alerts_test.yaml"]).unwrap();
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert is driven to firing by at least one unit test.
    let text = std::fs::read_to_string(&tests).unwrap();
    let cases: Value = serde_saphyr::from_str(&text).unwrap();
    let fired: BTreeSet<String> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().iter())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(fired, alerts, "alerts without a unit test that fires them");
}

/// The checks can fail: a rule whose expression does not parse, and a unit test expecting
/// an alert that does not fire.
#[test]
fn promtool_refuses_a_broken_rule_and_a_wrong_expectation() {
    let dir = tempfile::tempdir().unwrap();
    let broken = json!({"groups": [{"name": "x", "rules": [
        {"alert": "Broken", "expr": "sum by (pod (marin3r_xds_nacks_total)"}
    ]}]});
    std::fs::write(dir.path().join("rules.yaml"), broken.to_string()).unwrap();
    let (ok, out) = run_promtool(dir.path(), &["check", "rules", "rules.yaml"]).unwrap();
    assert!(!ok, "{out}");

    let spec = rules(&render().unwrap()).unwrap();
    std::fs::write(dir.path().join("rules.yaml"), spec.to_string()).unwrap();
    let wrong = "rule_files: [rules.yaml]\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'up{job=\"discovery-service\",namespace=\"a\",pod=\"b\"}'\n        values: '1x10'\n    alert_rule_test:\n      - eval_time: 10m\n        alertname: Marin3rDiscoveryServiceDown\n        exp_alerts: [{exp_labels: {severity: critical, job: discovery-service, namespace: a, pod: b}}]\n";
    std::fs::write(dir.path().join("wrong_test.yaml"), wrong).unwrap();
    let (ok, out) = run_promtool(dir.path(), &["test", "rules", "wrong_test.yaml"]).unwrap();
    assert!(!ok, "{out}");
}

#[test]
fn the_tests_prometheus_loads_the_rules_without_their_waits() {
    let spec = rules(&render().unwrap()).unwrap();
    let quick = monitoring::without_for(&spec);
    assert_eq!(alert_names(&quick), alert_names(&spec));
    for group in quick["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            assert!(rule.get("for").is_none() || rule["for"] == "0s", "{rule}");
        }
    }
    // Only `for` changed.
    let mut back = quick.clone();
    for (g, group) in spec["groups"].as_array().unwrap().iter().enumerate() {
        for (r, rule) in group["rules"].as_array().unwrap().iter().enumerate() {
            if let Some(wait) = rule.get("for") {
                back["groups"][g]["rules"][r]["for"] = wait.clone();
            }
        }
    }
    assert_eq!(back, spec);
}

fn alert_names(spec: &Value) -> BTreeSet<String> {
    spec["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_owned))
        .collect()
}
