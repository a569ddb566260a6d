//! The node's own faults on the real cluster (`hack/cluster restart`): the API server, etcd,
//! containerd and the kubelet, each stopped and started again while a request every 50 ms
//! goes through an injected sidecar. After each restart the EnvoyConfig still has the version
//! it had published, and the next update reaches Envoy; no request fails throughout. The
//! cluster is held alone: a restart disturbs every other scenario.

use std::time::{Duration, Instant};

use kube::{Api, ResourceExt};
use marin3r_api::envoy_config::{CacheState, EnvoyConfig};
use marin3r_e2e::demo::get;
use marin3r_e2e::real::{self, EXAMPLE_BODY, Scenario};
use marin3r_testkit::tools::repo_root;
use marin3r_testkit::wait::until;

const NODE_ID: &str = "demo-proxy";

fn restart(part: &str) {
    let out = std::process::Command::new(repo_root().join("hack/cluster"))
        .args(["restart", part])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hack/cluster restart {part} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The EnvoyConfig's published version, once it is in sync with its current spec (the status
/// is written after the proxies are served: an update seen through Envoy may not be in it
/// yet).
async fn published(configs: &Api<EnvoyConfig>) -> Option<String> {
    let ec = configs.get(NODE_ID).await.ok()?;
    let status = ec.status?;
    let version = status.published_version?;
    (status.cache_state == Some(CacheState::InSync) && version == ec.spec.version())
        .then_some(version)
}

#[tokio::test(flavor = "multi_thread")]
async fn restarts_of_the_api_server_etcd_containerd_and_the_kubelet_lose_nothing() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = Scenario::start_alone("faults", &[]).await.unwrap();
    if !scenario.cluster.is_local() {
        println!("not hack/cluster: its parts cannot be restarted from here; nothing to do");
        return;
    }
    let pod = scenario.serve_examples(EXAMPLE_BODY).await.unwrap();
    let url = format!("http://{}:8080/", real::pod_ip(&pod));
    until("the example's body", Duration::from_secs(60), || async {
        (get(&url).await.ok().flatten().as_deref() == Some(EXAMPLE_BODY)).then_some(())
    })
    .await;
    let configs: Api<EnvoyConfig> = Api::namespaced(scenario.client.clone(), &scenario.ns);
    step("the example served");

    let traffic = real::Traffic::start(&url);

    for (i, part) in ["kube-apiserver", "etcd", "containerd", "kubelet"]
        .into_iter()
        .enumerate()
    {
        let before = until("a published version", Duration::from_secs(60), || {
            published(&configs)
        })
        .await;
        tokio::task::spawn_blocking(move || restart(part))
            .await
            .unwrap();
        step(&format!("{part} restarted"));
        let after = until(
            &format!("the EnvoyConfig to be read back after the {part} restart"),
            Duration::from_secs(60),
            || published(&configs),
        )
        .await;
        assert_eq!(
            after, before,
            "the published version changed across the {part} restart"
        );

        let body = format!("served after the {part} restart ({i})");
        // The API server may still refuse for a moment after it answers /readyz.
        until(
            &format!("the update after the {part} restart to be applied"),
            Duration::from_secs(60),
            || async {
                scenario
                    .kubectl
                    .ok_with(
                        &["apply", "-f", "-"],
                        &real::example_config(&scenario.ns, &body).unwrap(),
                    )
                    .await
                    .ok()
            },
        )
        .await;
        until(
            &format!("the update after the {part} restart to be served"),
            Duration::from_secs(90),
            || async {
                (get(&url).await.ok().flatten().as_deref() == Some(body.as_str())).then_some(())
            },
        )
        .await;
        step(&format!("an update served after the {part} restart"));
    }

    let (answered, failed) = traffic.stop().await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} requests through the sidecar failed during the restarts: {failed:?}",
        failed.len(),
        answered as usize + failed.len()
    );
    assert!(answered >= 20, "only {answered} requests answered");
    // The pod was never restarted by any of it.
    let same =
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(scenario.client.clone(), &scenario.ns)
            .get(&pod.name_any())
            .await
            .unwrap();
    let restarts: i32 = same
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "a container of the pod restarted");
}
