//! The validating webhook's decision with real Envoy as the last judge (what the discovery
//! pod runs when its image carries Envoy): a config that passes marin3r's own checks and that
//! Envoy refuses is denied with Envoy's words on the resource; a good one is admitted; an
//! Envoy that cannot run admits on marin3r's own checks, so admission stays up.

use marin3r_envoyconfig::judge::EnvoyJudge;
use marin3r_envoyconfig::rules::validator_with;
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
    let with_envoy = validator_with(
        false,
        Some(EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"))),
    );
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
    let broken = validator_with(
        false,
        Some(EnvoyJudge::new("/nonexistent/envoy").with_launcher(env!("CARGO_BIN_EXE_marin3r"))),
    );
    assert_eq!(decide(&broken, &review(json!({})))["allowed"], true);
}

/// A spec's entries as `convert::entries` reads them.
fn spec(resources: Value) -> marin3r_api::EnvoyConfigSpec {
    serde_json::from_value(json!({"nodeID": "shop", "resources": resources})).unwrap()
}

/// Envoy refuses the whole spec; which entries get the blame. A listener whose inline route
/// names a cluster of another entry is judged beside the clusters that pass, so it is not
/// blamed for a bad cluster, nor for a good one it needs.
#[test]
fn only_the_entries_envoy_refuses_are_blamed() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let judge = EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    let listener = |name: &str, port: u16, router: Value| {
        json!({"type": "listener", "value": {
            "name": name,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": name,
                    "route_config": {"name": name, "virtual_hosts": [{"name": "all", "domains": ["*"],
                        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "app"}}]}]},
                    "http_filters": [router],
                }}]}],
        }})
    };
    let router = json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}});
    let name_only = json!({"name": "envoy.filters.http.router"});
    let good_cluster =
        json!({"type": "cluster", "value": {"name": "app", "connect_timeout": "1s"}});
    // A bad listener beside a good one that routes to a cluster of its own entry.
    let s = spec(json!([
        good_cluster,
        listener("good", 8080, router.clone()),
        listener("bad", 8081, name_only),
    ]));
    let Err(marin3r_envoyconfig::judge::JudgeError::Refused(blamed)) = judge.judge(&s) else {
        panic!("Envoy refuses a name-only router");
    };
    assert_eq!(blamed.len(), 1, "{blamed:#?}");
    assert!(
        blamed[0].starts_with("spec.resources[2].value: Envoy: Didn't find a registered implementation for 'envoy.filters.http.router'"),
        "{blamed:#?}"
    );
    // A bad cluster: the listeners that name the other cluster are not blamed with it.
    let s = spec(json!([
        good_cluster,
        {"type": "cluster", "value": {"name": "broken", "connect_timeout": "1s", "type": "ORIGINAL_DST", "lb_policy": "ROUND_ROBIN"}},
        listener("one", 8080, router.clone()),
        listener("two", 8081, router.clone()),
    ]));
    let Err(marin3r_envoyconfig::judge::JudgeError::Refused(blamed)) = judge.judge(&s) else {
        panic!("Envoy refuses an original-destination cluster balanced round robin");
    };
    assert!(
        blamed.len() == 1 && blamed[0].starts_with("spec.resources[1].value: Envoy: "),
        "{blamed:#?}"
    );
    // A route to the cluster every sidecar's bootstrap defines is what a sidecar takes.
    let admin = json!([{"type": "listener", "value": {
        "name": "admin-proxy",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8080}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "admin",
                "route_config": {"name": "admin", "virtual_hosts": [{"name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/ready"}, "route": {"cluster": "marin3r_sidecar_admin"}}]}]},
                "http_filters": [router],
            }}]}],
    }}]);
    assert_eq!(judge.judge(&spec(admin)), Ok(()));
}

/// An Envoy that never answers costs a verdict its budget, not the webhook's timeout: the
/// discovery pod's judge gives up well before the API server would, and the config is
/// admitted on marin3r's own checks.
#[test]
fn a_hung_envoy_is_given_up_on_within_the_budget() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let hung = dir.path().join("envoy");
    std::fs::write(&hung, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&hung, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(marin3r_envoyconfig::judge::ADMISSION_BUDGET < Duration::from_secs(10));
    // The stand-in hangs where the sandbox would start Envoy: a script could not run inside
    // the sandbox itself (it reads no shell).
    let judge = EnvoyJudge::new("/nonexistent/envoy")
        .with_launcher(&hung)
        .with_budget(Duration::from_millis(800));
    let started = Instant::now();
    let verdict = judge.judge(&spec(json!([
        {"type": "cluster", "value": {"name": "a", "connect_timeout": "1s"}},
        {"type": "cluster", "value": {"name": "b", "connect_timeout": "1s"}},
    ])));
    let took = started.elapsed();
    assert!(
        matches!(&verdict, Err(marin3r_envoyconfig::judge::JudgeError::Unavailable(why)) if why.contains("no verdict within")),
        "{verdict:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let validator = validator_with(false, Some(judge));
    let started = Instant::now();
    assert_eq!(decide(&validator, &review(json!({})))["allowed"], true);
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A resource reading a file of the proxy's pod hides nothing behind it: Envoy's refusal for
/// the missing file is no verdict, but a route beside it that Envoy refuses is still found.
#[test]
fn a_file_of_the_proxys_pod_hides_no_other_refusal() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let judge = EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    let lua = json!({"type": "listener", "value": {
        "name": "lua",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 8080}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "lua",
                "route_config": {"name": "lua", "virtual_hosts": [{"name": "all", "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                "http_filters": [
                    {"name": "envoy.filters.http.lua", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "default_source_code": {"filename": "/etc/envoy/lua/headers.lua"}}},
                    {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
                ],
            }}]}],
    }});
    assert_eq!(judge.judge(&spec(json!([lua.clone()]))), Ok(()));
    let bad_regex = json!({"type": "route", "value": {"name": "api", "virtual_hosts": [{
        "name": "all", "domains": ["*"],
        "routes": [{"match": {"safe_regex": {"regex": "/v1(["}}, "direct_response": {"status": 200}}]}]}});
    let Err(marin3r_envoyconfig::judge::JudgeError::Refused(blamed)) =
        judge.judge(&spec(json!([lua, bad_regex])))
    else {
        panic!("Envoy refuses an invalid RE2 beside a Lua module it cannot read");
    };
    assert!(
        blamed.len() == 1 && blamed[0].starts_with("spec.resources[1].value: Envoy: "),
        "{blamed:#?}"
    );
}

/// A tap transport socket crashed Envoy 1.40's validate mode when the bootstrap had no
/// `admin` (a backtrace line became the reason); the judge's bootstrap has one, so it is
/// judged, and accepted.
#[test]
fn a_tap_transport_socket_is_judged_not_crashed_on() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let judge = EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    let tapped = json!([{"type": "cluster", "value": {
        "name": "tapped", "connect_timeout": "1s",
        "transport_socket": {"name": "envoy.transport_sockets.tap", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tap.v3.Tap",
            "common_config": {"admin_config": {"config_id": "t"}},
            "transport_socket": {"name": "raw", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}}},
    }}]);
    assert_eq!(judge.judge(&spec(tapped)), Ok(()));
}

/// A config over 120 KiB went to Envoy through a temporary folder the discovery pod's
/// read-only root could not hold, and was never judged there. Every bootstrap now goes
/// through a file in `TMPDIR` (the pod's memory-backed /var/tmp): a large one Envoy refuses is
/// refused, in Envoy's words.
#[test]
fn a_config_over_120_kib_is_judged() {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let judge = EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    let hosts: Vec<Value> = (0..1500)
        .map(|i| json!({"name": format!("host-{i}"), "domains": [format!("h{i}.example.com")],
            "routes": [{"match": {"prefix": format!("/path/{i}")}, "direct_response": {"status": 200}}]}))
        .collect();
    let mut route = json!({"name": "big", "virtual_hosts": hosts});
    route["virtual_hosts"][700]["routes"][0]["match"] = json!({"safe_regex": {"regex": "/v1(["}});
    let resources = json!([{"type": "route", "value": route}]);
    assert!(resources.to_string().len() > 120 * 1024);
    let verdict = judge.judge(&spec(resources));
    let Err(marin3r_envoyconfig::judge::JudgeError::Refused(problems)) = &verdict else {
        panic!("{verdict:?}")
    };
    assert!(
        problems[0].starts_with("spec.resources[0].value: Envoy: "),
        "{problems:?}"
    );
    assert!(problems[0].contains("missing ]"), "{problems:?}");
}
