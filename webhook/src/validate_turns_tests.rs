#![allow(clippy::unwrap_used)]

use super::*;

const API_SERVER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

fn turns(at_once: usize, per_namespace: usize, wait_ms: u64) -> Arc<Turns> {
    Arc::new(Turns::new(ValidationLimits {
        at_once,
        per_namespace,
        wait: Duration::from_millis(wait_ms),
    }))
}

/// Starts waiting for a turn and returns the task, which holds the turn for `hold`.
fn waiter(
    turns: &Arc<Turns>,
    addr: IpAddr,
    namespace: &'static str,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<(), Refused>> {
    let turns = Arc::clone(turns);
    tokio::spawn(async move {
        let turn = turns.take(addr, namespace).await?;
        tokio::time::sleep(hold).await;
        drop(turn);
        Ok(())
    })
}

#[tokio::test]
async fn a_flooding_namespace_is_refused_its_own_writes_and_another_gets_its_turn_at_once() {
    let turns = turns(4, 1, 300);
    let long = Duration::from_secs(60);
    // One judged, eight waiting: the namespace's whole queue.
    let flood: Vec<_> = (0..1 + QUEUED_PER_TURN)
        .map(|_| waiter(&turns, API_SERVER, "team-a", long))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = turns.take(API_SERVER, "team-a").await.unwrap_err();
    assert_eq!(
        refused,
        Refused::Namespace {
            namespace: "team-a".into(),
            judged: 1,
            queued: QUEUED_PER_TURN,
        }
    );
    assert!(
        refused
            .to_string()
            .contains("--webhook-max-validations-per-namespace")
    );
    // Another namespace from the same address, and the same name from another address.
    let started = tokio::time::Instant::now();
    let other = turns.take(API_SERVER, "team-b").await.unwrap();
    let spoofed = turns.take(OTHER, "team-a").await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(100));
    drop((other, spoofed));
    // The waiting ones are refused once they have waited their while.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut waited = 0;
    for task in flood {
        if task.is_finished() {
            assert!(matches!(task.await.unwrap(), Err(Refused::Waited { .. })));
            waited += 1;
        } else {
            task.abort();
        }
    }
    assert_eq!(waited, QUEUED_PER_TURN, "the judged one is still judged");
}

#[tokio::test]
async fn a_waiting_validation_gets_its_turn_when_one_ends() {
    let turns = turns(4, 1, 2_000);
    let first = waiter(&turns, API_SERVER, "team-a", Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = tokio::time::Instant::now();
    let second = turns.take(API_SERVER, "team-a").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    first.await.unwrap().unwrap();
    drop(second);
    assert_eq!(turns.namespaces(), 0, "no namespace is left behind");
}

#[tokio::test]
async fn every_namespace_together_has_a_bounded_number_judged_and_waiting() {
    let turns = turns(2, 1, 2_000);
    let long = Duration::from_secs(60);
    let names = [
        "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r",
    ];
    assert_eq!(names.len(), 2 * (1 + QUEUED_PER_TURN));
    let held: Vec<_> = names
        .iter()
        .map(|n| waiter(&turns, API_SERVER, n, long))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let refused = turns.take(API_SERVER, "s").await.unwrap_err();
    assert!(
        matches!(
            refused,
            Refused::Everyone {
                judged: 2,
                queued: 16
            }
        ),
        "{refused:?}"
    );
    for task in held {
        task.abort();
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(turns.namespaces(), 0);
    assert!(turns.take(API_SERVER, "s").await.is_ok());
}

#[test]
fn a_long_namespace_is_cut_in_the_message() {
    let long = "x".repeat(10_000);
    assert_eq!(shown(&long).len(), 63);
}
