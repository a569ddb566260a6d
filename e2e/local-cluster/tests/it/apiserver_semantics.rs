//! API semantics beyond plain CRUD, through kube-rs: generateName, Secret stringData, dry
//! runs, delete preconditions, delete-collection, orphaning, CRD deletion, and watch-list
//! (`sendInitialEvents`) as kube-rs' streaming-list watcher uses it.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig};
use serde_json::json;

async fn setup() -> (ApiServer, Client, String) {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let ns = format!("s-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    (server, client, ns)
}

fn status_of(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cm(value: serde_json::Value) -> ConfigMap {
    serde_json::from_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_deletes_and_dry_runs() {
    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    let generated = cms
        .create(
            &PostParams::default(),
            &cm(json!({"metadata": {"generateName": "gen-"}})),
        )
        .await
        .unwrap();
    let name = generated.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"user": "admin"}}))
            .unwrap();
    let secret = secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["user"].0, b"admin");
    assert!(secret.string_data.is_none());

    // Large objects within a real API server's limits (1 MiB of ConfigMap data) are
    // accepted; the limits themselves are tested in apiserver_strict.rs.
    let big = "x".repeat(1_000_000);
    cms.create(
        &PostParams::default(),
        &cm(json!({"metadata": {"name": "big"}, "data": {"big": big}})),
    )
    .await
    .unwrap();

    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    cms.create(&dry, &cm(json!({"metadata": {"name": "dry"}})))
        .await
        .unwrap();
    assert_eq!(status_of(cms.get("dry").await.unwrap_err()).0, 404);

    // Namespaced objects need an existing namespace.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-namespace");
    assert_eq!(
        status_of(
            elsewhere
                .create(
                    &PostParams::default(),
                    &cm(json!({"metadata": {"name": "x"}}))
                )
                .await
                .unwrap_err()
        ),
        (404, "NotFound".into())
    );

    // Delete preconditions.
    let wrong_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        status_of(cms.delete(&name, &wrong_uid).await.unwrap_err()),
        (409, "Conflict".into())
    );

    // Delete-collection by label.
    for (n, color) in [("r1", "red"), ("r2", "red"), ("b1", "blue")] {
        cms.create(
            &PostParams::default(),
            &cm(json!({"metadata": {"name": n, "labels": {"color": color}}})),
        )
        .await
        .unwrap();
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("color=red"),
    )
    .await
    .unwrap();
    let left: Vec<String> = cms
        .list(&ListParams::default().labels("color"))
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(left, ["b1"]);

    // Orphaning keeps dependents and strips their owner reference.
    let owner = cms.get("b1").await.unwrap();
    let dependent = cm(json!({"metadata": {"name": "dep", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "b1", "uid": owner.uid().unwrap()}
    ]}}));
    cms.create(&PostParams::default(), &dependent)
        .await
        .unwrap();
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    cms.delete("b1", &orphan).await.unwrap();
    let kept = cms.get("dep").await.unwrap();
    assert!(kept.metadata.owner_references.is_none(), "{kept:?}");
}

/// As a real garbage collector does: an object whose owners are all gone is deleted, also
/// when it is written after they went (a controller re-applying a child of a deleted parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependent_written_after_its_owner_went_is_collected() {
    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = cms
        .create(
            &PostParams::default(),
            &cm(json!({"metadata": {"name": "owner"}})),
        )
        .await
        .unwrap();
    let owner_uid = owner.uid().unwrap();
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    let late = |name: &str, uids: &[&str]| {
        let refs: Vec<serde_json::Value> = uids
            .iter()
            .map(
                |uid| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}),
            )
            .collect();
        cm(json!({"metadata": {"name": name, "ownerReferences": refs}}))
    };
    cms.create(&PostParams::default(), &late("late", &[&owner_uid]))
        .await
        .unwrap();
    let gone = await_condition(cms.clone(), "late", conditions::is_deleted(""));
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the orphaned dependent is still there")
        .unwrap();
    // One live owner keeps it.
    let live = cms
        .create(
            &PostParams::default(),
            &cm(json!({"metadata": {"name": "live"}})),
        )
        .await
        .unwrap();
    let kept = late("kept", &[&owner_uid, &live.uid().unwrap()]);
    cms.create(&PostParams::default(), &kept).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cms.get("kept").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_crd_deletes_its_objects_and_stops_serving_them() {
    let (_server, client, ns) = setup().await;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "things.test.marin3r.io"},
        "spec": {
            "group": "test.marin3r.io", "scope": "Namespaced",
            "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.marin3r.io", "v1", "Thing"),
        "things",
    );
    let things: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let thing = DynamicObject::new("t", &ar).data(json!({"spec": {"a": 1}}));
    things.create(&PostParams::default(), &thing).await.unwrap();

    // A second CRD cannot claim the same resource.
    let mut clash = crd.clone();
    clash.metadata.name = Some("other.test.marin3r.io".into());
    assert_eq!(
        status_of(
            crds.create(&PostParams::default(), &clash)
                .await
                .unwrap_err()
        )
        .1,
        "Invalid"
    );

    crds.delete("things.test.marin3r.io", &DeleteParams::default())
        .await
        .unwrap();
    let uid = crds
        .get_opt("things.test.marin3r.io")
        .await
        .unwrap()
        .map(|c| c.uid().unwrap());
    if let Some(uid) = uid {
        let gone = await_condition(
            crds.clone(),
            "things.test.marin3r.io",
            conditions::is_deleted(&uid),
        );
        tokio::time::timeout(Duration::from_secs(5), gone)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(status_of(things.get("t").await.unwrap_err()).0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_watcher() {
    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    cms.create(
        &PostParams::default(),
        &cm(json!({"metadata": {"name": "before"}})),
    )
    .await
    .unwrap();
    let config = watcher::Config::default().streaming_lists();
    let mut events = watcher(cms.clone(), config).boxed();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(matches!(next().await, watcher::Event::InitApply(c) if c.name_any() == "before"));
    assert!(matches!(next().await, watcher::Event::InitDone));
    cms.create(
        &PostParams::default(),
        &cm(json!({"metadata": {"name": "after"}})),
    )
    .await
    .unwrap();
    assert!(matches!(next().await, watcher::Event::Apply(c) if c.name_any() == "after"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_event_recorder_publishes_and_counts_repeats() {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::Resource;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};

    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let target = cms
        .create(
            &PostParams::default(),
            &cm(json!({"metadata": {"name": "evented"}})),
        )
        .await
        .unwrap();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test-controller".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Tested".into(),
        note: Some("recorded by the test".into()),
        action: "Test".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let client_core = client.clone();
    let events: Api<K8sEvent> = Api::namespaced(client, &ns);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].reason.as_deref(), Some("Tested"));
    assert_eq!(listed[0].series.as_ref().map(|s| s.count), Some(2));

    // The same Event, as core/v1 shows it (what `kubectl describe` lists).
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client_core, &ns);
    let by_uid = format!("involvedObject.uid={}", target.uid().unwrap());
    let listed = core
        .list(&ListParams::default().fields(&by_uid))
        .await
        .unwrap()
        .items;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].message.as_deref(), Some("recorded by the test"));
    assert_eq!(
        listed[0].reporting_component.as_deref(),
        Some("test-controller")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminating_namespace_refuses_new_content_until_it_is_gone() {
    let (_server, client, ns) = setup().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let held = cm(json!({"metadata": {"name": "held", "finalizers": ["test.marin3r.io/hold"]}}));
    cms.create(&PostParams::default(), &held).await.unwrap();
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.delete(&ns, &DeleteParams::default()).await.unwrap();

    // The held object keeps the namespace Terminating; nothing new may be created in it.
    let terminating = await_condition(nss.clone(), &ns, |n: Option<&Namespace>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Terminating")
    });
    tokio::time::timeout(Duration::from_secs(5), terminating)
        .await
        .unwrap()
        .unwrap();
    let refused = cms
        .create(
            &PostParams::default(),
            &cm(json!({"metadata": {"name": "new"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(status_of(refused), (403, "Forbidden".into()));
    let deleting = cms.get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());

    // Releasing the finalizer lets the object, then the namespace, go.
    let release = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
    cms.patch("held", &kube::api::PatchParams::default(), &release)
        .await
        .unwrap();
    let gone = await_condition(nss, &ns, |n: Option<&Namespace>| n.is_none());
    tokio::time::timeout(Duration::from_secs(5), gone)
        .await
        .unwrap()
        .unwrap();
}
