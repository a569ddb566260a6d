//! The rollout guide (`docs/rollouts.md`), on the real cluster (`hack/cluster`) with marin3r
//! installed from `manifests/`: every command of the guide, in its order, word for word but
//! for the namespace (the test's own instead of `rollout`) and the image (the cluster's
//! python). Between them, what the guide says happens is checked: the good version reaches
//! one proxy, then all, and the client counts no failure; the broken version (every request
//! a 503) is rolled back by the health analysis within its step, its revision tainted
//! `FailedAnalysis`, and the client ends on the good version's answers.

use std::time::{Duration, Instant};

use kube::Api;
use marin3r_api::EnvoyConfig;
use marin3r_api::rollout::RolloutPhase;
use marin3r_e2e::real::Scenario;
use marin3r_testkit::commands::{self, Tools};
use marin3r_testkit::wait::until;

/// The guide's folder of examples and its namespace.
const GUIDE_EXAMPLES: &str = "docs/examples/rollout/";
const GUIDE_NS: &str = "rollout";
/// The one step's bake in the guide's config.
const BAKE: Duration = Duration::from_secs(30);

/// The guide's example `file` as it runs in the scenario's namespace `ns`.
fn guide_example(file: &str, ns: &str) -> String {
    marin3r_e2e::real::guide_example(GUIDE_EXAMPLES, GUIDE_NS, file, ns).unwrap()
}

/// Runs one of the guide's commands in the scenario's namespace, for at most `timeout`: an
/// `apply` of an example applies [`guide_example`], any other has its `-n rollout` turned
/// into the scenario's namespace. Its exit status and stdout.
async fn guide(s: &Scenario, command: &str, timeout: Duration) -> (bool, String) {
    if let Some(file) = command.strip_prefix(&format!("kubectl apply -f {GUIDE_EXAMPLES}")) {
        s.apply(&guide_example(file, &s.ns)).await.unwrap();
        return (true, String::new());
    }
    let here = command.replace(&format!(" -n {GUIDE_NS}"), &format!(" -n {}", s.ns));
    assert_ne!(here, command, "`{command}` runs in no namespace");
    let repo = marin3r_testkit::tools::repo_root();
    let marin3r = marin3r_testkit::image::marin3r_bin().unwrap();
    let tools = Tools {
        repo: &repo,
        kubectl: &s.kubectl,
        kubeconfig: s.cluster.kubeconfig(),
        marin3r: &marin3r,
    };
    let out = tools.output(&here, timeout).await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// A guide command that must succeed within 30 s (180 s for the waits); its output.
async fn ok(s: &Scenario, command: &str) -> String {
    let (success, out) = guide(s, command, Duration::from_secs(180)).await;
    assert!(success, "`{command}` failed:\n{out}");
    out
}

/// The client's lines so far (`ok=N failed=N last=...`).
async fn client_lines(s: &Scenario) -> Vec<String> {
    let out = s
        .kubectl
        .run(&["logs", "web-client", "-n", &s.ns])
        .await
        .unwrap();
    out.stdout.lines().map(str::to_owned).collect()
}

/// How many requests the client counted as failed over `lines`.
fn failed(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("failed=")))
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_guide_runs_as_written() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let s = Scenario::start("guide", &["python"]).await.unwrap();
    let mut commands = commands::ROLLOUT.iter().copied();
    let mut next = |expected: &str| {
        let command = commands.next().expect("more commands in the guide");
        assert_eq!(command, expected, "the guide's order");
        command
    };
    for command in [
        commands::ROLLOUT_APPLY_NAMESPACE,
        commands::ROLLOUT_APPLY_DISCOVERY_SERVICE,
        commands::ROLLOUT_WAIT_DISCOVERY_SERVICE,
        commands::ROLLOUT_APPLY_V1,
        commands::ROLLOUT_APPLY_WEB,
        commands::ROLLOUT_WAIT_WEB,
        commands::ROLLOUT_APPLY_CLIENT,
    ] {
        ok(&s, next(command)).await;
    }
    let logs = next(commands::ROLLOUT_CLIENT_LOGS);
    until(
        "the client answered by version one",
        Duration::from_secs(90),
        || async {
            // Fails while the client's container starts.
            let (_, out) = guide(&s, logs, Duration::from_secs(30)).await;
            out.trim_end()
                .ends_with("failed=0 last=web /hello")
                .then_some(())
        },
    )
    .await;
    step("set up: three proxies answer version one");

    // The good version: one canary, then all, no failure.
    let before = client_lines(&s).await.len();
    ok(&s, next(commands::ROLLOUT_APPLY_V2)).await;
    let configs: Api<EnvoyConfig> = Api::namespaced(s.client.clone(), &s.ns);
    let v2 = until("version two's step", Duration::from_secs(60), || async {
        let r = configs.get("web").await.ok()?.status?.rollout?;
        (r.phase == RolloutPhase::Progressing && r.canary.as_deref() == Some("1/3")).then_some(r)
    })
    .await;
    let status = ok(&s, next(commands::ROLLOUT_STATUS)).await;
    assert!(
        status.contains("Phase:   Progressing") && status.contains("Canary:  1/3 proxies"),
        "{status}"
    );
    let proxies = ok(&s, next(commands::ROLLOUT_PROXY_STATUS)).await;
    assert!(proxies.contains("TRACK"), "{proxies}");
    let watch = next(commands::ROLLOUT_WATCH);
    let (published, out) = guide(&s, watch, BAKE * 4).await;
    assert!(published, "version two was not published:\n{out}");
    let r = configs
        .get("web")
        .await
        .unwrap()
        .status
        .unwrap()
        .rollout
        .unwrap();
    assert_eq!(
        (r.version.as_str(), r.phase),
        (v2.version.as_str(), RolloutPhase::Completed)
    );
    let health = r.analysis.clone().unwrap_or_default();
    assert!(health.contains("healthy"), "the last analysis: {health}");
    until(
        "the client answered by version two",
        Duration::from_secs(30),
        || async {
            let lines = client_lines(&s).await;
            lines.last()?.ends_with("last=web /v2/hello").then_some(())
        },
    )
    .await;
    let lines = client_lines(&s).await;
    assert_eq!(failed(&lines[before..]), 0, "{:?}", &lines[before..]);
    step("version two: one canary, then all, no failed request");

    // The broken version: rolled back by the analysis within its step.
    let applied = Instant::now();
    ok(&s, next(commands::ROLLOUT_APPLY_BROKEN)).await;
    let watch = next(commands::ROLLOUT_WATCH);
    let (published, out) = guide(&s, watch, BAKE * 4).await;
    let took = applied.elapsed();
    assert!(!published, "the broken version was published:\n{out}");
    assert!(
        out.contains("Phase:   RolledBack")
            && out.contains("failed the health analysis")
            && out.contains("Health:  the canaries' 5xx responses are"),
        "{out}"
    );
    assert!(
        took < BAKE,
        "rolled back after {took:?}, not within the step's bake"
    );
    let history = ok(&s, next(commands::ROLLOUT_HISTORY)).await;
    assert!(
        history.contains("desired, tainted (FailedAnalysis)"),
        "{history}"
    );
    until(
        "the client answered by version two again",
        Duration::from_secs(30),
        || async {
            let lines = client_lines(&s).await;
            lines
                .last()?
                .ends_with("failed=0 last=web /v2/hello")
                .then_some(())
        },
    )
    .await;
    step(&format!("the broken version: rolled back after {took:?}"));

    // Back to version two: published at once, as it is what is served.
    ok(&s, next(commands::ROLLOUT_APPLY_V2)).await;
    until(
        "version two desired again",
        Duration::from_secs(30),
        || async {
            let status = configs.get("web").await.ok()?.status?;
            let r = status.rollout?;
            (r.version == v2.version
                && r.phase == RolloutPhase::Completed
                && status.published_version? == v2.version)
                .then_some(())
        },
    )
    .await;
    assert_eq!(commands.next(), None, "every command of the guide ran");
    step("back on version two");
}
