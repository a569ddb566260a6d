//! An EnvoyDeployment (the original MARIN3R's gateway) on the local cluster, installed from
//! `manifests/` and created with the EnvoyDeployment guide's own commands: a client pod
//! sends a continuous loop of requests through a Service to the gateway's Envoy pods and on
//! to a backend pod, and gets the backend's answer; an EnvoyConfig update reaches the
//! gateways and a rejected one is rolled back; a rolling update of the gateway (a spec
//! change) with the shutdown manager drops no request of the loop, counted. A bad spec is a
//! Ready=False condition naming the field and leaves the running Deployment alone; one the
//! CRD refuses never reaches the controller. Needs root (pod runner), python3 and the built
//! `marin3r` binary.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_discovery::api::EnvoyConfig;
use marin3r_discovery::api::envoy_config::CacheState;
use marin3r_discovery::api::envoy_deployment::EnvoyDeployment;
use marin3r_e2e::demo::commands;
use marin3r_e2e::product::{Installed, install, python3};
use marin3r_local_cluster::cluster::create_restricted_namespace;
use marin3r_testkit::wait::until;
use serde_json::json;

const NS: &str = "gateway";
const GATEWAY_PODS: &str =
    "app.kubernetes.io/component=envoy-deployment,app.kubernetes.io/instance=envoy";

/// The backend: answers `upstream-a <path>` on 8080.
const BACKEND_PY: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("upstream-a " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"#;

/// The client: a request every 50 ms through the gateway's Service, each on a new
/// connection; from its first answer on, every failure is counted and every count printed.
const CLIENT_PY: &str = r#"
import http.client, time
ok = fail = 0
last = ""
while True:
    try:
        c = http.client.HTTPConnection("envoy", 8080, timeout=5)
        c.request("GET", "/hello")
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        if r.status == 200:
            ok += 1
            last = body
        elif ok:
            fail += 1
            print("FAIL status", r.status, body, flush=True)
    except Exception as e:
        if ok:
            fail += 1
            print("FAIL", repr(e), flush=True)
    if ok:
        print(f"COUNT ok={ok} fail={fail} last={last}", flush=True)
    time.sleep(0.05)
"#;

/// Pod Security `restricted` for the test's own pods.
fn restricted_container(name: &str, script: &str) -> serde_json::Value {
    json!({
        "name": name,
        "image": "probe-server",
        "command": ["python3", "-c", script],
        "ports": [{"name": "http", "containerPort": 8080}],
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        },
    })
}

/// The backend Deployment and its headless Service, as kubectl would apply them.
fn backend() -> String {
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "upstream-a", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": {"app": "upstream-a"}},
            "template": {
                "metadata": {"labels": {"app": "upstream-a"}},
                "spec": {"containers": [restricted_container("app", BACKEND_PY)]},
            },
        },
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "upstream-a", "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"app": "upstream-a"},
                 "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]},
    });
    format!("{deployment}\n---\n{service}\n")
}

/// The client's latest count: (ok, fail, last body), and every FAIL line.
fn counts(installed: &Installed) -> (u64, u64, String, Vec<String>) {
    let path = installed.cluster.log_path(NS, "client", "client");
    let log = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let fails = log
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .map(str::to_owned)
        .collect();
    let Some(line) = log.lines().rev().find(|l| l.starts_with("COUNT ")) else {
        return (0, 0, String::new(), fails);
    };
    let field = |name: &str| {
        line.split(' ')
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let last = line
        .split_once("last=")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (field("ok="), field("fail="), last, fails)
}

async fn run(installed: &Installed, command: &str) -> String {
    let repo = marin3r_testkit::tools::repo_root();
    let marin3r = marin3r_e2e::product::marin3r_bin().unwrap();
    commands::run(
        command,
        &repo,
        &installed.kubectl,
        &installed.kubeconfig(),
        &marin3r,
    )
    .await
    .unwrap()
}

fn ready(ed: &EnvoyDeployment) -> Option<(String, String, String)> {
    let c = ed
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Waits for the client to have seen `body` as its latest answer.
async fn client_sees(installed: &Installed, what: &str, body: &str) {
    until(what, Duration::from_secs(60), || async {
        let (_, _, last, _) = counts(installed);
        (last == body).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_serves_through_a_service_follows_its_config_and_rolls_without_dropping_requests()
{
    let images = marin3r_e2e::product::images().with("probe-server", python3());
    let installed = install(images).await.unwrap();
    let client = installed.client.clone();
    create_restricted_namespace(&client, NS).await.unwrap();
    installed.apply(&backend()).await.unwrap();

    // The guide's commands, word for word.
    run(&installed, commands::GATEWAY_APPLY_DISCOVERY_SERVICE).await;
    installed.discovery_service_ready(NS, "instance").await;
    for command in [
        commands::GATEWAY_APPLY_ENVOY_CONFIG,
        commands::GATEWAY_APPLY_ENVOY_DEPLOYMENT,
        commands::GATEWAY_APPLY_SERVICE,
    ] {
        run(&installed, command).await;
    }
    let eds: Api<EnvoyDeployment> = Api::namespaced(client.clone(), NS);
    until(
        "the EnvoyDeployment to be Ready",
        Duration::from_secs(120),
        || async {
            let ed = eds.get("envoy").await.ok()?;
            (ready(&ed)?.0 == "True").then_some(())
        },
    )
    .await;
    let table = run(&installed, commands::GATEWAY_GET).await;
    assert!(
        table.contains("READY") && table.contains("marin3r-envoydeployment-envoy"),
        "{table}"
    );
    let children = run(&installed, commands::GATEWAY_GET_CHILDREN).await;
    for child in ["marin3r-envoydeployment-envoy", "envoy-client-cert-envoy"] {
        assert!(children.contains(child), "{children}");
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let d = deployments
        .get("marin3r-envoydeployment-envoy")
        .await
        .unwrap();
    assert_eq!(d.spec.replicas, Some(2));
    assert_eq!(
        d.labels()["app.kubernetes.io/component"],
        "envoy-deployment"
    );

    // A client pod in the namespace loops through the Service.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let client_pod = json!({
        "metadata": {"name": "client", "namespace": NS},
        "spec": {"containers": [restricted_container("client", CLIENT_PY)]},
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(client_pod).unwrap(),
    )
    .await
    .unwrap();
    client_sees(
        &installed,
        "the backend's answer through the gateway",
        "upstream-a /hello",
    )
    .await;

    // An EnvoyConfig update reaches the gateways.
    let ecs: Api<EnvoyConfig> = Api::namespaced(client.clone(), NS);
    let v1 = std::fs::read_to_string(
        marin3r_testkit::tools::repo_root().join("docs/examples/gateway/envoyconfig.yaml"),
    )
    .unwrap();
    let v2 = v1.replace(
        "route: {cluster: upstream-a}",
        "route: {cluster: upstream-a, prefix_rewrite: /v2/}",
    );
    assert_ne!(v1, v2);
    installed.apply(&v2).await.unwrap();
    client_sees(
        &installed,
        "the updated config's answer",
        "upstream-a /v2/hello",
    )
    .await;

    // One Envoy rejects (two routers) is rolled back; the gateways keep serving v2.
    let rejected = v2.replace(
        "                  route_config:",
        "                    - name: second-router\n                      typed_config:\n                        \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n                  route_config:",
    );
    assert_ne!(rejected, v2);
    installed.apply(&rejected).await.unwrap();
    until(
        "the rejected config to be rolled back",
        Duration::from_secs(90),
        || async {
            let ec = ecs.get("envoy").await.ok()?;
            (ec.status?.cache_state == Some(CacheState::Rollback)).then_some(())
        },
    )
    .await;
    let (ok_before, _, last, _) = counts(&installed);
    assert_eq!(last, "upstream-a /v2/hello");

    // A rolling update (a spec change) while the client loops: no request is dropped.
    let old_pods: BTreeSet<String> = pods
        .list(&ListParams::default().labels(GATEWAY_PODS))
        .await
        .unwrap()
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(old_pods.len(), 2, "{old_pods:?}");
    installed
        .kubectl
        .ok(&[
            "patch",
            "envoydeployment",
            "envoy",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"extraArgs":["--log-level","info"]}}"#,
        ])
        .await
        .unwrap();
    until(
        "the rolling update to finish",
        Duration::from_secs(180),
        || async {
            let ed = eds.get("envoy").await.ok()?;
            let status = ed.status.as_ref()?;
            let current = status.observed_generation == ed.metadata.generation;
            let now: BTreeSet<String> = pods
                .list(&ListParams::default().labels(GATEWAY_PODS))
                .await
                .ok()?
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            (current && ready(&ed)?.0 == "True" && now.len() == 2 && now.is_disjoint(&old_pods))
                .then_some(())
        },
    )
    .await;
    let (ok_after, fail, last, fails) = counts(&installed);
    assert_eq!(fail, 0, "requests dropped during the rollout: {fails:?}");
    assert!(ok_after > ok_before + 20, "{ok_before} -> {ok_after}");
    assert_eq!(last, "upstream-a /v2/hello");
    let d = deployments
        .get("marin3r-envoydeployment-envoy")
        .await
        .unwrap();
    let args = d.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.ends_with(&["--log-level".to_owned(), "info".to_owned()]),
        "{args:?}"
    );

    // A bad spec is a condition naming the field; the Deployment stays as it was.
    let generation = d.metadata.generation;
    installed
        .kubectl
        .ok(&[
            "patch",
            "envoydeployment",
            "envoy",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"ports":[{"name":"HTTP","port":8080}]}}"#,
        ])
        .await
        .unwrap();
    let (_, reason, message) = until(
        "the bad spec to be reported",
        Duration::from_secs(60),
        || async {
            let ed = eds.get("envoy").await.ok()?;
            ready(&ed).filter(|r| r.0 == "False")
        },
    )
    .await;
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("spec.ports[0].name"), "{message}");
    let d = deployments
        .get("marin3r-envoydeployment-envoy")
        .await
        .unwrap();
    assert_eq!(d.metadata.generation, generation);
    // ...and one the CRD refuses never reaches the controller.
    let both = r#"{"spec":{"replicas":{"static":1,"dynamic":{"maxReplicas":3}}}}"#;
    let out = installed
        .kubectl
        .run(&[
            "patch",
            "envoydeployment",
            "envoy",
            "-n",
            NS,
            "--type=merge",
            "-p",
            both,
        ])
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    assert!(out.stderr.contains("spec.replicas"), "{out:?}");
    let (_, fail, _, fails) = counts(&installed);
    assert_eq!(fail, 0, "{fails:?}");
    installed.cluster.shutdown(Duration::from_secs(5)).await;
}
