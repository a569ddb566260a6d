//! Scoped routes (SRDS) and extension configs (ECDS) from an EnvoyConfig, served to a real
//! Envoy over ADS in both flavours: its listener picks a route configuration by a request
//! header through the scopes, a filter of its chain gets its configuration by ECDS, and both
//! follow a new snapshot. Envoy also judges both kinds before they are published: a scope or
//! an extension config it would refuse is refused, naming the entry.

use crate::support;

use std::time::{Duration, Instant};

use marin3r_envoyconfig::judge::{EnvoyJudge, JudgeError};
use marin3r_webhook::bootstrap::AdsMode;
use serde_json::{Value, json};
use support::{Pki, Proxy, XdsServer, free_port, snapshot};

const NS: &str = "team-s";
const NODE: &str = "scoped-1";
const POD: &str = "scoped-1-5c6d7-fghij";
const HEADER_MUTATION: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";

/// A listener whose routes come by SRDS (scope key: the `x-tenant` header) and whose first
/// HTTP filter comes by ECDS, two scopes with their route configurations, and that filter's
/// configuration: it stamps every response with `x-stamp: <stamp>`.
fn spec(port: u16, body_a: &str, stamp: &str) -> marin3r_api::EnvoyConfigSpec {
    let text = format!(
        r#"
nodeID: {NODE}
serialization: yaml
envoyResources:
  listeners:
    - value: |
        name: scoped
        address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: scoped
                  scoped_routes:
                    name: tenants
                    scope_key_builder:
                      fragments:
                        - header_value_extractor: {{ name: x-tenant, index: 0 }}
                    rds_config_source: {{ ads: {{}}, resource_api_version: V3 }}
                    scoped_rds:
                      scoped_rds_config_source: {{ ads: {{}}, resource_api_version: V3 }}
                  http_filters:
                    - name: stamp
                      config_discovery:
                        config_source: {{ ads: {{}}, resource_api_version: V3 }}
                        type_urls: [{HEADER_MUTATION}]
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  scopedRoutes:
    - value: |
        name: tenant-a
        route_configuration_name: routes-a
        key: {{ fragments: [ {{ string_key: a }} ] }}
    - value: |
        name: tenant-b
        route_configuration_name: routes-b
        key: {{ fragments: [ {{ string_key: b }} ] }}
  routes:
    - value: |
        name: routes-a
        virtual_hosts:
          - name: a
            domains: ["*"]
            routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "{body_a}" }} }}
    - value: |
        name: routes-b
        virtual_hosts:
          - name: b
            domains: ["*"]
            routes:
              - match: {{ prefix: "/" }}
                direct_response: {{ status: 200, body: {{ inline_string: "tenant b" }} }}
  extensionConfigs:
    - value: |
        name: stamp
        typed_config:
          "@type": {HEADER_MUTATION}
          mutations:
            response_mutations:
              - append:
                  header: {{ key: x-stamp, value: "{stamp}" }}
                  append_action: OVERWRITE_IF_EXISTS_OR_ADD
"#
    );
    serde_saphyr::from_str(&text).unwrap()
}

/// `GET /` with `x-tenant: <tenant>` (none when empty): status, body and the `x-stamp` header.
fn get(port: u16, tenant: &str) -> Result<(u16, String, Option<String>), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut request = agent.get(format!("http://127.0.0.1:{port}/"));
    if !tenant.is_empty() {
        request = request.header("x-tenant", tenant);
    }
    let mut response = request.call().map_err(|e| e.to_string())?;
    let stamp = response
        .headers()
        .get("x-stamp")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, body, stamp))
}

fn wait_for_answer(proxy: &Proxy, port: u16, tenant: &str, body: &str, stamp: &str) {
    let want = Ok((200, body.to_owned(), Some(stamp.to_owned())));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = get(port, tenant);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "tenant {tenant:?}: never {want:?}; last {got:?}\n{}",
            proxy.envoy.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn scoped_routes_and_extension_configs_arrive(mode: AdsMode) {
    let port = free_port();
    let resources = |body_a: &str, stamp: &str| {
        marin3r_envoyconfig::convert::validate_config(&spec(port, body_a, stamp))
            .unwrap_or_else(|errors| panic!("{errors:?}"))
    };
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    server
        .cache
        .set_snapshot(NS, NODE, snapshot(resources("tenant a", "ecds-1")));
    let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, mode);

    // Each scope's routes answer for its key, every answer stamped by the ECDS filter.
    wait_for_answer(&proxy, port, "a", "tenant a", "ecds-1");
    wait_for_answer(&proxy, port, "b", "tenant b", "ecds-1");
    // No scope for the key: Envoy's 404, still stamped.
    let (status, _, stamp) = get(port, "c").unwrap();
    assert_eq!((status, stamp.as_deref()), (404, Some("ecds-1")));

    // What arrived, in Envoy's own words.
    let dump = proxy.envoy.admin_get("/config_dump").unwrap();
    for what in [
        "ScopedRoutesConfigDump",
        "tenant-a",
        "tenant-b",
        "EcdsConfigDump",
        "ecds-1",
    ] {
        assert!(dump.contains(what), "config_dump lacks {what:?}");
    }
    assert!(proxy.stat("http.scoped.scoped_rds.tenants.update_success") >= 1);
    assert!(proxy.stat("extension_config_discovery.http_filter.stamp.config_reload") >= 1);

    // A new version of the scope's routes and of the extension config: both follow.
    server
        .cache
        .set_snapshot(NS, NODE, snapshot(resources("tenant a, v2", "ecds-2")));
    wait_for_answer(&proxy, port, "a", "tenant a, v2", "ecds-2");
    wait_for_answer(&proxy, port, "b", "tenant b", "ecds-2");

    let status = server.sync_status();
    let types = &status.proxies[0].types;
    for kind in ["listeners", "routes", "scopedRoutes", "extensionConfigs"] {
        let t = types
            .get(kind)
            .unwrap_or_else(|| panic!("no {kind} in {types:?}"));
        assert!(
            t.acked_version.is_some() && t.acked_version == t.sent_version,
            "{kind}: {t:?}"
        );
        assert!(t.last_nack.is_none(), "{kind}: {t:?}");
    }
}

#[test]
fn sotw_envoy_gets_scoped_routes_and_extension_configs() {
    scoped_routes_and_extension_configs_arrive(AdsMode::StateOfTheWorld);
}

#[test]
fn delta_envoy_gets_scoped_routes_and_extension_configs() {
    scoped_routes_and_extension_configs_arrive(AdsMode::Delta);
}

fn judge() -> EnvoyJudge {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    EnvoyJudge::new(&envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"))
}

fn judged(resources: Value) -> Result<(), JudgeError> {
    let spec = serde_json::from_value(json!({"nodeID": NODE, "resources": resources})).unwrap();
    judge().judge(&spec)
}

#[test]
fn envoy_judges_scoped_routes_and_extension_configs() {
    let spec = spec(free_port(), "tenant a", "ecds-1");
    assert_eq!(judge().judge(&spec), Ok(()));

    // A scope with an inline route configuration Envoy refuses (an invalid RE2), beside a
    // good one: only the bad one is blamed.
    let good = json!({"type": "scopedRoute", "value": {"name": "good",
        "route_configuration_name": "r", "key": {"fragments": [{"string_key": "g"}]}}});
    let bad = json!({"type": "scopedRoute", "value": {"name": "bad",
        "key": {"fragments": [{"string_key": "b"}]},
        "route_configuration": {"name": "inline", "virtual_hosts": [{"name": "all",
            "domains": ["*"], "routes": [{"match": {"safe_regex": {"regex": "/v1(["}},
            "direct_response": {"status": 200}}]}]}}});
    let verdict = judged(json!([good, bad]));
    let Err(JudgeError::Refused(blamed)) = &verdict else {
        panic!("Envoy accepts an invalid RE2 in a scope: {verdict:?}");
    };
    assert!(
        blamed.len() == 1 && blamed[0].starts_with("spec.resources[1].value: Envoy: "),
        "{blamed:#?}"
    );

    // An HTTP filter's extension config Envoy refuses: a header mutation of a pseudo-header.
    let bad_filter = json!({"type": "extensionConfig", "value": {"name": "stamp", "typed_config": {
        "@type": HEADER_MUTATION,
        "mutations": {"response_mutations": [{"append": {"header": {"key": ":status", "value": "500"}}}]}}}});
    let verdict = judged(json!([bad_filter]));
    let Err(JudgeError::Refused(blamed)) = &verdict else {
        panic!("Envoy accepts a mutation of :status: {verdict:?}");
    };
    assert!(
        blamed.len() == 1 && blamed[0].starts_with("spec.resources[0].value: Envoy: "),
        "{blamed:#?}"
    );
}
