//! The seed's journey on the real cluster (`hack/cluster`, or the one `MARIN3R_E2E_KUBECONFIG`
//! names), with this build's images: `kubectl apply -k manifests/`, a DiscoveryService in an
//! application namespace under the restricted Pod Security level, an EnvoyConfig, a pod the
//! real API server sends to our webhook, injected with a native sidecar because this cluster
//! supports them (a classic one where it does not), the real Envoy container serving the
//! config, an update, a NACK rolled back (a listener on the sidecar's own admin address: only a
//! running Envoy can refuse it), a config over 120 KiB that only Envoy refuses, refused at
//! `kubectl apply` by the judge inside the real discovery pod (read-only root), a Job whose
//! native sidecar stops after its application, and the discovery pod rolling over to a new
//! server certificate while requests through the sidecar keep being answered.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use marin3r_api::discovery_service::{DiscoveryService, SERVER_CERT_HASH_LABEL};
use marin3r_api::envoy_config::{CacheState, EnvoyConfig};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_e2e::demo::get;
use marin3r_e2e::product::{discovery_service_ready, example_in};
use marin3r_e2e::real;
use marin3r_testkit::wait::until;
use serde_json::{Value, json};

const NODE_ID: &str = "demo-proxy";
const FIRST_BODY: &str = real::EXAMPLE_BODY;
const DISCOVERY_PODS: &str = "app.kubernetes.io/component=discovery-service";

/// The example EnvoyConfig in `ns`, answering `body` on `address:port`.
fn envoy_config(ns: &str, body: &str, address: &str, port: u16) -> String {
    real::example_config(ns, body).unwrap().replace(
        "address: 0.0.0.0, port_value: 8080",
        &format!("address: {address}, port_value: {port}"),
    )
}

/// An EnvoyConfig of one route configuration over 120 KiB, one of whose 1500 virtual hosts
/// has a regular expression Envoy cannot compile: only Envoy refuses it.
fn large_config_only_envoy_refuses(ns: &str) -> String {
    let hosts: Vec<Value> = (0..1500)
        .map(|i| {
            json!({"name": format!("host-{i}"), "domains": [format!("h{i}.example.com")],
                "routes": [{"match": {"prefix": format!("/path/{i}")}, "direct_response": {"status": 200}}]})
        })
        .collect();
    let mut route = json!({"name": "large", "virtual_hosts": hosts});
    route["virtual_hosts"][700]["routes"][0]["match"] = json!({"safe_regex": {"regex": "/v1(["}});
    let value = route.to_string();
    assert!(value.len() > 120 * 1024);
    serde_json::to_string(&json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "large", "namespace": ns},
        "spec": {"nodeID": "large", "serialization": "json",
            "envoyResources": {"routes": [{"name": "large", "value": value}]}},
    }))
    .unwrap()
}

/// A Job whose application makes one request through its Envoy and exits: 0 only when the
/// answer is `body`.
fn job(ns: &str, body: &str) -> String {
    let script = format!(
        "import sys, urllib.request\n\
         got = urllib.request.urlopen('http://127.0.0.1:8080/', timeout=5).read().decode()\n\
         print('answered:', got, flush=True)\n\
         sys.exit(0 if got == {body:?} else 2)\n"
    );
    serde_json::to_string(&json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "one-request", "namespace": ns},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {
                "labels": {"marin3r.3scale.net/status": "enabled"},
                "annotations": {"marin3r.3scale.net/node-id": NODE_ID, "marin3r.3scale.net/ports": "http:8080"},
            },
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [real::python_container(&script)],
            },
        }},
    }))
    .unwrap()
}

async fn body(url: &str) -> Option<String> {
    get(url).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seeds_journey_on_a_real_cluster() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("journey", &["python"]).await.unwrap();
    let (kubectl, client, ns) = (
        &scenario.kubectl,
        scenario.client.clone(),
        scenario.ns.clone(),
    );
    let unique = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();

    step("namespace created");
    // A DiscoveryService of the namespace's own, Ready once its certificates and pod are.
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &example_in("discoveryservice-own-namespace.yaml", &ns).unwrap(),
        )
        .await
        .unwrap();
    let services: Api<DiscoveryService> = Api::namespaced(client.clone(), &ns);
    until(
        "the DiscoveryService to be Ready",
        Duration::from_secs(120),
        || async {
            let ds = services.get("instance").await.ok()?;
            discovery_service_ready(&ds)
                .filter(|(status, _, _)| status == "True")
                .map(|_| ())
        },
    )
    .await;

    step("DiscoveryService Ready");
    // The real API server publishes our CRDs' schemas: kubectl explain reads them.
    let explained = kubectl
        .ok(&["explain", "envoyconfig.spec.nodeID"])
        .await
        .unwrap();
    assert!(
        explained.contains("GROUP:      marin3r.3scale.net")
            && explained.contains("FIELD: nodeID <string>")
            && explained.contains("The Envoy `node.id` this configuration is served to."),
        "{explained}"
    );
    // The EnvoyConfig, then the annotated Deployment the webhook injects.
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &envoy_config(&ns, FIRST_BODY, "0.0.0.0", 8080),
        )
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &example_in("deployment.yaml", &ns).unwrap(),
        )
        .await
        .unwrap();
    let pod = until(
        "the injected pod to be Ready",
        Duration::from_secs(120),
        || async { scenario.ready_pods("app=demo").await.into_iter().next() },
    )
    .await;

    step("injected pod Ready");
    // The sidecar's layout is chosen from what this API server supports: native from 1.29.
    let version: Value =
        serde_json::from_str(&kubectl.ok(&["version", "-o", "json"]).await.unwrap()).unwrap();
    let minor: u32 = version["serverVersion"]["minor"]
        .as_str()
        .unwrap()
        .trim_end_matches('+')
        .parse()
        .unwrap();
    let spec = pod.spec.clone().unwrap();
    let native = spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "envoy-sidecar")
        .is_some_and(|c| c.restart_policy.as_deref() == Some("Always"));
    let classic = spec.containers.iter().any(|c| c.name == "envoy-sidecar");
    assert_eq!(
        (native, classic),
        (minor >= 29, minor < 29),
        "a 1.{minor} API server: native sidecar {native}, classic {classic}"
    );

    // The real Envoy container serves the config.
    let url = format!("http://{}:8080/", real::pod_ip(&pod));
    until("the configured body", Duration::from_secs(60), || async {
        (body(&url).await.as_deref() == Some(FIRST_BODY)).then_some(())
    })
    .await;
    let logs = kubectl
        .ok(&["logs", "-n", &ns, &pod.name_any(), "-c", "envoy-sidecar"])
        .await
        .unwrap();
    assert!(logs.contains("starting main dispatch loop"), "{logs}");
    let events = kubectl
        .ok(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            &format!("involvedObject.name={}", pod.name_any()),
            "-o",
            "jsonpath={range .items[*]}{.reason} {.involvedObject.fieldPath}{\"\\n\"}{end}",
        ])
        .await
        .unwrap();
    let container = if native {
        "spec.initContainers{envoy-sidecar}"
    } else {
        "spec.containers{envoy-sidecar}"
    };
    assert!(
        events.lines().any(|l| l == format!("Started {container}")),
        "the kubelet reported no start of {container}:\n{events}"
    );

    step("config served");
    // An update, served.
    let second = "hello again from the journey";
    let applied = Instant::now();
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &envoy_config(&ns, second, "0.0.0.0", 8080),
        )
        .await
        .unwrap();
    until(
        "the update to be served",
        Duration::from_secs(60),
        || async { (body(&url).await.as_deref() == Some(second)).then_some(()) },
    )
    .await;
    println!(
        "the update was served {:?} after kubectl apply",
        applied.elapsed()
    );

    step("update served");
    // A listener on the sidecar's own admin address: validate mode binds nothing and admits
    // it, the pod's Envoy cannot bind it, NACKs, and the previous revision is served again.
    let configs: Api<EnvoyConfig> = Api::namespaced(client.clone(), &ns);
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &envoy_config(&ns, "never served", "127.0.0.1", 9901),
        )
        .await
        .unwrap();
    let nack = until("the rollback", Duration::from_secs(60), || async {
        let status = configs.get(NODE_ID).await.ok()?.status?;
        (status.cache_state == Some(CacheState::Rollback)).then_some(status.last_nack_message)
    })
    .await
    .unwrap_or_default();
    assert!(nack.contains("9901"), "the NACK names the address: {nack}");
    assert_eq!(body(&url).await.as_deref(), Some(second));

    step("rolled back");
    // Over 120 KiB, refused by Envoy inside the real discovery pod, at kubectl apply.
    let refused = kubectl
        .run_with(
            &["apply", "--server-side", "-f", "-"],
            &large_config_only_envoy_refuses(&ns),
        )
        .await
        .unwrap();
    assert!(!refused.success, "admitted:\n{}", refused.stdout);
    assert!(
        refused.stderr.contains("denied the request") && refused.stderr.contains("missing ]"),
        "{}",
        refused.stderr
    );
    assert!(configs.get_opt("large").await.unwrap().is_none());

    step("large config refused");
    // Back to a config the proxy takes.
    let third = "hello a third time";
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &envoy_config(&ns, third, "0.0.0.0", 8080),
        )
        .await
        .unwrap();
    until("the third body", Duration::from_secs(60), || async {
        (body(&url).await.as_deref() == Some(third)).then_some(())
    })
    .await;

    step("third config served");
    // A Job: its native sidecar has the config before the application starts, and stops
    // after it, so the Job completes.
    if native {
        kubectl
            .ok_with(&["apply", "-f", "-"], &job(&ns, third))
            .await
            .unwrap();
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
        let done = until("the Job to finish", Duration::from_secs(120), || async {
            let status = jobs.get("one-request").await.ok()?.status?;
            (status.succeeded.unwrap_or(0) + status.failed.unwrap_or(0) > 0).then_some(status)
        })
        .await;
        let logs = kubectl
            .run(&["logs", "-n", &ns, "job/one-request", "-c", "app"])
            .await
            .unwrap();
        let job_pods = kubectl
            .run(&[
                "get",
                "pods",
                "-n",
                &ns,
                "-l",
                "job-name=one-request",
                "-o",
                "jsonpath={.items[*].status}",
            ])
            .await
            .unwrap();
        assert_eq!(
            done.succeeded,
            Some(1),
            "the Job failed: {}{}\n{}",
            logs.stdout,
            logs.stderr,
            job_pods.stdout
        );
        assert!(logs.stdout.contains(third), "{}", logs.stdout);
    }

    step("Job done");
    // The server certificate renewed: the discovery pod rolls over while every request
    // through the sidecar is answered, and the proxy takes its next update from the new pod.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let hash = |d: &Deployment| {
        d.spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.as_ref())
            .and_then(|l| l.get(SERVER_CERT_HASH_LABEL).cloned())
    };
    let old_hash = hash(&deployments.get("marin3r-instance").await.unwrap());
    assert!(old_hash.is_some());
    let old_pods: Vec<String> = scenario
        .ready_pods(DISCOVERY_PODS)
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(old_pods.len(), 1, "{old_pods:?}");

    let traffic = real::Traffic::start(&url);
    let certificates: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), &ns);
    let server = certificates
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.name_any())
        .find(|n| n.contains("server"))
        .expect("a server certificate");
    certificates
        .patch(
            &server,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": format!("{unique}")}}})),
        )
        .await
        .unwrap();
    until(
        "the discovery pod to roll over",
        Duration::from_secs(120),
        || async {
            let d = deployments.get("marin3r-instance").await.ok()?;
            let now = scenario.ready_pods(DISCOVERY_PODS).await;
            (hash(&d) != old_hash && now.len() == 1 && !old_pods.contains(&now[0].name_any()))
                .then_some(())
        },
    )
    .await;
    step("discovery pod rolled over");
    let fourth = "hello from the new discovery pod";
    kubectl
        .ok_with(
            &["apply", "-f", "-"],
            &envoy_config(&ns, fourth, "0.0.0.0", 8080),
        )
        .await
        .unwrap();
    until(
        "the update through the new discovery pod",
        Duration::from_secs(60),
        || async { (body(&url).await.as_deref() == Some(fourth)).then_some(()) },
    )
    .await;
    step("update served by the new pod");
    let connected = scenario
        .envoy_admin(
            &pod.name_any(),
            "/stats?filter=control_plane.connected_state",
        )
        .await
        .unwrap();
    assert!(
        connected.contains("control_plane.connected_state: 1"),
        "{connected}"
    );
    let (answered, failed) = traffic.stop().await.unwrap();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rollover: {failed:?}",
        failed.len(),
        answered as usize + failed.len()
    );
    assert!(
        answered >= 10,
        "only {answered} requests during the rollover"
    );
}
