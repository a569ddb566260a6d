//! A DiscoveryService in an application namespace (the original MARIN3R's model) on the real
//! cluster, driven through kubectl with the real API server's RBAC: a namespace admin, who may only manage
//! DiscoveryServices and workloads in their namespace, creates one; it serves that namespace
//! (an annotated pod there is injected and its real Envoy gets its config over mTLS xDS),
//! reaches nothing outside it (pods elsewhere are not sent to its webhook, its discovery pod
//! cannot read other namespaces' Secrets), and one listing another namespace is refused.
//! Every namespace is the scenario's own, so it runs beside the others.

use marin3r_testkit::wait::until;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use marin3r_api::discovery_service::DiscoveryService;
use marin3r_e2e::product::{discovery_service_ready, example_in};
use marin3r_e2e::real::{self, Scenario};
use serde_json::json;

const BODY: &str = real::EXAMPLE_BODY;

/// What a namespace admin of `ns` may do there: DiscoveryServices, EnvoyConfigs and
/// workloads, nothing cluster-wide.
fn namespace_admin(ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: admin, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: admin, namespace: {ns}}}
rules:
  - apiGroups: [operator.marin3r.3scale.net]
    resources: [discoveryservices]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [marin3r.3scale.net]
    resources: [envoyconfigs]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [get, list, watch, create, patch, delete]
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: admin, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: admin}}
subjects:
  - {{kind: ServiceAccount, name: admin, namespace: {ns}}}
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_discovery_service_in_its_own_namespace_serves_that_namespace_only() {
    let scenario = Scenario::start("own", &[]).await.unwrap();
    let (client, kubectl) = (scenario.client.clone(), &scenario.kubectl);
    let app = scenario.ns.clone();
    let other = scenario.namespace("other").await.unwrap();
    let team_y = scenario.namespace("team-y").await.unwrap();
    let team_z = scenario.namespace("team-z").await.unwrap();
    let (app, other, team_y, team_z) = (
        app.as_str(),
        other.as_str(),
        team_y.as_str(),
        team_z.as_str(),
    );
    kubectl
        .ok_with(&["apply", "-f", "-"], &namespace_admin(app))
        .await
        .unwrap();
    // The namespace admin acts with their ServiceAccount's token alone.
    let (admin, _admin_kubeconfig) = scenario.kubectl_as(app, "admin").await.unwrap();

    // The namespace admin creates the discovery service, then (once its webhooks answer) the
    // config and the workload.
    let apply_as_admin = |file: &'static str| {
        let admin = &admin;
        async move {
            admin
                .ok_with(
                    &["apply", "--server-side", "-f", "-"],
                    &example_in(file, app).unwrap(),
                )
                .await
                .unwrap();
        }
    };
    apply_as_admin("discoveryservice-own-namespace.yaml").await;
    // ...who may not reach into the operator's namespace (a check that RBAC is on for them).
    let out = admin
        .run(&["get", "secrets", "-n", "marin3r-system"])
        .await
        .unwrap();
    assert!(!out.success);
    assert!(out.stderr.contains("forbidden"), "{out:?}");

    let dss: Api<DiscoveryService> = Api::namespaced(client.clone(), app);
    let ds = until(
        "the DiscoveryService to be Ready",
        Duration::from_secs(120),
        || async {
            let ds = dss.get("instance").await.ok()?;
            (discovery_service_ready(&ds)?.0 == "True").then_some(ds)
        },
    )
    .await;
    assert_eq!(ds.status.unwrap().enabled_namespaces, [app]);
    let out = kubectl
        .ok(&["get", "discoveryservices", "-n", app])
        .await
        .unwrap();
    assert!(out.contains("instance") && out.contains("True"), "{out}");
    apply_as_admin("envoyconfig.yaml").await;
    apply_as_admin("deployment.yaml").await;

    // Its validating webhook judges the EnvoyConfigs of its namespace, and only those.
    let typo = example_in("envoyconfig.yaml", app)
        .unwrap()
        .replace("name: demo-proxy", "name: typo")
        .replace("stat_prefix: http", "stat_prefx: http");
    let refused = admin
        .run_with(&["apply", "--server-side", "-f", "-"], &typo)
        .await
        .unwrap();
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused.stderr.contains(&format!(
            "admission webhook \"instance.{app}.envoyconfig-validator.marin3r.3scale.net\" denied the request: spec.envoyResources.listeners[0].value: "
        )) && refused.stderr.contains("stat_prefx"),
        "{refused:?}"
    );
    kubectl
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &typo.replace(&format!("namespace: {app}"), &format!("namespace: {other}")),
        )
        .await
        .unwrap();

    // An annotated pod there is injected and its real Envoy serves the EnvoyConfig.
    let pods: Api<Pod> = Api::namespaced(client.clone(), app);
    let pod = until(
        "the injected pod to serve its config",
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=demo"))
                .await
                .unwrap();
            list.items.into_iter().find(|p| {
                real::pod_ready(p)
                    && marin3r_testkit::envoy::get_body(&format!(
                        "http://{}:8080/",
                        real::pod_ip(p)
                    ))
                    .ok()
                    .as_deref()
                        == Some(BODY)
            })
        },
    )
    .await;
    // The API server is 1.36: Envoy is a native sidecar, an init container.
    let names = |list: &[k8s_openapi::api::core::v1::Container]| -> Vec<String> {
        list.iter().map(|c| c.name.clone()).collect()
    };
    let injected = pod.spec.clone().unwrap();
    assert_eq!(names(&injected.containers), ["app"]);
    assert_eq!(
        names(injected.init_containers.as_deref().unwrap_or_default()),
        ["envoy-sidecar"]
    );

    // Its webhook sees only its namespace: the same pod elsewhere is created as it is.
    let mut spec = pod.spec.clone().unwrap();
    spec.containers.retain(|c| c.name == "app");
    spec.init_containers = None;
    // The API server's ServiceAccount admission mounted a token volume: both go.
    spec.volumes = None;
    for c in &mut spec.containers {
        c.volume_mounts = None;
    }
    spec.node_name = None;
    let elsewhere: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "probe",
            "namespace": other,
            "labels": {"marin3r.3scale.net/status": "enabled"},
            "annotations": {"marin3r.3scale.net/node-id": "demo-proxy"},
        },
        "spec": spec,
    }))
    .unwrap();
    let created = Api::<Pod>::namespaced(client.clone(), other)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &elsewhere,
        )
        .await
        .unwrap();
    let created = created.spec.unwrap();
    assert_eq!(created.containers.len(), 1);
    assert!(created.init_containers.is_none());

    // A second DiscoveryService in the namespace is refused, naming the one that serves it,
    // and a pod cannot choose it: one owner for the namespace's configs and certificate.
    admin
        .ok_with(
            &["apply", "--server-side", "-f", "-"],
            &format!(
                "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
                 metadata: {{name: second, namespace: {app}}}\nspec: {{}}\n"
            ),
        )
        .await
        .unwrap();
    let (status, reason, message) = until(
        "the second DiscoveryService to be refused",
        Duration::from_secs(60),
        || async { discovery_service_ready(&dss.get("second").await.ok()?) },
    )
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NamespaceAlreadyServed")
    );
    assert!(
        message.contains("DiscoveryService \"instance\""),
        "{message}"
    );
    let mut choosing = elsewhere.clone();
    choosing.metadata.namespace = Some(app.into());
    choosing.annotations_mut().insert(
        "marin3r.3scale.net/discovery-service.name".into(),
        "second".into(),
    );
    let denied = pods
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &choosing,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        denied.contains("a namespace has one DiscoveryService"),
        "{denied}"
    );
    dss.delete("second", &DeleteParams::default())
        .await
        .unwrap();

    // Its discovery pod's identity reads its own namespace only.
    let (sa, _sa_kubeconfig) = scenario.kubectl_as(app, "marin3r-instance").await.unwrap();
    let out = sa
        .run(&["get", "secrets", "-n", "marin3r-system"])
        .await
        .unwrap();
    assert!(!out.success, "{out:?}");
    let out = sa.run(&["get", "envoyconfigs", "-A"]).await.unwrap();
    assert!(!out.success, "{out:?}");
    let out = sa.ok(&["get", "envoyconfigs", "-n", app]).await.unwrap();
    assert!(out.contains("demo-proxy"), "{out}");

    // A discovery service in team-y listing team-z is refused, and nothing reaches team-z.
    let reaching = format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryService\n\
         metadata: {{name: reach, namespace: {team_y}}}\n\
         spec:\n  enabledNamespaces: [{team_y}, {team_z}]\n"
    );
    kubectl
        .ok_with(&["apply", "--server-side", "-f", "-"], &reaching)
        .await
        .unwrap();
    let refused: Api<DiscoveryService> = Api::namespaced(client.clone(), team_y);
    let (_, _, message) = until(
        "the reaching DiscoveryService refused",
        Duration::from_secs(60),
        || async {
            let ds = refused.get("reach").await.ok()?;
            discovery_service_ready(&ds)
                .filter(|(status, reason, _)| status == "False" && reason == "ForbiddenNamespace")
        },
    )
    .await;
    assert!(
        message.starts_with(&format!(
            "spec.enabledNamespaces[1]: \"{team_z}\" is another namespace"
        )),
        "{message}"
    );
    let out = kubectl
        .ok(&["describe", "discoveryservice", "reach", "-n", team_y])
        .await
        .unwrap();
    assert!(out.contains("ForbiddenNamespace"), "{out}");
    assert!(
        Api::<Secret>::namespaced(client.clone(), team_z)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Deleted: its webhook configurations go with it.
    let hook = format!("marin3r-ns.{app}.instance");
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let gone = || async {
        webhooks.get_opt(&hook).await.unwrap().is_none()
            && validating.get_opt(&hook).await.unwrap().is_none()
    };
    assert!(webhooks.get_opt(&hook).await.unwrap().is_some());
    assert!(validating.get_opt(&hook).await.unwrap().is_some());
    dss.delete("instance", &DeleteParams::default())
        .await
        .unwrap();
    until(
        "the webhook configurations removed",
        Duration::from_secs(60),
        || async { gone().await.then_some(()) },
    )
    .await;
    let names: Vec<String> = webhooks
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert!(names.iter().all(|n| !n.contains(team_y)), "{names:?}");
}
