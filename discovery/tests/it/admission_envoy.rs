//! The validating webhook's decision with real Envoy as the last judge (what the discovery
//! pod runs when its image carries Envoy): a config that passes marin3r's own checks and that
//! Envoy refuses is denied with Envoy's words on the resource; a good one is admitted; an
//! Envoy that cannot run admits on marin3r's own checks, so admission stays up.

use marin3r_discovery::judge::EnvoyJudge;
use marin3r_discovery::rules::validator_with;
use marin3r_webhook::validate::review_envoy_config;
use serde_json::{Value, json};

fn review(per_filter: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "marin3r.3scale.net", "version": "v1alpha1", "kind": "EnvoyConfig"},
            "resource": {"group": "marin3r.3scale.net", "version": "v1alpha1", "resource": "envoyconfigs"},
            "namespace": "shop",
            "operation": "CREATE",
            "object": {
                "apiVersion": "marin3r.3scale.net/v1alpha1",
                "kind": "EnvoyConfig",
                "metadata": {"name": "routes", "namespace": "shop"},
                "spec": {"nodeID": "shop", "resources": [
                    {"type": "cluster", "value": {"name": "app", "connect_timeout": "1s"}},
                    {"type": "route", "value": {"name": "local", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": "app"}, "typed_per_filter_config": {"envoy.filters.http.buffer": per_filter}},
                    ]}]}},
                ]},
            },
        }
    })
}

fn decide(validator: &marin3r_webhook::EnvoyConfigValidator, body: &Value) -> Value {
    let (out, _) = review_envoy_config(body.to_string().as_bytes(), validator).unwrap();
    out["response"].clone()
}

#[test]
fn envoy_judges_at_admission_what_passes_our_checks() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let with_envoy = validator_with(false, Some(EnvoyJudge::new(&envoy)));
    // An empty Any straight in the map: our checks pass it, Envoy finds no filter for it.
    let refused = decide(&with_envoy, &review(json!({})));
    assert_eq!(refused["allowed"], false, "{refused}");
    let message = refused["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.resources[1].value: Envoy: Didn't find a registered implementation for 'envoy.filters.http.buffer' with type URL: ''"),
        "{message}"
    );
    // The same route enabling the filter the way Envoy takes it: admitted.
    let enabled =
        json!({"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}});
    let admitted = decide(&with_envoy, &review(enabled));
    assert_eq!(admitted["allowed"], true, "{admitted}");
    // Without Envoy, our checks alone admit the first; with an Envoy that cannot run, too.
    assert_eq!(
        decide(&validator_with(false, None), &review(json!({})))["allowed"],
        true
    );
    let broken = validator_with(false, Some(EnvoyJudge::new("/nonexistent/envoy")));
    assert_eq!(decide(&broken, &review(json!({})))["allowed"], true);
}
