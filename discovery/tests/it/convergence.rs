//! Convergence in `EnvoyConfig` status with real Envoy processes: `status.proxies` counts the
//! node's connected proxies that acknowledged the published version (the `SYNCED` column),
//! the `Synced` condition is what `kubectl wait` and GitOps tools wait on, and with several
//! discovery replicas each counts its own proxies while the leader sums them.

use crate::support;

use marin3r_api::envoy_config::CacheState;
use marin3r_webhook::bootstrap::AdsMode;
use support::free_port;
use support::plane::*;

fn synced(ec: &marin3r_api::EnvoyConfig) -> Option<&str> {
    Some(ec.status.as_ref()?.proxies.as_ref()?.synced.as_str())
}

fn synced_condition(ec: &marin3r_api::EnvoyConfig) -> Option<(String, String)> {
    condition(ec, "Synced").map(|c| (c.status.clone(), c.reason.clone()))
}

#[test]
fn the_synced_column_and_condition_follow_the_fleet() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    let node = "gateway";
    let k = plane.kubectl();
    let kubectl_wait = |condition: &str| {
        plane.rt.block_on(k.ok(&[
            "wait",
            "ec/gw",
            "-n",
            ns,
            &format!("--for=condition={condition}"),
            "--timeout=30s",
        ]))
    };

    // Published with nobody connected: nothing to wait for.
    plane.apply(ns, "gw", spec(node, port, "v1"));
    plane.wait_in_sync(ns, "gw");
    let ec = plane.wait_status(ns, "gw", "0/0 and Synced", |ec| {
        synced(ec) == Some("0/0")
            && synced_condition(ec) == Some(("True".into(), "NoProxiesConnected".into()))
    });
    let v1 = ec.spec.version();
    assert_eq!(ec.status.unwrap().proxies.unwrap().version, v1);

    // Two real Envoys of the node acknowledge it.
    let one = plane.proxy_on(plane.xds_port, ns, node, "gw-1", AdsMode::StateOfTheWorld);
    let two = plane.proxy_on(plane.xds_port, ns, node, "gw-2", AdsMode::Delta);
    one.wait_for_body(port, "v1");
    two.wait_for_body(port, "v1");
    plane.wait_status(ns, "gw", "2/2 and AllProxiesSynced", |ec| {
        synced(ec) == Some("2/2")
            && synced_condition(ec) == Some(("True".into(), "AllProxiesSynced".into()))
    });
    kubectl_wait("Synced").unwrap();
    let table = plane.rt.block_on(k.ok(&["get", "ec", "-n", ns])).unwrap();
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap()
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    let column = header.iter().position(|c| *c == "SYNCED").expect(&table);
    let row = table.lines().find(|l| l.starts_with("gw ")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[column], "2/2", "{table}");

    // An update: both follow, and the count is about the new version.
    plane.apply(ns, "gw", spec(node, port, "v2"));
    let v2 = plane.wait_in_sync(ns, "gw").spec.version();
    let ec = plane.wait_status(ns, "gw", "2/2 of v2", |ec| {
        synced(ec) == Some("2/2")
            && ec
                .status
                .as_ref()
                .unwrap()
                .proxies
                .as_ref()
                .unwrap()
                .version
                == v2
    });
    assert_eq!(synced_condition(&ec).unwrap().0, "True");

    // A version Envoy rejects: rolled back, so the desired version did not reach the fleet,
    // and the condition says so while the proxies are back in sync on the old one.
    plane.apply(ns, "gw", nacked_spec(node, port, "bad"));
    let ec = plane.wait_status(ns, "gw", "the rollback and Synced=False", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
            && synced_condition(ec) == Some(("False".into(), "DesiredVersionNotPublished".into()))
    });
    let message = &condition(&ec, "Synced").unwrap().message;
    assert!(message.contains(&v2), "{message}");
    kubectl_wait("Synced=false").unwrap();
    plane.wait_status(ns, "gw", "2/2 of the version rolled back to", |ec| {
        synced(ec) == Some("2/2")
    });

    // A proxy leaves: counted out.
    drop(two);
    plane.apply(ns, "gw", spec(node, port, "v3"));
    plane.wait_in_sync(ns, "gw");
    one.wait_for_body(port, "v3");
    plane.wait_status(ns, "gw", "1/1 after a proxy left", |ec| {
        synced(ec) == Some("1/1")
            && synced_condition(ec) == Some(("True".into(), "AllProxiesSynced".into()))
    });
    drop(one);
    plane.wait_status(ns, "gw", "0/0 once everyone left", |ec| {
        synced(ec) == Some("0/0")
    });
}

#[test]
fn proxies_on_every_replica_are_summed() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let replica = plane.replica("replica-b", |_| {});
    let port = free_port();
    let node = "web";
    plane.apply(ns, "web", spec(node, port, "v1"));
    plane.wait_in_sync(ns, "web");
    let on_plane = plane.proxy_on(plane.xds_port, ns, node, "web-1", AdsMode::StateOfTheWorld);
    let on_replica = plane.proxy_on(
        replica.xds_port,
        ns,
        node,
        "web-2",
        AdsMode::StateOfTheWorld,
    );
    on_plane.wait_for_body(port, "v1");
    on_replica.wait_for_body(port, "v1");
    let ec = plane.wait_status(ns, "web", "both replicas' proxies summed", |ec| {
        synced(ec) == Some("2/2")
    });
    let reports = &ec.status.as_ref().unwrap().sync_reports;
    let replicas: Vec<&str> = reports.iter().map(|r| r.replica.as_str()).collect();
    assert_eq!(
        replicas,
        [plane.replica.as_str(), "replica-b"],
        "{reports:?}"
    );
    assert!(
        reports.iter().all(|r| (r.connected, r.acked) == (1, 1)),
        "{reports:?}"
    );
    // The replica's proxy leaves: its entry goes, and the sum follows.
    drop(on_replica);
    let ec = plane.wait_status(ns, "web", "the replica's entry removed", |ec| {
        synced(ec) == Some("1/1")
    });
    let left: Vec<&str> = ec
        .status
        .as_ref()
        .unwrap()
        .sync_reports
        .iter()
        .map(|r| r.replica.as_str())
        .collect();
    assert_eq!(left, [plane.replica.as_str()]);
}

/// `marin3r_envoyconfig_proxies{namespace,name,state}` as the leader's registry encodes it for
/// `/metrics`: `None` when the series is absent.
fn proxies_gauge(plane: &Plane, name: &str, state: &str) -> Option<f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &plane.registry).unwrap();
    let ns = plane.ns(NS);
    let sample = format!(
        "marin3r_envoyconfig_proxies{{namespace=\"{ns}\",name=\"{name}\",state=\"{state}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&sample)?.trim().parse().ok())
}

fn counts(plane: &Plane, name: &str) -> [Option<f64>; 3] {
    ["synced", "nacked", "pending"].map(|state| proxies_gauge(plane, name, state))
}

/// Sends `signal` (`STOP`, `CONT`) to a real Envoy.
fn signal(proxy: &support::Proxy, signal: &str) {
    let pid = proxy.envoy.pid().to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The leader exports the sums it writes into `status.proxies` per EnvoyConfig: acknowledged,
/// rejected (a version with nothing to roll back to), not answered (a frozen Envoy, still
/// connected); a deleted config's series go with it.
#[test]
fn the_leader_exports_the_proxy_counts_by_state() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    let node = "gateway";
    plane.apply(ns, "gw", spec(node, port, "v1"));
    plane.wait_in_sync(ns, "gw");
    let one = plane.proxy_on(plane.xds_port, ns, node, "gw-1", AdsMode::StateOfTheWorld);
    let two = plane.proxy_on(plane.xds_port, ns, node, "gw-2", AdsMode::Delta);
    one.wait_for_body(port, "v1");
    two.wait_for_body(port, "v1");
    let timeout = std::time::Duration::from_secs(30);
    let want = |name: &str, synced: f64, nacked: f64, pending: f64| {
        let want = [Some(synced), Some(nacked), Some(pending)];
        wait(&format!("{name}: {want:?}"), timeout, || {
            (counts(&plane, name) == want).then_some(())
        });
    };
    want("gw", 2.0, 0.0, 0.0);

    // A connected Envoy that does not answer the next version: pending, until it does.
    signal(&two, "STOP");
    plane.apply(ns, "gw", spec(node, port, "v2"));
    plane.wait_in_sync(ns, "gw");
    want("gw", 1.0, 0.0, 1.0);
    signal(&two, "CONT");
    two.wait_for_body(port, "v2");
    want("gw", 2.0, 0.0, 0.0);

    // The only version of a config rejected: nothing to roll back to, so it stays published
    // and its proxy is counted as rejecting it.
    let edge_port = free_port();
    plane.apply(ns, "edge", nacked_spec("edge", edge_port, "bad"));
    plane.wait_status(ns, "edge", "the bad version published", |ec| {
        ec.status
            .as_ref()
            .and_then(|s| s.published_version.as_ref())
            .is_some()
    });
    let edge = plane.proxy_on(plane.xds_port, ns, "edge", "edge-1", AdsMode::Delta);
    want("edge", 0.0, 1.0, 0.0);
    assert_eq!(counts(&plane, "gw"), [Some(2.0), Some(0.0), Some(0.0)]);

    // Deleted: its series go, the other config's stay.
    plane
        .rt
        .block_on(plane.configs(ns).delete("edge", &Default::default()))
        .unwrap();
    wait("the deleted config's series to go", timeout, || {
        (counts(&plane, "edge") == [None, None, None]).then_some(())
    });
    assert_eq!(counts(&plane, "gw"), [Some(2.0), Some(0.0), Some(0.0)]);
    drop(edge);
}

/// Two discovery services in one cluster (an installed marin3r's beside this plane, say),
/// each serving its own namespaces: the other's leader, whose replicas are not this plane's,
/// never sums or taints the configs of namespaces it does not serve. Before, it rewrote their
/// proxy counts every period without this plane's reports, and the two leaders fought.
#[test]
fn another_discovery_service_leaves_the_configs_it_does_not_serve_alone() {
    use marin3r_discovery::controllers::nacks::ReplicaPods;
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    // Its replicas are the pods of its selector in its own namespace, as a discovery pod's.
    let other = Plane::start_with(&["other"], |c, s| {
        c.replica_pods = Some(ReplicaPods {
            namespace: s.ns("other").to_owned(),
            selector: "app=other-discovery".into(),
        });
    });
    let (port, node) = (free_port(), "gateway");
    plane.apply(ns, "gw", spec(node, port, "v1"));
    plane.wait_in_sync(ns, "gw");
    let proxy = plane.proxy_on(plane.xds_port, ns, node, "gw-1", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "v1");
    plane.wait_status(ns, "gw", "1/1", |ec| synced(ec) == Some("1/1"));
    // Several of the other leader's periods: the count stays this plane's.
    for _ in 0..30 {
        let ec = plane.get(ns, "gw");
        assert_eq!(synced(&ec), Some("1/1"), "{:#?}", ec.status);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // A version the proxy rejects is tainted by this plane's leader only.
    plane.apply(ns, "gw", nacked_spec(node, port, "bad"));
    plane.wait_status(ns, "gw", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    plane.wait_metric("marin3r_revision_taints_total", 1.0);
    assert_eq!(other.metric("marin3r_revision_taints_total"), 0.0);
}
