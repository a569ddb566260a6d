//! Watch semantics kube-rs and kubectl rely on, seen through raw watches: selector
//! transitions as ADDED/DELETED, bookmarks, timeouts, no event for a no-op write, and the
//! fault switches (dropped watches, injected error codes).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use marin3r_local_cluster::apiserver::{ApiServer, ApiServerConfig, FaultScope};
use serde_json::json;

async fn setup(bookmarks: Duration) -> (ApiServer, Api<ConfigMap>, Api<Namespace>) {
    let config = ApiServerConfig {
        bookmark_interval: bookmarks,
        ..ApiServerConfig::default()
    };
    let server = ApiServer::start(config).await.unwrap();
    let client = server.kube_client().await.unwrap();
    let ns = format!("w-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .unwrap();
    (server, Api::namespaced(client, &ns), nss)
}

fn cm(name: &str, color: &str) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"color": color}}, "data": {"k": "v"}}),
    )
    .unwrap()
}

fn describe(e: &WatchEvent<ConfigMap>) -> String {
    match e {
        WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.clone().unwrap()),
        WatchEvent::Bookmark(_) => "BOOKMARK".into(),
        WatchEvent::Error(s) => format!("ERROR {}", s.code),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_watches_see_objects_start_and_stop_matching() {
    let (_server, api, _) = setup(Duration::from_secs(60)).await;
    api.create(&PostParams::default(), &cm("a", "red"))
        .await
        .unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("color=blue"), &rv)
        .await
        .unwrap()
        .boxed();
    let mut next = async || {
        describe(
            &tokio::time::timeout(Duration::from_secs(5), stream.try_next())
                .await
                .unwrap()
                .unwrap()
                .unwrap(),
        )
    };

    let paint = |c: &str| Patch::Merge(json!({"metadata": {"labels": {"color": c}}}));
    api.patch("a", &PatchParams::default(), &paint("blue"))
        .await
        .unwrap();
    assert_eq!(next().await, "ADDED a");
    // A no-op write produces no event and no new version.
    let before = api.get("a").await.unwrap().metadata.resource_version;
    let after = api
        .patch("a", &PatchParams::default(), &paint("blue"))
        .await
        .unwrap()
        .metadata
        .resource_version;
    assert_eq!(before, after);
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "w"}})),
    )
    .await
    .unwrap();
    assert_eq!(next().await, "MODIFIED a");
    api.patch("a", &PatchParams::default(), &paint("green"))
        .await
        .unwrap();
    assert_eq!(next().await, "DELETED a");
    api.create(&PostParams::default(), &cm("b", "blue"))
        .await
        .unwrap();
    assert_eq!(next().await, "ADDED b");
    api.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(next().await, "DELETED b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_replay_bookmarks_and_timeouts() {
    let (_server, api, _) = setup(Duration::from_millis(200)).await;
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("x", "red"))
        .await
        .unwrap();
    api.delete("x", &DeleteParams::default()).await.unwrap();
    // Everything after `rv` is replayed, in order, then bookmarks flow while idle.
    let params = WatchParams::default().timeout(2);
    let events: Vec<String> = api
        .watch(&params, &rv)
        .await
        .unwrap()
        .map(|e| describe(&e.unwrap()))
        .collect()
        .await;
    assert_eq!(events[..2], ["ADDED x", "DELETED x"], "{events:?}");
    assert!(
        events[2..].iter().all(|e| e == "BOOKMARK") && events.len() > 3,
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_can_target_writes_and_one_client() {
    let (server, api, _) = setup(Duration::from_secs(60)).await;
    let faults = server.faults();
    // A conflict for writes only: reads pass, the next write takes it.
    faults.fail_next(1, 409, FaultScope::Write);
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        matches!(api.create(&PostParams::default(), &cm("a", "red")).await, Err(kube::Error::Api(s)) if s.code == 409)
    );
    api.create(&PostParams::default(), &cm("a", "red"))
        .await
        .unwrap();
    // Errors for the pods' service accounts spare this client (the cluster's admin)...
    faults.fail_next_for(2, 500, FaultScope::Any, "system:serviceaccount:");
    api.list(&ListParams::default()).await.unwrap();
    api.get("a").await.unwrap();
    assert_eq!(faults.pending(), 2);
    // ...and errors for it hit it.
    faults.fail_next_for(1, 500, FaultScope::Any, "local-cluster-admin");
    assert!(matches!(api.get("a").await, Err(kube::Error::Api(s)) if s.code == 500));
    assert_eq!(faults.pending(), 2);
    assert_eq!(
        faults.served(),
        std::collections::BTreeMap::from([(409, 1), (500, 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_and_dropped_watches() {
    let (server, api, nss) = setup(Duration::from_secs(60)).await;
    server.faults().fail_next(2, 500, FaultScope::Any);
    assert!(
        matches!(api.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 500)
    );
    assert!(matches!(api.get_opt("a").await, Err(kube::Error::Api(s)) if s.code == 500));
    api.list(&ListParams::default()).await.unwrap();
    server.faults().fail_next(1, 409, FaultScope::Any);
    assert!(
        matches!(api.create(&PostParams::default(), &cm("c", "red")).await, Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "Conflict")
    );

    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    server.faults().drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap();
    assert!(end.is_none(), "the watch should have ended, got {end:?}");

    // Deleting a namespace deletes what is in it, then the namespace itself.
    api.create(&PostParams::default(), &cm("d", "red"))
        .await
        .unwrap();
    let ns = api.namespace().unwrap().to_owned();
    nss.delete(&ns, &DeleteParams::default()).await.unwrap();
    let gone =
        kube::runtime::wait::await_condition(nss.clone(), &ns, |n: Option<&Namespace>| n.is_none());
    tokio::time::timeout(Duration::from_secs(5), gone)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(api.get("d").await, Err(kube::Error::Api(s)) if s.code == 404));
}
