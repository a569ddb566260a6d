//! The `EnvoyConfig` and `EnvoyConfigRevision` controllers against the real cluster's API
//! server, feeding an in-process xDS server that real Envoy processes (product bootstrap,
//! client certificates of their namespace) connect to: publishing, updates, re-applied
//! specs, NACK-driven rollback, invalid specs, namespaces sharing a node id, the revision
//! limit and deletion, original manifests through kubectl, and API faults. Secrets are in
//! `envoy_config_secrets.rs`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kube::api::DeleteParams;
use marin3r_api::envoy_config::CacheState;
use marin3r_api::envoy_config_revision::REVISION_TAINTED;
use marin3r_api_faults::FaultScope;
use marin3r_testkit::xds::client::{ClientTls, SotwStream, connect_from};
use marin3r_webhook::bootstrap::AdsMode;
use marin3r_xds::resource::ResourceType;
use support::free_port;
use support::plane::*;

#[test]
fn publishes_updates_republishes_and_rolls_back_on_nack() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    let node = "gateway";

    // Apply: one revision, published, InSync; Envoy serves it.
    plane.apply(ns, "gw", spec(node, port, "v1"));
    let ec = plane.wait_in_sync(ns, "gw");
    let v1 = ec.spec.version();
    assert_eq!(revision_versions(&ec), std::slice::from_ref(&v1));
    let revisions = plane.list_revisions(ns);
    assert_eq!(revisions.len(), 1);
    let r1 = &revisions[0];
    assert_eq!(
        r1.metadata.name.as_deref(),
        Some(format!("{node}-{v1}").as_str())
    );
    let labels = r1.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["marin3r.3scale.net/node-id"], node);
    assert_eq!(labels["marin3r.3scale.net/config-version"], v1);
    assert!(r1.is_published());
    assert!(r1.status.as_ref().unwrap().last_published_at.is_some());
    let proxy = plane.proxy(ns, node, AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "v1");

    // Update: a second revision, published; Envoy follows.
    plane.apply(ns, "gw", spec(node, port, "v2"));
    let ec = plane.wait_in_sync(ns, "gw");
    let v2 = ec.spec.version();
    assert_eq!(revision_versions(&ec), [v1.clone(), v2.clone()]);
    proxy.wait_for_body(port, "v2");

    // Re-applying the first spec republishes its revision; no third one.
    plane.apply(ns, "gw", spec(node, port, "v1"));
    let ec = plane.wait_in_sync(ns, "gw");
    assert_eq!(revision_versions(&ec), [v2.clone(), v1.clone()]);
    assert_eq!(plane.list_revisions(ns).len(), 2);
    proxy.wait_for_body(port, "v1");

    // An invalid spec never reaches Envoy and says why; what was published stays.
    let mut invalid = spec(node, port, "never");
    invalid["envoyResources"]["listeners"][0]["value"] =
        format!("{}no_such_field: 1\n", listener_yaml(port, "never", false)).into();
    plane.apply(ns, "gw", invalid);
    let ec = plane.wait_status(ns, "gw", "the InvalidSpec condition", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.listeners[0].value")
            && message.contains("no_such_field"),
        "{message}"
    );
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(status.desired_version, Some(ec.spec.version()));
    assert_eq!(plane.list_revisions(ns).len(), 2);
    proxy.wait_for_body(port, "v1");

    // A config Envoy rejects: tainted with Envoy's message, rolled back, Envoy keeps v1.
    plane.apply(ns, "gw", nacked_spec(node, port, "bad"));
    let ec = plane.wait_status(ns, "gw", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    let bad = ec.spec.version();
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(v1.as_str()));
    assert_eq!(
        revision_versions(&ec),
        [v2.clone(), v1.clone(), bad.clone()]
    );
    let nack = status.last_nack_message.as_deref().unwrap();
    assert!(nack.contains("router"), "{nack}");
    let out_of_sync = condition(&ec, "CacheOutOfSync").unwrap();
    assert_eq!(
        (out_of_sync.status.as_str(), out_of_sync.reason.as_str()),
        ("True", "Rollback")
    );
    let tainted = plane
        .list_revisions(ns)
        .into_iter()
        .find(|r| r.spec.version == bad)
        .unwrap();
    assert!(tainted.is_tainted() && !tainted.is_published());
    let c = tainted
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == REVISION_TAINTED)
        .unwrap();
    assert!(c.message.contains("router"), "{}", c.message);
    proxy.wait_for_body(port, "v1");
    // HEAD's `ResourcesInSync` is on the published revision only: the tainted one loses it,
    // the one rolled back to has it.
    let in_sync = |version: &str| {
        let r = plane
            .list_revisions(ns)
            .into_iter()
            .find(|r| r.spec.version == version)?;
        r.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "ResourcesInSync")
            .map(|c| c.status)
    };
    wait(
        "ResourcesInSync on the published revision only",
        Duration::from_secs(20),
        || (in_sync(&bad).is_none() && in_sync(&v1).as_deref() == Some("True")).then_some(()),
    );
    plane.wait_metric("marin3r_revision_taints_total", 1.0);
    plane.wait_metric(
        r#"marin3r_envoyconfig_cache_state_changes_total{state="rollback"}"#,
        1.0,
    );
    // `kubectl describe` tells the user why.
    let k = plane.kubectl();
    let described = plane
        .rt
        .block_on(k.ok(&["describe", "ec", "gw", "-n", ns]))
        .unwrap();
    assert!(
        described.contains("Rollback") && described.contains("terminal filter"),
        "{described}"
    );
    // `kubectl wait` (and GitOps tools) read the Ready condition: not ready while rolled back.
    let wait = |condition: &str| {
        plane.rt.block_on(k.ok(&[
            "wait",
            "ec/gw",
            "-n",
            ns,
            &format!("--for=condition={condition}"),
            "--timeout=30s",
        ]))
    };
    wait("Ready=false").unwrap();
    let rolled_back = plane.get(ns, "gw");
    let ready = condition(&rolled_back, "Ready").unwrap();
    assert_eq!(ready.reason, "Rollback", "{ready:?}");

    // A fixed spec is InSync again, and Ready.
    plane.apply(ns, "gw", spec(node, port, "v3"));
    wait("Ready").unwrap();
    plane.wait_in_sync(ns, "gw");
    proxy.wait_for_body(port, "v3");
}

#[test]
fn with_no_good_revision_the_rollback_fails_until_the_spec_is_fixed() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "edge", nacked_spec("edge", port, "bad"));
    plane.wait_status(ns, "edge", "the bad revision published", |ec| {
        ec.status
            .as_ref()
            .and_then(|s| s.published_version.clone())
            .is_some()
    });
    let proxy = plane.proxy(ns, "edge", AdsMode::Delta);
    let ec = plane.wait_status(ns, "edge", "RollbackFailed", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::RollbackFailed)
    });
    let bad = ec.spec.version();
    let status = ec.status.as_ref().unwrap();
    // The failing revision stays published until the user fixes the spec.
    assert_eq!(status.published_version.as_deref(), Some(bad.as_str()));
    let failed = condition(&ec, "RollbackFailed").unwrap();
    assert_eq!(failed.status, "True");
    assert!(
        status
            .last_nack_message
            .as_deref()
            .unwrap()
            .contains("router")
    );

    plane.apply(ns, "edge", spec("edge", port, "fixed"));
    let ec = plane.wait_in_sync(ns, "edge");
    assert_eq!(condition(&ec, "RollbackFailed").unwrap().status, "False");
    assert_eq!(condition(&ec, "CacheOutOfSync").unwrap().status, "False");
    assert!(ec.status.as_ref().unwrap().last_nack_message.is_none());
    proxy.wait_for_body(port, "fixed");
}

#[test]
fn the_same_node_id_in_two_namespaces_gets_each_namespace_its_own_config() {
    let plane = Plane::start(&["ns-one", "ns-two"]);
    let (ns_one, ns_two) = (plane.ns("ns-one"), plane.ns("ns-two"));
    let (p1, p2) = (free_port(), free_port());
    plane.apply(ns_one, "cfg", spec("shared", p1, "one"));
    plane.apply(ns_two, "cfg", spec("shared", p2, "two"));
    plane.wait_in_sync(ns_one, "cfg");
    plane.wait_in_sync(ns_two, "cfg");
    let one = plane.proxy(ns_one, "shared", AdsMode::StateOfTheWorld);
    let two = plane.proxy(ns_two, "shared", AdsMode::Delta);
    one.wait_for_body(p1, "one");
    two.wait_for_body(p2, "two");
    // Neither got the other's listener.
    assert!(
        marin3r_testkit::envoy::get_body(&format!("http://127.0.0.1:{p2}/")).unwrap_or_default()
            == "two"
    );
    let listeners = one.envoy.admin_get("/listeners").unwrap();
    assert!(!listeners.contains(&p2.to_string()), "{listeners}");
}

/// Two configs of one node id were both published and the proxy got
/// whichever reconciled last. The second is refused, naming the first, and takes over when
/// the first is deleted.
#[test]
fn a_second_config_for_the_same_node_is_refused_until_the_first_is_gone() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let (p1, p2) = (free_port(), free_port());
    let node = "twice";
    plane.apply(ns, "first", spec(node, p1, "first"));
    plane.wait_in_sync(ns, "first");
    let proxy = plane.proxy(ns, node, AdsMode::StateOfTheWorld);
    proxy.wait_for_body(p1, "first");

    plane.apply(ns, "second", spec(node, p2, "second"));
    let refused = plane.wait_status(ns, "second", "the InvalidSpec condition", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&refused, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.nodeID") && message.contains("EnvoyConfig first"),
        "{message}"
    );
    let owners: Vec<String> = plane
        .list_revisions(ns)
        .iter()
        .flat_map(|r| r.metadata.owner_references.iter().flatten())
        .map(|o| o.name.clone())
        .collect();
    assert_eq!(owners, ["first"], "no revision of the refused config");
    // The proxy still has the first config only.
    std::thread::sleep(Duration::from_millis(500));
    assert!(marin3r_testkit::envoy::get_body(&format!("http://127.0.0.1:{p2}/")).is_err());
    proxy.wait_for_body(p1, "first");

    // Deleting the first hands the node to the second.
    plane
        .rt
        .block_on(plane.configs(ns).delete("first", &DeleteParams::default()))
        .unwrap();
    plane.wait_in_sync(ns, "second");
    proxy.wait_for_body(p2, "second");
}

#[test]
fn eleven_updates_keep_ten_revisions_and_deleting_the_config_clears_the_cache() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    let mut versions = Vec::new();
    for i in 0..11 {
        plane.apply(ns, "many", spec("many", port, &format!("body {i}")));
        versions.push(
            plane
                .wait_in_sync(ns, "many")
                .spec
                .envoy_resources
                .version(),
        );
    }
    let ec = plane.get(ns, "many");
    assert_eq!(revision_versions(&ec), versions[1..]);
    let revisions = wait("the oldest revision to go", Duration::from_secs(10), || {
        let r = plane.list_revisions(ns);
        (r.len() == 10).then_some(r)
    });
    assert!(revisions.iter().all(|r| r.spec.version != versions[0]));
    assert_eq!(revisions.iter().filter(|r| r.is_published()).count(), 1);
    assert!(plane.cache.snapshot(ns, "many").is_some());

    plane
        .rt
        .block_on(plane.configs(ns).delete("many", &DeleteParams::default()))
        .unwrap();
    wait(
        "the revisions to be deleted",
        Duration::from_secs(10),
        || plane.list_revisions(ns).is_empty().then_some(()),
    );
    wait(
        "the cache entry to be cleared",
        Duration::from_secs(10),
        || plane.cache.snapshot(ns, "many").is_none().then_some(()),
    );
}

/// The design seed's example, as written for the original MARIN3R (v2 type URLs and all).
const SEED_EXAMPLE: &str = r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata:
  name: test
  namespace: team-a
spec:
  nodeID: my-proxy
  serialization: yaml
  envoyResources:
    secrets:
      - name: my-certificate
        ref:
          name: my-certificate-secret-resource
          namespace: team-a
    listeners:
      - name: https
        value: |
          name: https
          address: { socket_address: { address: 0.0.0.0, port_value: 1443 }}
          filter_chains:
            - filters:
              - name: envoy.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager
                  stat_prefix: ingress_http
                  route_config:
                    name: local_route
                    virtual_hosts:
                      - name: my-proxy
                        domains: ["*"]
                        routes:
                          - match: { prefix: "/" }
                            direct_response: { status: 200, body: { inline_string: ok }}
                  http_filters: [ name: envoy.router ]
"#;

#[test]
fn kubectl_applies_the_crds_and_original_manifests_and_prints_the_columns() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let k = plane.kubectl();
    // The checked-in CRDs apply (again: the plane applied them the same way).
    plane.apply_checked_in_crds(&k);

    // The original manifest applies unchanged; its Envoy v2 resources are refused in status.
    plane
        .rt
        .block_on(k.ok_with(
            &["apply", "--server-side", "-f", "-"],
            &SEED_EXAMPLE.replace("namespace: team-a", &format!("namespace: {ns}")),
        ))
        .unwrap();
    let ec = plane.wait_status(ns, "test", "the v2 resources to be refused", |ec| {
        condition(ec, "CacheOutOfSync").is_some_and(|c| c.reason == "InvalidSpec")
    });
    let message = &condition(&ec, "CacheOutOfSync").unwrap().message;
    assert!(
        message.contains("spec.envoyResources.listeners[0].value"),
        "{message}"
    );
    assert!(plane.list_revisions(ns).is_empty());

    let port = free_port();
    plane.apply(ns, "good", spec("good", port, "ok"));
    let ec = plane.wait_in_sync(ns, "good");
    let version = ec.spec.version();
    let table = plane.rt.block_on(k.ok(&["get", "ec", "-n", ns])).unwrap();
    let header = table.lines().next().unwrap();
    for column in [
        "NODE ID",
        "ENVOY API",
        "DESIRED VERSION",
        "PUBLISHED VERSION",
        "CACHE STATE",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = table.lines().find(|l| l.starts_with("good ")).unwrap();
    assert!(row.contains(&version) && row.contains("InSync"), "{table}");
    let table = plane.rt.block_on(k.ok(&["get", "ecr", "-n", ns])).unwrap();
    let header = table.lines().next().unwrap();
    for column in [
        "NODE ID",
        "VERSION",
        "PUBLISHED",
        "CREATED AT",
        "LAST PUBLISHED AT",
        "TAINTED",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("good-{version}")))
        .unwrap();
    assert!(row.contains("true"), "{table}");
}

#[test]
fn the_controllers_recover_from_dropped_watches_and_failed_requests() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "flaky", spec("flaky", port, "before"));
    plane.wait_in_sync(ns, "flaky");
    let proxy = plane.proxy(ns, "flaky", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "before");

    let faults = plane.faults();
    faults.drop_watches();
    faults.fail_next(1, 410, FaultScope::Watch);
    faults.fail_next(3, 500, FaultScope::Any);
    faults.fail_next(2, 409, FaultScope::Any);
    plane.apply(ns, "flaky", spec("flaky", port, "after"));
    plane.wait_in_sync(ns, "flaky");
    proxy.wait_for_body(port, "after");
    assert_eq!(plane.list_revisions(ns).len(), 2);
}

/// The soak's lost config (an Envoy back from revision 3 to 1): a publication is two
/// writes, and when the second fails, two revisions of one node were published at once; any
/// reload of the older one then (a watch relisted, a Secret changed, a replica restarted)
/// served it over the newer. Here the old revision's status cannot be written while the
/// watches are dropped again and again: what the node is served never goes back.
#[test]
fn a_failed_unpublication_never_serves_the_older_revision_again() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "pair", spec("pair", port, "old"));
    let ec = plane.wait_in_sync(ns, "pair");
    let old = format!("pair-{}", ec.spec.version());
    let listeners = || {
        plane
            .cache
            .snapshot(ns, "pair")
            .map(|s| s.version(ResourceType::Listener).to_owned())
    };
    // InSync is written once the revision is published; the cache may take it a moment later.
    let old_listeners = wait(
        "the first revision served",
        Duration::from_secs(20),
        listeners,
    );

    let faults = plane.faults();
    let status = format!(
        "/apis/marin3r.3scale.net/v1alpha1/namespaces/{ns}/envoyconfigrevisions/{old}/status"
    );
    faults.deny(&status, 500);
    plane.apply(ns, "pair", spec("pair", port, "new"));
    // Served versions in order, while every watch is relisted again and again.
    let mut seen = vec![old_listeners.clone()];
    let observe = |seen: &mut Vec<String>| {
        if let Some(v) = listeners()
            && seen.last() != Some(&v)
        {
            seen.push(v);
        }
    };
    for round in 0..40 {
        if round % 8 == 0 {
            // Ended, and answered 410 when resumed: relisted.
            faults.fail_next(4, 410, FaultScope::Watch);
            faults.drop_watches();
        }
        observe(&mut seen);
        std::thread::sleep(Duration::from_millis(100));
    }
    faults.allow(&status);
    plane.wait_in_sync(ns, "pair");
    wait("the new revision served", Duration::from_secs(20), || {
        listeners().filter(|v| *v != old_listeners)
    });
    for _ in 0..20 {
        observe(&mut seen);
        std::thread::sleep(Duration::from_millis(50));
    }
    let back = seen.iter().skip(1).any(|v| *v == old_listeners);
    assert!(
        !back && seen.len() == 2,
        "the node went back to the old revision: listener versions served in turn {seen:?}"
    );
}

#[test]
fn a_published_revision_deleted_by_hand_is_recreated_and_served_again() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "kept", spec("kept", port, "kept"));
    let ec = plane.wait_in_sync(ns, "kept");
    let name = format!("kept-{}", ec.spec.version());
    let proxy = plane.proxy(ns, "kept", AdsMode::StateOfTheWorld);
    proxy.wait_for_body(port, "kept");
    let old_uid = plane.list_revisions(ns)[0].metadata.uid.clone();

    retry(|| {
        plane
            .rt
            .block_on(plane.revisions(ns).delete(&name, &DeleteParams::default()))
    });
    let revision = wait(
        "the revision to be recreated and published",
        Duration::from_secs(20),
        || {
            plane
                .list_revisions(ns)
                .into_iter()
                .find(|r| r.metadata.uid != old_uid && r.is_published())
        },
    );
    assert_eq!(revision.metadata.name.as_deref(), Some(name.as_str()));
    wait(
        "the cache to serve it again",
        Duration::from_secs(20),
        || plane.cache.snapshot(ns, "kept").map(|_| ()),
    );
    proxy.wait_for_body(port, "kept");
    assert_eq!(revision_versions(&plane.get(ns, "kept")).len(), 1);
}

/// An EnvoyConfig written with fields the CRD does not declare (by a client of a newer CRD,
/// with validation off) is stored without them, as the API server prunes them; the type
/// reads such an object (the unknown fields ignored, as a controller of an older version
/// must), and the controllers serve it beside the others.
#[test]
fn an_unknown_spec_field_does_not_stop_the_controllers() {
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let mut odd = spec("odd", free_port(), "odd");
    odd["envoyResource"] = serde_json::json!({"typo": true});
    odd["envoyResources"]["listener"] = serde_json::json!([]);
    let object = serde_json::json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "odd", "namespace": ns},
        "spec": odd,
    });
    // The type reads it as it is, unknown fields and all.
    let read: marin3r_api::EnvoyConfig = serde_json::from_value(object.clone()).unwrap();
    assert_eq!(read.spec.node_id, "odd");
    // Server-side apply refuses undeclared fields; a create (validation `Warn`, the API
    // server's default) stores the object without them.
    plane
        .rt
        .block_on(plane.configs(ns).patch(
            "odd",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&object),
        ))
        .unwrap_err();
    let resource = ApiResource::erase::<marin3r_api::EnvoyConfig>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(plane.client.clone(), ns, &resource);
    plane
        .rt
        .block_on(raw.create(
            &Default::default(),
            &serde_json::from_value(object).unwrap(),
        ))
        .unwrap();
    let stored = serde_json::to_value(plane.get(ns, "odd")).unwrap();
    assert!(stored["spec"].get("envoyResource").is_none(), "{stored}");
    assert!(
        stored["spec"]["envoyResources"].get("listener").is_none(),
        "{stored}"
    );
    plane.apply(ns, "good", spec("good", free_port(), "good"));
    plane.wait_in_sync(ns, "good");
    plane.wait_in_sync(ns, "odd");
}

/// A proxy of `node` that accepts whatever it is sent (an Envoy of another build that finds
/// nothing wrong with the config): a simulated ADS client that ACKs every listener response.
fn accepting_proxy(plane: &Plane, node: &str) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let acks = Arc::new(AtomicUsize::new(0));
    let cert = plane.client_cert(plane.ns(NS));
    let tls = ClientTls {
        ca_pem: plane.pki.ca_pem().to_owned(),
        identity: Some((cert.cert_pem.clone(), cert.key_pem.clone())),
        server_name: "127.0.0.1".into(),
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], plane.xds_port));
    let node = node.to_owned();
    let counted = acks.clone();
    let task = plane.rt.spawn(async move {
        let from = crate::support::pod_address("accepting-pod").into();
        let channel = connect_from(addr, &tls, Some(from)).await.unwrap();
        let mut stream = SotwStream::open(channel, &node, Some("accepting-pod"))
            .await
            .unwrap();
        let listeners = ResourceType::Listener.type_url();
        stream.subscribe(listeners, &[]).await.unwrap();
        while let Ok(resp) = stream.recv().await {
            stream.ack(&resp, &[]).await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (task, acks)
}

#[test]
fn a_version_rejected_by_some_proxies_of_a_node_is_tainted_only_when_all_reject_it() {
    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    let node = "fleet";
    plane.apply(ns, "fleet", spec(node, port, "good"));
    plane.wait_in_sync(ns, "fleet");
    let envoy = plane.proxy(ns, node, AdsMode::StateOfTheWorld);
    envoy.wait_for_body(port, "good");
    let (accepting, acks) = accepting_proxy(&plane, node);
    wait("the second proxy to ACK", Duration::from_secs(10), || {
        (acks.load(Ordering::SeqCst) >= 1).then_some(())
    });

    // Envoy rejects the new version, the other proxy accepts it: 1 of 2 is below the
    // default threshold (every connected proxy), so nothing is tainted or rolled back.
    plane.apply(ns, "fleet", nacked_spec(node, port, "bad"));
    let bad = plane.get(ns, "fleet").spec.version();
    wait(
        "the NACK below the threshold",
        Duration::from_secs(20),
        || (plane.metric("marin3r_nacks_below_threshold_total") >= 1.0).then_some(()),
    );
    std::thread::sleep(Duration::from_millis(500));
    let ec = plane.get(ns, "fleet");
    let status = ec.status.as_ref().unwrap();
    assert_eq!(status.published_version.as_deref(), Some(bad.as_str()));
    assert_eq!(status.cache_state, Some(CacheState::InSync));
    assert_eq!(plane.metric("marin3r_revision_taints_total"), 0.0);
    envoy.wait_for_body(port, "good");

    // The accepting proxy leaves and a second real Envoy joins (another pod: proxies are
    // counted by pod, not by stream): it rejects the version too, now 2 of 2 have, and the
    // revision is tainted and rolled back.
    accepting.abort();
    let second = crate::support::Proxy::start_on(
        plane.xds_port,
        &plane.client_cert(ns),
        node,
        "fleet-pod-2",
        AdsMode::StateOfTheWorld,
    );
    let ec = plane.wait_status(ns, "fleet", "the rollback", |ec| {
        ec.status.as_ref().and_then(|s| s.cache_state) == Some(CacheState::Rollback)
    });
    let message = ec
        .status
        .as_ref()
        .unwrap()
        .last_nack_message
        .clone()
        .unwrap();
    assert!(message.contains("2 of 2 connected proxies"), "{message}");
    plane.wait_metric("marin3r_revision_taints_total", 1.0);
    envoy.wait_for_body(port, "good");
    drop(second);
}

/// A second discovery process whose EnvoyConfig watch has stalled (an old pod during a
/// rollout, or a watch stuck behind API errors) still sees the revisions change. Before the
/// controller read the EnvoyConfig fresh, it decided from its stale cached spec and
/// republished the old revision over the newest one (found by the soak: every Envoy went back
/// one revision); now the published revision stays the newest.
#[test]
fn a_stale_cached_envoyconfig_never_republishes_an_old_revision() {
    use marin3r_discovery::controllers::{self, Readiness};
    use marin3r_xds::{Cache, Server};

    let plane = Plane::start(&[NS]);
    let ns = plane.ns(NS);
    let port = free_port();
    plane.apply(ns, "gw", spec("gw", port, "one"));
    plane.wait_in_sync(ns, "gw");

    // The second process reaches the API server through an endpoint of its own, so that
    // only its requests can be held.
    let stale_client = plane.client_as("stale-pod", &plane.rt);
    let cache = Cache::new();
    let (_server, nacks) = Server::builder(cache.clone()).build();
    let readiness = Readiness::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let second = plane.rt.spawn(controllers::run(
        stale_client,
        controllers::Config {
            discovery_service: Some(plane.discovery_service.clone()),
            ..Default::default()
        },
        cache,
        nacks,
        readiness.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    wait("the second process synced", Duration::from_secs(20), || {
        readiness.ready().then_some(())
    });

    // Its EnvoyConfig watch stalls (held, as its re-watch after the drop); everything else
    // of it and of the first process goes on.
    let watch_path = "/apis/marin3r.3scale.net/v1alpha1/envoyconfigs";
    let faults = plane.faults();
    faults.hold_for(watch_path, "stale-pod");
    faults.drop_watches();
    std::thread::sleep(Duration::from_millis(500));
    plane.apply(ns, "gw", spec("gw", port, "two"));
    let newest = plane.wait_in_sync(ns, "gw").spec.envoy_resources.version();

    // The revisions changed under the second process: it reconciles its stale spec. For
    // three seconds the newest stays the one published, and only it.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let published: Vec<String> = plane
            .list_revisions(ns)
            .into_iter()
            .filter(|r| r.is_published())
            .map(|r| r.spec.version)
            .collect();
        assert_eq!(
            published,
            std::slice::from_ref(&newest),
            "the old revision was republished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    faults.release(watch_path);
    let _ = stop.send(());
    let _ = plane.rt.block_on(second);
}
