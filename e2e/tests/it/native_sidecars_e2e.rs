//! Where the sidecar goes, on the real cluster (`hack/cluster`, kubelet 1.36) with marin3r
//! installed from `manifests/`: a DiscoveryService with sidecar defaults (`spec.sidecar`)
//! injects native sidecars (the API server is 1.29 or later), so a real Job whose
//! application makes one request through its Envoy and exits gets its answer from the
//! EnvoyConfig on the first try (the kubelet starts the application only once the sidecar's
//! startup probe passed), its pod reaches `Succeeded`, the kubelet stops Envoy after the
//! application, and the Job controller marks the Job complete. In the classic layout with
//! `hold-application-until-proxy-starts`, the kubelet holds the application behind the hold
//! container's postStart hook, and the application's first request succeeds too.

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_e2e::real;
use marin3r_testkit::wait::until;
use serde_json::json;

const BODY: &str = "configured by marin3r";
/// The sidecar image the DiscoveryService defaults to: Envoy's under its fully qualified
/// name, the same image as the webhook's default `envoyproxy/envoy:v1.40.0` to containerd
/// but a different string in the pod, so the default is seen to come from the
/// DiscoveryService.
const QUALIFIED: &str = "docker.io/envoyproxy/envoy:v1.40.0";

/// The application: one request through Envoy's listener, no retry. It exits 0 only when the
/// answer is the EnvoyConfig's, so a request sent before Envoy had its config fails the pod.
const FIRST_REQUEST_PY: &str = r#"
import sys, urllib.request
try:
    body = urllib.request.urlopen("http://127.0.0.1:8080/", timeout=5).read().decode()
except Exception as e:
    print("first request failed:", e, flush=True)
    sys.exit(1)
print("first request answered:", body, flush=True)
sys.exit(0 if body == "configured by marin3r" else 2)
"#;

/// Sidecar defaults: the image, resources and a pull Secret (which need not exist: the
/// image is on the node and pulled only if missing).
const DISCOVERY_SERVICE: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata: {name: instance}
spec:
  sidecar:
    image: docker.io/envoyproxy/envoy:v1.40.0
    resources:
      requests: {cpu: 10m, memory: 32Mi}
      limits: {memory: 256Mi}
    imagePullSecrets: [{name: mirror-credentials}]
"#;

const ENVOY_CONFIG: &str = r#"
apiVersion: marin3r.3scale.net/v1alpha1
kind: EnvoyConfig
metadata: {name: job}
spec:
  nodeID: job
  serialization: yaml
  envoyResources:
    listeners:
      - name: http
        value: |
          name: http
          address: { socket_address: { address: 0.0.0.0, port_value: 8080 }}
          filter_chains:
            - filters:
              - name: envoy.filters.network.http_connection_manager
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                  stat_prefix: http
                  route_config:
                    name: local
                    virtual_hosts:
                      - name: job
                        domains: ["*"]
                        routes:
                          - match: { prefix: "/" }
                            direct_response: { status: 200, body: { inline_string: "configured by marin3r" }}
                  http_filters:
                    - name: envoy.filters.http.router
                      typed_config:
                        "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#;

/// A pod template of one application container, `restartPolicy: Never`, Pod Security
/// `restricted`, labelled for injection with the node `job` and `annotations`.
fn template(annotations: &[(&str, &str)]) -> serde_json::Value {
    let mut all = serde_json::Map::new();
    all.insert("marin3r.3scale.net/node-id".into(), "job".into());
    for (k, v) in annotations {
        all.insert((*k).into(), (*v).into());
    }
    json!({
        "metadata": {
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": all,
        },
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [real::python_container(FIRST_REQUEST_PY)],
        },
    })
}

fn status<'a>(list: Option<&'a Vec<ContainerStatus>>, name: &str) -> &'a ContainerStatus {
    list.into_iter()
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status for container {name}"))
}

fn started_at(c: &ContainerStatus) -> Time {
    let state = c.state.as_ref();
    let started = state
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.started_at.clone())
        .or_else(|| state.and_then(|s| s.running.as_ref())?.started_at.clone());
    started.unwrap_or_else(|| panic!("{} has not started: {c:?}", c.name))
}

fn finished_at(c: &ContainerStatus) -> Time {
    let t = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    let t = t.unwrap_or_else(|| panic!("{} has not terminated: {c:?}", c.name));
    t.finished_at.clone().expect("finishedAt")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_jobs_pod_with_a_native_sidecar_completes_and_its_first_request_is_served() {
    let start = Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", start.elapsed().as_secs_f64());
    let scenario = real::Scenario::start("sidecars", &["python"])
        .await
        .unwrap();
    let (client, ns) = (scenario.client.clone(), scenario.ns.clone());
    step("namespace created");
    scenario.apply(DISCOVERY_SERVICE).await.unwrap();
    scenario.apply(ENVOY_CONFIG).await.unwrap();
    scenario
        .discovery_service_ready("instance", Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");

    // A real Job: the Job controller creates its pod, the webhook injects it.
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "native"},
        "spec": {"backoffLimit": 0, "template": template(&[])},
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = until("the Job's pod", Duration::from_secs(30), || async {
        pods.list(&ListParams::default().labels("job-name=native"))
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap();
    let init: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(init, ["envoy-sidecar"], "{spec:?}");
    let envoy_spec = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(envoy_spec.restart_policy.as_deref(), Some("Always"));
    assert!(envoy_spec.startup_probe.is_some(), "{envoy_spec:?}");
    // The DiscoveryService's defaults: image, resources, pull Secret.
    assert_eq!(envoy_spec.image.as_deref(), Some(QUALIFIED));
    let resources = serde_json::to_value(&envoy_spec.resources).unwrap();
    assert_eq!(
        resources,
        json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
    );
    let secrets: Vec<&str> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(secrets, ["mirror-credentials"]);

    let done = until(
        "the Job's pod to reach Succeeded",
        Duration::from_secs(120),
        || async {
            let p = pods.get(&name).await.ok()?;
            match p.status.as_ref()?.phase.as_deref() {
                Some("Succeeded") => Some(Ok(p)),
                Some("Failed") => Some(Err(p)),
                _ => None,
            }
        },
    )
    .await;
    let done = match done {
        Ok(p) => p,
        Err(p) => panic!(
            "the pod failed: {:?}\n{}",
            p.status,
            scenario.logs(&name, &["app", "envoy-sidecar"]).await
        ),
    };
    step("Job's pod Succeeded");
    let s = done.status.unwrap();
    let app = status(s.container_statuses.as_ref(), "app");
    let envoy = status(s.init_container_statuses.as_ref(), "envoy-sidecar");
    let app_log = scenario.logs(&name, &["app"]).await;
    assert!(
        app_log.contains(&format!("first request answered: {BODY}")),
        "{app_log}"
    );
    // The kubelet started the application after Envoy, ran Envoy until the application was
    // done, then stopped it.
    assert!(
        started_at(app) >= started_at(envoy),
        "the application started before Envoy: {envoy:?} {app:?}"
    );
    assert!(
        finished_at(envoy) >= finished_at(app),
        "Envoy stopped before the application: {envoy:?} {app:?}"
    );
    // And the Job controller saw it through.
    let complete = until("the Job Complete", Duration::from_secs(60), || async {
        let status = jobs.get("native").await.ok()?.status?;
        status
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
            .then_some(status.succeeded)
    })
    .await;
    assert_eq!(complete, Some(1));
    step("Job Complete");

    // The classic layout, holding the application until Envoy is ready: a bare pod, since a
    // classic sidecar never stops and a Job around it would never complete.
    let mut held = template(&[
        ("marin3r.3scale.net/native-sidecar", "false"),
        (
            "marin3r.3scale.net/hold-application-until-proxy-starts",
            "true",
        ),
    ]);
    held["metadata"]["name"] = "held".into();
    let held: Pod = serde_json::from_value(held).unwrap();
    let created = pods.create(&PostParams::default(), &held).await.unwrap();
    let names: Vec<String> = created
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["envoy-sidecar", "marin3r-hold", "app"]);
    let held = until(
        "the held application to finish",
        Duration::from_secs(120),
        || async {
            let p = pods.get("held").await.ok()?;
            let s = p.status.clone()?;
            let app = s
                .container_statuses?
                .into_iter()
                .find(|c| c.name == "app")?;
            app.state?.terminated.map(|_| p)
        },
    )
    .await;
    let s = held.status.unwrap();
    let app = status(s.container_statuses.as_ref(), "app");
    let hold = status(s.container_statuses.as_ref(), "marin3r-hold");
    let exit = app
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    assert_eq!(
        exit,
        0,
        "the held application's first request failed:\n{}",
        scenario
            .logs("held", &["app", "marin3r-hold", "envoy-sidecar"])
            .await
    );
    // The kubelet started the application only after the hold container (whose postStart
    // hook returned once Envoy was ready), and the hook did not fail.
    assert!(
        started_at(app) >= started_at(hold),
        "the application started before the hold: {hold:?} {app:?}"
    );
    let events = scenario
        .kubectl
        .ok(&[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "involvedObject.name=held",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.involvedObject.fieldPath}{\"\\n\"}{end}",
        ])
        .await
        .unwrap();
    assert!(!events.contains("FailedPostStartHook"), "{events}");
    assert!(
        events.contains("Started spec.containers{marin3r-hold}"),
        "{events}"
    );
    step("held application answered");
}
