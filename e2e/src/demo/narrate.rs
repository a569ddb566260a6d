//! The demo's voice: each step prints what it waits for, then how long it took or why it
//! failed; `wait_for` polls a condition until it holds or the step's deadline passes.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::anyhow;

/// Records every step's outcome so the demo can say at the end whether all succeeded.
#[derive(Debug, Default)]
pub struct Narrator {
    started: Option<Instant>,
    pub failed: Vec<String>,
    pub passed: usize,
}

impl Narrator {
    pub fn new() -> Self {
        Self {
            started: Some(Instant::now()),
            ..Self::default()
        }
    }

    fn since_start(&self) -> f64 {
        self.started.map_or(0.0, |s| s.elapsed().as_secs_f64())
    }

    /// Runs one step, printing its title, then `ok` with its duration and what it returned,
    /// or the error. Returns the value, or `None` after a failure (already printed).
    pub async fn step<T, F>(&mut self, title: &str, run: F) -> Option<T>
    where
        F: Future<Output = anyhow::Result<(T, String)>>,
    {
        println!("[{:6.1}s] {title} ...", self.since_start());
        let begun = Instant::now();
        match run.await {
            Ok((value, detail)) => {
                let took = begun.elapsed().as_secs_f64();
                if detail.is_empty() {
                    println!("          ok ({took:.1}s)");
                } else {
                    println!("          ok ({took:.1}s): {detail}");
                }
                self.passed += 1;
                Some(value)
            }
            Err(err) => {
                println!("          FAILED: {err:#}");
                self.failed.push(format!("{title}: {err:#}"));
                None
            }
        }
    }

    /// Indented extra output (a command's answer) under the current step.
    pub fn show(text: &str) {
        for line in text.lines() {
            println!("            {line}");
        }
    }
}

/// Polls `check` every 200 ms until it returns `Ok(Some(_))` or `timeout` passes; the
/// error names what was awaited and the last thing `check` saw.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    marin3r_testkit::wait::poll(timeout, Duration::from_millis(200), check)
        .await
        .map_err(|t| {
            let last = t
                .last
                .map_or_else(|| "nothing yet".into(), |e| format!("{e:#}"));
            anyhow!("{what}: not within {}s (last: {last})", timeout.as_secs())
        })
}

#[cfg(test)]
mod tests {
    use anyhow::bail;

    use super::*;

    #[tokio::test]
    async fn a_failed_step_is_recorded_and_later_steps_still_run() {
        let mut n = Narrator::new();
        let a: Option<()> = n.step("first", async { bail!("boom") }).await;
        let b = n.step("second", async { Ok((7, String::new())) }).await;
        assert_eq!(a, None);
        assert_eq!(b, Some(7));
        assert_eq!(n.passed, 1);
        assert_eq!(n.failed, ["first: boom"]);
    }

    #[tokio::test]
    async fn wait_for_reports_what_it_last_saw() {
        let err = wait_for::<(), _, _>("the thing", Duration::from_millis(300), || async {
            bail!("still 503")
        })
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the thing: not within 0s (last: still 503)"
        );
        let mut calls = 0;
        let v = wait_for("a count", Duration::from_secs(5), || {
            calls += 1;
            let c = calls;
            async move { Ok((c >= 3).then_some(c)) }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
    }
}
