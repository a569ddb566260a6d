//! Waiting until something holds: the one polling loop behind the tests' `until` helpers and
//! the demo's steps. A check answers `Some(value)` when it holds; a test that waits too long
//! fails naming what it waited for.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a check is repeated.
pub const INTERVAL: Duration = Duration::from_millis(50);

/// What a check last said when the time ran out.
#[derive(Debug)]
pub struct TimedOut<E> {
    pub after: Duration,
    /// The check's last error, if its last answer was one.
    pub last: Option<E>,
}

/// Repeats `check` every `interval` until it answers `Ok(Some(_))` or `timeout` passes (the
/// check runs at least once, and once more at the deadline).
pub async fn poll<T, E, Fut>(
    timeout: Duration,
    interval: Duration,
    mut check: impl FnMut() -> Fut,
) -> Result<T, TimedOut<E>>
where
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(e) => Some(e),
        };
        let after = start.elapsed();
        if after >= timeout {
            return Err(TimedOut { after, last });
        }
        tokio::time::sleep(interval.min(timeout.saturating_sub(after))).await;
    }
}

/// Waits until the async `check` answers `Some`; a timeout fails the test, naming `what`.
#[expect(
    clippy::panic,
    reason = "a test helper: timing out is the test's failure"
)]
pub async fn until<T, Fut>(what: &str, timeout: Duration, mut check: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let checked = poll(timeout, INTERVAL, || {
        let answer = check();
        async move { Ok::<_, std::convert::Infallible>(answer.await) }
    });
    match checked.await {
        Ok(value) => value,
        Err(t) => panic!("timed out waiting for {what} (after {:?})", t.after),
    }
}

/// Waits until the plain `check` answers `Some`, blocking the thread; for tests without a
/// runtime. A timeout fails the test, naming `what`.
#[expect(
    clippy::panic,
    reason = "a test helper: timing out is the test's failure"
)]
pub fn until_sync<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        if start.elapsed() >= timeout {
            panic!("timed out waiting for {what} (after {:?})", start.elapsed());
        }
        std::thread::sleep(INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[tokio::test]
    async fn poll_returns_the_first_value_and_reports_the_last_error() {
        let mut n = 0;
        let v = poll(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            std::future::ready(Ok::<_, String>((n == 3).then_some(n)))
        })
        .await
        .unwrap();
        assert_eq!(v, 3);

        let mut n = 0;
        let t = poll(Duration::from_millis(30), Duration::from_millis(5), || {
            n += 1;
            std::future::ready(Err::<Option<()>, _>(format!("try {n}")))
        })
        .await
        .unwrap_err();
        assert!(t.after >= Duration::from_millis(30));
        assert_eq!(t.last, Some(format!("try {n}")));
        assert!(
            n >= 2,
            "checked at the start and again at the deadline: {n}"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "timed out waiting for the impossible")]
    async fn until_fails_naming_what_it_waited_for() {
        until("the impossible", Duration::from_millis(20), || async {
            None::<()>
        })
        .await;
    }

    #[test]
    #[should_panic(expected = "timed out waiting for nothing")]
    fn until_sync_fails_naming_what_it_waited_for() {
        until_sync("nothing", Duration::from_millis(20), || None::<()>);
    }
}
