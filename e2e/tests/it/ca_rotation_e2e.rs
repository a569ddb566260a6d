//! F9 end to end: the CA of a discovery service is renewed while a sidecar Envoy serves
//! traffic, keeps receiving config over mTLS xDS, and pods keep being admitted through the
//! webhook (the local API server trusts only the `caBundle` it has). Secrets reach running
//! pods 4 s late, as a real kubelet's sync makes them, so a hard CA cutover shows: the
//! rolled discovery pod presents a new-CA certificate the sidecar does not trust yet, and the
//! API server trusts the new CA before the old discovery pod serves it. With the overlap no
//! request, config update, TLS handshake or admission fails. Needs root and the built
//! `marin3r` (`cargo build -p marin3r-discovery`).

use marin3r_testkit::wait::until;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_certs::controller::rotation::split_certificates;
use marin3r_certs::{CertificateInfo, verify_signed_by};
use marin3r_discovery::api::discovery_service::DiscoveryService;
use marin3r_local_cluster::cluster::{LocalCluster, LocalClusterConfig};
use marin3r_testkit::kubectl::Kubectl;
use serde_json::json;

const OPS: &str = "marin3r-system";
const WEBHOOK: &str = "marin3r-marin3r-system-instance";
const BODY: &str = "hello from marin3r";
/// How late a Secret change reaches a running pod here.
const VOLUME_DELAY: Duration = Duration::from_secs(4);
/// The operator's `--trust-propagation-seconds`: the volume delay plus the xDS server's 10 s
/// file reload, with a second to spare.
const PROPAGATION_SECONDS: u64 = 15;

fn repo() -> PathBuf {
    marin3r_testkit::tools::repo_root()
}

fn pod_ip(p: &Pod) -> String {
    p.status.as_ref().unwrap().pod_ip.clone().unwrap()
}

async fn ready_pods(client: &Client, ns: &str, selector: &str) -> Vec<Pod> {
    marin3r_local_cluster::cluster::ready_pods(client, ns, selector)
        .await
        .unwrap()
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    String::from_utf8(secret.data.as_ref()?.get(key)?.0.clone()).ok()
}

fn serial(pem: &str) -> String {
    CertificateInfo::from_pem(pem)
        .unwrap()
        .serial
        .replace(':', "")
        .to_lowercase()
}

/// The example EnvoyConfig answering `body`.
fn envoy_config(body: &str) -> String {
    let text = std::fs::read_to_string(repo().join("manifests/examples/envoyconfig.yaml")).unwrap();
    text.replace(
        &format!("inline_string: \"{BODY}\""),
        &format!("inline_string: \"{body}\""),
    )
}

/// `GET` a sidecar's admin `path` from inside its pod.
fn admin(cluster: &LocalCluster, pod: &Pod, path: &str) -> String {
    cluster
        .get_in_pod(
            &pod.namespace().unwrap(),
            &pod.name_any(),
            &format!("http://127.0.0.1:9901{path}"),
        )
        .unwrap_or_else(|e| format!("GET failed: {e:#}"))
}

/// The sidecar's counters of failed TLS handshakes with the discovery service.
fn tls_failures(cluster: &LocalCluster, pod: &Pod) -> u64 {
    let stats = admin(
        cluster,
        pod,
        "/stats?filter=^cluster\\.xds_cluster\\.ssl\\.(connection_error|fail_verify_error|fail_verify_no_cert)$",
    );
    assert!(!stats.starts_with("GET failed"), "{stats}");
    stats
        .lines()
        .filter_map(|l| l.rsplit(": ").next()?.trim().parse::<u64>().ok())
        .sum()
}

#[derive(Default)]
struct Failures {
    requests: AtomicU64,
    requests_ok: AtomicU64,
    admissions: AtomicU64,
    admissions_ok: AtomicU64,
    log: std::sync::Mutex<Vec<String>>,
}

impl Failures {
    fn record(&self, what: String) {
        eprintln!("FAILED: {what}");
        self.log.lock().unwrap().push(what);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_fails_no_request_no_config_update_and_no_admission() {
    let images = marin3r_e2e::product::images();
    images
        .resolve(marin3r_discovery::IMAGE)
        .expect("build the marin3r binary first: cargo build -p marin3r-discovery");
    let cluster = LocalCluster::start(LocalClusterConfig {
        images,
        log_dir: std::env::var_os("MARIN3R_E2E_LOG_DIR").map(PathBuf::from),
        volume_update_delay: VOLUME_DELAY,
        ..Default::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.api().write_kubeconfig(&kubeconfig).unwrap();
    let kubectl = Kubectl::new(&kubeconfig).unwrap();

    // The operator from manifests/, told how late Secrets arrive here.
    let manifests = kubectl
        .ok(&["kustomize", repo().join("manifests").to_str().unwrap()])
        .await
        .unwrap();
    let args = "      - args:\n        - operator\n";
    assert_eq!(manifests.matches(args).count(), 1, "{manifests}");
    let flag = format!("{args}        - --trust-propagation-seconds={PROPAGATION_SECONDS}\n");
    let manifests = manifests.replace(args, &flag);
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &manifests)
        .await
        .unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {
        "name": "demo",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
    }}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let examples = repo().join("manifests/examples");
    kubectl
        .ok(&[
            "apply",
            "--server-side",
            "-f",
            examples.join("discoveryservice.yaml").to_str().unwrap(),
        ])
        .await
        .unwrap();
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), OPS);
    until(
        "the DiscoveryService to be Ready",
        Duration::from_secs(120),
        || async {
            let ds = dss.get("instance").await.ok()?;
            let ready = ds
                .status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(())
        },
    )
    .await;
    let ecs = |body: &str| envoy_config(body);
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &ecs(BODY))
        .await
        .unwrap();
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &std::fs::read_to_string(examples.join("deployment.yaml")).unwrap(),
        )
        .await
        .unwrap();
    let pod = until(
        "the injected pod serving the EnvoyConfig",
        Duration::from_secs(120),
        || async {
            let pod = ready_pods(&client, "demo", "app=demo").await.pop()?;
            let body =
                marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", pod_ip(&pod))).ok()?;
            (body == BODY).then_some(pod)
        },
    )
    .await;
    let ip = pod_ip(&pod);

    let secrets = |ns: &str| Api::<Secret>::namespaced(client.clone(), ns);
    let ca_secret = secrets(OPS).get("marin3r-ca-cert-instance").await.unwrap();
    let old_ca = text(&ca_secret, "tls.crt").unwrap();
    let old_client = text(
        &secrets("demo")
            .get("envoy-sidecar-client-cert")
            .await
            .unwrap(),
        "tls.crt",
    )
    .unwrap();
    let discovery = "app.kubernetes.io/component=discovery-service";
    let old_discovery = ready_pods(&client, OPS, discovery).await[0].name_any();
    let tls_failures_before = tls_failures(&cluster, &pod);
    let template = Api::<Deployment>::namespaced(client.clone(), "demo")
        .get("demo")
        .await
        .unwrap()
        .spec
        .template;

    // Traffic through the sidecar and admissions, all the way through the rotation.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Failures::default());
    let requests = {
        let (stop, failures, url) = (stop.clone(), failures.clone(), format!("http://{ip}:8080/"));
        std::thread::spawn(move || {
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(300) {
                match marin3r_testkit::envoy::request("GET", &url) {
                    Ok((200, body)) if body.starts_with(BODY) => {
                        failures.requests_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        failures.requests.fetch_add(1, Ordering::Relaxed);
                        failures.record(format!("request at {:?}: {other:?}", started.elapsed()));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let admissions = {
        let (stop, failures, client) = (stop.clone(), failures.clone(), client.clone());
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, "demo");
            let meta = template.metadata.unwrap_or_default();
            let pod = Pod {
                metadata: ObjectMeta {
                    generate_name: Some("rotation-".into()),
                    labels: meta.labels,
                    annotations: meta.annotations,
                    ..Default::default()
                },
                spec: template.spec,
                status: None,
            };
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(300) {
                match pods.create(&dry_run, &pod).await {
                    Ok(p)
                        if p.spec.as_ref().is_some_and(|s| {
                            s.containers
                                .iter()
                                .chain(s.init_containers.iter().flatten())
                                .any(|c| c.name == "envoy-sidecar")
                        }) =>
                    {
                        failures.admissions_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        failures.admissions.fetch_add(1, Ordering::Relaxed);
                        let what = other.map(|p| p.spec.map(|s| s.containers.len()));
                        failures.record(format!("admission at {:?}: {what:?}", started.elapsed()));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // Renew the CA, as `marin3r certs renew` does.
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), OPS);
    let renew = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": "rotate-ca"}}});
    dscs.patch(
        "marin3r-ca-cert-instance",
        &PatchParams::default(),
        &Patch::Merge(&renew),
    )
    .await
    .unwrap();

    // Until the rotation is over, a new config every few seconds must reach the sidecar.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let started = Instant::now();
    let (mut version, mut late_configs) = (0u32, Vec::new());
    let (mut bundle_overlap, mut envoy_overlap) = (false, false);
    let old_ca_serial = serial(&old_ca);
    let new_ca = loop {
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "the CA rotation did not finish; failures: {:?}",
            failures.log.lock().unwrap()
        );
        version += 1;
        let body = format!("{BODY} {version}");
        kubectl
            .ok_with(&["apply", "--server-side", "-f", "-"], &ecs(&body))
            .await
            .unwrap();
        let pushed = Instant::now();
        loop {
            let served = marin3r_testkit::envoy::get_body(&format!("http://{ip}:8080/")).ok();
            if served.as_deref() == Some(body.as_str()) {
                break;
            }
            if pushed.elapsed() > Duration::from_secs(10) {
                late_configs.push((version, started.elapsed(), served));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let bundle = webhooks.get(WEBHOOK).await.unwrap().webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
            .map(|b| String::from_utf8(b.0).unwrap())
            .unwrap();
        let bundle = split_certificates(&bundle);
        bundle_overlap |= bundle.len() == 2;
        let certs = admin(&cluster, &pod, "/certs")
            .replace(':', "")
            .to_lowercase();
        let ca = text(
            &secrets(OPS).get("marin3r-ca-cert-instance").await.unwrap(),
            "tls.crt",
        )
        .unwrap();
        if ca != old_ca {
            envoy_overlap |= certs.contains(&old_ca_serial) && certs.contains(&serial(&ca));
        }
        let client_secret = secrets("demo")
            .get("envoy-sidecar-client-cert")
            .await
            .unwrap();
        let client_cert = text(&client_secret, "tls.crt").unwrap();
        let discovery_pods = ready_pods(&client, OPS, discovery).await;
        let done = ca != old_ca
            && bundle == [ca.clone()]
            && split_certificates(&text(&client_secret, "ca.crt").unwrap()) == [ca.clone()]
            && verify_signed_by(&client_cert, &ca).is_ok()
            && certs.contains(&serial(&client_cert))
            && !certs.contains(&old_ca_serial)
            && discovery_pods.len() == 1
            && discovery_pods[0].name_any() != old_discovery;
        if done {
            break ca;
        }
        tokio::time::sleep(Duration::from_millis(2000)).await;
    };
    eprintln!("the CA rotation took {:?}", started.elapsed());
    // One more config after the rotation: xDS works on the new CA alone.
    version += 1;
    let body = format!("{BODY} {version}");
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &ecs(&body))
        .await
        .unwrap();
    until(
        "the last config to reach the sidecar",
        Duration::from_secs(20),
        || async {
            let served = marin3r_testkit::envoy::get_body(&format!("http://{ip}:8080/")).ok()?;
            (served == body).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    requests.join().unwrap();
    admissions.await.unwrap();

    assert_ne!(serial(&new_ca), old_ca_serial);
    assert_ne!(
        text(
            &secrets("demo")
                .get("envoy-sidecar-client-cert")
                .await
                .unwrap(),
            "tls.crt"
        )
        .unwrap(),
        old_client
    );
    assert!(bundle_overlap, "the webhook's caBundle never held both CAs");
    assert!(envoy_overlap, "the sidecar never trusted both CAs");
    let log = failures.log.lock().unwrap().clone();
    let (ok, failed) = (
        failures.requests_ok.load(Ordering::Relaxed),
        failures.requests.load(Ordering::Relaxed),
    );
    let (admitted, refused) = (
        failures.admissions_ok.load(Ordering::Relaxed),
        failures.admissions.load(Ordering::Relaxed),
    );
    eprintln!(
        "requests: {ok} ok, {failed} failed; admissions: {admitted} ok, {refused} failed; configs: {version}, late: {late_configs:?}"
    );
    assert!(ok > 100 && admitted > 50, "too little traffic to tell");
    assert_eq!((failed, refused), (0, 0), "{log:#?}");
    assert!(
        late_configs.is_empty(),
        "configs that did not arrive within 10 s: {late_configs:?}"
    );
    assert_eq!(
        tls_failures(&cluster, &pod),
        tls_failures_before,
        "the sidecar failed TLS handshakes with the discovery service"
    );
    cluster.shutdown(Duration::from_secs(5)).await;
}
