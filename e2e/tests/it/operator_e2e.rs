//! marin3r end to end on the real cluster (`hack/cluster`), driven only through the Kubernetes
//! API and kubectl as a user would: `manifests/` installed as users install it (the operator
//! runs as a pod of this build's image), a DiscoveryService in the operator's namespace (the
//! example's, under a name of this run) serving the scenario's namespace, and SPEC §2.2/§5
//! followed through real Envoy sidecars: injection, mTLS xDS, namespaces joining and leaving,
//! client and server certificate renewal, a NACKed config rolled back, and deletion. Every
//! namespace enforces Pod Security `restricted`, so the operator, discovery and injected pods
//! must meet it. The sidecar's admin API is reachable only inside its pod (here through the
//! API server's port-forward); through the pod network only its readiness listener answers,
//! and only `GET /ready`.

use marin3r_api::envoy_config::CacheState;
use marin3r_testkit::wait::until;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use marin3r_api::discovery_service::{
    DISCOVERY_SERVICE_LABEL, DiscoveryService, SERVER_CERT_HASH_LABEL,
};
use marin3r_api::{EnvoyConfig, EnvoyConfigRevision};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_e2e::product::example_in;
use marin3r_e2e::real::{self, OPERATOR_NAMESPACE as OPS, Scenario, pod_ip, pod_ready as is_ready};
use marin3r_e2e::rejected::nacked_by_proxies;
use serde_json::json;

const BODY: &str = real::EXAMPLE_BODY;

/// The names of this run's DiscoveryService `ds` in the operator's namespace and of what it
/// makes, and the namespace it serves.
struct Names {
    ds: String,
    /// `marin3r-<ds>`: its Deployment, Service, ServiceAccount, disruption budget.
    owned: String,
    /// `marin3r-marin3r-system-<ds>`: its webhook configurations, ClusterRole(Binding) and
    /// the Secret Role(Binding) in each served namespace.
    webhook: String,
    ca: String,
    server: String,
    /// The namespace it serves (the scenario's).
    demo: String,
}

impl Names {
    fn new(ds: String, demo: &str) -> Self {
        Self {
            owned: format!("marin3r-{ds}"),
            webhook: format!("marin3r-{OPS}-{ds}"),
            ca: format!("marin3r-ca-cert-{ds}"),
            server: format!("marin3r-server-cert-{ds}"),
            demo: demo.to_owned(),
            ds,
        }
    }
}

fn get(url: &str) -> String {
    marin3r_testkit::envoy::get_body(url).unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

/// `GET` a sidecar's admin `path` inside its pod (the admin listens on loopback), through
/// the API server's port-forward.
async fn admin(client: &Client, pod: &Pod, path: &str) -> String {
    marin3r_discovery::cli::port_forward::get(
        client.clone(),
        &pod.namespace().unwrap_or_default(),
        &pod.name_any(),
        9901,
        path,
    )
    .await
    .map(|(_, body)| body)
    .unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

/// Whether the object `name` exists.
async fn present<K>(api: Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_some()
}

/// What the DiscoveryService created that is still there, by kind and name.
async fn leftovers(client: &Client, n: &Names) -> Vec<String> {
    let c = || client.clone();
    let ds_objects = n.owned.as_str();
    let demo = n.demo.as_str();
    let found = [
        (
            present(Api::<MutatingWebhookConfiguration>::all(c()), &n.webhook).await,
            "MutatingWebhookConfiguration",
        ),
        (
            present(Api::<ValidatingWebhookConfiguration>::all(c()), &n.webhook).await,
            "ValidatingWebhookConfiguration",
        ),
        (
            present(Api::<ClusterRole>::all(c()), &n.webhook).await,
            "ClusterRole",
        ),
        (
            present(Api::<ClusterRoleBinding>::all(c()), &n.webhook).await,
            "ClusterRoleBinding",
        ),
        (
            present(Api::<Role>::namespaced(c(), demo), &n.webhook).await,
            "the Secret Role in the served namespace",
        ),
        (
            present(Api::<Deployment>::namespaced(c(), OPS), ds_objects).await,
            "Deployment",
        ),
        (
            present(Api::<Service>::namespaced(c(), OPS), ds_objects).await,
            "Service",
        ),
        (
            present(Api::<PodDisruptionBudget>::namespaced(c(), OPS), ds_objects).await,
            "PodDisruptionBudget",
        ),
        (
            secret_cert(client, demo, "envoy-sidecar-client-cert")
                .await
                .is_some(),
            "Secret envoy-sidecar-client-cert of the served namespace",
        ),
        (
            secret_cert(client, OPS, &n.ca).await.is_some(),
            "the CA Secret",
        ),
        (
            secret_cert(client, OPS, &n.server).await.is_some(),
            "the server certificate Secret",
        ),
        (
            present(
                Api::<ConfigMap>::namespaced(c(), demo),
                "envoy-sidecar-bootstrap",
            )
            .await,
            "ConfigMap envoy-sidecar-bootstrap of the served namespace",
        ),
        (
            Api::<Namespace>::all(c())
                .get(demo)
                .await
                .unwrap()
                .labels()
                .contains_key(DISCOVERY_SERVICE_LABEL),
            "the discovery-service label of the served namespace",
        ),
    ];
    found
        .into_iter()
        .filter(|(there, _)| *there)
        .map(|(_, what)| what.to_owned())
        .collect()
}

/// The pods of `ns` that `selector` picks, Ready and not being deleted.
async fn ready_pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && is_ready(p))
        .collect()
}

async fn renew(client: &Client, name: &str, value: &str) {
    let patch = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": value}}});
    Api::<DiscoveryServiceCertificate>::namespaced(client.clone(), OPS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn secret_cert(client: &Client, ns: &str, name: &str) -> Option<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()?;
    String::from_utf8(s.data?.get("tls.crt")?.0.clone()).ok()
}

fn serial_hex(pem: &str) -> String {
    marin3r_certs::CertificateInfo::from_pem(pem)
        .unwrap()
        .serial
        .replace(':', "")
        .to_lowercase()
}

/// The restarts of every container of `p`, the native sidecar's (an init container's) too.
fn restarts(p: &Pod) -> i32 {
    let status = p.status.as_ref();
    let containers = status.and_then(|s| s.container_statuses.as_ref());
    let init = status.and_then(|s| s.init_container_statuses.as_ref());
    containers
        .into_iter()
        .chain(init)
        .flatten()
        .map(|c| c.restart_count)
        .sum()
}

/// The demo workload's ready pod in `ns`: injected, with its Envoy serving the body. On a
/// timeout, the sidecar's xDS stats say why.
async fn serving_pod(client: &Client, ns: &str) -> Pod {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let pods = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels("app=demo"))
            .await
            .unwrap()
            .items;
        if let Some(pod) = pods.iter().find(|p| is_ready(p))
            && get(&format!("http://{}:8080/", pod_ip(pod))) == BODY
        {
            return pod.clone();
        }
        if tokio::time::Instant::now() > deadline {
            let stats = match pods.first() {
                Some(p) => admin(client, p, "/stats?filter=xds_cluster|control_plane|ssl").await,
                None => "no pod".into(),
            };
            let statuses: Vec<String> = pods
                .iter()
                .map(|p| serde_json::to_string(&p.status).unwrap_or_default())
                .collect();
            panic!(
                "no injected pod serving the EnvoyConfig in {ns}; sidecar stats:\n{stats}\npod statuses:\n{}",
                statuses.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn marin3r_end_to_end() {
    let started = std::time::Instant::now();
    let step = |what: &str| println!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("the built marin3r binary");
    // 1. Installed (by the scenario, from manifests/), the example DiscoveryService created
    //    under this run's name, serving the scenario's namespace: everything appears, Ready.
    let scenario = Scenario::start("op", &[]).await.unwrap();
    let (client, kubectl) = (scenario.client.clone(), &scenario.kubectl);
    let kubeconfig = scenario.cluster.kubeconfig().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let n = Names::new(
        scenario.operator_discovery_service("op").unwrap(),
        &scenario.ns,
    );
    let (ds_name, demo) = (n.ds.as_str(), n.demo.as_str());
    let plain = scenario.namespace("p").await.unwrap();
    let team_b = scenario.namespace("b").await.unwrap();
    let (plain, team_b) = (plain.as_str(), team_b.as_str());
    let operator = until("the operator pod", Duration::from_secs(60), || async {
        ready_pods(&client, OPS, "app.kubernetes.io/component=operator")
            .await
            .pop()
    })
    .await;
    // Ready means its readiness probe on /healthz passed; liveness probes the same path.
    let container = &operator.spec.as_ref().unwrap().containers[0];
    for probe in [&container.readiness_probe, &container.liveness_probe] {
        let path = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref()?.path.clone());
        assert_eq!(path.as_deref(), Some("/healthz"), "{container:?}");
    }
    // It runs the controllers because it holds the leader Lease.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), OPS);
    until(
        "the operator to hold the leader Lease",
        Duration::from_secs(30),
        || async {
            let holder = leases
                .get_opt("marin3r-operator")
                .await
                .unwrap()?
                .spec?
                .holder_identity?;
            (holder == operator.name_any()).then_some(())
        },
    )
    .await;
    // manifests/ label the operator's namespace `restricted`: its pods must pass.
    let ops_ns = Api::<Namespace>::all(client.clone())
        .get(OPS)
        .await
        .unwrap();
    assert_eq!(
        ops_ns
            .labels()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );
    let example = example_in("discoveryservice.yaml", OPS).unwrap();
    assert!(
        example.contains("  name: instance\n") && example.contains("    - demo\n"),
        "{example}"
    );
    let example = example
        .replace("  name: instance\n", &format!("  name: {ds_name}\n"))
        .replace("    - demo\n", &format!("    - {demo}\n"));
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &example)
        .await
        .unwrap();
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), OPS);
    scenario
        .discovery_service_ready_in(OPS, ds_name, Duration::from_secs(120))
        .await
        .unwrap();
    step("DiscoveryService Ready");
    let ds = dss.get(ds_name).await.unwrap();
    assert_eq!(ds.status.as_ref().unwrap().enabled_namespaces, [demo]);
    // The operator counts and times the reconciles that got there.
    let metrics = get(&format!("http://{}:8383/metrics", pod_ip(&operator)));
    for controller in ["discoveryservice", "certificate"] {
        let ok = format!(
            r#"marin3r_controller_reconciles_total{{controller="{controller}",result="ok"}} "#
        );
        let count: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&ok)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {ok} in {metrics}"));
        assert!(count > 0, "{metrics}");
        let timed = format!(
            r#"marin3r_controller_reconcile_duration_seconds_count{{controller="{controller}"}}"#
        );
        assert!(metrics.contains(&timed), "{metrics}");
    }
    // ...and reports when each certificate it issued expires, and that it is ready.
    for metric in [
        "marin3r_certificate_expiration_timestamp_seconds",
        "marin3r_certificate_ready",
    ] {
        let series = format!(r#"{metric}{{namespace="{OPS}",name="{}"}} "#, n.ca);
        assert!(metrics.contains(&series), "no {series} in {metrics}");
    }
    let discovery_selector = format!(
        "app.kubernetes.io/component=discovery-service,app.kubernetes.io/instance={ds_name}"
    );
    let discovery_pods = ready_pods(&client, OPS, &discovery_selector).await;
    assert_eq!(discovery_pods.len(), 1);
    for (ns, name) in [
        (OPS, n.ca.as_str()),
        (OPS, n.server.as_str()),
        (demo, "envoy-sidecar-client-cert"),
    ] {
        assert!(
            secret_cert(&client, ns, name).await.is_some(),
            "Secret {ns}/{name}"
        );
    }
    Api::<ConfigMap>::namespaced(client.clone(), demo)
        .get("envoy-sidecar-bootstrap")
        .await
        .unwrap();
    Api::<Service>::namespaced(client.clone(), OPS)
        .get(&n.owned)
        .await
        .unwrap();
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    webhooks.get(&n.webhook).await.unwrap();
    let out = kubectl
        .ok(&["get", "discoveryservices", "-n", OPS])
        .await
        .unwrap();
    assert!(
        out.lines()
            .any(|l| l.contains(ds_name) && l.contains("True")),
        "{out}"
    );
    // The discovery pod reads Secrets only where it serves: a Role in each enabled namespace,
    // none elsewhere, and no Secret rule cluster-wide.
    let secret_role = n.webhook.as_str();
    let sa = n.owned.as_str();
    let has_secret_access = |ns: &str| {
        let (client, ns) = (client.clone(), ns.to_owned());
        async move {
            let ns = ns.as_str();
            let role = Api::<Role>::namespaced(client.clone(), ns)
                .get_opt(secret_role)
                .await
                .unwrap();
            let binding = Api::<RoleBinding>::namespaced(client.clone(), ns)
                .get_opt(secret_role)
                .await
                .unwrap();
            match (role, binding) {
                (Some(role), Some(binding)) => Some({
                    let rule = &role.rules.unwrap()[0];
                    assert_eq!(rule.resources.as_deref(), Some(&["secrets".to_owned()][..]));
                    let subject = &binding.subjects.unwrap()[0];
                    assert_eq!(
                        (subject.name.as_str(), subject.namespace.as_deref()),
                        (sa, Some(OPS))
                    );
                    true
                }),
                (None, None) => Some(false),
                // The operator writes (and deletes) the two one after the other: a reader in
                // between sees one of them (None). Only the polls below may see that.
                _ => None,
            }
        }
    };
    assert_eq!(has_secret_access(demo).await, Some(true));
    assert_eq!(has_secret_access(plain).await, Some(false));
    // And the RBAC-enforcing API server holds the discovery pod's ServiceAccount to it: a
    // Secret of the enabled namespace is readable, one of another namespace (its own CA's
    // too) is not, and Secrets cannot be listed cluster-wide.
    let (_, as_discovery_dir) = scenario.kubectl_as(OPS, sa).await.unwrap();
    let as_discovery = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(as_discovery_dir.path().join("kubeconfig"))
                .unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    Api::<Secret>::namespaced(as_discovery.clone(), demo)
        .get("envoy-sidecar-client-cert")
        .await
        .unwrap();
    Api::<Secret>::namespaced(as_discovery.clone(), demo)
        .list(&ListParams::default())
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), plain)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "private"}, "stringData": {"k": "v"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let refused = |r: Result<Secret, kube::Error>| match r {
        Err(kube::Error::Api(e)) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(
            Api::<Secret>::namespaced(as_discovery.clone(), plain)
                .get("private")
                .await
        ),
        403
    );
    assert_eq!(
        refused(
            Api::<Secret>::namespaced(as_discovery.clone(), OPS)
                .get(&n.ca)
                .await
        ),
        403
    );
    match Api::<Secret>::all(as_discovery.clone())
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403),
        other => panic!("a cluster-wide Secret list was not refused: {other:?}"),
    }
    let cluster_rules = Api::<ClusterRole>::all(client.clone())
        .get(secret_role)
        .await
        .unwrap()
        .rules
        .unwrap();
    assert!(
        cluster_rules
            .iter()
            .all(|r| !r.resources.iter().flatten().any(|x| x == "secrets")),
        "{cluster_rules:?}"
    );

    // 1b. EnvoyConfigs are judged at admission by the discovery pod, through the operator's
    //     ValidatingWebhookConfiguration: `kubectl apply` of a bad one is refused with the
    //     field path `marin3r validate` reports offline, and nothing is stored. The good one
    //     (step 2) is admitted and served.
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(&n.webhook)
        .await
        .unwrap();
    assert_eq!(
        validating.webhooks.unwrap()[0].rules.as_ref().unwrap()[0].resources,
        Some(vec!["envoyconfigs".to_owned()])
    );
    let typo = example_in("envoyconfig.yaml", demo)
        .unwrap()
        .replace("name: demo-proxy", "name: demo-typo")
        .replace("nodeID: demo-proxy", "nodeID: demo-typo")
        .replace("stat_prefix: http", "stat_prefx: http");
    let typo_file = dir.path().join("typo.yaml");
    std::fs::write(&typo_file, &typo).unwrap();
    let offline = std::process::Command::new(&marin3r)
        .args(["validate", "-f", typo_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!offline.status.success());
    let offline = String::from_utf8_lossy(&offline.stderr).into_owned();
    // `FILE:LINE:COLUMN: EnvoyConfig demo/demo-typo: PATH: MESSAGE`
    let problem = offline
        .lines()
        .find_map(|l| {
            l.split_once(&format!("EnvoyConfig {demo}/demo-typo: "))
                .map(|(_, p)| p.to_owned())
        })
        .unwrap_or_else(|| panic!("{offline}"));
    assert!(
        problem.starts_with("spec.envoyResources.listeners[0].value: ")
            && problem.contains("stat_prefx"),
        "{offline}"
    );
    let refused = kubectl
        .run_with(&["apply", "--server-side", "-f", "-"], &typo)
        .await
        .unwrap();
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused.stderr.contains(&format!(
            "admission webhook \"{ds_name}.{OPS}.envoyconfig-validator.marin3r.3scale.net\" denied the request: "
        )) && refused.stderr.contains(&problem),
        "expected {problem:?} in {refused:?}"
    );
    assert!(
        Api::<EnvoyConfig>::namespaced(client.clone(), demo)
            .get_opt("demo-typo")
            .await
            .unwrap()
            .is_none()
    );

    // 2. An annotated pod is injected, its Envoy connects over mTLS and serves the config;
    //    the same workload in a namespace that is not enabled is not injected.
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("envoyconfig.yaml", demo).unwrap(),
        )
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("deployment.yaml", demo).unwrap(),
        )
        .await
        .unwrap();
    let pod = serving_pod(&client, demo).await;
    step("injected pod serving");
    // The API server is 1.36: Envoy is a native sidecar, an init container.
    let spec = pod.spec.as_ref().unwrap();
    let names = |list: &[k8s_openapi::api::core::v1::Container]| -> Vec<String> {
        list.iter().map(|c| c.name.clone()).collect()
    };
    assert_eq!(names(&spec.containers), ["app"]);
    assert_eq!(
        names(spec.init_containers.as_deref().unwrap_or_default()),
        ["envoy-sidecar"]
    );

    // A misspelt marin3r annotation: kubectl prints the webhook's warning naming it (and the
    // likely name), and the pod is injected all the same.
    let mut typo_pod: serde_json::Value = serde_json::to_value(&pod).unwrap();
    // The API server's ServiceAccount admission mounted a token volume: the mount goes with
    // the volume, which is not copied.
    typo_pod["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("volumeMounts");
    let typo_pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "annotation-typo",
            "namespace": demo,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {
                "marin3r.3scale.net/node-id": "demo-proxy",
                "marin3r.3scale.net/envoy-extra-arg": "--log-level debug",
            },
        },
        "spec": {
            "securityContext": typo_pod["spec"]["securityContext"].take(),
            "containers": [typo_pod["spec"]["containers"][0].take()],
        },
    });
    let applied = kubectl
        .run_with(&["apply", "-f", "-"], &typo_pod.to_string())
        .await
        .unwrap();
    assert!(applied.success, "{applied:?}");
    assert!(
        applied.stderr.contains(
            "Warning: annotation marin3r.3scale.net/envoy-extra-arg is not a marin3r annotation \
             and has no effect; did you mean marin3r.3scale.net/envoy-extra-args?"
        ),
        "{applied:?}"
    );
    let injected = Api::<Pod>::namespaced(client.clone(), demo)
        .get("annotation-typo")
        .await
        .unwrap();
    let spec = injected.spec.unwrap();
    assert_eq!(names(&spec.containers), ["app"]);
    assert_eq!(
        names(spec.init_containers.as_deref().unwrap_or_default()),
        ["envoy-sidecar"]
    );
    Api::<Pod>::namespaced(client.clone(), demo)
        .delete("annotation-typo", &DeleteParams::default())
        .await
        .unwrap();

    // The sidecar's admin API stays inside the pod. Through the pod network (the host
    // reaches the pod IP as any other pod does) the admin port refuses connections, and the
    // readiness listener kubelet probes answers `GET /ready` and nothing else.
    let ip = pod_ip(&pod);
    let admin_addr: std::net::SocketAddr = format!("{ip}:9901").parse().unwrap();
    let refused = std::net::TcpStream::connect_timeout(&admin_addr, Duration::from_secs(3));
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "the admin port must not accept connections on the pod IP"
    );
    let (status, body) =
        marin3r_testkit::envoy::request("GET", &format!("http://{ip}:9902/ready")).unwrap();
    assert_eq!((status, body.trim()), (200, "LIVE"));
    for (method, path) in [
        ("POST", "/quitquitquit"),
        ("GET", "/config_dump"),
        ("GET", "/certs"),
        ("POST", "/runtime_modify?x=1"),
        ("POST", "/ready"),
    ] {
        let url = format!("http://{ip}:9902{path}");
        let (status, body) = marin3r_testkit::envoy::request(method, &url).unwrap();
        assert_eq!(
            status, 404,
            "{method} {path} through the readiness port: {body}"
        );
    }
    // Inside the pod (its containers, `kubectl exec`) the admin answers, and Envoy is still up.
    assert_eq!(admin(&client, &pod, "/ready").await.trim(), "LIVE");
    assert_eq!(get(&format!("http://{ip}:8080/")), BODY);
    // The discovery pods have a disruption budget, which kubectl lists.
    let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), OPS)
        .get(&n.owned)
        .await
        .unwrap();
    assert!(pdb.spec.unwrap().max_unavailable.is_some());
    let out = kubectl.ok(&["get", "pdb", "-n", OPS]).await.unwrap();
    assert!(out.contains(&n.owned), "{out}");
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("deployment.yaml", plain).unwrap(),
        )
        .await
        .unwrap();
    let plain_pod = until(
        "the pod in the plain namespace",
        Duration::from_secs(60),
        || async { ready_pods(&client, plain, "app=demo").await.pop() },
    )
    .await;
    assert_eq!(
        plain_pod.spec.unwrap().containers.len(),
        1,
        "not injected outside enabled namespaces"
    );

    // `marin3r proxy-status` reaches the sync status through the API server (a pod
    // port-forward to the discovery pod's loopback admin port) and shows the sidecar...
    let proxy_status = || {
        let (marin3r, kubeconfig) = (marin3r.clone(), kubeconfig.clone());
        async move {
            marin3r_e2e::cli::proxy_status(&marin3r, &kubeconfig, &["-n", demo])
                .await
                .unwrap()
        }
    };
    let table = until(
        "proxy-status to show the synced sidecar",
        Duration::from_secs(30),
        || async {
            let table = proxy_status().await;
            (table.contains(&pod.name_any()) && table.contains("SYNCED")).then_some(table)
        },
    )
    .await;
    assert!(table.starts_with("NAMESPACE"), "{table}");
    // ...which the network cannot: not on the admin port, not on the metrics port.
    let discovery_ip = pod_ip(&discovery_pods[0]);
    let admin_port = get(&format!("http://{discovery_ip}:8385/sync-status"));
    assert!(admin_port.starts_with("GET failed"), "{admin_port}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let on_metrics = agent
        .get(&format!("http://{discovery_ip}:8383/sync-status"))
        .call()
        .unwrap()
        .status();
    assert_eq!(on_metrics, 404);
    // The probe port (spec.probePort, 8384) answers the health paths the kubelet's probes
    // use, and only those.
    let probe = |path: &str| {
        let mut r = agent
            .get(&format!("http://{discovery_ip}:8384{path}"))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    };
    assert_eq!(probe("/readyz"), (200, "ready\n".to_owned()));
    assert_eq!(probe("/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(probe("/metrics").0, 404);
    let probes = discovery_pods[0].spec.as_ref().unwrap().containers[0]
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|h| h.port.clone());
    assert_eq!(probes, Some(IntOrString::Int(8384)));

    // The discovery pod loads a TLS Secret of a served namespace for SDS (read through its
    // per-namespace Role and watch): here the namespace's client certificate Secret.
    let sds = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "sds-check", "namespace": demo},
        "spec": {
            "nodeID": "sds-check",
            "serialization": "yaml",
            "envoyResources": {
                "secrets": [{"name": "client", "ref": {"name": "envoy-sidecar-client-cert"}}],
            },
        },
    });
    Api::<EnvoyConfig>::namespaced(client.clone(), demo)
        .patch("sds-check", &PatchParams::apply("e2e"), &Patch::Apply(&sds))
        .await
        .unwrap();
    let revisions: Api<EnvoyConfigRevision> = Api::namespaced(client.clone(), demo);
    until(
        "the SDS Secret loaded by the discovery pod",
        Duration::from_secs(60),
        || async {
            revisions
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|r| r.spec.node_id == "sds-check")
                .flat_map(|r| r.status.map(|s| s.conditions).unwrap_or_default())
                .find(|c| {
                    c.type_ == "ResourcesOutOfSync"
                        && c.status == "False"
                        && c.reason == "ResourcesLoaded"
                })
        },
    )
    .await;
    Api::<EnvoyConfig>::namespaced(client.clone(), demo)
        .delete("sds-check", &DeleteParams::default())
        .await
        .unwrap();

    // It reads and watches the namespace's EndpointSlices for `generateFromEndpointSlices`
    // (through the same Role, which grants nothing else): the endpoints version it serves
    // changes when the slice does.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), demo);
    let slice = |port: u16| {
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "eds-check-1", "labels": {"kubernetes.io/service-name": "eds-check"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": port}],
        })
    };
    slices
        .patch(
            "eds-check-1",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&slice(8080)),
        )
        .await
        .unwrap();
    let eds = json!({
        "apiVersion": "marin3r.3scale.net/v1alpha1",
        "kind": "EnvoyConfig",
        "metadata": {"name": "eds-check", "namespace": demo},
        "spec": {
            "nodeID": "eds-check",
            "resources": [{"type": "endpoint", "generateFromEndpointSlices": {
                "selector": {"matchLabels": {"kubernetes.io/service-name": "eds-check"}},
                "clusterName": "eds-check",
                "targetPort": "http",
            }}],
        },
    });
    Api::<EnvoyConfig>::namespaced(client.clone(), demo)
        .patch("eds-check", &PatchParams::apply("e2e"), &Patch::Apply(&eds))
        .await
        .unwrap();
    let endpoints_version = || async {
        revisions
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| r.spec.node_id == "eds-check")
            .find_map(|r| r.status?.provides_versions?.endpoints)
    };
    let first = until(
        "the EndpointSlice read by the discovery pod",
        Duration::from_secs(60),
        endpoints_version,
    )
    .await;
    slices
        .patch(
            "eds-check-1",
            &PatchParams::apply("e2e"),
            &Patch::Apply(&slice(8081)),
        )
        .await
        .unwrap();
    until(
        "the changed EndpointSlice seen by the discovery pod",
        Duration::from_secs(60),
        || async { endpoints_version().await.filter(|v| *v != first) },
    )
    .await;
    Api::<EnvoyConfig>::namespaced(client.clone(), demo)
        .delete("eds-check", &DeleteParams::default())
        .await
        .unwrap();

    // 3. A user labels a second namespace: it is served; unlabelled, it is not.
    step("SDS and EDS read");
    let patch = |v: Option<&str>| json!({"metadata": {"labels": {DISCOVERY_SERVICE_LABEL: v}}});
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.patch(
        team_b,
        &PatchParams::default(),
        &Patch::Merge(&patch(Some(ds_name))),
    )
    .await
    .unwrap();
    until(
        "team-b's client certificate",
        Duration::from_secs(60),
        || async { secret_cert(&client, team_b, "envoy-sidecar-client-cert").await },
    )
    .await;
    Api::<ConfigMap>::namespaced(client.clone(), team_b)
        .get("envoy-sidecar-bootstrap")
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("envoyconfig.yaml", team_b).unwrap(),
        )
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &example_in("deployment.yaml", team_b).unwrap(),
        )
        .await
        .unwrap();
    serving_pod(&client, team_b).await;
    assert_eq!(has_secret_access(team_b).await, Some(true));
    Api::<Deployment>::namespaced(client.clone(), team_b)
        .delete("demo", &DeleteParams::default())
        .await
        .unwrap();
    nss.patch(team_b, &PatchParams::default(), &Patch::Merge(&patch(None)))
        .await
        .unwrap();
    until(
        "team-b's certificate and bootstrap to go",
        Duration::from_secs(60),
        || async {
            let gone = secret_cert(&client, team_b, "envoy-sidecar-client-cert")
                .await
                .is_none()
                && Api::<ConfigMap>::namespaced(client.clone(), team_b)
                    .get_opt("envoy-sidecar-bootstrap")
                    .await
                    .unwrap()
                    .is_none();
            gone.then_some(())
        },
    )
    .await;
    until(
        "team-b's Secret access to go",
        Duration::from_secs(30),
        || async { (has_secret_access(team_b).await == Some(false)).then_some(()) },
    )
    .await;
    step("team-b joined and left");

    // 4. Client certificate renewal: new files, Envoy presents the new certificate, no
    //    restart, traffic keeps flowing.
    let ip = pod_ip(&pod);
    let old_cert = secret_cert(&client, demo, "envoy-sidecar-client-cert")
        .await
        .unwrap();
    renew(
        &client,
        &format!("marin3r-client-{ds_name}-{demo}"),
        "client-1",
    )
    .await;
    let new_cert = until(
        "the client certificate Secret to change",
        Duration::from_secs(60),
        || async {
            secret_cert(&client, demo, "envoy-sidecar-client-cert")
                .await
                .filter(|c| *c != old_cert)
        },
    )
    .await;
    let serial = serial_hex(&new_cert);
    until(
        "Envoy to present the new client certificate",
        Duration::from_secs(60),
        || async {
            admin(&client, &pod, "/certs")
                .await
                .replace(':', "")
                .to_lowercase()
                .contains(&serial)
                .then_some(())
        },
    )
    .await;
    let same = Api::<Pod>::namespaced(client.clone(), demo)
        .get(&pod.name_any())
        .await
        .unwrap();
    assert_eq!(restarts(&same), 0, "no container restarted");
    assert_eq!(get(&format!("http://{ip}:8080/")), BODY);
    step("client certificate renewed");

    // 5. Server certificate renewal: the Deployment rolls, Envoys reconnect, injection works.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPS);
    let hash = |d: &Deployment| {
        d.spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap()[SERVER_CERT_HASH_LABEL]
            .clone()
    };
    let old_hash = hash(&deployments.get(&n.owned).await.unwrap());
    let old_pod = discovery_pods[0].name_any();
    // Connections Envoy has opened to the discovery service so far: a reconnection to the
    // new pod opens another.
    let xds_connections = || async {
        let stats = admin(
            &client,
            &pod,
            "/stats?filter=^cluster.xds_cluster.upstream_cx_total$",
        )
        .await;
        stats
            .rsplit(": ")
            .next()
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let connections_before = xds_connections().await;
    assert!(connections_before >= 1, "no xDS connection counted yet");
    renew(&client, &n.server, "server-1").await;
    until(
        "the discovery pod to roll",
        Duration::from_secs(120),
        || async {
            let d = deployments.get(&n.owned).await.unwrap();
            let pods = ready_pods(&client, OPS, &discovery_selector).await;
            // Until the old pod stops, at least one discovery pod is ready.
            assert!(
                !pods.is_empty(),
                "no ready discovery pod during the rollout"
            );
            let rolled = hash(&d) != old_hash && pods.len() == 1 && pods[0].name_any() != old_pod;
            rolled.then_some(())
        },
    )
    .await;
    until(
        "Envoy to reconnect to the new discovery pod",
        Duration::from_secs(60),
        || async {
            let stats = admin(&client, &pod, "/stats?filter=control_plane.connected_state").await;
            (stats.contains("control_plane.connected_state: 1")
                && xds_connections().await > connections_before)
                .then_some(())
        },
    )
    .await;
    assert_eq!(get(&format!("http://{ip}:8080/")), BODY);
    step("server certificate renewed, discovery pod rolled");
    // A new pod is still injected (the webhook serves the new certificate).
    Api::<Pod>::namespaced(client.clone(), demo)
        .delete(&pod.name_any(), &DeleteParams::default())
        .await
        .unwrap();
    let pod = until(
        "a replacement pod, injected and serving",
        Duration::from_secs(90),
        || async {
            let pods = ready_pods(&client, demo, "app=demo").await;
            let p = pods.into_iter().find(|p| p.name_any() != pod.name_any())?;
            (get(&format!("http://{}:8080/", pod_ip(&p))) == BODY).then_some(p)
        },
    )
    .await;
    let ip = pod_ip(&pod);

    // 6. A config Envoy refuses is rolled back and reported; the pod keeps serving.
    let bad = nacked_by_proxies(&example_in("envoyconfig.yaml", demo).unwrap()).unwrap();
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &bad)
        .await
        .unwrap();
    let ecs: Api<EnvoyConfig> = Api::namespaced(client.clone(), demo);
    until(
        "the bad config to be rolled back",
        Duration::from_secs(60),
        || async {
            let ec = ecs.get("demo-proxy").await.ok()?;
            (ec.status?.cache_state == Some(CacheState::Rollback)).then_some(())
        },
    )
    .await;
    assert_eq!(get(&format!("http://{ip}:8080/")), BODY);

    // 7. Deleting the DiscoveryService removes everything, cluster-scoped objects included.
    step("NACK rolled back");
    dss.delete(ds_name, &DeleteParams::default()).await.unwrap();
    // Named, so a timeout says what stayed behind.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let left = leftovers(&client, &n).await;
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "90 s after the DiscoveryService was deleted, still there: {}",
            left.join(", ")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    step("everything removed");
}
