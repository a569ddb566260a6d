//! A configuration Envoy's validate mode accepts and a running Envoy rejects: a listener on an
//! address the proxy does not have. Validate mode binds no socket, so the judge admits it;
//! served over LDS, Envoy fails to bind it and NACKs. It is the config the e2e scenarios use
//! to show a NACK and the rollback now that the webhook judges with Envoy.

use crate::support;

use std::time::Duration;

use marin3r_api::EnvoyConfigSpec;
use marin3r_envoyconfig::judge::EnvoyJudge;
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use support::{Pki, Proxy, XdsServer, free_port, snapshot};

const NS: &str = "team-a";
const NODE: &str = "proxy-1";

/// RFC 5737's TEST-NET-3: never an address of a pod or of a test machine.
const NOT_LOCAL: &str = "203.0.113.1";

fn spec(address: &str, port: u16, body: &str) -> EnvoyConfigSpec {
    serde_json::from_value(serde_json::json!({
        "nodeID": NODE,
        "serialization": "yaml",
        "envoyResources": {"listeners": [{
            "value": support::plane::listener_yaml_on(address, port, body, false),
        }]},
    }))
    .unwrap()
}

#[test]
fn a_listener_on_an_address_the_proxy_lacks_passes_the_judge_and_is_nacked() {
    assert!(
        std::net::TcpListener::bind((NOT_LOCAL, 0)).is_err(),
        "this machine has {NOT_LOCAL}: the test needs an address it cannot bind"
    );
    let envoy = marin3r_testkit::tools::envoy().unwrap();
    let port = free_port();
    let good = spec("127.0.0.1", port, "good");
    let elsewhere = spec(NOT_LOCAL, port, "never served");
    let judge = EnvoyJudge::new(envoy).with_launcher(env!("CARGO_BIN_EXE_marin3r"));
    assert_eq!(judge.judge(&elsewhere), Ok(()));

    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let resources = |s: &EnvoyConfigSpec| {
        snapshot(
            marin3r_envoyconfig::convert::validate_config(s).unwrap_or_else(|e| panic!("{e:?}")),
        )
    };
    server.cache.set_snapshot(NS, NODE, resources(&good));
    let proxy = Proxy::start(
        &server,
        &pki.client(Some(NS)),
        NODE,
        "proxy-1-pod",
        AdsMode::StateOfTheWorld,
    );
    proxy.wait_for_body(port, "good");
    server.cache.set_snapshot(NS, NODE, resources(&elsewhere));
    let nack = server
        .next_nack(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no NACK event\n{}", proxy.envoy.log_tail()));
    eprintln!("NACK from Envoy: {}", nack.message);
    assert_eq!(nack.resource_type, ResourceType::Listener);
    let bind = format!("cannot bind '{NOT_LOCAL}:{port}'");
    assert!(nack.message.contains(&bind), "{:?}", nack.message);
    // Envoy keeps serving the listener it had.
    proxy.wait_for_body(port, "good");
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 1);
}
