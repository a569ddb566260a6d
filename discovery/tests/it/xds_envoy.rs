//! The xDS server against a real Envoy started from the product's bootstrap, over mutual TLS,
//! in both ADS flavours: configuration arrives and changes, a bad listener is NACKed (the
//! event carries Envoy's message, Envoy keeps the last good config, the rejected version is
//! not sent again), a rotated client certificate is picked up without a restart, and two
//! namespaces with the same node id never see each other's configuration.

use crate::support;

use std::time::Duration;

use marin3r_testkit::xds::resources::{
    ListenerFlaw, direct_response_config, eds_cluster_with_timeout,
};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use support::{Pki, Proxy, XdsServer, envoy_serial, free_port, snapshot, wait_for};

const NS: &str = "team-a";
const NODE: &str = "proxy-1";
const POD: &str = "proxy-1-7d9f8-abcde";

fn updates_and_nacks(mode: AdsMode, flaw: ListenerFlaw, envoy_says: &str) {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let port = free_port();
    let config = |body: &str, flaw| snapshot(direct_response_config(port.into(), body, flaw));
    server
        .cache
        .set_snapshot(NS, NODE, config("hello v1", ListenerFlaw::None));
    let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, mode);
    proxy.wait_for_body(port, "hello v1");

    // A new snapshot changes what Envoy serves; a changed cluster is re-created and gets
    // its endpoints without waiting for Envoy's initial-fetch timeout.
    let mut v2 = direct_response_config(port.into(), "hello v2", ListenerFlaw::None);
    for r in &mut v2 {
        if r.kind == ResourceType::Cluster {
            *r = eds_cluster_with_timeout(&r.name, 3);
        }
    }
    let good = snapshot(v2);
    let good_listeners = good.version(ResourceType::Listener).to_owned();
    server.cache.set_snapshot(NS, NODE, good);
    proxy.wait_for_body(port, "hello v2");
    wait_for(
        "the changed cluster to warm",
        Duration::from_secs(5),
        || {
            (proxy.stat("cluster_manager.cds.update_success") >= 2
                && proxy.stat("cluster_manager.warming_clusters") == 0)
                .then_some(())
        },
    );

    // A bad listener is NACKed with Envoy's own message.
    let bad = config("hello v2", flaw);
    let bad_listeners = bad.version(ResourceType::Listener).to_owned();
    server.cache.set_snapshot(NS, NODE, bad);
    let nack = server
        .next_nack(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no NACK event\n{}", proxy.envoy.log_tail()));
    eprintln!("NACK from Envoy: {}", nack.message);
    assert_eq!(nack.namespace, NS);
    assert_eq!(nack.node_id, NODE);
    assert_eq!(nack.pod_name.as_deref(), Some(POD));
    assert_eq!(nack.resource_type, ResourceType::Listener);
    assert_eq!(nack.type_url, ResourceType::Listener.type_url());
    assert_eq!(nack.version, bad_listeners);
    assert!(
        nack.message.contains(envoy_says),
        "NACK message {:?} does not contain {envoy_says:?}",
        nack.message
    );
    // Envoy keeps serving the last good configuration.
    proxy.wait_for_body(port, "hello v2");
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 1);

    // A later snapshot that still carries the rejected listeners but new routes: the routes
    // arrive, the rejected listeners are not sent again.
    let listener_responses = r#"marin3r_xds_responses_total{resource_type="listeners"}"#;
    let sent_before = server.metric(listener_responses);
    let still_bad = config("hello v3", flaw);
    assert_eq!(still_bad.version(ResourceType::Listener), bad_listeners);
    server.cache.set_snapshot(NS, NODE, still_bad);
    proxy.wait_for_body(port, "hello v3");
    assert_eq!(server.metric(listener_responses), sent_before);
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 1);
    assert!(server.next_nack(Duration::from_millis(200)).is_none());

    // Sync status and metrics tell the same story.
    let status = server.sync_status();
    assert_eq!(status.proxies.len(), 1, "{status:?}");
    let p = &status.proxies[0];
    assert_eq!((p.namespace.as_str(), p.node_id.as_str()), (NS, NODE));
    assert_eq!(p.pod.as_deref(), Some(POD));
    let listeners = &p.types["listeners"];
    assert_eq!(
        listeners.acked_version.as_deref(),
        Some(good_listeners.as_str())
    );
    let last_nack = listeners.last_nack.as_ref().unwrap();
    assert_eq!(last_nack.version, bad_listeners);
    assert!(last_nack.message.contains(envoy_says));
    assert!(p.types["routes"].acked_version.is_some());
    assert_eq!(
        server.metric(r#"marin3r_xds_nacks_total{resource_type="listeners"}"#),
        1.0
    );
    let protocol = match mode {
        AdsMode::StateOfTheWorld => "sotw",
        AdsMode::Delta => "delta",
    };
    assert_eq!(
        server.metric(&format!(
            r#"marin3r_xds_connected_proxies{{protocol="{protocol}"}}"#
        )),
        1.0
    );
    assert!(
        server.metric(r#"marin3r_xds_convergence_latency_seconds_count{resource_type="routes"}"#)
            >= 2.0
    );

    // `marin3r proxy-status` prints the same, as a user sees it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args([
            "proxy-status",
            "--url",
            &format!("http://{}", server.http_addr),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with(NS))
        .unwrap_or_else(|| panic!("no row for {NS}:\n{stdout}"));
    assert!(row.contains(NODE) && row.contains(POD), "{row}");
    assert!(
        row.contains(&format!("NACKED {}", &bad_listeners[..8])),
        "{stdout}"
    );
    assert!(row.contains("SYNCED"), "{stdout}");
    assert!(
        stdout.contains("Last NACKs:") && stdout.contains(envoy_says),
        "{stdout}"
    );

    // Fixing the listener is accepted.
    server
        .cache
        .set_snapshot(NS, NODE, config("hello v4", ListenerFlaw::None));
    proxy.wait_for_body(port, "hello v4");

    // A listener gone from the snapshot is removed from Envoy (delta: `removed_resources`).
    let without_listener: Vec<_> =
        direct_response_config(port.into(), "hello v4", ListenerFlaw::None)
            .into_iter()
            .filter(|r| r.kind != ResourceType::Listener)
            .collect();
    server
        .cache
        .set_snapshot(NS, NODE, snapshot(without_listener));
    wait_for(
        "the listener to be removed",
        Duration::from_secs(10),
        || {
            (proxy.stat("listener_manager.total_listeners_active") == 0
                && proxy.stat("listener_manager.listener_removed") == 1)
                .then_some(())
        },
    );
}

#[test]
fn sotw_envoy_follows_snapshots_and_a_rejected_listener_is_not_resent() {
    updates_and_nacks(
        AdsMode::StateOfTheWorld,
        ListenerFlaw::PortOutOfRange,
        "65535",
    );
}

#[test]
fn delta_envoy_follows_snapshots_and_a_rejected_listener_is_not_resent() {
    updates_and_nacks(
        AdsMode::Delta,
        ListenerFlaw::RouterNotLast,
        "must be the last filter",
    );
}

#[test]
fn rotated_client_certificate_is_presented_without_a_restart() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let port = free_port();
    server.cache.set_snapshot(
        NS,
        NODE,
        snapshot(direct_response_config(
            port.into(),
            "ok",
            ListenerFlaw::None,
        )),
    );
    let first = pki.client(Some(NS));
    let mut proxy = Proxy::start(&server, &first, NODE, POD, AdsMode::Delta);
    proxy.wait_for_body(port, "ok");
    let pid = proxy.envoy.pid();
    let certs = proxy.envoy.admin_get("/certs").unwrap();
    assert!(certs.contains(&envoy_serial(&first)), "{certs}");

    let second = pki.client(Some(NS));
    proxy.certs.swap(&second);
    wait_for(
        "Envoy to load the rotated client certificate",
        Duration::from_secs(20),
        || {
            let certs = proxy.envoy.admin_get("/certs").ok()?;
            (certs.contains(&envoy_serial(&second)) && !certs.contains(&envoy_serial(&first)))
                .then_some(())
        },
    );
    assert_eq!(proxy.envoy.pid(), pid);
    // Same process, still serving, still connected.
    proxy.wait_for_body(port, "ok");
    assert!(
        proxy
            .envoy
            .admin_get("/server_info")
            .unwrap()
            .contains("\"LIVE\"")
    );
}

/// A connection lived until the proxy went away, so a renewed CA or a
/// disabled namespace was never checked again. Past its age it is closed; Envoy reconnects,
/// keeps serving meanwhile and follows the next change over the new connection.
#[test]
fn an_old_connection_is_closed_and_envoy_reconnects_without_losing_its_config() {
    let pki = Pki::new();
    let limits = marin3r_xds::Limits {
        max_connection_age: Duration::from_secs(1),
        ..Default::default()
    };
    let server = XdsServer::start_limited(&pki, "127.0.0.1:0".parse().unwrap(), None, limits);
    let port = free_port();
    let config = |body: &str| {
        snapshot(direct_response_config(
            port.into(),
            body,
            ListenerFlaw::None,
        ))
    };
    server.cache.set_snapshot(NS, NODE, config("first"));
    let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, AdsMode::Delta);
    proxy.wait_for_body(port, "first");
    let connections = "cluster.xds_cluster.upstream_cx_total";
    assert_eq!(proxy.stat(connections), 1);

    // Age 1 s, then 5 s of grace: Envoy is on a second connection within ~10 s, and the
    // listener answered all along.
    wait_for(
        "Envoy on a new xDS connection",
        Duration::from_secs(20),
        || {
            assert_eq!(
                marin3r_testkit::envoy::get_body(&format!("http://127.0.0.1:{port}/")).unwrap(),
                "first"
            );
            (proxy.stat(connections) >= 2).then_some(())
        },
    );
    server.cache.set_snapshot(NS, NODE, config("second"));
    proxy.wait_for_body(port, "second");
}

#[test]
fn namespaces_with_the_same_node_id_never_see_each_others_config() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let (port_a, port_b) = (free_port(), free_port());
    // B's snapshot is there first: a leak would reach A before its own.
    server.cache.set_snapshot(
        "team-b",
        "shared",
        snapshot(direct_response_config(
            port_b.into(),
            "from team-b",
            ListenerFlaw::None,
        )),
    );
    server.cache.set_snapshot(
        "team-a",
        "shared",
        snapshot(direct_response_config(
            port_a.into(),
            "from team-a",
            ListenerFlaw::None,
        )),
    );
    let a = Proxy::start(
        &server,
        &pki.client(Some("team-a")),
        "shared",
        "a",
        AdsMode::StateOfTheWorld,
    );
    let b = Proxy::start(
        &server,
        &pki.client(Some("team-b")),
        "shared",
        "b",
        AdsMode::Delta,
    );
    a.wait_for_body(port_a, "from team-a");
    b.wait_for_body(port_b, "from team-b");
    // A change for B reaches B only.
    server.cache.set_snapshot(
        "team-b",
        "shared",
        snapshot(direct_response_config(
            port_b.into(),
            "team-b v2",
            ListenerFlaw::None,
        )),
    );
    b.wait_for_body(port_b, "team-b v2");
    let dump_a = a.envoy.admin_get("/config_dump").unwrap();
    assert!(dump_a.contains("from team-a"));
    assert!(
        !dump_a.contains("team-b"),
        "team-a's Envoy holds team-b's config"
    );
    let dump_b = b.envoy.admin_get("/config_dump").unwrap();
    assert!(
        !dump_b.contains("team-a"),
        "team-b's Envoy holds team-a's config"
    );
    let status = server.sync_status();
    let mut who: Vec<(String, String)> = status
        .proxies
        .iter()
        .map(|p| (p.namespace.clone(), p.node_id.clone()))
        .collect();
    who.sort();
    assert_eq!(
        who,
        [
            ("team-a".to_string(), "shared".to_string()),
            ("team-b".to_string(), "shared".to_string())
        ]
    );
}

/// Versions are content hashes: an Envoy that reconnects to a restarted server presents what
/// it holds (delta: `initial_resource_versions`) and takes an older configuration.
fn reconnects_to_a_restarted_server(mode: AdsMode) {
    let pki = Pki::new();
    let mut server = XdsServer::start(&pki);
    let port = free_port();
    let config = |body: &str| {
        snapshot(direct_response_config(
            port.into(),
            body,
            ListenerFlaw::None,
        ))
    };
    server.cache.set_snapshot(NS, NODE, config("hello v1"));
    let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, mode);
    proxy.wait_for_body(port, "hello v1");
    server.cache.set_snapshot(NS, NODE, config("hello v2"));
    proxy.wait_for_body(port, "hello v2");

    let addr = server.addr;
    server.shutdown();
    drop(server);
    let server = XdsServer::start_at(&pki, addr);
    // The restarted server has the older configuration (say, a rollback happened).
    let old = config("hello v1");
    let routes = old.version(ResourceType::Route).to_owned();
    server.cache.set_snapshot(NS, NODE, old);
    proxy.wait_for_body(port, "hello v1");
    wait_for(
        "the reconnected proxy to ACK",
        Duration::from_secs(10),
        || {
            let status = server.sync_status();
            let p = status.proxies.first()?;
            (p.types.get("routes")?.acked_version.as_deref() == Some(routes.as_str())).then_some(())
        },
    );
    assert_eq!(proxy.stat("listener_manager.lds.update_rejected"), 0);
}

#[test]
fn sotw_envoy_reconnects_to_a_restarted_server_and_takes_an_older_version() {
    reconnects_to_a_restarted_server(AdsMode::StateOfTheWorld);
}

#[test]
fn delta_envoy_reconnects_to_a_restarted_server_and_takes_an_older_version() {
    reconnects_to_a_restarted_server(AdsMode::Delta);
}

/// Envoy moving to another server (a replica with its own cache, the same content built
/// separately) keeps everything it has: nothing is added, modified or removed, and with SotW
/// no listener or cluster response comes at all; a later change still reaches it.
fn moves_to_a_replica_with_the_same_content_without_a_resend(mode: AdsMode) {
    let pki = Pki::new();
    let mut first = XdsServer::start(&pki);
    let port = free_port();
    let config = |body: &str| {
        snapshot(direct_response_config(
            port.into(),
            body,
            ListenerFlaw::None,
        ))
    };
    first.cache.set_snapshot(NS, NODE, config("hello"));
    let proxy = Proxy::start(&first, &pki.client(Some(NS)), NODE, POD, mode);
    proxy.wait_for_body(port, "hello");
    let listeners = config("hello").version(ResourceType::Listener).to_owned();
    let acked = |server: &XdsServer| {
        let status = server.sync_status();
        let p = status.proxies.first()?;
        (p.types.get("listeners")?.acked_version.as_deref() == Some(listeners.as_str()))
            .then_some(())
    };
    wait_for(
        "the ACK on the first server",
        Duration::from_secs(10),
        || acked(&first),
    );
    let counters = [
        "listener_manager.listener_added",
        "listener_manager.listener_modified",
        "listener_manager.listener_removed",
        "cluster_manager.cluster_added",
        "cluster_manager.cluster_modified",
        "cluster_manager.cluster_removed",
        "listener_manager.lds.update_success",
        "cluster_manager.cds.update_success",
    ];
    let before: Vec<u64> = counters.iter().map(|c| proxy.stat(c)).collect();

    let addr = first.addr;
    first.shutdown();
    drop(first);
    let second = XdsServer::start_at(&pki, addr);
    second.cache.set_snapshot(NS, NODE, config("hello"));
    wait_for(
        "the proxy back, on the second server, at the version it had",
        Duration::from_secs(20),
        || acked(&second),
    );
    std::thread::sleep(Duration::from_secs(2));
    let after: Vec<u64> = counters.iter().map(|c| proxy.stat(c)).collect();
    // Delta answers the first request of each type with an empty response, which Envoy
    // counts as a successful update; nothing in it changes anything. (The broken stream
    // counts as an update attempt, so attempts are not compared.)
    let compared = if mode == AdsMode::StateOfTheWorld {
        counters.len()
    } else {
        counters.len() - 2
    };
    for i in 0..compared {
        assert_eq!(after[i], before[i], "{} changed", counters[i]);
    }
    proxy.wait_for_body(port, "hello");
    second.cache.set_snapshot(NS, NODE, config("hello again"));
    proxy.wait_for_body(port, "hello again");
}

#[test]
fn sotw_envoy_moves_to_a_replica_with_the_same_content_without_a_resend() {
    moves_to_a_replica_with_the_same_content_without_a_resend(AdsMode::StateOfTheWorld);
}

#[test]
fn delta_envoy_moves_to_a_replica_with_the_same_content_without_a_resend() {
    moves_to_a_replica_with_the_same_content_without_a_resend(AdsMode::Delta);
}

#[test]
fn envoy_with_a_foreign_or_namespace_less_certificate_gets_nothing() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let port = free_port();
    server.cache.set_snapshot(
        NS,
        NODE,
        snapshot(direct_response_config(
            port.into(),
            "secret",
            ListenerFlaw::None,
        )),
    );
    let day = Duration::from_secs(86_400);
    let other =
        marin3r_certs::issue_self_signed(&marin3r_certs::CertificateRequest::ca("other-ca", day))
            .unwrap();
    let other = marin3r_certs::CertificateAuthority::from_issued(&other).unwrap();
    let mut foreign = other
        .issue(
            &marin3r_certs::CertificateRequest::new("envoy", marin3r_certs::Usage::Client, day)
                .with_hosts([marin3r_certs::spiffe_id("cluster.local", NS)]),
        )
        .unwrap();
    // The proxy trusts the right server CA; only its own certificate is wrong.
    foreign.ca_pem = pki.ca_pem().to_owned();
    for (client, reason) in [
        (foreign, "untrusted_client_certificate"),
        (pki.client(None), "no_namespace_identity"),
    ] {
        let proxy = Proxy::start_with(&server, &client, NODE, POD, AdsMode::Delta, Some("1s"));
        let sample = format!(r#"marin3r_xds_refused_connections_total{{reason="{reason}"}}"#);
        wait_for(
            &format!("a refusal for {reason}"),
            Duration::from_secs(10),
            || (server.metric(&sample) >= 1.0).then_some(()),
        );
        assert_eq!(proxy.stat("cluster_manager.cds.update_success"), 0);
        assert_eq!(proxy.stat("listener_manager.total_listeners_active"), 0);
        assert!(server.sync_status().proxies.is_empty());
    }
}

/// A user's EnvoyConfig, as the controllers will handle it: converted by
/// `convert::validate_config` (plus the referenced TLS Secret), put into the cache, served to a
/// real Envoy: the listener answers, the certificate arrives by SDS over ADS, the runtime
/// layer is loaded.
#[test]
fn a_converted_envoyconfig_reaches_envoy_over_ads_including_sds_and_rtds() {
    let port = free_port();
    let tls_port = free_port();
    let spec = format!(
        r#"
nodeID: {NODE}
serialization: yaml
envoyResources:
  secrets:
    - name: server-cert
      ref: {{ name: server-cert-secret }}
  listeners:
    - value: |
        name: http
        address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    virtual_hosts:
                      - name: all
                        domains: ["*"]
                        routes:
                          - match: {{ prefix: "/" }}
                            direct_response: {{ status: 200, body: {{ inline_string: "from an EnvoyConfig" }} }}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - value: |
        name: https
        address: {{ socket_address: {{ address: 127.0.0.1, port_value: {tls_port} }} }}
        filter_chains:
          - transport_socket:
              name: envoy.transport_sockets.tls
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
                common_tls_context:
                  tls_certificate_sds_secret_configs:
                    - name: server-cert
                      sds_config: {{ ads: {{}}, resource_api_version: V3 }}
            filters:
              - name: envoy.filters.network.tcp_proxy
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
                  stat_prefix: https
                  cluster: backend
  clusters:
    - value: |
        name: backend
        connect_timeout: 1s
        type: STATIC
        load_assignment:
          cluster_name: backend
          endpoints:
            - lb_endpoints:
                - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}
  runtimes:
    - value: |
        name: runtime
        layer:
          marin3r.test_key: converted
"#
    );
    let spec: marin3r_api::EnvoyConfigSpec = serde_saphyr::from_str(&spec).unwrap();
    let mut resources = marin3r_envoyconfig::convert::validate_config(&spec)
        .unwrap_or_else(|errors| panic!("{errors:?}"));
    let pki = Pki::new();
    let served = pki
        .ca
        .issue(
            &marin3r_certs::CertificateRequest::new(
                "served-by-sds",
                marin3r_certs::Usage::Server,
                Duration::from_secs(3600),
            )
            .with_hosts(["localhost"]),
        )
        .unwrap();
    resources.push(
        marin3r_envoyconfig::convert::tls_secret(
            "server-cert",
            served.cert_pem.as_bytes(),
            served.key_pem.as_bytes(),
        )
        .unwrap(),
    );

    let server = XdsServer::start(&pki);
    server.cache.set_snapshot(NS, NODE, snapshot(resources));
    let proxy = Proxy::start(
        &server,
        &pki.client(Some(NS)),
        NODE,
        POD,
        AdsMode::StateOfTheWorld,
    );
    proxy.wait_for_body(port, "from an EnvoyConfig");
    wait_for(
        "the TLS listener with its SDS secret",
        Duration::from_secs(10),
        || (proxy.stat("listener_manager.total_listeners_active") == 2).then_some(()),
    );
    let certs = proxy.envoy.admin_get("/certs").unwrap();
    assert!(certs.contains(&envoy_serial(&served)), "{certs}");
    let runtime = proxy.envoy.admin_get("/runtime").unwrap();
    assert!(
        runtime.contains("marin3r.test_key") && runtime.contains("converted"),
        "{runtime}"
    );
    let status = server.sync_status();
    let types = &status.proxies[0].types;
    for kind in ["listeners", "clusters", "secrets", "runtimes"] {
        let t = &types[kind];
        assert!(
            t.acked_version.is_some() && t.acked_version == t.sent_version,
            "{kind}: {t:?}"
        );
    }
}

/// The bootstrap subscribes to the runtime layer `runtime`; a configuration without one must
/// not leave Envoy waiting for it (its initial-fetch timeout) before it starts.
#[test]
fn a_configuration_without_a_runtime_layer_does_not_hold_up_envoy() {
    for mode in [AdsMode::StateOfTheWorld, AdsMode::Delta] {
        let pki = Pki::new();
        let server = XdsServer::start(&pki);
        let port = free_port();
        let resources: Vec<_> =
            direct_response_config(port.into(), "no runtime", ListenerFlaw::None)
                .into_iter()
                .filter(|r| r.kind != ResourceType::Runtime)
                .collect();
        server.cache.set_snapshot(NS, NODE, snapshot(resources));
        let proxy = Proxy::start(&server, &pki.client(Some(NS)), NODE, POD, mode);
        proxy.wait_for_body(port, "no runtime");
        // Envoy got the (empty) layer: it did not start because its wait timed out.
        assert_eq!(proxy.stat("runtime.init_fetch_timeout"), 0, "{mode:?}");
        assert!(proxy.stat("runtime.update_success") >= 1, "{mode:?}");
        assert_eq!(proxy.stat("runtime.update_rejected"), 0, "{mode:?}");
    }
}
