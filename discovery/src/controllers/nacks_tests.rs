use std::sync::Mutex;
use std::time::Duration;

use super::*;
use marin3r_xds::resource::ResourceType;

fn mk_nack(namespace: &str, rejecting: usize, connected: usize) -> NackEvent {
    NackEvent {
        namespace: namespace.into(),
        node_id: "node".into(),
        pod_name: None,
        resource_type: ResourceType::Listener,
        type_url: ResourceType::Listener.type_url().into(),
        version: "v2".into(),
        message: "bad".into(),
        rejecting,
        connected,
    }
}

#[test]
fn thresholds() {
    let all = TaintThreshold::default();
    assert!(all.reached(1, 1));
    assert!(!all.reached(1, 2));
    assert!(all.reached(2, 2));
    assert!(all.reached(1, 0), "a proxy gone since still counts");
    let half = TaintThreshold::percent(50).unwrap();
    assert!(half.reached(1, 2));
    assert!(!half.reached(1, 3));
    assert!(half.reached(usize::MAX, usize::MAX));
    assert!(TaintThreshold::percent(0).is_err());
    assert!(TaintThreshold::percent(101).unwrap_err().contains("101"));
}

fn mk_report(replica: &str, rejecting: u32, connected: u32, secs_ago: i64) -> NackReport {
    NackReport {
        replica: replica.into(),
        connected_proxies: connected,
        rejecting_proxies: rejecting,
        resource_type: "listeners".into(),
        version: "v2".into(),
        message: if rejecting > 0 {
            format!("bad on {replica}")
        } else {
            String::new()
        },
        proxy_pod: None,
        reported_at: Time(at(secs_ago)),
    }
}

fn at(secs_ago: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 - secs_ago).unwrap()
}

fn names(n: &[&str]) -> BTreeSet<String> {
    n.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_reports_of_every_live_replica_are_summed() {
    let all = TaintThreshold::default();
    let now = at(0);
    let live = names(&["a", "b"]);
    // One proxy per replica; only a's rejected: 1 of 2, below 100%.
    let reports = [mk_report("a", 1, 1, 2), mk_report("b", 0, 1, 1)];
    assert_eq!(
        decide(&reports, Some(&live), now, all),
        Decision::Below {
            rejecting: 1,
            connected: 2
        }
    );
    // Both rejected: taint, with a rejecting replica's message.
    let reports = [mk_report("a", 1, 1, 2), mk_report("b", 1, 1, 1)];
    let Decision::Taint { message } = decide(&reports, Some(&live), now, all) else {
        panic!("not tainted")
    };
    assert!(message.contains("2 of 2 connected proxies"), "{message}");
    assert!(message.contains("over 2 discovery replica(s)"), "{message}");
    assert!(message.contains("bad on"), "{message}");
    // At 50%, a's alone is enough once b answered.
    let half = TaintThreshold::percent(50).unwrap();
    let reports = [mk_report("a", 1, 1, 2), mk_report("b", 0, 1, 1)];
    assert!(matches!(
        decide(&reports, Some(&live), now, half),
        Decision::Taint { .. }
    ));
}

#[test]
fn the_leader_waits_for_live_replicas_to_answer_then_decides_without_them() {
    let all = TaintThreshold::default();
    let live = names(&["a", "b"]);
    // b has not answered: 1 of 1 would taint, but b may have proxies that accepted.
    let reports = [mk_report("a", 1, 1, 2)];
    assert_eq!(
        decide(&reports, Some(&live), at(0), all),
        Decision::Wait(ANSWER_WAIT - Duration::from_secs(2))
    );
    // Past the wait, what was reported decides.
    let reports = [mk_report("a", 1, 1, 6)];
    assert!(matches!(
        decide(&reports, Some(&live), at(0), all),
        Decision::Taint { .. }
    ));
    // Without a list of pods (one replica), no wait.
    let reports = [mk_report("a", 1, 1, 0)];
    assert!(matches!(
        decide(&reports, None, at(0), all),
        Decision::Taint { .. }
    ));
}

#[test]
fn reports_of_gone_or_stale_replicas_are_ignored() {
    let all = TaintThreshold::default();
    // c's pod is gone: its 0-of-5 does not hold the taint back.
    let reports = [mk_report("a", 1, 1, 1), mk_report("c", 0, 5, 1)];
    let live = names(&["a"]);
    assert!(matches!(
        decide(&reports, Some(&live), at(0), all),
        Decision::Taint { .. }
    ));
    // A stale rejection alone is nothing; a stale acceptance does not dilute.
    let old = REPORT_LIFETIME.as_secs() as i64 + 1;
    let reports = [mk_report("a", 1, 1, old)];
    assert_eq!(decide(&reports, None, at(0), all), Decision::Nothing);
    let reports = [mk_report("a", 1, 1, 0), mk_report("b", 0, 9, old)];
    assert!(matches!(
        decide(&reports, None, at(0), all),
        Decision::Taint { .. }
    ));
    // Reports that count no rejection: nothing to decide.
    let reports = [mk_report("a", 0, 1, 0)];
    assert_eq!(decide(&reports, None, at(0), all), Decision::Nothing);
    // A report from the future (another replica's clock ahead) counts as fresh.
    let reports = [mk_report("a", 1, 1, -30)];
    assert!(matches!(
        decide(&reports, None, at(0), all),
        Decision::Taint { .. }
    ));
}

#[tokio::test]
async fn a_stuck_namespace_does_not_delay_or_drop_another() {
    let (tx, rx) = mpsc::channel(1024);
    let handled = Arc::new(Mutex::new(Vec::new()));
    let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handle = {
        let handled = handled.clone();
        move |nack: NackEvent| {
            let handled = handled.clone();
            async move {
                if nack.namespace == "stuck" {
                    // An API write that never returns.
                    std::future::pending::<()>().await;
                }
                handled.lock().unwrap().push(nack.namespace);
            }
        }
    };
    let on_drop = {
        let dropped = dropped.clone();
        move || {
            dropped.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(dispatch(
        rx,
        |n: &NackEvent| TaintThreshold::default().reached(n.rejecting, n.connected),
        handle,
        on_drop,
        stop.clone().cancelled_owned(),
    ));
    // A flood from one namespace, more than its queue holds...
    for _ in 0..500 {
        tx.send(mk_nack("stuck", 1, 1)).await.unwrap();
    }
    // ...one NACK below the threshold elsewhere, and one that taints.
    tx.send(mk_nack("calm", 1, 2)).await.unwrap();
    tx.send(mk_nack("calm", 2, 2)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while handled.lock().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "calm was never handled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        *handled.lock().unwrap(),
        ["calm"],
        "only the one over the threshold"
    );
    // The stuck namespace's overflow was dropped, and only its own.
    assert_eq!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        500 - PER_NAMESPACE_QUEUE - 1
    );
    stop.cancel();
    task.await.unwrap();
}

/// A report carries the count when it is written: three proxies rejecting at once, whose
/// events came 1, 3, 2 of 3, leave 3 of 3 as the last word, not 2.
#[test]
fn a_report_carries_the_count_when_written_not_when_the_nack_came() {
    let threshold = TaintThreshold::default();
    let now = (3, 3);
    let written: Vec<(usize, usize)> = [(1, 3), (3, 3), (2, 3)]
        .into_iter()
        .map(|event| counted(now, event))
        .collect();
    let last_written = written[2];
    assert!(threshold.reached(last_written.0, last_written.1));
    // A proxy that rejected and has gone since still counts, as its event said.
    assert_eq!(counted((0, 2), (1, 3)), (1, 3));
}

/// The leader of discovery service `discovery_service`, its API on a closed loopback port:
/// any read or write it tries fails. Its Namespace watch has not listed yet.
fn unlisted_leader_of(discovery_service: &str) -> Context {
    let url = "http://127.0.0.1:1".parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
    let config = super::super::Config {
        discovery_service: Some(discovery_service.into()),
        replica: format!("{discovery_service}-0"),
        ..Default::default()
    };
    Context {
        events: marin3r_controller::Events::new(client.clone(), super::super::FIELD_MANAGER),
        index: super::super::Indexes::new(&config),
        client,
        metrics: config.metrics.clone(),
        config,
        publisher: super::super::publisher::Publisher::new(marin3r_xds::Cache::new()),
        attempted: Default::default(),
        verdicts: Default::default(),
        traffic: Default::default(),
    }
}

/// [`unlisted_leader_of`] once its Namespace watch has listed the namespaces `labelled`
/// (name, discovery service label).
fn leader_of(discovery_service: &str, labelled: &[(&str, &str)]) -> Arc<Context> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::runtime::watcher::Event;
    let ctx = unlisted_leader_of(discovery_service);
    let mut events = vec![Event::Init];
    for (name, label) in labelled {
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {
            "name": name,
            "labels": {marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL: label},
        }}))
        .unwrap();
        events.push(Event::InitApply(ns));
    }
    events.push(Event::InitDone);
    ctx.index.namespaces.as_ref().unwrap().feed(events);
    Arc::new(ctx)
}

/// A revision of `namespace` that its node's only proxy, on replica `replica`, has just
/// rejected.
fn rejected_revision(namespace: &str, replica: &str) -> Arc<EnvoyConfigRevision> {
    let mut report = mk_report(replica, 1, 1, 0);
    report.reported_at = super::super::now();
    let revision: EnvoyConfigRevision = serde_json::from_value(serde_json::json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfigRevision",
        "metadata": {"name": "node-v2", "namespace": namespace, "resourceVersion": "7"},
        "spec": {"nodeID": "node", "version": "v2"},
        "status": {"published": true, "nackReports": [report]},
    }))
    .unwrap();
    Arc::new(revision)
}

/// Every discovery service's leader watches revisions cluster-wide, but only decides on those
/// of the namespaces it serves: another service's leader (here one of a single replica, which
/// has no list of pods to wait for) would taint a revision of this one on the first replica's
/// report, "1 of 1 connected proxies, over 1 discovery replica(s)", before the others answer.
#[tokio::test]
async fn the_leader_decides_only_on_revisions_of_namespaces_it_serves() {
    let other = leader_of("other", &[("shop", "mine"), ("lab", "other")]);
    // Not its namespace: left alone, the API not even asked (it is unreachable).
    let theirs = rejected_revision("shop", "mine-replica-a");
    let action = reconcile(theirs, Arc::clone(&other)).await;
    assert!(action.is_ok(), "{action:?}");
    assert_eq!(other.metrics.taints.get(), 0);
    // Its own namespace's revision is decided: 1 of 1 taints, whose write fails here.
    let own = rejected_revision("lab", "other-replica-a");
    let action = reconcile(own, Arc::clone(&other)).await;
    assert!(action.is_err(), "{action:?}");
}

/// A leader on its way out whose Namespace watch ended before it had listed cannot know which
/// namespaces it serves: it decides on none (the service that serves them decides), rather
/// than on every one, which would taint another service's revision on its replica's first
/// report.
#[tokio::test]
async fn a_leader_that_cannot_know_what_it_serves_decides_on_nothing() {
    let ctx = Arc::new(unlisted_leader_of("leaving"));
    ctx.index.namespaces.as_ref().unwrap().close();
    for namespace in ["shop", "lab"] {
        let revision = rejected_revision(namespace, "mine-replica-a");
        let action = reconcile(revision, Arc::clone(&ctx)).await;
        assert!(action.is_ok(), "{action:?}");
    }
    assert_eq!(ctx.metrics.taints.get(), 0);
    // What it has loaded, it keeps serving until it is gone.
    assert!(ctx.serves("shop").await.unwrap());
}
