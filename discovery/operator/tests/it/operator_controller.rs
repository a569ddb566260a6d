//! The DiscoveryService and certificate controllers, in-process, against the real cluster's
//! API server, with the in-cluster operator stopped meanwhile (two operators on one object
//! prove nothing): every child appears in shape, the discovery pods run and turn ready, namespaces join and leave, a renewed
//! server certificate changes the pod template, deletion removes everything (cluster-scoped
//! objects and other namespaces included), and two operator replicas never both lead.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use marin3r_api::discovery_service::{
    DISCOVERY_SERVICE_LABEL, DiscoveryService, SERVER_CERT_HASH_LABEL, STATUS_LABEL,
};
use marin3r_certs::api::DiscoveryServiceCertificate;
use marin3r_controller::leader;
use marin3r_operator as operator;
use marin3r_testkit::cluster::OperatorStopped;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use marin3r_testkit::namespaces::{Namespaces, cluster};

/// Polls `f` until it returns `Some`, failing with `what` after 30 s.
async fn wait_for<T, Fut: Future<Output = Option<T>>>(what: &str, f: impl FnMut() -> Fut) -> T {
    marin3r_testkit::wait::until(what, Duration::from_secs(30), f).await
}

/// The controllers on the real cluster, in namespaces of their own: `ops` (the trusted one,
/// as `marin3r-system` is) and `a`, `b`, `c` (a team's each).
struct Operator {
    client: Client,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    ops: String,
    a: String,
    b: String,
    c: String,
    space: Namespaces,
    _stopped: OperatorStopped,
}

impl Drop for Operator {
    /// Deletes the DiscoveryServices left in its namespaces while the controllers still run
    /// (their finalizer removes what they made across the cluster), then stops them.
    fn drop(&mut self) {
        if let Ok(kubectl) = marin3r_testkit::tools::kubectl() {
            for ns in [&self.ops, &self.a, &self.b, &self.c] {
                let _ = std::process::Command::new(&kubectl)
                    .args(["delete", "discoveryservices", "--all", "-n", ns])
                    .args(["--ignore-not-found", "--timeout=60s"])
                    .env("KUBECONFIG", self.space.kubeconfig())
                    .output();
            }
        }
        self.stop.cancel();
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Operator {
    fn names(&self) -> (&str, &str, &str, &str) {
        (&self.ops, &self.a, &self.b, &self.c)
    }
}

/// The image the discovery pods run, this build's, loaded into the cluster once per
/// process (`MARIN3R_BIN` names the binary, as for the end-to-end scenarios).
static IMAGES: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

async fn start() -> Operator {
    let cluster = cluster();
    let stopped = marin3r_testkit::namespaces::operator_stopped(&cluster).await;
    IMAGES
        .get_or_init(|| async {
            let cluster = cluster.clone();
            tokio::task::spawn_blocking(move || {
                marin3r_testkit::image::load_images(&cluster, &["marin3r", "envoy"])
            })
            .await
            .unwrap()
            .unwrap();
        })
        .await;
    let client = cluster.client().await.unwrap();
    let space = Namespaces::holding(&cluster, &client, None).await;
    let ops = space.create("ops", &[]).await;
    let a = space.create("ta", &[]).await;
    let b = space.create("tb", &[]).await;
    let c = space.create("tc", &[]).await;
    let stop = CancellationToken::new();
    let tasks = controllers(&client, &[&ops], &stop);
    Operator {
        client,
        stop,
        tasks,
        ops,
        a,
        b,
        c,
        space,
        _stopped: stopped,
    }
}

/// The certificate and DiscoveryService controllers with these trusted namespaces, until
/// `stop`.
fn controllers(
    client: &Client,
    trusted: &[&str],
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let trusted: BTreeSet<String> = trusted.iter().map(|s| (*s).to_owned()).collect();
    let certs = tokio::spawn(marin3r_certs::controller::run(
        client.clone(),
        marin3r_certs::controller::Config {
            trusted_namespaces: trusted.clone(),
            ..Default::default()
        },
        stop.clone().cancelled_owned(),
    ));
    let dss = tokio::spawn(operator::run(
        client.clone(),
        operator::Config {
            // The marin3r image of this release, as `marin3r_discovery::IMAGE` names it.
            default_image: concat!("marin3r:v", env!("CARGO_PKG_VERSION")).into(),
            trusted_namespaces: trusted,
            ..Default::default()
        },
        stop.clone().cancelled_owned(),
    ));
    vec![certs, dss]
}

async fn label_namespace(client: &Client, name: &str, value: Option<&str>) {
    let patch = json!({"metadata": {"labels": {DISCOVERY_SERVICE_LABEL: value}}});
    Api::<Namespace>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn ready_condition(ds: &DiscoveryService) -> Option<(String, String)> {
    let c = ds
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone()))
}

async fn namespace_labels(client: &Client, name: &str) -> (Option<String>, Option<String>) {
    let ns = Api::<Namespace>::all(client.clone())
        .get(name)
        .await
        .unwrap();
    let labels = ns.labels();
    (
        labels.get(STATUS_LABEL).cloned(),
        labels.get(DISCOVERY_SERVICE_LABEL).cloned(),
    )
}

/// Waits (up to two minutes) until the DiscoveryService says Ready, its discovery pod
/// running and ready.
async fn wait_ready(dss: &Api<DiscoveryService>, name: &str) -> DiscoveryService {
    marin3r_testkit::wait::until("Ready", Duration::from_secs(120), || async {
        let ds = dss.get(name).await.unwrap();
        (ready_condition(&ds)? == ("True".into(), "Ready".into())).then_some(ds)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_service_gets_every_child_and_loses_them_on_deletion() {
    let op = start().await;
    let client = op.client.clone();
    let (ops, team_a, team_b, team_c) = op.names();
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), ops);
    let ds: DiscoveryService = serde_json::from_value(json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryService",
        "metadata": {"name": "instance", "namespace": ops},
        "spec": {
            "enabledNamespaces": [team_a],
            "debug": true,
            "podPriorityClass": "system-cluster-critical",
        },
    }))
    .unwrap();
    dss.create(&PostParams::default(), &ds).await.unwrap();
    label_namespace(&client, team_b, Some("instance")).await;

    // Certificates: the CA, the server certificate, one client certificate per namespace.
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), ops);
    let server_hash = wait_for("the server certificate", || async {
        let dsc = dscs
            .get_opt("marin3r-server-cert-instance")
            .await
            .unwrap()?;
        dsc.status?.certificate_hash
    })
    .await;
    for ns in [team_a, team_b] {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let secret = wait_for("a client certificate Secret", || async {
            secrets.get_opt("envoy-sidecar-client-cert").await.unwrap()
        })
        .await;
        let cert = String::from_utf8(secret.data.unwrap()["tls.crt"].0.clone()).unwrap();
        let info = marin3r_certs::CertificateInfo::from_pem(&cert).unwrap();
        assert!(format!("{:?}", info.sans).contains(&format!("spiffe://cluster.local/ns/{ns}")));
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm = wait_for("the bootstrap", || async {
            cms.get_opt("envoy-sidecar-bootstrap").await.unwrap()
        })
        .await;
        assert!(cm.data.unwrap()["config.json"].contains(&format!("marin3r-instance.{ops}.svc")));
        let labels = wait_for("the namespace labels", || async {
            let l = namespace_labels(&client, ns).await;
            (l.0.is_some()).then_some(l)
        })
        .await;
        assert_eq!(labels, (Some("enabled".into()), Some("instance".into())));
    }
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), team_c)
            .get_opt("envoy-sidecar-bootstrap")
            .await
            .unwrap()
            .is_none(),
        "a namespace that is neither listed nor labelled is not served"
    );

    // The discovery pod's objects.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ops);
    let deployment = wait_for("the Deployment", || async {
        deployments.get_opt("marin3r-instance").await.unwrap()
    })
    .await;
    assert_eq!(
        deployment
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .priority_class_name
            .as_deref(),
        Some("system-cluster-critical")
    );
    let template_labels = deployment.spec.template.metadata.unwrap().labels.unwrap();
    assert_eq!(template_labels[SERVER_CERT_HASH_LABEL], server_hash);
    assert!(
        Api::<ServiceAccount>::namespaced(client.clone(), ops)
            .get_opt("marin3r-instance")
            .await
            .unwrap()
            .is_some()
    );
    let svc = Api::<Service>::namespaced(client.clone(), ops)
        .get("marin3r-instance")
        .await
        .unwrap();
    assert_eq!(svc.owner_references()[0].name, "instance");
    let pdb =
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), ops)
            .get("marin3r-instance")
            .await
            .unwrap();
    assert_eq!(pdb.owner_references()[0].name, "instance");
    let cluster_name = &format!("marin3r-{ops}-instance");
    Api::<ClusterRole>::all(client.clone())
        .get(cluster_name)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .get(cluster_name)
        .await
        .unwrap();
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let webhook = wait_for("the webhook configuration", || async {
        webhooks.get_opt(cluster_name).await.unwrap()
    })
    .await;
    let ca = Api::<Secret>::namespaced(client.clone(), ops)
        .get("marin3r-ca-cert-instance")
        .await
        .unwrap();
    assert_eq!(
        webhook.webhooks.unwrap()[0]
            .client_config
            .ca_bundle
            .as_ref()
            .unwrap()
            .0,
        ca.data.as_ref().unwrap()["tls.crt"].0
    );
    // The EnvoyConfig validation webhook beside it, trusting the same CA.
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let validator = wait_for("the validating webhook configuration", || async {
        validating.get_opt(cluster_name).await.unwrap()
    })
    .await;
    let hook = &validator.webhooks.unwrap()[0];
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().unwrap().0,
        ca.data.unwrap()["tls.crt"].0
    );
    assert_eq!(
        hook.client_config.service.as_ref().unwrap().path.as_deref(),
        Some("/validate-marin3r-3scale-net-v1alpha1-envoyconfig")
    );

    // Not ready until the Deployment has a ready pod; then Ready, with the namespaces.
    let reason = wait_for("DeploymentNotReady", || async {
        let ds = dss.get("instance").await.unwrap();
        ready_condition(&ds).filter(|(_, r)| r == "DeploymentNotReady")
    })
    .await;
    assert_eq!(reason.0, "False");
    let ds = wait_ready(&dss, "instance").await;
    let status = ds.status.unwrap();
    assert_eq!(status.enabled_namespaces, [team_a, team_b]);
    // The original's status fields: the Deployment's name and its own status.
    assert_eq!(status.deployment_name.as_deref(), Some("marin3r-instance"));
    let deployment_status = status.deployment_status.unwrap();
    assert_eq!(deployment_status.ready_replicas, Some(1));
    // What happened is told in Events on the DiscoveryService.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ops);
    let reasons = wait_for("the Events", || async {
        let reasons: BTreeSet<String> = events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("instance"))
            .filter_map(|e| e.reason)
            .collect();
        (reasons.contains("Ready") && reasons.contains("NamespaceEnabled")).then_some(reasons)
    })
    .await;
    assert!(reasons.contains("DeploymentNotReady"), "{reasons:?}");
    assert_eq!(status.deployment.as_deref(), Some("1/1"));

    // A renewed server certificate rolls the pod template.
    let renew = json!({"metadata": {"annotations": {"marin3r.3scale.net/renew": "now"}}});
    dscs.patch(
        "marin3r-server-cert-instance",
        &PatchParams::default(),
        &Patch::Merge(&renew),
    )
    .await
    .unwrap();
    wait_for("the pod template to follow the new certificate", || async {
        let d = deployments.get("marin3r-instance").await.unwrap();
        let hash = d
            .spec
            .template
            .metadata?
            .labels?
            .get(SERVER_CERT_HASH_LABEL)?
            .clone();
        (hash != server_hash).then_some(())
    })
    .await;

    // The user unlabels team-b: its certificate, Secret, bootstrap and labels go.
    label_namespace(&client, team_b, None).await;
    let b_secrets: Api<Secret> = Api::namespaced(client.clone(), team_b);
    wait_for("team-b's Secret to go", || async {
        b_secrets
            .get_opt("envoy-sidecar-client-cert")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let b_cms: Api<ConfigMap> = Api::namespaced(client.clone(), team_b);
    wait_for("team-b's bootstrap to go", || async {
        b_cms
            .get_opt("envoy-sidecar-bootstrap")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    wait_for("team-b's status label to go", || async {
        (namespace_labels(&client, team_b).await == (None, None)).then_some(())
    })
    .await;

    // team-a leaves the list: the labels the operator set go too.
    dss.patch(
        "instance",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"enabledNamespaces": []}})),
    )
    .await
    .unwrap();
    wait_for("team-a's labels to go", || async {
        (namespace_labels(&client, team_a).await == (None, None)).then_some(())
    })
    .await;
    // ...and the discovery pod's Secret access there.
    let secret_access = |ns: &str| {
        let (client, ns) = (client.clone(), ns.to_owned());
        async move {
            let role = Api::<Role>::namespaced(client.clone(), &ns)
                .get_opt(cluster_name)
                .await
                .unwrap()
                .is_some();
            let binding = Api::<RoleBinding>::namespaced(client.clone(), &ns)
                .get_opt(cluster_name)
                .await
                .unwrap()
                .is_some();
            (role, binding)
        }
    };
    wait_for("team-a's Role and RoleBinding to go", || async {
        (secret_access(team_a).await == (false, false)).then_some(())
    })
    .await;
    // And back, to have something to clean up.
    dss.patch(
        "instance",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"enabledNamespaces": [team_a]}})),
    )
    .await
    .unwrap();
    let a_secrets: Api<Secret> = Api::namespaced(client.clone(), team_a);
    wait_for("team-a's Secret again", || async {
        a_secrets
            .get_opt("envoy-sidecar-client-cert")
            .await
            .unwrap()
    })
    .await;
    wait_for("team-a's Role and RoleBinding again", || async {
        (secret_access(team_a).await == (true, true)).then_some(())
    })
    .await;

    // Deleting the DiscoveryService removes everything.
    dss.delete("instance", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the DiscoveryService to go", || async {
        dss.get_opt("instance")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    wait_for("every child to go", || async {
        let gone = webhooks.get_opt(cluster_name).await.unwrap().is_none()
            && validating.get_opt(cluster_name).await.unwrap().is_none()
            && Api::<ClusterRole>::all(client.clone())
                .get_opt(cluster_name)
                .await
                .unwrap()
                .is_none()
            && Api::<ClusterRoleBinding>::all(client.clone())
                .get_opt(cluster_name)
                .await
                .unwrap()
                .is_none()
            && a_secrets
                .get_opt("envoy-sidecar-client-cert")
                .await
                .unwrap()
                .is_none()
            && Api::<ConfigMap>::namespaced(client.clone(), team_a)
                .get_opt("envoy-sidecar-bootstrap")
                .await
                .unwrap()
                .is_none()
            && deployments
                .get_opt("marin3r-instance")
                .await
                .unwrap()
                .is_none()
            && dscs
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
            && namespace_labels(&client, team_a).await == (None, None)
            && secret_access(team_a).await == (false, false);
        gone.then_some(())
    })
    .await;
    drop(op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_or_overreaching_discovery_service_says_why() {
    let op = start().await;
    let client = op.client.clone();
    let (ops, team_a, _, team_c) = op.names();
    let refusal = format!(
        "spec.enabledNamespaces[0]: \"{team_a}\" is another namespace; a DiscoveryService outside the operator's trusted namespaces ({ops}) serves only its own namespace {team_c}"
    );
    let long = "x".repeat(64);
    for (ns, name, spec, reason, needle) in [
        (
            ops,
            "bad",
            json!({"xdsServerPort": 8383}),
            "InvalidSpec",
            "must differ",
        ),
        (
            ops,
            long.as_str(),
            json!({}),
            "InvalidSpec",
            "longer than 63 characters",
        ),
        (
            team_c,
            "bad",
            json!({"enabledNamespaces": [team_a]}),
            "ForbiddenNamespace",
            refusal.as_str(),
        ),
    ] {
        let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), ns);
        let ds: DiscoveryService = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        }))
        .unwrap();
        dss.create(&PostParams::default(), &ds).await.unwrap();
        let ds = wait_for(reason, || async {
            let ds = dss.get(name).await.unwrap();
            ready_condition(&ds)
                .filter(|(_, r)| r == reason)
                .map(|_| ds)
        })
        .await;
        let message = &ds.status.unwrap().conditions[0].message;
        assert!(message.contains(needle), "{message}");
        assert!(
            Api::<Deployment>::namespaced(client.clone(), ns)
                .get_opt(&format!("marin3r-{name}"))
                .await
                .unwrap()
                .is_none()
        );
        // Refused, it is still deleted: its finalizer goes (a name longer than a label value
        // is not one the cleanup can select children by, and it has none).
        dss.delete(name, &DeleteParams::default()).await.unwrap();
        wait_for("the refused DiscoveryService to be deleted", || async {
            dss.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_service_outside_the_trusted_namespaces_serves_its_own_namespace() {
    let op = start().await;
    let client = op.client.clone();
    let (_, team_a, team_b, team_c) = op.names();
    let ns = team_c;
    // team-a is labelled with the same name: it is not this discovery service's to serve.
    label_namespace(&client, team_a, Some("local")).await;
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), ns);
    let ds: DiscoveryService = serde_json::from_value(json!({
        "metadata": {"name": "local", "namespace": ns},
        "spec": {"enabledNamespaces": [ns]},
    }))
    .unwrap();
    dss.create(&PostParams::default(), &ds).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait_for("the discovery Deployment", || async {
        deployments.get_opt("marin3r-local").await.unwrap()
    })
    .await;
    let ds = wait_ready(&dss, "local").await;
    let d = deployments.get("marin3r-local").await.unwrap();
    assert_eq!(ds.status.unwrap().enabled_namespaces, [ns]);

    // Its certificates, bootstrap and Secret live in its namespace.
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), ns);
    let names: BTreeSet<String> = dscs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(
        names,
        [
            "marin3r-ca-cert-local".to_owned(),
            format!("marin3r-client-local-{ns}"),
            "marin3r-server-cert-local".to_owned(),
        ]
        .into()
    );
    for dsc in dscs.list(&Default::default()).await.unwrap() {
        assert_eq!(dsc.spec.secret_ref.namespace.as_deref(), Some(ns));
    }
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt("envoy-sidecar-bootstrap")
            .await
            .unwrap()
            .is_some()
    );
    // Nothing in team-a, and no Namespace labelled.
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), team_a)
            .get_opt("envoy-sidecar-bootstrap")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(namespace_labels(&client, ns).await, (None, None));
    assert_eq!(
        namespace_labels(&client, team_a).await,
        (None, Some("local".into()))
    );

    // The discovery pod watches its namespace, with a Role there and no cluster-wide access.
    let args = d.spec.template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.contains(&format!("--watch-namespace={ns}")),
        "{args:?}"
    );
    let role = Api::<Role>::namespaced(client.clone(), ns)
        .get(&format!("marin3r-{ns}-local"))
        .await
        .unwrap();
    assert!(role.rules.unwrap().iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|x| x.contains(&"envoyconfigrevisions".to_owned()))
    }));
    assert!(
        Api::<RoleBinding>::namespaced(client.clone(), ns)
            .get_opt(&format!("marin3r-{ns}-local"))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt(&format!("marin3r-{ns}-local"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&format!("marin3r-{ns}-local"))
            .await
            .unwrap()
            .is_none()
    );

    // Its webhook sends only its namespace's pods to it.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let hook = webhooks
        .get(&format!("marin3r-ns.{ns}.local"))
        .await
        .unwrap();
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(
        w.namespace_selector.as_ref().unwrap().match_labels,
        Some([("kubernetes.io/metadata.name".to_owned(), ns.to_owned())].into())
    );
    assert_eq!(w.client_config.service.as_ref().unwrap().namespace, ns);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let hook = validating
        .get(&format!("marin3r-ns.{ns}.local"))
        .await
        .unwrap();
    assert_eq!(
        hook.webhooks.unwrap()[0]
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_labels,
        Some([("kubernetes.io/metadata.name".to_owned(), ns.to_owned())].into())
    );

    // Listing another namespace later is refused, and nothing reaches it.
    let patch = json!({"spec": {"enabledNamespaces": [ns, team_b]}});
    dss.patch("local", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for("ForbiddenNamespace", || async {
        let ds = dss.get("local").await.unwrap();
        (ready_condition(&ds) == Some(("False".into(), "ForbiddenNamespace".into()))).then_some(())
    })
    .await;
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), team_b)
            .get_opt("envoy-sidecar-bootstrap")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Role>::namespaced(client.clone(), team_b)
            .get_opt(&format!("marin3r-{ns}-local"))
            .await
            .unwrap()
            .is_none()
    );

    // Deleted: the webhook goes too.
    dss.delete("local", &DeleteParams::default()).await.unwrap();
    wait_for("the webhook removed", || async {
        webhooks
            .get_opt(&format!("marin3r-ns.{ns}.local"))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    drop(op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_service_whose_namespace_is_no_longer_trusted_keeps_to_it() {
    let op = start().await;
    let client = op.client.clone();
    let (ops, team_a, _, team_c) = op.names();
    // Stop the operator started with the operator's namespace only; trust team-c too.
    op.stop.cancel();
    for t in &op.tasks {
        t.abort();
    }
    let stop = CancellationToken::new();
    let mut tasks = controllers(&client, &[ops, team_c], &stop);
    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), team_c);
    let ds: DiscoveryService = serde_json::from_value(json!({
        "metadata": {"name": "ds", "namespace": team_c},
        "spec": {"enabledNamespaces": [team_a]},
    }))
    .unwrap();
    dss.create(&PostParams::default(), &ds).await.unwrap();
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bootstrap = |ns: &str| {
        let (client, ns) = (client.clone(), ns.to_owned());
        async move {
            Api::<ConfigMap>::namespaced(client, &ns)
                .get_opt("envoy-sidecar-bootstrap")
                .await
                .unwrap()
                .is_some()
        }
    };
    wait_for("the trusted discovery service serving team-a", || async {
        (webhooks
            .get_opt(&format!("marin3r-{team_c}-ds"))
            .await
            .unwrap()
            .is_some()
            && roles
                .get_opt(&format!("marin3r-{team_c}-ds"))
                .await
                .unwrap()
                .is_some()
            && bootstrap(team_a).await
            && namespace_labels(&client, team_a).await
                == (Some("enabled".into()), Some("ds".into())))
            .then_some(())
    })
    .await;

    // The operator restarts without trusting team-c: the listing is refused, and nothing is
    // left reaching team-a or the cluster.
    stop.cancel();
    for t in &tasks {
        t.abort();
    }
    let stop = CancellationToken::new();
    tasks = controllers(&client, &[ops], &stop);
    wait_for("ForbiddenNamespace", || async {
        let ds = dss.get("ds").await.unwrap();
        (ready_condition(&ds) == Some(("False".into(), "ForbiddenNamespace".into()))).then_some(())
    })
    .await;
    // Once the user drops the listing, it serves team-c alone.
    let patch = json!({"spec": {"enabledNamespaces": null}});
    dss.patch("ds", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(
        "team-c served alone, the trusted leftovers gone",
        || async {
            let ds = dss.get("ds").await.unwrap();
            let enabled = ds.status.map(|s| s.enabled_namespaces).unwrap_or_default();
            (enabled == [team_c]
                && webhooks
                    .get_opt(&format!("marin3r-ns.{team_c}.ds"))
                    .await
                    .unwrap()
                    .is_some()
                && webhooks
                    .get_opt(&format!("marin3r-{team_c}-ds"))
                    .await
                    .unwrap()
                    .is_none()
                && roles
                    .get_opt(&format!("marin3r-{team_c}-ds"))
                    .await
                    .unwrap()
                    .is_none()
                && Api::<ClusterRoleBinding>::all(client.clone())
                    .get_opt(&format!("marin3r-{team_c}-ds"))
                    .await
                    .unwrap()
                    .is_none()
                && !bootstrap(team_a).await
                && bootstrap(team_c).await
                && namespace_labels(&client, team_a).await == (None, None)
                && Api::<Role>::namespaced(client.clone(), team_a)
                    .get_opt(&format!("marin3r-{team_c}-ds"))
                    .await
                    .unwrap()
                    .is_none())
            .then_some(())
        },
    )
    .await;
    stop.cancel();
    for t in &tasks {
        t.abort();
    }
    drop(op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_lead_at_once() {
    let cluster = cluster();
    let client = cluster.client().await.unwrap();
    let space = Namespaces::new(&cluster, &client).await;
    let ops = space.create("ops", &[]).await;
    let ops = ops.as_str();
    let leading = Arc::new(AtomicUsize::new(0));
    let max_leading = Arc::new(AtomicUsize::new(0));
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for id in ["one", "two"] {
        let mut config = leader::LeaseConfig::new(ops, "marin3r-operator", id);
        config.retry_period = Duration::from_millis(100);
        config.renew_deadline = Duration::from_secs(1);
        config.lease_duration = Duration::from_secs(2);
        let stop = CancellationToken::new();
        let work = {
            let (leading, max_leading, stop) = (leading.clone(), max_leading.clone(), stop.clone());
            async move {
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                max_leading.fetch_max(now, Ordering::SeqCst);
                stop.cancelled().await;
                leading.fetch_sub(1, Ordering::SeqCst);
            }
        };
        tasks.push(tokio::spawn(leader::run_as_leader(
            client.clone(),
            config,
            stop.clone(),
            work,
        )));
        stops.push(stop);
    }
    wait_for("a leader", || async {
        (leading.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    // Give the other candidate many chances to (wrongly) take the lease.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(max_leading.load(Ordering::SeqCst), 1);
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ops);
    let holder = lease
        .get("marin3r-operator")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    // The leader stops and releases: the other takes over without waiting for expiry.
    let first = if holder == "one" { 0 } else { 1 };
    stops[first].cancel();
    tasks.remove(first).await.unwrap().unwrap();
    wait_for("the other replica to lead", || async {
        let spec = lease.get("marin3r-operator").await.ok()?.spec?;
        (spec.holder_identity.as_deref() != Some(holder.as_str())
            && spec.holder_identity.is_some()
            && leading.load(Ordering::SeqCst) == 1)
            .then_some(())
    })
    .await;
    assert_eq!(max_leading.load(Ordering::SeqCst), 1);
    for s in &stops {
        s.cancel();
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_certificate_example_is_issued() {
    let op = start().await;
    let client = op.client.clone();
    let demo = op.space.create("demo", &[]).await;
    let demo = demo.as_str();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../manifests/examples/certificate.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let dscs: Api<DiscoveryServiceCertificate> = Api::namespaced(client.clone(), demo);
    for doc in text.split("\n---\n") {
        let mut dsc: DiscoveryServiceCertificate = serde_saphyr::from_str(doc).unwrap();
        dsc.metadata.namespace = Some(demo.to_owned());
        dscs.create(&PostParams::default(), &dsc).await.unwrap();
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), demo);
    let server = wait_for("the example server certificate", || async {
        let dsc = dscs.get("example-server").await.unwrap();
        dsc.status.as_ref()?.ready.filter(|r| *r)?;
        secrets.get_opt("example-server").await.unwrap()
    })
    .await;
    let ca = secrets.get("example-ca").await.unwrap();
    let text =
        |s: &Secret, k: &str| String::from_utf8(s.data.as_ref().unwrap()[k].0.clone()).unwrap();
    assert_eq!(
        text(&server, "ca.crt"),
        text(&ca, "tls.crt"),
        "signed by the example CA"
    );
    let info = marin3r_certs::CertificateInfo::from_pem(&text(&server, "tls.crt")).unwrap();
    assert!(info.server_auth);
    assert!(format!("{:?}", info.sans).contains("example.demo.svc"));
}

/// A DiscoveryService as written for the original v0.13.3, `affinity` included.
const V0_13_3_DISCOVERY_SERVICE: &str = r#"
apiVersion: operator.marin3r.3scale.net/v1alpha1
kind: DiscoveryService
metadata:
  name: instance
spec:
  debug: true
  resources:
    requests: {cpu: 100m, memory: 64Mi}
  serviceConfig: {name: marin3r-instance, type: ClusterIP}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
              - {key: node-role.kubernetes.io/infra, operator: Exists}
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: marin3r}}
"#;

/// `kubectl apply` of that manifest to an API server that prunes unknown fields, as a real
/// one does: the affinity is kept and reaches the discovery pods' template unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_original_v0_13_3_affinity_reaches_the_discovery_pods() {
    let op = start().await;
    let ops = op.ops.as_str();
    let kubectl = op.space.kubectl();
    kubectl
        .ok_with(&["apply", "-n", ops, "-f", "-"], V0_13_3_DISCOVERY_SERVICE)
        .await
        .unwrap();
    let manifest: serde_json::Value = serde_saphyr::from_str(V0_13_3_DISCOVERY_SERVICE).unwrap();
    let want = &manifest["spec"]["affinity"];
    let stored: serde_json::Value = serde_json::from_str(
        &kubectl
            .ok(&["get", "mds", "instance", "-n", ops, "-o", "json"])
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        &stored["spec"]["affinity"], want,
        "pruned by the CRD schema"
    );
    let deployments: Api<Deployment> = Api::namespaced(op.client.clone(), ops);
    let affinity = wait_for("the discovery Deployment", || async {
        let d = deployments.get_opt("marin3r-instance").await.unwrap()?;
        d.spec.template.spec?.affinity
    })
    .await;
    assert_eq!(&serde_json::to_value(affinity).unwrap(), want);
}
