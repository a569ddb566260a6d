//! One discovery service on the real cluster (`hack/cluster`), of this run in the operator's
//! namespace, two tenants (namespaces of the scenario), one of them hostile. Tenant A's namespace admin holds
//! A's client certificate (a Secret of their namespace) and may run pods on the pod network;
//! they try what the reliability review found, all at once: webhook connections held with
//! slow bodies from several pods, reopened as the webhook closes them, for the whole test;
//! tenant B's shutdown manager asked to drain and stop B's Envoy; xDS subscriptions that
//! would make the discovery pod hold gigabytes; more xDS connections
//! than the namespace may have, held idle (against the discovery pod's cap, 4,096, the
//! default: opened 64 at a time from the host); and A's client-certificate Secret made immutable,
//! which stalled renewals and CA rotations. Meanwhile B's Envoy keeps its config and
//! takes an update, B's pods keep being admitted and injected, each within a second, no
//! connection of B is refused, B's certificate is left alone, A's frozen one is renewed all
//! the same, and the discovery pod's own accounting stays within its bounds.
//!
//! Not tried: holding B's NACK tally. A tally is kept per namespace and node id, and
//! A's certificate names namespace A, so no stream of A reports for B's proxies; what A's
//! streams claim stays within A.

mod attacks;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use marin3r_certs::api::{DiscoveryServiceCertificate, RENEW_ANNOTATION};
use marin3r_e2e::product::example_in;
use marin3r_e2e::real::{IDLE_PY, OPERATOR_NAMESPACE as OPS, Scenario, pod_ip, pod_ready};
use marin3r_testkit::wait::until;
use marin3r_testkit::xds::client::ClientTls;
use serde_json::json;

use attacks::{
    ATTACKERS, HELD_AT_LEAST, SLOW_CONNECTIONS, XDS_CAP, XDS_EXCESS, attack, attacker_log,
    attacker_pod, idle_connections, rustls_config, subscribe,
};

const BODY: &str = marin3r_e2e::real::EXAMPLE_BODY;
const UPDATED_BODY: &str = "hello again from marin3r";
const CLIENT_CERT: &str = "envoy-sidecar-client-cert";
/// The discovery pod's default budget for one namespace's subscribed names.
const NAMESPACE_BUDGET: f64 = (128 << 20) as f64;
/// The longest a pod creation of B may take, webhook included, while A attacks.
const ADMISSION_BOUND: Duration = Duration::from_secs(1);
/// How long B's pods keep being created under the attack: two of the webhook's 5 s body
/// deadlines, so no slow connection of the attack's start is left.
const ATTACK_AT_LEAST: Duration = Duration::from_secs(12);

/// A container of `hack/image`'s python running `command`, as the restricted Pod Security
/// level wants it.
fn restricted_container(name: &str, command: serde_json::Value) -> serde_json::Value {
    let mut container = marin3r_e2e::real::python_container(IDLE_PY);
    container["name"] = json!(name);
    container["command"] = command;
    container
}

/// A pod of tenant B (namespace `b`), injected: the EnvoyConfig's listener on 8080, with the
/// drain.
fn tenant_b_pod(b: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": b,
            "labels": {"marin3r.3scale.net/status": "enabled", "app": "b"},
            "annotations": {
                "marin3r.3scale.net/node-id": "demo-proxy",
                "marin3r.3scale.net/ports": "http:8080",
                "marin3r.3scale.net/shutdown-manager.enabled": "true",
            },
        },
        "spec": {
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "terminationGracePeriodSeconds": 5,
            "containers": [restricted_container("app", json!(["python3", "-c", IDLE_PY]))],
        },
    }))
    .unwrap()
}

async fn serving(client: &Client, ns: &str, name: &str, body: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    until(
        &format!("{ns}/{name} to serve {body:?}"),
        Duration::from_secs(120),
        || async {
            let p = pods.get(name).await.ok()?;
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            let got = marin3r_testkit::envoy::get_body(&format!("http://{ip}:8080/"));
            (pod_ready(&p) && got.ok().as_deref() == Some(body)).then_some(p)
        },
    )
    .await
}

/// Creates a pod of B (a dry run unless `run`: the admission happens, nothing starts);
/// asserts it came back injected within [`ADMISSION_BOUND`], and returns how long it took.
async fn admit(pods: &Api<Pod>, b: &str, name: &str, run: bool) -> Duration {
    let params = PostParams {
        dry_run: !run,
        ..Default::default()
    };
    let asked = Instant::now();
    let created = pods.create(&params, &tenant_b_pod(b, name)).await.unwrap();
    let took = asked.elapsed();
    let injected = created.spec.unwrap().init_containers.unwrap_or_default();
    assert!(
        injected.iter().any(|c| c.name == "envoy-sidecar"),
        "{injected:?}"
    );
    println!("admission of {b}/{name} during the attacks: {took:?}");
    assert!(took < ADMISSION_BOUND, "admission of {name} took {took:?}");
    took
}

/// The client certificate of namespace `ns`, as its namespace admin can read it, for the xDS
/// server `server_name`.
async fn client_tls(client: &Client, ns: &str, server_name: &str) -> ClientTls {
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(CLIENT_CERT)
        .await
        .unwrap();
    ClientTls {
        ca_pem: text(&secret, "ca.crt"),
        identity: Some((text(&secret, "tls.crt"), text(&secret, "tls.key"))),
        server_name: server_name.into(),
    }
}

fn text(secret: &Secret, key: &str) -> String {
    let data = secret.data.as_ref().unwrap();
    String::from_utf8(data[key].0.clone()).unwrap()
}

/// The operator's pods and the discovery pod `discovery`: (name, Ready, restarts).
async fn control_plane(ops_pods: &Api<Pod>, discovery: &str) -> Vec<(String, bool, i32)> {
    let mut pods: Vec<(String, bool, i32)> = ops_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| {
            p.labels()
                .get("app.kubernetes.io/component")
                .map(String::as_str)
                == Some("operator")
                || p.name_any() == discovery
        })
        .map(|p| {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref());
            let restarts = statuses.into_iter().flatten().map(|c| c.restart_count);
            (p.name_any(), pod_ready(p), restarts.sum())
        })
        .collect();
    pods.sort();
    pods
}

/// One value of the discovery pod's metrics, summed over its label sets matching `labels`.
fn metric(metrics: &str, name: &str, labels: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_tenant_cannot_stop_another_tenants_proxies_or_pods() {
    let started = Instant::now();
    let scenario = Scenario::start("tn", &["python"]).await.unwrap();
    let client = scenario.client.clone();
    let a = scenario.ns.clone();
    let b = scenario.namespace("b").await.unwrap();
    let (a, b) = (a.as_str(), b.as_str());
    let ds = scenario.operator_discovery_service("tn").unwrap();
    let xds_server_name = format!("marin3r-{ds}.{OPS}.svc");
    let manifest = example_in("discoveryservice.yaml", OPS)
        .unwrap()
        .replace("  name: instance\n", &format!("  name: {ds}\n"))
        .replace("    - demo\n", &format!("    - {a}\n    - {b}\n"));
    scenario
        .kubectl
        .ok_with(&["apply", "-f", "-"], &manifest)
        .await
        .unwrap();
    scenario
        .discovery_service_ready_in(OPS, &ds, Duration::from_secs(120))
        .await
        .unwrap();
    for ns in [a, b] {
        let config = example_in("envoyconfig.yaml", ns).unwrap();
        scenario
            .kubectl
            .ok_with(&["apply", "-f", "-"], &config)
            .await
            .unwrap();
    }
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), a);
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), b);
    pods_b
        .create(&PostParams::default(), &tenant_b_pod(b, "b-1"))
        .await
        .unwrap();
    let victim = serving(&client, b, "b-1", BODY).await;
    let ops_pods: Api<Pod> = Api::namespaced(client.clone(), OPS);
    let discovery_selector =
        format!("app.kubernetes.io/component=discovery-service,app.kubernetes.io/instance={ds}");
    let discovery = until("a ready discovery pod", Duration::from_secs(60), || async {
        let list = ops_pods
            .list(&ListParams::default().labels(&discovery_selector))
            .await
            .ok()?;
        list.items.into_iter().find(pod_ready)
    })
    .await;
    let control_before = control_plane(&ops_pods, &discovery.name_any()).await;
    let discovery_ip = pod_ip(&discovery);
    let metrics_url = format!("http://{discovery_ip}:8383/metrics");
    let metrics = || marin3r_testkit::envoy::get_body(&metrics_url).unwrap();
    let xds: SocketAddr = format!("{discovery_ip}:18000").parse().unwrap();
    let discovery_log = || async {
        let params = LogParams {
            container: Some("marin3r".into()),
            ..Default::default()
        };
        ops_pods.logs(&discovery.name_any(), &params).await.unwrap()
    };
    let evictions = || async {
        discovery_log()
            .await
            .matches("dropping a stalled connection")
            .count()
    };
    let secrets_a: Api<Secret> = Api::namespaced(client.clone(), a);
    let secrets_b: Api<Secret> = Api::namespaced(client.clone(), b);
    let b_cert_before = secrets_b.get(CLIENT_CERT).await.unwrap();
    println!("set up in {:?}", started.elapsed());

    // Tenant A's pods hold slow webhook connections; the first calls B's manager.
    let attack_began = Instant::now();
    for i in 0..ATTACKERS {
        let attacker = attacker_pod(a, i, &discovery_ip, &pod_ip(&victim));
        pods_a
            .create(&PostParams::default(), &attacker)
            .await
            .unwrap();
    }
    until(
        "the attacker to call B's shutdown manager",
        Duration::from_secs(60),
        || async {
            attacker_log(&pods_a, 0)
                .await
                .contains("victim /shutdown")
                .then_some(())
        },
    )
    .await;
    let log = attacker_log(&pods_a, 0).await;
    assert!(
        log.contains("victim /drain 401") && log.contains("victim /shutdown 401"),
        "{log}"
    );
    // The attack is under way: the webhook has closed (evicted, or timed out) connections
    // and the attackers have opened them again.
    let pressing = until(
        "the attackers to reopen the connections the webhook closed",
        Duration::from_secs(30),
        || async {
            let now = attack(&pods_a).await?;
            (now.ended >= SLOW_CONNECTIONS as u64 && now.held() >= HELD_AT_LEAST).then_some(now)
        },
    )
    .await;
    println!("attack under way at {:?}: {pressing:?}", started.elapsed());
    let evicted_before = evictions().await;
    let mut admissions = vec![admit(&pods_b, b, "b-dry-1", false).await];

    // Tenant A's subscriptions, over the name size and over the namespace's budget.
    let tls_a = client_tls(&client, a, &xds_server_name).await;
    let mut held = Vec::new();
    if let Some(s) = subscribe(xds, &tls_a, 0, 1, 5000).await {
        held.push(s);
    }
    // 36 streams of about 3.8 MiB each: 137 MiB, over the 128 MiB of one namespace.
    for i in 0..36 {
        if let Some(s) = subscribe(xds, &tls_a, (i + 1) * 1000, 950, 4000).await {
            held.push(s);
        }
    }
    println!(
        "N1: {} of A's streams held at {:?}",
        held.len(),
        started.elapsed()
    );
    admissions.push(admit(&pods_b, b, "b-dry-2", false).await);

    // Tenant A opens more connections than the namespace may have, and keeps them.
    let refused_connections = || {
        metric(
            &metrics(),
            "marin3r_xds_refused_connections_total",
            "reason=\"connections_per_namespace\"",
        )
    };
    let refused_before = refused_connections();
    let config_a = rustls_config(&tls_a);
    let flood = idle_connections(xds, &xds_server_name, &config_a, XDS_CAP + XDS_EXCESS).await;
    let refused = XDS_CAP + XDS_EXCESS - flood.len();
    println!(
        "N12: {} of A's connections served, {refused} refused, at {:?}",
        flood.len(),
        started.elapsed()
    );
    assert!(
        !flood.is_empty() && flood.len() <= XDS_CAP && refused >= XDS_EXCESS,
        "{} served",
        flood.len()
    );
    let refused_counted = refused_connections() - refused_before;
    assert!(refused_counted >= refused as f64, "{refused_counted}");
    admissions.push(admit(&pods_b, b, "b-dry-3", false).await);

    // A's admin freezes A's certificate Secret, then A's certificate is renewed (asked
    // for here as `marin3r certs renew` asks: the renewal that would have stalled).
    let a_cert_before = text(&secrets_a.get(CLIENT_CERT).await.unwrap(), "tls.crt");
    let freeze = json!({"immutable": true});
    secrets_a
        .patch(CLIENT_CERT, &PatchParams::default(), &Patch::Merge(&freeze))
        .await
        .unwrap();
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), OPS);
    let dsc_a = dscs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|d| d.spec.secret_ref.namespace.as_deref() == Some(a))
        .expect("tenant A's client certificate");
    let renew = json!({"metadata": {"annotations": {RENEW_ANNOTATION: "tenants-e2e"}}});
    dscs.patch(
        &dsc_a.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&renew),
    )
    .await
    .unwrap();
    admissions.push(admit(&pods_b, b, "b-dry-4", false).await);

    // Meanwhile B's Envoy takes a config update, and a new pod of B is admitted and serves.
    let update_b = example_in("envoyconfig.yaml", b)
        .unwrap()
        .replace(BODY, UPDATED_BODY);
    scenario
        .kubectl
        .ok_with(&["apply", "-f", "-"], &update_b)
        .await
        .unwrap();
    admissions.push(admit(&pods_b, b, "b-2", true).await);
    serving(&client, b, "b-1", UPDATED_BODY).await;
    serving(&client, b, "b-2", UPDATED_BODY).await;
    println!("B updated and b-2 serving at {:?}", started.elapsed());

    // More of B's pods, each after the attackers have opened another round of connections,
    // until the attack has lasted two of the webhook's body deadlines.
    let mut last = attack(&pods_a).await.unwrap();
    while attack_began.elapsed() < ATTACK_AT_LEAST {
        last = until(
            "the attackers to open another round of connections",
            Duration::from_secs(30),
            || async {
                let now = attack(&pods_a).await?;
                (now.opened >= last.opened + SLOW_CONNECTIONS as u64).then_some(now)
            },
        )
        .await;
        let name = format!("b-dry-{}", admissions.len());
        admissions.push(admit(&pods_b, b, &name, false).await);
    }
    let slowest = admissions.iter().max().unwrap();
    println!(
        "B's {} admissions during {:?} of attack, slowest {slowest:?}: {admissions:?}",
        admissions.len(),
        attack_began.elapsed()
    );

    // The attack went on through all of it, with every slot wanted (the webhook kept closing
    // stalled connections for waiting ones), and the webhook counted what it refused.
    let after = attack(&pods_a).await.unwrap();
    let evicted = evictions().await - evicted_before;
    println!(
        "attack at the end, {:?}: {after:?}, {evicted} stalled connections closed meanwhile",
        started.elapsed()
    );
    let reopened = after.opened > pressing.opened + SLOW_CONNECTIONS as u64;
    assert!(
        reopened && after.held() >= HELD_AT_LEAST && evicted >= SLOW_CONNECTIONS,
        "{pressing:?} then {after:?}, {evicted} evicted"
    );
    let per_address = metric(
        &metrics(),
        "marin3r_webhook_refused_total",
        "limit=\"connections_per_address\"",
    );
    assert!(per_address >= 1.0, "{per_address}");

    // A's frozen Secret was replaced by its renewal; B's was not touched and is valid,
    // and neither the operator nor the discovery pod ever restarted.
    let a_cert = until(
        "A's frozen certificate Secret to be renewed",
        Duration::from_secs(30),
        || async {
            let s = secrets_a.get(CLIENT_CERT).await.ok()?;
            (text(&s, "tls.crt") != a_cert_before).then_some(s)
        },
    )
    .await;
    assert_eq!(a_cert.immutable, None);
    println!("N4: A's frozen Secret renewed by {:?}", started.elapsed());
    let b_cert = secrets_b.get(CLIENT_CERT).await.unwrap();
    assert_eq!(b_cert.resource_version(), b_cert_before.resource_version());
    assert_eq!(b_cert.data, b_cert_before.data);
    let (b_tls, b_ca) = (text(&b_cert, "tls.crt"), text(&b_cert, "ca.crt"));
    marin3r_certs::check_validity(&b_tls, time::OffsetDateTime::now_utc()).unwrap();
    marin3r_certs::verify_signed_by(&b_tls, &b_ca).unwrap();
    // The operator is the one every scenario shares (an earlier scenario holding the cluster
    // alone may have restarted it: the attacks must not have), the discovery pod this run's.
    let after = control_plane(&ops_pods, &discovery.name_any()).await;
    assert!(
        after == control_before && after.iter().all(|(_, ready, _)| *ready),
        "before the attacks {control_before:?}, after {after:?}"
    );

    // The discovery pod's own accounting: A's names refused past the bounds, and never more
    // held than the namespace's budget.
    let metrics = until(
        "the refusals to be counted",
        Duration::from_secs(30),
        || async {
            let m = marin3r_testkit::envoy::get_body(&metrics_url).ok()?;
            let name = metric(
                &m,
                "marin3r_xds_refused_streams_total",
                "limit=\"name_size\"",
            );
            let budget = metric(
                &m,
                "marin3r_xds_refused_streams_total",
                "limit=\"subscription_bytes_per_namespace\"",
            );
            (name >= 1.0 && budget >= 1.0).then_some(m)
        },
    )
    .await;
    let held_bytes = metric(&metrics, "marin3r_xds_subscription_bytes", "");
    assert!(
        held_bytes <= NAMESPACE_BUDGET + (1 << 20) as f64,
        "the discovery pod holds {held_bytes} bytes of names"
    );
    // B's proxies (b-1 updated, b-2 new) connected while A held its cap: none was refused.
    let discovery_log = discovery_log().await;
    let refusals = |ns: &str| {
        let namespace = format!("namespace={ns} ");
        discovery_log
            .lines()
            .filter(|l| l.contains("too many connections open") && l.contains(&namespace))
            .count()
    };
    assert!(refusals(a) >= XDS_EXCESS, "{discovery_log}");
    assert_eq!(refusals(b), 0);
    drop((held, flood));
    let pods = pods_b
        .list(&ListParams::default().labels("app=b"))
        .await
        .unwrap();
    assert_eq!(pods.items.len(), 2);
    println!("done in {:?}", started.elapsed());
}
