//! Several discovery replicas on one API server, each with its own xDS server and cache, real
//! Envoys connected to each: only the Lease holder publishes and taints; the NACKs seen on
//! every replica reach the taint decision through the revision's `status.nackReports`, and
//! the taint is written once; a follower takes over when the leader dies.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use marin3r_api::envoy_config::CacheState;
use marin3r_controller::leader::LeaseConfig;
use marin3r_discovery::controllers::nacks::ReplicaPods;
use marin3r_testkit::xds::client::{ClientTls, SotwStream, connect};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use serde_json::json;
use support::free_port;
use support::plane::*;

const NS: &str = "replicas";
const LEASE: &str = "marin3r-discovery-plane";
const SELECTOR: &str = "app=discovery-test";

/// A short lease for the replica that should lead at once; the plane's own controllers get
/// client-go's 15 s, so they stay followers while that replica renews.
fn short_lease(ns: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
        ..LeaseConfig::new(ns, LEASE, identity)
    }
}

fn replica_pods(ns: &str) -> Option<ReplicaPods> {
    Some(ReplicaPods {
        namespace: ns.into(),
        selector: SELECTOR.into(),
    })
}

/// The Pod objects of the replicas, held back from scheduling (a gate nobody lifts): they
/// never run, and only say which replicas exist.
fn setup(setup: &Setup<'_>, replicas: &[&str]) {
    setup.rt.block_on(async {
        let pods: Api<Pod> = Api::namespaced(setup.client.clone(), setup.ns(NS));
        for name in replicas {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": "discovery-test"}},
                "spec": {
                    "schedulingGates": [{"name": "marin3r.3scale.net/never"}],
                    "containers": [{"name": "discovery", "image": "marin3r"}],
                },
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
    });
}

/// A Lease held by `holder` a moment ago, so the plane's controllers, started first, wait
/// as followers.
fn hold_lease(setup: &Setup<'_>, holder: &str) {
    setup.rt.block_on(async {
        let leases: Api<Lease> = Api::namespaced(setup.client.clone(), setup.ns(NS));
        let now = k8s_openapi::jiff::Timestamp::now();
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 15,
                "acquireTime": now.to_string(),
                "renewTime": now.to_string(),
            },
        }))
        .unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
    });
}

fn holder(plane: &Plane) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(plane.client.clone(), plane.ns(NS));
    plane
        .rt
        .block_on(leases.get_opt(LEASE))
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

/// A hand-written SotW proxy of `node` on `xds_port` that ACKs every listener version.
fn accepting_proxy(
    plane: &Plane,
    xds_port: u16,
    node: &str,
) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let acks = Arc::new(AtomicUsize::new(0));
    let cert = plane.client_cert(plane.ns(NS));
    let tls = ClientTls {
        ca_pem: plane.pki.ca_pem().to_owned(),
        identity: Some((cert.cert_pem.clone(), cert.key_pem.clone())),
        server_name: "127.0.0.1".into(),
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], xds_port));
    let node = node.to_owned();
    let counted = acks.clone();
    let task = plane.rt.spawn(async move {
        let channel = connect(addr, &tls).await.unwrap();
        let mut stream = SotwStream::open(channel, &node, Some("accepting-pod"))
            .await
            .unwrap();
        stream
            .subscribe(ResourceType::Listener.type_url(), &[])
            .await
            .unwrap();
        while let Ok(resp) = stream.recv().await {
            stream.ack(&resp, &[]).await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (task, acks)
}

/// Two replicas, one real Envoy on each; both reject a version. Each replica reports its
/// own 1 of 1, the leader (replica-b) sums 2 of 2 and taints once, and both Envoys get the
/// rollback. Then the leader dies; the other replica takes the Lease and publishes the next
/// spec, which the Envoy connected to it receives.
#[test]
fn nacks_seen_on_two_replicas_taint_once_and_the_survivor_takes_over() {
    let plane = Plane::start_with(&[NS], |c, s| {
        c.replica = "replica-a".into();
        c.leader_lease = Some(LeaseConfig::new(s.ns(NS), LEASE, "replica-a"));
        c.replica_pods = replica_pods(s.ns(NS));
        setup(s, &["replica-a", "replica-b"]);
        hold_lease(s, "replica-b");
    });
    let ns = plane.ns(NS);
    let mut b = plane.replica("replica-b", |c| {
        c.leader_lease = Some(short_lease(ns, "replica-b"));
        c.replica_pods = replica_pods(ns);
    });
    wait("replica-b to lead", Duration::from_secs(10), || {
        (holder(&plane).as_deref() == Some("replica-b")).then_some(())
    });

    let port = free_port();
    let node = "fleet";
    plane.apply(ns, "fleet", spec(node, port, "good"));
    plane.wait_in_sync(ns, "fleet");
    let on_a = plane.proxy_on(
        plane.xds_port,
        ns,
        node,
        "envoy-a",
        AdsMode::StateOfTheWorld,
    );
    let on_b = plane.proxy_on(b.xds_port, ns, node, "envoy-b", AdsMode::StateOfTheWorld);
    for envoy in [&on_a, &on_b] {
        wait(
            "each Envoy to take the listener",
            Duration::from_secs(20),
            || (envoy.stat("listener_manager.lds.update_success") >= 1).then_some(()),
        );
    }
    on_a.wait_for_body(port, "good");
    // Only the leader exports the sums it writes: the follower has no series.
    let synced = format!(
        "marin3r_envoyconfig_proxies{{namespace=\"{ns}\",name=\"fleet\",state=\"synced\"}}"
    );
    wait(
        "the leader to export 2 synced",
        Duration::from_secs(20),
        || (b.metric(&synced) == 2.0).then_some(()),
    );
    let mut follower = String::new();
    prometheus_client::encoding::text::encode(&mut follower, &plane.registry).unwrap();
    assert!(
        !follower.contains("marin3r_envoyconfig_proxies{"),
        "{follower}"
    );

    // Both reject the next version.
    plane.apply(ns, "fleet", nacked_spec(node, port, "bad"));
    let bad = plane.get(ns, "fleet").spec.version();
    let ec = plane.wait_status(ns, "fleet", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    let message = ec.status.unwrap().last_nack_message.unwrap();
    assert!(
        message.contains("2 of 2 connected proxies of the node, over 2 discovery replica(s)"),
        "{message}"
    );
    let rejected = plane
        .list_revisions(ns)
        .into_iter()
        .find(|r| r.spec.version == bad)
        .unwrap();
    assert!(rejected.is_tainted());
    let reports = rejected.status.unwrap().nack_reports;
    let mut by: Vec<(String, u32, u32)> = reports
        .iter()
        .map(|r| (r.replica.clone(), r.rejecting_proxies, r.connected_proxies))
        .collect();
    by.sort();
    assert_eq!(
        by,
        [("replica-a".into(), 1, 1), ("replica-b".into(), 1, 1)],
        "one report per replica, each counting its own Envoy"
    );
    // Written once, by the leader only.
    b.wait_metric("marin3r_revision_taints_total", 1.0);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(b.metric("marin3r_revision_taints_total"), 1.0);
    assert_eq!(plane.metric("marin3r_revision_taints_total"), 0.0);
    for envoy in [&on_a, &on_b] {
        wait("each Envoy to reject once", Duration::from_secs(10), || {
            (envoy.stat("listener_manager.lds.update_rejected") >= 1).then_some(())
        });
    }
    on_a.wait_for_body(port, "good");

    // The leader dies without releasing the Lease: replica-a waits out the lease (15 s on
    // its clock), takes it, and runs the EnvoyConfig controller.
    b.kill();
    drop(on_b);
    wait("replica-a to lead", Duration::from_secs(40), || {
        (holder(&plane).as_deref() == Some("replica-a")).then_some(())
    });
    plane.apply(ns, "fleet", spec(node, port, "after failover"));
    plane.wait_in_sync(ns, "fleet");
    on_a.wait_for_body(port, "after failover");
    assert_eq!(plane.metric("marin3r_revision_taints_total"), 0.0);
}

/// One replica's Envoy rejects a version, the proxy on the other replica accepts it: the
/// leader waits for the other replica's count (0 of 1), sums 1 of 2, below the default
/// threshold, and nothing is tainted. Once the accepting replica's pod is gone, its count
/// no longer holds the taint back when the next report comes.
#[test]
fn a_rejection_on_one_replica_is_weighed_against_the_proxies_of_every_replica() {
    let plane = Plane::start_with(&[NS], |c, s| {
        c.replica = "replica-a".into();
        c.leader_lease = Some(short_lease(s.ns(NS), "replica-a"));
        c.replica_pods = replica_pods(s.ns(NS));
        setup(s, &["replica-a", "replica-b"]);
    });
    let ns = plane.ns(NS);
    wait("replica-a to lead", Duration::from_secs(10), || {
        (holder(&plane).as_deref() == Some("replica-a")).then_some(())
    });
    let b = plane.replica("replica-b", |c| {
        c.leader_lease = Some(short_lease(ns, "replica-b"));
        c.replica_pods = replica_pods(ns);
    });

    let port = free_port();
    let node = "fleet";
    plane.apply(ns, "fleet", spec(node, port, "good"));
    plane.wait_in_sync(ns, "fleet");
    let envoy = plane.proxy_on(
        plane.xds_port,
        ns,
        node,
        "envoy-a",
        AdsMode::StateOfTheWorld,
    );
    envoy.wait_for_body(port, "good");
    let (accepting, acks) = accepting_proxy(&plane, b.xds_port, node);
    wait(
        "the proxy on replica-b to ACK",
        Duration::from_secs(10),
        || (acks.load(Ordering::SeqCst) >= 1).then_some(()),
    );

    plane.apply(ns, "fleet", nacked_spec(node, port, "bad"));
    let bad = plane.get(ns, "fleet").spec.version();
    wait(
        "the NACKs below the threshold",
        Duration::from_secs(20),
        || (plane.metric("marin3r_nacks_below_threshold_total") >= 1.0).then_some(()),
    );
    let rejected = plane
        .list_revisions(ns)
        .into_iter()
        .find(|r| r.spec.version == bad)
        .unwrap();
    assert!(!rejected.is_tainted());
    let mut by: Vec<(String, u32, u32)> = rejected
        .status
        .unwrap()
        .nack_reports
        .iter()
        .map(|r| (r.replica.clone(), r.rejecting_proxies, r.connected_proxies))
        .collect();
    by.sort();
    assert_eq!(
        by,
        [("replica-a".into(), 1, 1), ("replica-b".into(), 0, 1)],
        "replica-b answered with its own count"
    );
    let ec = plane.get(ns, "fleet");
    assert_eq!(
        ec.status.as_ref().unwrap().published_version.as_deref(),
        Some(bad.as_str())
    );
    assert_eq!(plane.metric("marin3r_revision_taints_total"), 0.0);
    assert_eq!(b.metric("marin3r_revision_taints_total"), 0.0);

    // replica-b's pod goes away (and the proxy with it); a second Envoy on replica-a rejects
    // the version too: 2 of 2 live, tainted and rolled back.
    accepting.abort();
    drop(b);
    let pods: Api<Pod> = Api::namespaced(plane.client.clone(), ns);
    plane
        .rt
        .block_on(pods.delete("replica-b", &DeleteParams::default()))
        .unwrap();
    let second = plane.proxy_on(
        plane.xds_port,
        ns,
        node,
        "envoy-a2",
        AdsMode::StateOfTheWorld,
    );
    let ec = plane.wait_status(ns, "fleet", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    let message = ec.status.unwrap().last_nack_message.unwrap();
    assert!(
        message.contains("2 of 2 connected proxies of the node, over 1 discovery replica(s)"),
        "{message}"
    );
    plane.wait_metric("marin3r_revision_taints_total", 1.0);
    envoy.wait_for_body(port, "good");
    drop(second);
}
