//! kube-rs against the local cluster's API server, over HTTPS through its kubeconfig: CRUD
//! of a CRD-typed object with exact error reasons, a `watcher` that recovers from a forced
//! 410 by relisting, and a `Controller` with `finalizer()` and status server-side apply.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{Client, CustomResource, CustomResourceExt, ResourceExt};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig, FaultScope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "test.marin3r.io",
    version = "v1",
    kind = "Gizmo",
    namespaced,
    status = "GizmoStatus"
)]
struct GizmoSpec {
    size: i64,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
struct GizmoStatus {
    observed_size: i64,
}

/// A server, a client, the Gizmo CRD established and a fresh namespace.
async fn setup() -> (ApiServer, Client, Api<Gizmo>) {
    let server = ApiServer::start(ApiServerConfig::default()).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Gizmo::crd())
        .await
        .unwrap();
    let established = await_condition(
        crds,
        "gizmos.test.marin3r.io",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(10), established)
        .await
        .unwrap()
        .unwrap();
    let ns = format!("t-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    nss.create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    (server, client.clone(), Api::namespaced(client, &ns))
}

fn gizmo(name: &str, size: i64) -> Gizmo {
    let mut g = Gizmo::new(name, GizmoSpec { size });
    g.metadata.labels = Some([("app".to_owned(), "gizmo".to_owned())].into());
    g
}

fn reason(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_of_a_custom_resource() {
    let (_server, _client, api) = setup().await;
    let created = api
        .create(&PostParams::default(), &gizmo("one", 1))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv1 = created.resource_version().unwrap();

    let again = api
        .create(&PostParams::default(), &gizmo("one", 1))
        .await
        .unwrap_err();
    assert_eq!(reason(again), (409, "AlreadyExists".into()));
    assert_eq!(
        reason(api.get("missing").await.unwrap_err()),
        (404, "NotFound".into())
    );
    let mut bad = gizmo("Not_Valid", 1);
    bad.metadata.name = Some("Not_Valid".into());
    assert_eq!(
        reason(api.create(&PostParams::default(), &bad).await.unwrap_err()),
        (422, "Invalid".into())
    );

    let got = api.get("one").await.unwrap();
    assert_eq!(got.spec.size, 1);
    api.create(&PostParams::default(), &gizmo("two", 2))
        .await
        .unwrap();
    let list = api
        .list(&ListParams::default().labels("app=gizmo"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 2);
    assert!(
        !list
            .metadata
            .resource_version
            .unwrap_or_default()
            .is_empty()
    );
    let only = api
        .list(&ListParams::default().fields("metadata.name=two"))
        .await
        .unwrap();
    assert_eq!(
        only.items.iter().map(|g| g.name_any()).collect::<Vec<_>>(),
        ["two"]
    );

    // A spec change moves generation and the version; a no-op patch moves nothing.
    let patched = api
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (patched.spec.size, patched.metadata.generation),
        (5, Some(2))
    );
    let rv2 = patched.resource_version().unwrap();
    assert_ne!(rv1, rv2);
    let same = api
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version().unwrap(), rv2);

    // Status is its own subresource: the main resource ignores it and vice versa.
    let ignored = api
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observed_size": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(ignored.status, None);
    let status = Patch::Apply(
        json!({"apiVersion": "test.marin3r.io/v1", "kind": "Gizmo", "status": {"observed_size": 5}}),
    );
    let with_status = api
        .patch_status("one", &PatchParams::apply("test").force(), &status)
        .await
        .unwrap();
    assert_eq!(with_status.status, Some(GizmoStatus { observed_size: 5 }));
    assert_eq!(
        with_status.metadata.generation,
        Some(2),
        "status writes leave generation alone"
    );
    let spec_via_status = api
        .patch_status(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(spec_via_status.spec.size, 5);

    // A stale write conflicts.
    let mut stale = got.clone();
    stale.spec.size = 8;
    assert_eq!(
        reason(
            api.replace("one", &PostParams::default(), &stale)
                .await
                .unwrap_err()
        ),
        (409, "Conflict".into())
    );

    // Server-side apply creates when missing, then updates.
    let applied = json!({"apiVersion": "test.marin3r.io/v1", "kind": "Gizmo", "metadata": {"name": "three"}, "spec": {"size": 3}});
    let three = api
        .patch(
            "three",
            &PatchParams::apply("test"),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    assert_eq!(three.spec.size, 3);

    // JSON patch, including the null `test` kube-rs' finalizer() sends.
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["test.marin3r.io/hold"]},
    ]))
    .unwrap();
    let held = api
        .patch("three", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(held.finalizers(), ["test.marin3r.io/hold"]);

    // Delete: a held object gets a deletionTimestamp and stays until its finalizer goes.
    api.delete("three", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("three").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch("three", &PatchParams::default(), &release)
        .await
        .unwrap();
    assert_eq!(reason(api.get("three").await.unwrap_err()).1, "NotFound");
    api.delete("one", &DeleteParams::default()).await.unwrap();
    assert_eq!(reason(api.get("one").await.unwrap_err()).1, "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_sees_changes_and_relists_after_410() {
    let (server, _client, api) = setup().await;
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let mut expired = 0;
    let mut next = async || loop {
        match tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .unwrap()
        {
            Ok(event) => return event.unwrap(),
            // The watcher reports the 410, then relists on its next poll.
            Err(watcher::Error::WatchError(status)) if status.code == 410 => expired += 1,
            Err(other) => panic!("unexpected watcher error {other:?}"),
        }
    };
    assert!(matches!(next().await, watcher::Event::Init));
    assert!(matches!(next().await, watcher::Event::InitDone));

    api.create(&PostParams::default(), &gizmo("w", 1))
        .await
        .unwrap();
    assert!(matches!(next().await, watcher::Event::Apply(g) if g.spec.size == 1));
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
    assert!(matches!(next().await, watcher::Event::Apply(g) if g.spec.size == 2));

    // The next watch is told its version expired (inside the stream): the watcher relists.
    server.faults().fail_next(1, 410, FaultScope::Watch);
    server.faults().drop_watches();
    let mut relisted = false;
    loop {
        match next().await {
            watcher::Event::Init => relisted = true,
            watcher::Event::InitApply(g) => assert_eq!(g.spec.size, 2),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(relisted);
    let _ = next;
    assert_eq!(expired, 1);
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), events.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };

    api.delete("w", &DeleteParams::default()).await.unwrap();
    assert!(matches!(next().await, watcher::Event::Delete(g) if g.name_any() == "w"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_version_expires() {
    let (server, _client, api) = setup().await;
    api.create(&PostParams::default(), &gizmo("x", 1))
        .await
        .unwrap();
    let old = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 2}})),
    )
    .await
    .unwrap();
    server.store().compact();
    let mut stream = api
        .watch(&kube::api::WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap();
    match first {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        Ok(kube::api::WatchEvent::Error(status)) => assert_eq!(status.code, 410),
        other => panic!("expected a 410, got {other:?}"),
    }
}

struct Ctx {
    api: Api<Gizmo>,
    reconciles: AtomicUsize,
    cleanups: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ReconcileError(String);

async fn reconcile(
    g: Arc<Gizmo>,
    ctx: Arc<Ctx>,
) -> Result<Action, kube::runtime::finalizer::Error<ReconcileError>> {
    ctx.reconciles.fetch_add(1, Ordering::SeqCst);
    let api = ctx.api.clone();
    finalizer(&api, "test.marin3r.io/cleanup", g, |event| async {
        match event {
            Finalizer::Apply(g) => {
                let status = json!({"apiVersion": "test.marin3r.io/v1", "kind": "Gizmo", "status": {"observed_size": g.spec.size}});
                ctx.api
                    .patch_status(&g.name_any(), &PatchParams::apply("gizmo-controller").force(), &Patch::Apply(status))
                    .await
                    .map_err(|e| ReconcileError(e.to_string()))?;
                Ok(Action::await_change())
            }
            Finalizer::Cleanup(_) => {
                ctx.cleanups.fetch_add(1, Ordering::SeqCst);
                Ok(Action::await_change())
            }
        }
    })
    .await
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let holds = || std::future::ready(f().then_some(()));
    marin3r_testkit::wait::until(what, Duration::from_secs(10), holds).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_with_finalizer_reconciles_goes_quiet_and_cleans_up() {
    let (_server, _client, api) = setup().await;
    let ctx = Arc::new(Ctx {
        api: api.clone(),
        reconciles: AtomicUsize::new(0),
        cleanups: AtomicUsize::new(0),
    });
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(
            reconcile,
            |_, _, _| Action::requeue(Duration::from_millis(200)),
            ctx.clone(),
        )
        .for_each(|_| async {});
    let controller = tokio::spawn(controller);

    api.create(&PostParams::default(), &gizmo("c", 4))
        .await
        .unwrap();
    let converged = await_condition(api.clone(), "c", |g: Option<&Gizmo>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.observed_size == 4)
    });
    tokio::time::timeout(Duration::from_secs(10), converged)
        .await
        .unwrap()
        .unwrap();
    let g = api.get("c").await.unwrap();
    assert_eq!(g.finalizers(), ["test.marin3r.io/cleanup"]);

    // Idle: the controller's own writes must not keep it busy. Let the echo of its last
    // write pass (the count holds for half a second), then it must stay quiet.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut settled = ctx.reconciles.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.reconciles.load(Ordering::SeqCst);
        if now == settled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller never went quiet ({now} reconciles)"
        );
        settled = now;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ctx.reconciles.load(Ordering::SeqCst),
        settled,
        "the controller kept reconciling while idle"
    );
    assert!(settled <= 4, "{settled} reconciles for one object");

    // A spec change is reconciled.
    api.patch(
        "c",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 6}})),
    )
    .await
    .unwrap();
    let changed = await_condition(api.clone(), "c", |g: Option<&Gizmo>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.observed_size == 6)
    });
    tokio::time::timeout(Duration::from_secs(10), changed)
        .await
        .unwrap()
        .unwrap();

    // Delete: cleanup runs once, the finalizer goes, the object is gone.
    api.delete("c", &DeleteParams::default()).await.unwrap();
    let uid = g.uid().unwrap();
    let gone = await_condition(api.clone(), "c", conditions::is_deleted(&uid));
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .unwrap()
        .unwrap();
    wait_for("cleanup", || ctx.cleanups.load(Ordering::SeqCst) == 1).await;
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_owner_deletes_its_dependents() {
    let (_server, _client, api) = setup().await;
    let owner = api
        .create(&PostParams::default(), &gizmo("owner", 1))
        .await
        .unwrap();
    let mut child = gizmo("child", 1);
    child.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "test.marin3r.io/v1".into(),
            kind: "Gizmo".into(),
            name: "owner".into(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    let child = api.create(&PostParams::default(), &child).await.unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    let uid = child.uid().unwrap();
    let gone = await_condition(api.clone(), "child", conditions::is_deleted(&uid));
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .unwrap()
        .unwrap();
}
