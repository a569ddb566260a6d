//! `marin3r rollout history` and `marin3r rollout diff` (the built binary) on the real cluster
//! (`hack/cluster`), marin3r installed from `manifests/`: an EnvoyConfig served to an injected
//! sidecar, then changed so that the real Envoy rejects the new listener (an address no pod
//! has). The history shows the first revision published again and the second desired and
//! tainted, with Envoy's reason; the diff between them names the cluster removed, the cluster
//! added and the listener changed, with a unified diff of the listener (a terminal escape in
//! it printed escaped), and exits 1; a
//! revision against itself exits 0; a version or an EnvoyConfig that does not exist is an
//! error that names it (`diff` exits 2 then, as `diff` and `kubectl diff` do).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use marin3r_api::EnvoyConfig;
use marin3r_api::envoy_config::CacheState;
use marin3r_e2e::real;
use marin3r_e2e::rejected::NO_POD_ADDRESS;
use marin3r_testkit::wait::until;

/// A listener on `address` answering `body`, and a static cluster named `cluster`.
fn envoy_config(address: &str, body: &str, cluster: &str) -> String {
    format!(
        r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {{name: web}}
spec:
  nodeID: web
  resources:
    - type: cluster
      value:
        name: {cluster}
        connect_timeout: 1s
        type: STATIC
        load_assignment:
          cluster_name: {cluster}
          endpoints:
            - lb_endpoints:
                - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 9}}}}}}
    - type: listener
      value:
        name: http
        address: {{socket_address: {{address: {address}, port_value: 8080}}}}
        filter_chains:
          - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: http
                    virtual_hosts:
                      - name: web
                        domains: ["*"]
                        routes:
                          - match: {{prefix: "/"}}
                            direct_response: {{status: 200, body: {{inline_string: "{body}"}}}}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// `marin3r rollout ARGS...` with the test's kubeconfig: exit code, stdout, stderr. What it
/// prints for people shows no Rust Debug formatting.
async fn rollout(kubeconfig: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    let out = tokio::process::Command::new(marin3r)
        .arg("rollout")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if !args.contains(&"-o") {
        for text in [&stdout, &stderr] {
            let line = marin3r_testkit::readable::debug_line(text);
            assert_eq!(
                line, None,
                "rollout {args:?} printed Debug formatting:\n{text}"
            );
        }
    }
    (out.status.code(), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn history_and_diff_show_a_rejected_change_and_what_it_changed() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("rollout", &["python"]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.clone());
    let kubeconfig = scenario.cluster.kubeconfig().to_owned();
    scenario.apply(real::DISCOVERY_SERVICE).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    scenario
        .apply(&envoy_config("0.0.0.0", "one", "backend"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &real::idle_injected_pod("web", "web").unwrap(),
    )
    .await
    .unwrap();
    until("the pod Ready", Duration::from_secs(120), || async {
        marin3r_e2e::demo::ready_ip(&pods.get("web").await.ok()?)
    })
    .await;
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &ns);
    let state = || async {
        let status = configs.get("web").await.ok()?.status?;
        Some((status.cache_state?, status.desired_version?))
    };
    let (_, first) = until(
        "the first version InSync",
        Duration::from_secs(90),
        || async { state().await.filter(|(s, _)| *s == CacheState::InSync) },
    )
    .await;
    step("first version served");

    // The listener moved where no pod can bind and the cluster renamed: Envoy rejects the
    // listener, the revision is tainted and the first one published again.
    scenario
        .apply(&envoy_config(NO_POD_ADDRESS, "two\\e[31m", "backend-v2"))
        .await
        .unwrap();
    let (_, second) = until("Rollback", Duration::from_secs(90), || async {
        state()
            .await
            .filter(|(s, v)| *s == CacheState::Rollback && *v != first)
    })
    .await;
    step("second version rejected, first published");

    let (code, table, err) = rollout(&kubeconfig, &["history", "-n", &ns, "web"]).await;
    assert_eq!(code, Some(0), "{table}{err}");
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(
        rows[0].starts_with("VERSION") && rows[0].ends_with("STATE"),
        "{table}"
    );
    assert!(
        rows[1].starts_with(&first) && rows[1].ends_with("published"),
        "{table}"
    );
    assert!(
        rows[2].starts_with(&second) && rows[2].contains("desired, tainted (RejectedByEnvoy)"),
        "{table}"
    );
    let (code, json_out, err) =
        rollout(&kubeconfig, &["history", "-n", &ns, "web", "-o", "json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_str(&json_out).expect("-o json parses");
    assert_eq!(doc["envoyConfig"], format!("{ns}/web"));
    assert_eq!(doc["publishedVersion"], first.as_str());
    assert_eq!(doc["revisions"][1]["tainted"], true);
    assert_eq!(doc["revisions"][1]["revision"], format!("web-{second}"));
    step("history read");

    // By default: the published revision against the one before it; there is none.
    let (code, _, err) = rollout(&kubeconfig, &["diff", "-n", &ns, "web"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is the first") && err.contains("--from"),
        "{err}"
    );

    let (code, diff, err) = rollout(
        &kubeconfig,
        &["diff", "-n", &ns, "web", "--from", &first, "--to", &second],
    )
    .await;
    assert_eq!(code, Some(1), "{diff}{err}");
    assert!(diff.contains("  removed: clusters/backend\n"), "{diff}");
    assert!(diff.contains("  added: clusters/backend-v2\n"), "{diff}");
    assert!(diff.contains("  changed: listeners/http\n"), "{diff}");
    assert!(
        diff.lines()
            .any(|l| l.starts_with('-') && l.contains("0.0.0.0")),
        "{diff}"
    );
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains(NO_POD_ADDRESS)),
        "{diff}"
    );
    // The new body holds a terminal escape: printed escaped, never as itself.
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains("\"two\\u001b[31m\"")),
        "{diff}"
    );
    assert!(!diff.contains('\u{1b}'), "{diff}");

    let (code, same, err) = rollout(
        &kubeconfig,
        &["diff", "-n", &ns, "web", "--from", &second, "--to", &second],
    )
    .await;
    assert_eq!(code, Some(0), "{same}{err}");
    assert!(
        same.contains("No difference: the 2 resource(s) are alike."),
        "{same}"
    );

    let (code, _, err) = rollout(&kubeconfig, &["diff", "-n", &ns, "web", "--from", "nope"]).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no revision of version nope") && err.contains(&first),
        "{err}"
    );
    let (code, _, err) = rollout(&kubeconfig, &["history", "-n", &ns, "absent"]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!("no EnvoyConfig {ns}/absent")),
        "{err}"
    );
    step("diffs read");
}

/// An EnvoyConfig with a rollout strategy (`rollout: {}`, the guard's defaults), `clusters`
/// and a listener answering `body`.
fn guarded_config(clusters: &[&str], body: &str) -> String {
    let clusters: String = clusters
        .iter()
        .map(|c| {
            format!(
                "    - type: cluster\n      value: {{name: {c}, connect_timeout: 1s, type: STATIC, \
                 load_assignment: {{cluster_name: {c}, endpoints: [{{lb_endpoints: [{{endpoint: \
                 {{address: {{socket_address: {{address: 127.0.0.1, port_value: 9}}}}}}}}]}}]}}}}\n"
            )
        })
        .collect();
    let base = envoy_config("0.0.0.0", body, "unused");
    let (head, listener) = base
        .split_once("    - type: listener")
        .expect("the config has a listener");
    let head = head
        .split_once("  resources:\n")
        .expect("the config has resources")
        .0;
    format!("{head}  rollout: {{}}\n  resources:\n{clusters}    - type: listener{listener}")
}

/// The clusters the sidecar of `pod` has, as its Envoy reports them (`/clusters`), without
/// the sidecar's own.
async fn sidecar_clusters(scenario: &real::Scenario, pod: &str) -> Option<Vec<String>> {
    let text = scenario.envoy_admin(pod, "/clusters").await.ok()?;
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once("::").map(|(name, _)| name.to_owned()))
        .filter(|n| n.starts_with("c-"))
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_removing_most_clusters_waits_for_approval_then_is_published() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::ListParams;
    use marin3r_api::rollout::RolloutPhase;

    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("guard", &["python"]).await.unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.clone());
    let kubeconfig = scenario.cluster.kubeconfig().to_owned();
    scenario.apply(real::DISCOVERY_SERVICE).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    let all = ["c-a", "c-b", "c-c", "c-d", "c-e"];
    scenario.apply(&guarded_config(&all, "one")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &real::idle_injected_pod("web", "web").unwrap(),
    )
    .await
    .unwrap();
    until("the pod Ready", Duration::from_secs(120), || async {
        marin3r_e2e::demo::ready_ip(&pods.get("web").await.ok()?)
    })
    .await;
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &ns);
    let first = until(
        "the first version InSync",
        Duration::from_secs(90),
        || async {
            let status = configs.get("web").await.ok()?.status?;
            let rollout = status.rollout?;
            (status.cache_state? == CacheState::InSync && rollout.phase == RolloutPhase::Completed)
                .then_some(status.published_version?)
        },
    )
    .await;
    until(
        "the sidecar has the five clusters",
        Duration::from_secs(60),
        || async {
            sidecar_clusters(&scenario, "web")
                .await
                .filter(|c| c.len() == 5)
        },
    )
    .await;
    step("first version served, with a rollout strategy");

    // Four of the five clusters go: 80% > 30%, held.
    scenario
        .apply(&guarded_config(&["c-a"], "one"))
        .await
        .unwrap();
    let (second, message) = until("the version held", Duration::from_secs(90), || async {
        let status = configs.get("web").await.ok()?.status?;
        let rollout = status.rollout?;
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
        (rollout.phase == RolloutPhase::Held
            && ready.reason == "RolloutHeld"
            && ready.status == "False")
            .then_some((rollout.version, ready.message.clone()))
    })
    .await;
    assert_ne!(second, first);
    assert!(
        message.contains("removes 4 of 5 clusters (80% > 30%): c-b, c-c, c-d, c-e"),
        "{message}"
    );
    let status = configs.get("web").await.unwrap().status.unwrap();
    assert_eq!(status.published_version.as_deref(), Some(first.as_str()));
    assert_eq!(status.desired_version.as_deref(), Some(second.as_str()));
    // The real Envoy still has every cluster.
    assert_eq!(
        sidecar_clusters(&scenario, "web").await.unwrap(),
        all.map(String::from).to_vec()
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    until(
        "the BlastRadiusExceeded Event",
        Duration::from_secs(30),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("BlastRadiusExceeded")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
                })
                .then_some(())
        },
    )
    .await;
    step("held, the sidecar keeps its clusters, an Event says why");

    let (code, text, err) = rollout(&kubeconfig, &["status", "-n", &ns, "web", "--watch"]).await;
    assert_eq!(
        code,
        Some(1),
        "a held version is not published: {text}{err}"
    );
    assert!(text.contains("Phase:   Held\n"), "{text}");
    assert!(text.contains(&format!("Version: {second}\n")), "{text}");
    assert!(text.contains(&format!("Stable:  {first}\n")), "{text}");
    assert!(text.contains("removes 4 of 5 clusters"), "{text}");
    // The held version has its revision: the diff names what it removes.
    let (code, diff, err) = rollout(
        &kubeconfig,
        &["diff", "-n", &ns, "web", "--from", &first, "--to", &second],
    )
    .await;
    assert_eq!(code, Some(1), "{diff}{err}");
    assert!(diff.contains("  removed: clusters/c-e\n"), "{diff}");

    let (code, out, err) = rollout(&kubeconfig, &["promote", "-n", &ns, "web"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("Approved version {second}")), "{out}");
    until(
        "the approved version InSync",
        Duration::from_secs(90),
        || async {
            let status = configs.get("web").await.ok()?.status?;
            let rollout = status.rollout?;
            (status.published_version.as_deref() == Some(second.as_str())
                && status.cache_state? == CacheState::InSync
                && rollout.phase == RolloutPhase::Completed)
                .then_some(())
        },
    )
    .await;
    until(
        "the sidecar has one cluster",
        Duration::from_secs(60),
        || async {
            sidecar_clusters(&scenario, "web")
                .await
                .filter(|c| c == &["c-a".to_owned()])
        },
    )
    .await;
    let (code, text, err) = rollout(&kubeconfig, &["status", "-n", &ns, "web", "--watch"]).await;
    assert_eq!(code, Some(0), "{text}{err}");
    assert!(text.contains("Phase:   Completed\n"), "{text}");
    // Nothing is held any more: promote says so and changes nothing.
    let (code, _, err) = rollout(&kubeconfig, &["promote", "-n", &ns, "web"]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("has nothing to promote"), "{err}");
    step("approved with `marin3r rollout promote`, published and served");

    // Undo to the first version by name: published in its place, the spec untouched.
    let (code, out, err) = rollout(
        &kubeconfig,
        &["undo", "-n", &ns, "web", "--to-revision", &first],
    )
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("Version {first} of")), "{out}");
    until(
        "the first version published again",
        Duration::from_secs(60),
        || async {
            let status = configs.get("web").await.ok()?.status?;
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
            (status.published_version.as_deref() == Some(first.as_str())
                && status.desired_version.as_deref() == Some(second.as_str())
                && ready.reason == "Undone"
                && ready.status == "False")
                .then_some(())
        },
    )
    .await;
    until(
        "the sidecar has the five clusters again",
        Duration::from_secs(60),
        || async {
            sidecar_clusters(&scenario, "web")
                .await
                .filter(|c| c.len() == 5)
        },
    )
    .await;
    let spec = configs.get("web").await.unwrap().spec;
    assert_eq!(spec.version(), second, "the spec is as it was applied");
    // Resume: the desired version is published again (undoing the undo holds nothing: it
    // was approved).
    let (code, out, err) = rollout(&kubeconfig, &["resume", "-n", &ns, "web"]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    until(
        "the sidecar has one cluster again",
        Duration::from_secs(60),
        || async {
            sidecar_clusters(&scenario, "web")
                .await
                .filter(|c| c == &["c-a".to_owned()])
        },
    )
    .await;
    let (code, _, err) = rollout(
        &kubeconfig,
        &["undo", "-n", &ns, "web", "--to-revision", "nope"],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no revision of version nope"), "{err}");
    step("`marin3r rollout undo --to-revision` and `resume`");
}
