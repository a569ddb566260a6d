//! Leader election under faults, against the real cluster's API server through a fault
//! proxy: a hung API server (Lease requests held) makes the leader step down before anyone
//! may take over, and a killed leader is replaced within a lease duration and a retry. "At no
//! instant two leaders act" is checked on the API writes the leaders make: ordered by the
//! server's resourceVersion, each leader's writes form one block, and a block never resumes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use marin3r_api_faults::FaultProxy;
use marin3r_controller::leader::{self, LeaderError, LeaseConfig};
use serde_json::json;

use marin3r_testkit::namespaces::{Namespaces, cluster};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "marin3r-operator";

/// Every write a leader made: (server resourceVersion, who, when the answer came back).
type Writes = Arc<Mutex<Vec<(u64, String, Instant)>>>;

fn config(ns: &str, identity: &str) -> LeaseConfig {
    let mut config = LeaseConfig::new(ns, LEASE, identity);
    config.lease_duration = Duration::from_secs(2);
    config.renew_deadline = Duration::from_millis(1200);
    config.retry_period = Duration::from_millis(200);
    config
}

/// A candidate whose work, while it leads, writes its name to a ConfigMap every 50 ms.
fn candidate(
    client: &Client,
    ns: &str,
    identity: &str,
    writes: &Writes,
) -> (CancellationToken, JoinHandle<Result<(), LeaderError>>) {
    let stop = CancellationToken::new();
    let work = {
        let (api, writes, me) = (
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            writes.clone(),
            identity.to_owned(),
        );
        async move {
            for n in 0u64.. {
                let patch = json!({"data": {"leader": me, "n": n.to_string()}});
                if let Ok(cm) = api
                    .patch("writes", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    let rv = cm.metadata.resource_version.unwrap().parse().unwrap();
                    writes
                        .lock()
                        .unwrap()
                        .push((rv, me.clone(), Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let task = tokio::spawn(leader::run_as_leader(
        client.clone(),
        config(ns, identity),
        stop.clone(),
        work,
    ));
    (stop, task)
}

/// The leaders in the order their writes reached the server, each block once; panics if a
/// leader wrote again after another had started writing.
fn leaders_in_order(writes: &Writes) -> Vec<String> {
    let mut writes = writes.lock().unwrap().clone();
    writes.sort_by_key(|(rv, _, _)| *rv);
    let mut blocks: Vec<String> = Vec::new();
    for (rv, who, _) in &writes {
        if blocks.last() != Some(who) {
            assert!(
                !blocks.contains(who),
                "{who} wrote again (resourceVersion {rv}) after another leader had acted: {blocks:?}"
            );
            blocks.push(who.clone());
        }
    }
    blocks
}

fn first_write_of(writes: &Writes, who: &str) -> Option<Instant> {
    let writes = writes.lock().unwrap();
    writes
        .iter()
        .find(|(_, w, _)| w == who)
        .map(|(_, _, at)| *at)
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    marin3r_testkit::wait::until(what, timeout, || std::future::ready(f().then_some(()))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_api_server_and_a_killed_leader_never_give_two_leaders() {
    let cluster = cluster();
    let admin = cluster.client().await.unwrap();
    let space = Namespaces::new(&cluster, &admin).await;
    let ns = space.create("leader", &[]).await;
    let ns = ns.as_str();
    // The candidates reach the API server through the proxy, which the test makes hang.
    let proxy = FaultProxy::start(cluster.config().await.unwrap())
        .await
        .unwrap();
    let client = proxy
        .endpoint("candidates")
        .await
        .unwrap()
        .client()
        .unwrap();
    let writes_cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("writes".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &writes_cm)
        .await
        .unwrap();

    let writes: Writes = Arc::default();
    let (_stop_a, task_a) = candidate(&client, ns, "a", &writes);
    wait_until("a to lead", Duration::from_secs(10), || {
        first_write_of(&writes, "a").is_some()
    })
    .await;
    let (_stop_b, task_b) = candidate(&client, ns, "b", &writes);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(leaders_in_order(&writes), ["a"], "b waits while a renews");

    // The API server hangs on Leases: a cannot renew, so it must stop acting within its
    // renew deadline, and b, which cannot read the Lease either, must not act meanwhile.
    let hung_at = Instant::now();
    proxy
        .faults()
        .delay_requests("leases", Some(Duration::from_secs(3)));
    let stepped_down = tokio::time::timeout(Duration::from_secs(5), task_a)
        .await
        .expect("a steps down while the API server hangs")
        .unwrap();
    assert!(
        matches!(stepped_down, Err(LeaderError::Lost(_))),
        "{stepped_down:?}"
    );
    let stepped_down_after = hung_at.elapsed();
    assert!(
        stepped_down_after < Duration::from_millis(1200 + 200 + 500),
        "a acted {stepped_down_after:?} after its last renewal was sent"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.faults().delay_requests("leases", None);
    let healed_at = Instant::now();
    wait_until("b to take over", Duration::from_secs(10), || {
        first_write_of(&writes, "b").is_some()
    })
    .await;
    let takeover = first_write_of(&writes, "b").unwrap() - healed_at;
    // Within a lease duration (b saw the record change when a's held renewal landed, at
    // most 3 s after it was sent) plus a retry.
    assert!(
        takeover < Duration::from_secs(3 + 2) + Duration::from_millis(200 + 500),
        "b took over {takeover:?} after the API server answered again"
    );
    assert_eq!(leaders_in_order(&writes), ["a", "b"]);

    // b is killed (no release): a new candidate takes over once the Lease has been seen
    // unchanged for a lease duration.
    task_b.abort();
    let killed_at = Instant::now();
    let (_stop_c, _task_c) = candidate(&client, ns, "c", &writes);
    wait_until("c to take over", Duration::from_secs(10), || {
        first_write_of(&writes, "c").is_some()
    })
    .await;
    let takeover = first_write_of(&writes, "c").unwrap() - killed_at;
    assert!(
        takeover < Duration::from_secs(2) + Duration::from_millis(200 + 500),
        "c took over {takeover:?} after b was killed"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leaders_in_order(&writes), ["a", "b", "c"]);
}
