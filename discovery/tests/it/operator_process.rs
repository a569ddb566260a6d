//! The `marin3r operator` process as the binary runs it (its controllers are the operator
//! crate's, tested there in-process): the addresses it serves its probes and metrics on.

use std::future::Future;
use std::time::Duration;

use marin3r_testkit::namespaces::{Namespaces, cluster};

/// Polls `f` until it returns `Some`, failing with `what` after 30 s.
async fn wait_for<T, Fut: Future<Output = Option<T>>>(what: &str, f: impl FnMut() -> Fut) -> T {
    marin3r_testkit::wait::until(what, Duration::from_secs(30), f).await
}

/// The `marin3r operator` process serves `/healthz` (its probes) and `/metrics` on both IP
/// families from `[::]`, its default, so an IPv6-only cluster's kubelet reaches it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_process_answers_over_ipv4_and_ipv6() {
    let cluster = cluster();
    // Two operators on one cluster would fight over every DiscoveryService: the in-cluster one
    // is stopped meanwhile, as for the operator crate's own tests.
    let _stopped = marin3r_testkit::namespaces::operator_stopped(&cluster).await;
    let client = cluster.client().await.unwrap();
    let space = Namespaces::holding(&cluster, &client, None).await;
    let ops = space.create("ops", &[]).await;
    let ops = ops.as_str();
    let kubeconfig = space.kubeconfig();
    let marin3r = env!("CARGO_BIN_EXE_marin3r");
    let help = std::process::Command::new(marin3r)
        .args(["operator", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("[default: [::]:8383]"), "{help}");
    let port = std::net::TcpListener::bind("[::]:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new(marin3r)
        .args([
            "operator",
            "--no-leader-election",
            "--trusted-namespace",
            ops,
        ])
        .args(["--metrics-addr", &format!("[::]:{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", ops)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for host in ["127.0.0.1", "[::1]"] {
        let url = format!("http://{host}:{port}/healthz");
        let body = wait_for(&format!("the operator's {url}"), || async {
            let url = url.clone();
            tokio::task::spawn_blocking(move || {
                ureq::get(&url)
                    .call()
                    .ok()?
                    .into_body()
                    .read_to_string()
                    .ok()
            })
            .await
            .unwrap()
        })
        .await;
        assert_eq!(body, "ok\n", "{host}");
    }
    drop(child);
}
