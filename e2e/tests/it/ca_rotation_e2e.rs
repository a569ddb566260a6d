//! F9 end to end, on the real cluster: the CA of a discovery service is renewed while a
//! sidecar Envoy serves traffic, keeps receiving config over mTLS xDS, and pods keep being
//! admitted through the webhook (the API server trusts only the `caBundle` it has). Secrets
//! reach running pods when the real kubelet next syncs them (`hack/cluster`'s kubelet syncs
//! every 10 s), so a hard CA cutover would show: the rolled discovery pod presenting a new-CA
//! certificate the sidecar does not trust yet, and the API server trusting the new CA before
//! the old discovery pod serves it. With the overlap no request, config update, TLS handshake
//! or admission fails. The operator is run with `--trust-propagation-seconds` above the
//! kubelet's sync, so the cluster is held alone, and the stock operator is applied again at
//! the end.

use marin3r_testkit::wait::until;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_certs::controller::rotation::split_certificates;
use marin3r_certs::{CertificateInfo, verify_signed_by};
use marin3r_e2e::real::{self, Scenario};
use marin3r_testkit::tools::repo_root;
use serde_json::json;

const BODY: &str = real::EXAMPLE_BODY;
/// The operator's `--trust-propagation-seconds`: the kubelet's 10 s sync (and the time a
/// sync takes) plus the xDS server's 10 s file reload, with seconds to spare.
const PROPAGATION_SECONDS: u64 = 25;

/// Applies the stock `manifests/` again however the test ends, so the operator runs with its
/// default trust propagation for the scenarios after this one.
struct StockOperator(std::path::PathBuf);

impl Drop for StockOperator {
    fn drop(&mut self) {
        if let Ok(kubectl) = marin3r_testkit::tools::kubectl() {
            let manifests = repo_root().join("manifests");
            let _ = std::process::Command::new(kubectl)
                .arg("apply")
                .arg("-k")
                .arg(manifests)
                .env("KUBECONFIG", &self.0)
                .output();
        }
    }
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

/// The sidecar's counters of failed TLS handshakes with the discovery service.
async fn tls_failures(scenario: &Scenario, pod: &Pod) -> u64 {
    let stats = scenario
        .envoy_admin(
            &pod.name_any(),
            "/stats?filter=^cluster\\.xds_cluster\\.ssl\\.(connection_error|fail_verify_error|fail_verify_no_cert)$",
        )
        .await
        .unwrap();
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

#[tokio::test(flavor = "multi_thread")]
async fn a_ca_rotation_fails_no_request_no_config_update_and_no_admission() {
    let scenario = Scenario::start_alone("rotation", &[]).await.unwrap();
    let (client, kubectl, ns) = (
        scenario.client.clone(),
        &scenario.kubectl,
        scenario.ns.as_str(),
    );
    let webhook = format!("marin3r-ns.{ns}.instance");

    // The operator from manifests/, told how late Secrets arrive here.
    let _stock = StockOperator(scenario.cluster.kubeconfig().to_path_buf());
    let manifests = kubectl
        .ok(&["kustomize", repo_root().join("manifests").to_str().unwrap()])
        .await
        .unwrap();
    let args = "      - args:\n        - operator\n";
    assert_eq!(manifests.matches(args).count(), 1, "{manifests}");
    let flag = format!("{args}        - --trust-propagation-seconds={PROPAGATION_SECONDS}\n");
    let manifests = manifests.replace(args, &flag);
    kubectl
        .ok_with(&["apply", "-f", "-"], &manifests)
        .await
        .unwrap();
    kubectl
        .ok(&[
            "rollout",
            "status",
            "-n",
            "marin3r-system",
            "deployment/marin3r-operator",
            "--timeout=120s",
        ])
        .await
        .unwrap();
    let pod = scenario.serve_examples(BODY).await.unwrap();
    let pod = until(
        "the injected pod serving the EnvoyConfig",
        Duration::from_secs(120),
        || async {
            let body =
                marin3r_testkit::envoy::get_body(&format!("http://{}:8080/", real::pod_ip(&pod)))
                    .ok()?;
            (body == BODY).then_some(pod.clone())
        },
    )
    .await;
    let ip = real::pod_ip(&pod);
    let ecs = |body: &str| real::example_config(ns, body).unwrap();

    let secrets = |ns: &str| Api::<Secret>::namespaced(client.clone(), ns);
    let ca_secret = secrets(ns).get("marin3r-ca-cert-instance").await.unwrap();
    let old_ca = text(&ca_secret, "tls.crt").unwrap();
    let old_client = text(
        &secrets(ns).get("envoy-sidecar-client-cert").await.unwrap(),
        "tls.crt",
    )
    .unwrap();
    let discovery = "app.kubernetes.io/component=discovery-service";
    let old_discovery = scenario.ready_pods(discovery).await[0].name_any();
    let tls_failures_before = tls_failures(&scenario, &pod).await;
    let template = Api::<Deployment>::namespaced(client.clone(), ns)
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
        let ns = ns.to_owned();
        tokio::spawn(async move {
            let pods: Api<Pod> = Api::namespaced(client, &ns);
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
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), ns);
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
            started.elapsed() < Duration::from_secs(240),
            "the CA rotation did not finish; failures: {:?}",
            failures.log.lock().unwrap()
        );
        version += 1;
        let body = format!("{BODY} {version}");
        kubectl
            .ok_with(&["apply", "-f", "-"], &ecs(&body))
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
        let bundle = webhooks.get(&webhook).await.unwrap().webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .clone()
            .map(|b| String::from_utf8(b.0).unwrap())
            .unwrap();
        let bundle = split_certificates(&bundle);
        bundle_overlap |= bundle.len() == 2;
        let certs = scenario
            .envoy_admin(&pod.name_any(), "/certs")
            .await
            .unwrap_or_else(|e| format!("GET failed: {e:#}"))
            .replace(':', "")
            .to_lowercase();
        let ca = text(
            &secrets(ns).get("marin3r-ca-cert-instance").await.unwrap(),
            "tls.crt",
        )
        .unwrap();
        if ca != old_ca {
            envoy_overlap |= certs.contains(&old_ca_serial) && certs.contains(&serial(&ca));
        }
        let client_secret = secrets(ns).get("envoy-sidecar-client-cert").await.unwrap();
        let client_cert = text(&client_secret, "tls.crt").unwrap();
        let discovery_pods = scenario.ready_pods(discovery).await;
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
        .ok_with(&["apply", "-f", "-"], &ecs(&body))
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
            &secrets(ns).get("envoy-sidecar-client-cert").await.unwrap(),
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
        tls_failures(&scenario, &pod).await,
        tls_failures_before,
        "the sidecar failed TLS handshakes with the discovery service"
    );
}
