//! The `DiscoveryServiceCertificate` controller run by the test against the real API server
//! of `hack/cluster` (through the fault proxy, the cluster's own operator stopped meanwhile),
//! driven only through the Kubernetes API: issuance, renewal at 80%, every reissue trigger
//! exactly once, CA rotation, bad specs, cross-namespace refusal, and API faults.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use marin3r_api_faults::{FaultProxy, FaultScope};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_certs::controller::{self, Config};
use marin3r_certs::{CertificateInfo, SubjectAltName, certificate_hash, verify_signed_by};
use marin3r_testkit::cluster::{Cluster, OperatorStopped};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const PROPAGATION: Duration = Duration::from_secs(2);

struct Env {
    /// The test's own client, straight to the API server (never faulted).
    client: Client,
    /// What the controller's client talks through.
    proxy: FaultProxy,
    ns: String,
    kubeconfig: std::path::PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// The controller's certificate gauges.
    certificates: controller::CertificateMetrics,
    /// Last: the cluster's operator comes back once the namespaces are deleted.
    _operator_stopped: OperatorStopped,
}

impl Env {
    async fn start(trusted: &[&str]) -> Self {
        Self::start_with(trusted, |_| {}).await
    }

    /// As [`Env::start`], with the controller's configuration adjusted by `configure`.
    async fn start_with(trusted: &[&str], configure: impl FnOnce(&mut Config)) -> Self {
        // The controller's log, with RUST_LOG.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let cluster = tokio::task::spawn_blocking(Cluster::start_or_attach)
            .await
            .unwrap()
            .unwrap();
        // The cluster's operator runs this controller too, on every certificate of the
        // cluster: it stops while the test's runs.
        let test = marin3r_testkit::cluster::current_test();
        let operator_stopped = tokio::task::spawn_blocking({
            let cluster = cluster.clone();
            move || cluster.operator_stopped_for(test)
        })
        .await
        .unwrap()
        .unwrap();
        let kubectl = cluster.kubectl().unwrap();
        let crds = marin3r_testkit::tools::repo_root().join("manifests/crds");
        kubectl
            .ok(&["apply", "-f", crds.to_str().unwrap()])
            .await
            .unwrap();
        kubectl
            .ok(&[
                "wait",
                "--for=condition=Established",
                "crd/discoveryservicecertificates.operator.marin3r.3scale.net",
            ])
            .await
            .unwrap();
        let client = cluster.client().await.unwrap();
        let proxy = FaultProxy::start(cluster.config().await.unwrap())
            .await
            .unwrap();
        let controller_client = proxy
            .endpoint("certificate-controller")
            .await
            .unwrap()
            .client()
            .unwrap();
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let ns = format!("certs-{}-{millis}", std::process::id());
        let nss: Api<Namespace> = Api::all(client.clone());
        for name in [ns.clone(), format!("{ns}-other")] {
            let obj: Namespace =
                serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            nss.create(&PostParams::default(), &obj).await.unwrap();
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let mut config = Config {
            trusted_namespaces: trusted
                .iter()
                .map(|t| t.replace("{ns}", &ns))
                .collect::<BTreeSet<_>>(),
            // The renewal tests use validities of seconds.
            min_renewal_interval: Duration::from_secs(1),
            // Secrets reach no pod here: each CA rotation step waits 2 s for the one before.
            trust_propagation: PROPAGATION,
            ..Default::default()
        };
        configure(&mut config);
        let certificates = config.certificates.clone();
        let task = tokio::spawn(controller::run(controller_client, config, async move {
            let _ = stopped.await;
        }));
        Self {
            client,
            proxy,
            ns,
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            stop: Some(stop),
            task: Some(task),
            certificates,
            _operator_stopped: operator_stopped,
        }
    }

    /// The certificate gauges as Prometheus scrapes them.
    fn metrics(&self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        self.certificates.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    fn dscs(&self) -> Api<DiscoveryServiceCertificate> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn secrets(&self, ns: &str) -> Api<Secret> {
        Api::namespaced(self.client.clone(), ns)
    }

    async fn apply(&self, name: &str, spec: Value) {
        let obj = json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryServiceCertificate",
            "metadata": {"name": name},
            "spec": spec,
        });
        // Retried: some tests inject API errors that may hit this write too.
        for attempt in 0.. {
            match self
                .dscs()
                .patch(
                    name,
                    &PatchParams::apply("test").force(),
                    &Patch::Apply(&obj),
                )
                .await
            {
                Ok(_) => return,
                Err(e) if attempt < 20 => {
                    eprintln!("apply {name}: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("apply {name}: {e}"),
            }
        }
    }

    /// Waits (10 s at most) until the certificate's Ready condition has `reason`.
    async fn wait_reason(&self, name: &str, reason: &str) -> DiscoveryServiceCertificate {
        self.wait_reason_for(name, reason, Duration::from_secs(10))
            .await
    }

    /// Waits (`timeout` at most) until the certificate's Ready condition has `reason`.
    async fn wait_reason_for(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> DiscoveryServiceCertificate {
        let deadline = Instant::now() + timeout;
        loop {
            // Errors are retried: some tests inject API faults.
            if let Ok(Some(dsc)) = self.dscs().get_opt(name).await
                && ready_reason(&dsc).as_deref() == Some(reason)
            {
                return dsc;
            }
            if Instant::now() > deadline {
                let dsc = self.dscs().get_opt(name).await.unwrap();
                panic!(
                    "{name} never reached reason {reason}: {:?}",
                    dsc.and_then(|d| d.status)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn secret_cert(&self, ns: &str, name: &str) -> Option<(Secret, CertificateInfo)> {
        let secret = self.secrets(ns).get_opt(name).await.ok().flatten()?;
        let pem = text(&secret, "tls.crt")?;
        let info = CertificateInfo::from_pem(&pem).ok()?;
        Some((secret, info))
    }

    /// Waits (up to `within`) for the Secret's certificate serial to differ from `old`.
    async fn wait_new_serial(&self, name: &str, old: &str, within: Duration) -> CertificateInfo {
        let deadline = Instant::now() + within;
        loop {
            if let Some((_, info)) = self.secret_cert(&self.ns, name).await
                && info.serial != old
            {
                return info;
            }
            assert!(
                Instant::now() < deadline,
                "{name} was not reissued within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for `status.renewalTime` (in Unix seconds) to become `expected`.
    async fn wait_renewal_time(&self, name: &str, expected: Option<i64>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let dsc = self.dscs().get(name).await.unwrap();
            let seen = dsc
                .status
                .and_then(|s| s.renewal_time)
                .map(|t| t.0.as_second());
            if seen == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "status.renewalTime did not move to {expected:?}: still {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Asserts the serial stays `serial` for `period` (no second issuance).
    async fn assert_stable(&self, name: &str, serial: &str, period: Duration) {
        let deadline = Instant::now() + period;
        while Instant::now() < deadline {
            let (_, info) = self.secret_cert(&self.ns, name).await.unwrap();
            assert_eq!(info.serial, serial, "{name} was reissued again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn issued_events(&self, name: &str) -> usize {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("Issued")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            // Repeats of one event are a series on the first one.
            .map(|e| e.series.as_ref().map_or(1, |s| s.count) as usize)
            .sum()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Ok(kubectl) = marin3r_testkit::tools::kubectl() {
            let other = format!("{}-other", self.ns);
            let _ = std::process::Command::new(kubectl)
                .args(["delete", "namespace", &self.ns, &other, "--wait=false"])
                .env("KUBECONFIG", &self.kubeconfig)
                .output();
        }
    }
}

fn ready_reason(dsc: &DiscoveryServiceCertificate) -> Option<String> {
    dsc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.reason.clone())
}

fn ready_message(dsc: &DiscoveryServiceCertificate) -> String {
    dsc.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn ca_spec(valid_for: i64) -> Value {
    json!({"commonName": "test-ca", "isCA": true, "validFor": valid_for,
           "signer": {"selfSigned": {}}, "secretRef": {"name": "ca"}})
}

fn leaf_spec(server: bool, hosts: &[&str], valid_for: i64) -> Value {
    json!({"commonName": "leaf", "server": server, "validFor": valid_for, "hosts": hosts,
           "signer": {"caSigned": {"caSecretRef": {"name": "ca"}}},
           "secretRef": {"name": if server { "server-cert" } else { "client-cert" }}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issues_a_ca_then_server_and_client_certificates_signed_by_it() {
    let env = Env::start(&[]).await;
    env.apply("ca", ca_spec(3600)).await;
    env.apply(
        "server",
        leaf_spec(true, &["marin3r", "marin3r.default.svc", "127.0.0.1"], 600),
    )
    .await;
    env.apply(
        "client",
        leaf_spec(false, &["spiffe://cluster.local/ns/team-a"], 600),
    )
    .await;

    let ca = env.wait_reason("ca", "Issued").await;
    let server = env.wait_reason("server", "Issued").await;
    env.wait_reason("client", "Issued").await;

    let (ca_secret, ca_info) = env.secret_cert(&env.ns, "ca").await.unwrap();
    assert!(ca_info.is_ca);
    assert_eq!(ca_secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca_pem = text(&ca_secret, "tls.crt").unwrap();
    assert_eq!(text(&ca_secret, "ca.crt").unwrap(), ca_pem);

    let (secret, info) = env.secret_cert(&env.ns, "server-cert").await.unwrap();
    let keys: Vec<&String> = secret.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
    assert!(info.server_auth && !info.client_auth && !info.is_ca);
    assert_eq!(
        info.sans,
        vec![
            SubjectAltName::Dns("marin3r".into()),
            SubjectAltName::Dns("marin3r.default.svc".into()),
            SubjectAltName::Ip("127.0.0.1".parse().unwrap()),
        ]
    );
    let pem = text(&secret, "tls.crt").unwrap();
    verify_signed_by(&pem, &ca_pem).unwrap();
    marin3r_certs::key_matches(&pem, &text(&secret, "tls.key").unwrap()).unwrap();
    assert_eq!(text(&secret, "ca.crt").unwrap(), ca_pem);
    // Owned by the certificate, so deleting it garbage-collects the Secret.
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("DiscoveryServiceCertificate", "server")
    );

    let status = server.status.clone().unwrap();
    assert_eq!(status.ready, Some(true));
    assert_eq!(
        status.certificate_hash.as_deref(),
        Some(certificate_hash(&pem).unwrap().as_str())
    );
    let renewal = status.renewal_time.unwrap().0.as_second();
    assert_eq!(renewal, info.renewal_time().unix_timestamp());
    assert_eq!(
        ca.status.unwrap().not_after.unwrap().0.as_second(),
        ca_info.not_after.unix_timestamp()
    );

    let (client_secret, client) = env.secret_cert(&env.ns, "client-cert").await.unwrap();
    assert!(client.client_auth && !client.server_auth);
    assert_eq!(
        client.sans,
        vec![SubjectAltName::Uri(
            "spiffe://cluster.local/ns/team-a".into()
        )]
    );
    verify_signed_by(&text(&client_secret, "tls.crt").unwrap(), &ca_pem).unwrap();

    assert_eq!(env.issued_events("server").await, 1);

    env.dscs()
        .delete("server", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env
        .secrets(&env.ns)
        .get_opt("server-cert")
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the Secret outlived its certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_certificate_reports_its_expiry_renewal_and_readiness_until_deleted() {
    let env = Env::start(&[]).await;
    env.apply("ca", ca_spec(3600)).await;
    let mut orphan = leaf_spec(true, &["marin3r"], 600);
    orphan["signer"]["caSigned"]["caSecretRef"]["name"] = json!("no-such-ca");
    env.apply("orphan", orphan).await;
    let ca = env.wait_reason("ca", "Issued").await;
    let status = ca.status.unwrap();
    let not_after = status.not_after.unwrap().0.as_second();
    let renewal_time = status.renewal_time.unwrap().0.as_second();
    let ns = &env.ns;
    let series =
        |metric: &str, name: &str| format!("{metric}{{namespace=\"{ns}\",name=\"{name}\"}} ");
    let expiry = |name: &str| series("marin3r_certificate_expiration_timestamp_seconds", name);
    let renewal = |name: &str| series("marin3r_certificate_renewal_timestamp_seconds", name);
    let ready = |name: &str| series("marin3r_certificate_ready", name);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = env.metrics();
        let done = text.contains(&format!("{}{not_after}\n", expiry("ca")))
            && text.contains(&format!("{}{renewal_time}\n", renewal("ca")))
            && text.contains(&format!("{}1\n", ready("ca")))
            && text.contains(&format!("{}0\n", ready("orphan")));
        if done {
            // Never issued: no expiry to report.
            assert!(!text.contains(&expiry("orphan")), "{text}");
            assert!(!text.contains(&renewal("orphan")), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A deleted certificate leaves no series behind.
    env.dscs()
        .delete("ca", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env.metrics().contains(&ready("ca")) {
        assert!(Instant::now() < deadline, "{}", env.metrics());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renews_at_eighty_percent_of_the_validity_and_not_when_disabled() {
    let env = Env::start(&[]).await;
    env.apply(
        "short",
        json!({"commonName": "short", "validFor": 5,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "short"}}),
    )
    .await;
    let first = env.wait_reason("short", "Issued").await;
    let (_, info) = env.secret_cert(&env.ns, "short").await.unwrap();
    let renewed = env
        .wait_new_serial("short", &info.serial, Duration::from_secs(10))
        .await;
    // Reissued at 80% of 5 s, give or take a second of X.509 time resolution.
    let after = (renewed.not_before - info.not_before).whole_milliseconds();
    assert!(
        (3_000..=6_000).contains(&after),
        "renewed {after} ms after issuance"
    );
    // The Secret is written before the status, so wait for the status of the renewed
    // certificate rather than reading it once (a read between the two writes saw the old one).
    let first_renewal = first.status.unwrap().renewal_time.map(|t| t.0.as_second());
    let expected = Some(renewed.renewal_time().unix_timestamp());
    assert_ne!(
        first_renewal, expected,
        "the renewed certificate is due when the first was"
    );
    env.wait_renewal_time("short", expected).await;

    env.apply(
        "pinned",
        json!({"commonName": "pinned", "validFor": 2,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "pinned"},
        "certificateRenewal": {"enabled": false}}),
    )
    .await;
    env.wait_reason("pinned", "Issued").await;
    let (_, pinned) = env.secret_cert(&env.ns, "pinned").await.unwrap();
    let expired = env.wait_reason("pinned", "Expired").await;
    assert_eq!(expired.status.as_ref().unwrap().ready, Some(false));
    assert_eq!(expired.status.unwrap().renewal_time, None);
    env.assert_stable("pinned", &pinned.serial, Duration::from_secs(1))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_trigger_reissues_exactly_once() {
    let env = Env::start(&[]).await;
    env.apply("ca", ca_spec(3600)).await;
    env.apply(
        "client",
        leaf_spec(false, &["spiffe://cluster.local/ns/a"], 3600),
    )
    .await;
    env.wait_reason("client", "Issued").await;
    let quiet = Duration::from_millis(1500);
    let (_, mut current) = env.secret_cert(&env.ns, "client-cert").await.unwrap();
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;
    let mut events = env.issued_events("client").await;

    // 1. Spec change.
    env.apply(
        "client",
        leaf_spec(
            false,
            &["spiffe://cluster.local/ns/a", "extra.example"],
            3600,
        ),
    )
    .await;
    current = env
        .wait_new_serial("client-cert", &current.serial, Duration::from_secs(10))
        .await;
    assert!(
        current
            .sans
            .contains(&SubjectAltName::Dns("extra.example".into()))
    );
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;

    // 2. Secret deleted.
    env.secrets(&env.ns)
        .delete("client-cert", &DeleteParams::default())
        .await
        .unwrap();
    current = env
        .wait_new_serial("client-cert", &current.serial, Duration::from_secs(10))
        .await;
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;

    // 3. Secret tampered with: the key of another certificate.
    let (ca_secret, _) = env.secret_cert(&env.ns, "ca").await.unwrap();
    let foreign_key = ca_secret.data.as_ref().unwrap()["tls.key"].clone();
    let patch = json!({"data": {"tls.key": foreign_key}});
    env.secrets(&env.ns)
        .patch("client-cert", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    current = env
        .wait_new_serial("client-cert", &current.serial, Duration::from_secs(10))
        .await;
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;

    // 4. Manual renewal through the annotation, and the same value again does nothing.
    let renew = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": "first"}}});
    env.dscs()
        .patch("client", &PatchParams::default(), &Patch::Merge(&renew))
        .await
        .unwrap();
    current = env
        .wait_new_serial("client-cert", &current.serial, Duration::from_secs(10))
        .await;
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;
    let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
    env.dscs()
        .patch("client", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;

    // 5. The Secret made immutable (a namespace admin may): the renewal replaces it whole
    //    rather than failing on it for ever.
    let freeze = json!({"immutable": true});
    env.secrets(&env.ns)
        .patch(
            "client-cert",
            &PatchParams::default(),
            &Patch::Merge(freeze),
        )
        .await
        .unwrap();
    let renew = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": "second"}}});
    env.dscs()
        .patch("client", &PatchParams::default(), &Patch::Merge(&renew))
        .await
        .unwrap();
    current = env
        .wait_new_serial("client-cert", &current.serial, Duration::from_secs(10))
        .await;
    env.assert_stable("client-cert", &current.serial, quiet)
        .await;

    events += 5;
    let all: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let notes: Vec<String> = all
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            format!(
                "{:?} {:?} {:?}",
                e.reason,
                e.note,
                e.series.map(|s| s.count)
            )
        })
        .collect();
    assert_eq!(env.issued_events("client").await, events, "{notes:#?}");
    // The tampered Secret was replaced whole: the key belongs to the certificate again.
    let (secret, _) = env.secret_cert(&env.ns, "client-cert").await.unwrap();
    marin3r_certs::key_matches(
        &text(&secret, "tls.crt").unwrap(),
        &text(&secret, "tls.key").unwrap(),
    )
    .unwrap();
}

/// What each Secret holds, polled: its certificate's serial and the CAs of its ca.crt.
fn bundle_of(secret: &Secret) -> Vec<String> {
    marin3r_certs::controller::rotation::split_certificates(&text(secret, "ca.crt").unwrap())
}

/// F9: a renewed CA was a hard cutover (every certificate reissued at once and trusting only
/// the new CA). Now the new CA is first trusted everywhere, then signs, and the old one is
/// dropped only after every certificate it signed was reissued, each step a propagation
/// after the one before; at no poll does a certificate's CA fall outside another's ca.crt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_ca_is_trusted_before_it_signs_and_dropped_after_its_certificates() {
    let env = Env::start(&[]).await;
    env.apply("ca", ca_spec(3600)).await;
    env.apply("server", leaf_spec(true, &["marin3r"], 3600))
        .await;
    env.apply(
        "client",
        leaf_spec(false, &["spiffe://cluster.local/ns/a"], 3600),
    )
    .await;
    env.wait_reason("server", "Issued").await;
    env.wait_reason("client", "Issued").await;
    let (ca_secret, old_ca) = env.secret_cert(&env.ns, "ca").await.unwrap();
    let old_ca_pem = text(&ca_secret, "tls.crt").unwrap();
    let (_, old_server) = env.secret_cert(&env.ns, "server-cert").await.unwrap();
    let (_, old_client) = env.secret_cert(&env.ns, "client-cert").await.unwrap();
    let hash_before = env
        .dscs()
        .get("ca")
        .await
        .unwrap()
        .status
        .unwrap()
        .trust_bundle_hash;
    assert!(hash_before.is_some());

    let renew = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": "rotate"}}});
    env.dscs()
        .patch("ca", &PatchParams::default(), &Patch::Merge(&renew))
        .await
        .unwrap();

    let leaves = ["server-cert", "client-cert"];
    let start = Instant::now();
    let (mut bundled_everywhere, mut switched, mut reissued) = (None, None, None);
    let mut saw_rotation_status = false;
    // When each step is first seen, the start of the poll before (which did not see it yet)
    // is when it happened at the earliest: measured from there, the time until the next step
    // is never shorter than the controller's, however slow a poll is.
    let mut before_this_poll = start;
    let new_ca_pem = loop {
        let this_poll = Instant::now();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the rotation did not finish: bundled {bundled_everywhere:?}, switched {switched:?}, reissued {reissued:?}"
        );
        let (ca_secret, ca) = env.secret_cert(&env.ns, "ca").await.unwrap();
        let ca_bundle = bundle_of(&ca_secret);
        let mut secrets = Vec::new();
        for name in leaves {
            secrets.push(env.secret_cert(&env.ns, name).await.unwrap());
        }
        // Every certificate's CA is in every ca.crt (the other leaves' and the CA's, which
        // is the webhook's caBundle).
        for (secret, _) in &secrets {
            let cert = text(secret, "tls.crt").unwrap();
            for trusts in secrets
                .iter()
                .map(|(s, _)| bundle_of(s))
                .chain([ca_bundle.clone()])
            {
                assert!(
                    trusts.iter().any(|ca| verify_signed_by(&cert, ca).is_ok()),
                    "after {:?} a certificate is signed by a CA outside a ca.crt",
                    start.elapsed()
                );
            }
        }
        saw_rotation_status |= env
            .dscs()
            .get("ca")
            .await
            .unwrap()
            .status
            .unwrap()
            .rotation
            .is_some();
        let serials_kept =
            secrets[0].1.serial == old_server.serial && secrets[1].1.serial == old_client.serial;
        if bundled_everywhere.is_none()
            && ca_bundle.len() == 2
            && secrets.iter().all(|(s, _)| bundle_of(s).len() == 2)
        {
            assert!(
                serials_kept,
                "a certificate was reissued before all trusted the next CA"
            );
            assert_eq!(ca.serial, old_ca.serial, "the next CA signs too early");
            bundled_everywhere = Some(before_this_poll);
        }
        if switched.is_none() && ca.serial != old_ca.serial {
            let since =
                bundled_everywhere.expect("the CA switched before the bundle was everywhere");
            assert!(since.elapsed() >= PROPAGATION - Duration::from_millis(300));
            assert_eq!(
                ca_bundle.len(),
                2,
                "the old CA must stay trusted when the new one signs"
            );
            switched = Some(Instant::now());
        }
        if !serials_kept {
            // Read after the leaves: a leaf reissued by then means the CA switched by then.
            let (_, ca_now) = env.secret_cert(&env.ns, "ca").await.unwrap();
            assert!(
                switched.is_some() || ca_now.serial != old_ca.serial,
                "a certificate was reissued before the CA switched"
            );
        }
        let ca_pem = text(&ca_secret, "tls.crt").unwrap();
        let all_new = secrets
            .iter()
            .all(|(s, _)| verify_signed_by(&text(s, "tls.crt").unwrap(), &ca_pem).is_ok());
        if switched.is_some() && all_new && reissued.is_none() {
            reissued = Some(before_this_poll);
        }
        if ca_bundle.len() == 1 && switched.is_some() {
            let since =
                reissued.expect("the old CA was dropped before every certificate was reissued");
            assert!(since.elapsed() >= PROPAGATION - Duration::from_millis(300));
            if secrets.iter().all(|(s, _)| bundle_of(s).len() == 1) {
                break ca_pem;
            }
        }
        before_this_poll = this_poll;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        saw_rotation_status,
        "status.rotation never showed the rotation"
    );
    assert_ne!(new_ca_pem, old_ca_pem);
    for name in leaves {
        let (secret, _) = env.secret_cert(&env.ns, name).await.unwrap();
        verify_signed_by(&text(&secret, "tls.crt").unwrap(), &new_ca_pem).unwrap();
        assert_eq!(
            bundle_of(&secret),
            vec![new_ca_pem.clone()],
            "{name} still trusts the old CA"
        );
    }
    let ca_secret = env.secrets(&env.ns).get("ca").await.unwrap();
    assert!(!ca_secret.data.unwrap().contains_key("next.crt"));
    // The status is written after the Secret.
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = env.dscs().get("ca").await.unwrap().status.unwrap();
        if status.rotation.is_none() || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.rotation, None);
    assert_ne!(status.trust_bundle_hash, hash_before);
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("ca"))
        .filter_map(|e| e.reason)
        .collect();
    for want in ["NextCAIssued", "NextCASigning", "PreviousCADropped"] {
        assert!(
            reasons.iter().any(|r| r == want),
            "no {want} Event: {reasons:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_are_reported_and_never_cost_an_issued_secret() {
    let env = Env::start(&[]).await;

    // The CA Secret does not exist (yet).
    env.apply("orphan", leaf_spec(true, &["marin3r"], 600))
        .await;
    let dsc = env.wait_reason("orphan", "CASecretNotFound").await;
    assert!(ready_message(&dsc).contains(&format!("CA Secret {}/ca not found", env.ns)));
    assert_eq!(dsc.status.unwrap().ready, Some(false));
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let warned = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .any(|e| {
            e.reason.as_deref() == Some("CASecretNotFound") && e.type_.as_deref() == Some("Warning")
        });
    assert!(warned, "no Warning event for the missing CA");

    // The CA Secret holds a certificate that is not a CA.
    env.apply(
        "not-a-ca",
        json!({"commonName": "plain", "validFor": 600,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "ca"}}),
    )
    .await;
    let dsc = env.wait_reason("orphan", "CASecretInvalid").await;
    assert!(
        ready_message(&dsc).contains("not a CA"),
        "{}",
        ready_message(&dsc)
    );
    assert!(
        env.secrets(&env.ns)
            .get_opt("server-cert")
            .await
            .unwrap()
            .is_none()
    );

    // Zero validity never reaches the controller: the CRD's schema (minimum 1) refuses it,
    // as a real API server does.
    let zero = json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": "zero"},
        "spec": {"commonName": "z", "validFor": 0,
            "signer": {"selfSigned": {}}, "secretRef": {"name": "zero"}},
    });
    match env
        .dscs()
        .patch("zero", &PatchParams::apply("test"), &Patch::Apply(&zero))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{}", s.message);
            assert!(
                s.message
                    .contains("spec.validFor in body should be greater than or equal to 1"),
                "{}",
                s.message
            );
        }
        other => panic!("validFor 0 was not refused: {other:?}"),
    }
    // A host that is no DNS name, IP or URI passes the schema; the controller flags it.
    env.apply(
        "badhost",
        json!({"commonName": "b", "validFor": 60, "hosts": ["not a host"],
        "signer": {"selfSigned": {}}, "secretRef": {"name": "badhost"}}),
    )
    .await;
    let dsc = env.wait_reason("badhost", "InvalidSpec").await;
    assert!(
        ready_message(&dsc).contains("spec.hosts[0]"),
        "{}",
        ready_message(&dsc)
    );

    // A good certificate whose spec turns bad keeps its Secret untouched.
    env.apply(
        "good",
        json!({"commonName": "g", "validFor": 600,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "good"}}),
    )
    .await;
    env.wait_reason("good", "Issued").await;
    let (before, _) = env.secret_cert(&env.ns, "good").await.unwrap();
    // (Two signers at once never get here: the CRD's validation rule refuses them.)
    let both = json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryServiceCertificate",
        "metadata": {"name": "good"},
        "spec": {"commonName": "g", "validFor": 600,
            "signer": {"selfSigned": {}, "caSigned": {"caSecretRef": {"name": "ca"}}},
            "secretRef": {"name": "good"}},
    });
    match env
        .dscs()
        .patch(
            "good",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&both),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422
                && s.message
                    .contains("set exactly one of selfSigned or caSigned"),
            "{}",
            s.message
        ),
        other => panic!("two signers were not refused: {other:?}"),
    }
    env.apply(
        "good",
        json!({"commonName": "g", "validFor": 600, "hosts": ["not a host"],
        "signer": {"selfSigned": {}}, "secretRef": {"name": "good"}}),
    )
    .await;
    let dsc = env.wait_reason("good", "InvalidSpec").await;
    assert!(
        ready_message(&dsc).contains("spec.hosts[0]"),
        "{}",
        ready_message(&dsc)
    );
    let (after, _) = env.secret_cert(&env.ns, "good").await.unwrap();
    assert_eq!(before.data, after.data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_namespace_references_only_from_trusted_namespaces() {
    // Untrusted: a user may not have a Secret written into (or a CA read from) elsewhere.
    let env = Env::start(&[]).await;
    let other = format!("{}-other", env.ns);
    env.apply(
        "remote",
        json!({"commonName": "r", "validFor": 600,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "remote", "namespace": other}}),
    )
    .await;
    let dsc = env.wait_reason("remote", "CrossNamespaceReference").await;
    assert!(ready_message(&dsc).contains(&format!("{other}/remote")));
    assert!(
        env.secrets(&other)
            .get_opt("remote")
            .await
            .unwrap()
            .is_none()
    );
    drop(env);

    // Trusted: allowed, and the Secret (which cannot be owned across namespaces) is removed
    // by a finalizer when the certificate goes.
    let env = Env::start(&["{ns}"]).await;
    let other = format!("{}-other", env.ns);
    env.apply(
        "remote",
        json!({"commonName": "r", "validFor": 600,
        "signer": {"selfSigned": {}}, "secretRef": {"name": "remote", "namespace": other}}),
    )
    .await;
    let dsc = env.wait_reason("remote", "Issued").await;
    assert!(
        dsc.finalizers()
            .iter()
            .any(|f| f.starts_with("operator.marin3r.3scale.net/"))
    );
    assert!(env.secret_cert(&other, "remote").await.is_some());
    env.dscs()
        .delete("remote", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while env
        .secrets(&other)
        .get_opt("remote")
        .await
        .unwrap()
        .is_some()
        || env.dscs().get_opt("remote").await.unwrap().is_some()
    {
        assert!(Instant::now() < deadline, "cleanup did not happen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn converges_through_dropped_watches_and_api_errors() {
    let env = Env::start(&[]).await;
    env.apply("ca", ca_spec(3600)).await;
    env.wait_reason("ca", "Issued").await;
    // Errors for any request (relists, reads, writes), then conflicts on the writes, as the
    // API server answers them; every open watch dropped after each. Each lands on the
    // controller (the test's own requests are never faulted), and each failed list backs off
    // (0.8 s, doubling, with jitter).
    env.proxy.faults().fail_next(3, 500, FaultScope::Any);
    env.proxy.faults().drop_watches();
    env.apply("server", leaf_spec(true, &["marin3r"], 600))
        .await;
    env.proxy.faults().fail_next(3, 409, FaultScope::Write);
    env.proxy.faults().drop_watches();
    let dsc = env
        .wait_reason_for("server", "Issued", Duration::from_secs(60))
        .await;
    assert_eq!(
        env.proxy.faults().pending(),
        0,
        "some errors were never met"
    );
    assert_eq!(dsc.status.unwrap().ready, Some(true));
    let (_, info) = env.secret_cert(&env.ns, "server-cert").await.unwrap();
    env.assert_stable("server-cert", &info.serial, Duration::from_secs(1))
        .await;
}

/// a request that is never answered (its connection died without a reset)
/// holds its reconcile only until the reconcile's deadline; the retry, on a fresh request,
/// issues the certificate. With no deadline the reconcile waits for good, and the object is
/// never reconciled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_never_answered_times_out_its_reconcile_and_the_retry_issues() {
    let deadline = Duration::from_secs(1);
    let env = Env::start_with(&[], |c| c.reconcile_timeout = Some(deadline)).await;
    env.apply("ca", ca_spec(3600)).await;
    env.wait_reason("ca", "Issued").await;
    let path = format!("/api/v1/namespaces/{}/secrets/server-cert", env.ns);
    env.proxy.faults().never_answer(&path, 1);
    env.apply("server", leaf_spec(true, &["marin3r"], 600))
        .await;
    // The deadline, then the error policy's 5 s, then the retry.
    let dsc = env
        .wait_reason_for("server", "Issued", Duration::from_secs(30))
        .await;
    assert_eq!(dsc.status.unwrap().ready, Some(true));
    assert_eq!(env.proxy.faults().swallowed(), 1);
    assert!(env.secret_cert(&env.ns, "server-cert").await.is_some());
}
