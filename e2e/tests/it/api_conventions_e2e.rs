//! The API's conventions, checked by the real API server and its controllers (`hack/cluster`),
//! marin3r installed from `manifests/`:
//! - what OpenAPI cannot say is refused by the API server itself, with our words: the CRDs'
//!   CEL rules (`x-kubernetes-validations`) on `kubectl apply --dry-run=server`;
//! - users get marin3r's objects through Kubernetes' own roles: `manifests/operator/
//!   user-roles.yaml` aggregates into `view`, `edit` and `admin` (the real
//!   clusterrole-aggregation controller folds them in), asked with `kubectl auth can-i`.

use marin3r_e2e::real::Scenario;

/// `kubectl apply --dry-run=server` of `manifest`: whether it passed, and what was said.
async fn dry_run(scenario: &Scenario, manifest: &str) -> (bool, String) {
    let out = scenario
        .kubectl
        .run_with(&["apply", "--dry-run=server", "-f", "-"], manifest)
        .await
        .unwrap();
    (out.success, format!("{}{}", out.stdout, out.stderr))
}

fn gateway(ns: &str, replicas: &str, budget: &str) -> String {
    format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: EnvoyDeployment\n\
         metadata: {{name: gw, namespace: {ns}}}\n\
         spec:\n  discoveryServiceRef: instance\n  envoyConfigRef: gw\n  replicas: {replicas}\n  \
         podDisruptionBudget: {budget}\n"
    )
}

fn certificate(ns: &str, signer: &str) -> String {
    format!(
        "apiVersion: operator.marin3r.3scale.net/v1alpha1\nkind: DiscoveryServiceCertificate\n\
         metadata: {{name: c, namespace: {ns}}}\n\
         spec: {{commonName: c, validFor: 3600, secretRef: {{name: c}}, signer: {signer}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_what_openapi_cannot_say_in_our_words() {
    let scenario = Scenario::start("celrules", &[]).await.unwrap();
    let ns = scenario.ns.as_str();

    let (ok, said) = dry_run(
        &scenario,
        &gateway(ns, "{static: 2}", "{maxUnavailable: 1}"),
    )
    .await;
    assert!(ok, "a good gateway is accepted: {said}");
    for (replicas, budget, words) in [
        (
            "{static: 2, dynamic: {maxReplicas: 3}}",
            "{}",
            "set exactly one of static (a fixed number) or dynamic (an autoscaler)",
        ),
        (
            "{}",
            "{}",
            "set exactly one of static (a fixed number) or dynamic (an autoscaler)",
        ),
        (
            "{dynamic: {minReplicas: 4, maxReplicas: 3}}",
            "{}",
            "minReplicas must not be more than maxReplicas",
        ),
        (
            "{static: 1}",
            "{minAvailable: 1, maxUnavailable: 1}",
            "set minAvailable or maxUnavailable, not both",
        ),
    ] {
        let (ok, said) = dry_run(&scenario, &gateway(ns, replicas, budget)).await;
        assert!(!ok && said.contains(words), "{replicas} {budget}: {said}");
    }

    let (ok, said) = dry_run(&scenario, &certificate(ns, "{selfSigned: {}}")).await;
    assert!(ok, "a good certificate is accepted: {said}");
    for signer in [
        "{}",
        "{selfSigned: {}, caSigned: {caSecretRef: {name: ca}}}",
    ] {
        let (ok, said) = dry_run(&scenario, &certificate(ns, signer)).await;
        assert!(
            !ok && said.contains("set exactly one of selfSigned or caSigned"),
            "{signer}: {said}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn view_edit_and_admin_include_marin3rs_objects() {
    let scenario = Scenario::start("userroles", &[]).await.unwrap();
    let ns = scenario.ns.as_str();
    let elsewhere = scenario.namespace("elsewhere").await.unwrap();
    for role in ["view", "edit", "admin"] {
        let account = format!("{role}er");
        scenario
            .kubectl
            .ok(&["create", "serviceaccount", &account, "-n", ns])
            .await
            .unwrap();
        scenario
            .kubectl
            .ok(&[
                "create",
                "rolebinding",
                &account,
                "-n",
                ns,
                &format!("--clusterrole={role}"),
                &format!("--serviceaccount={ns}:{account}"),
            ])
            .await
            .unwrap();
    }
    // `kubectl auth can-i VERB RESOURCE --as ACCOUNT -n NS`: yes or no.
    let can = |account: &str, verb: &str, resource: &str, namespace: &str| {
        let (account, verb, resource, namespace) = (
            format!("system:serviceaccount:{ns}:{account}"),
            verb.to_owned(),
            resource.to_owned(),
            namespace.to_owned(),
        );
        let kubectl = &scenario.kubectl;
        async move {
            let out = kubectl
                .run(&[
                    "auth", "can-i", &verb, &resource, "--as", &account, "-n", &namespace,
                ])
                .await
                .unwrap();
            out.stdout.trim() == "yes"
        }
    };
    let ec = "envoyconfigs.marin3r.3scale.net";
    let ecr = "envoyconfigrevisions.marin3r.3scale.net";
    let ds = "discoveryservices.operator.marin3r.3scale.net";
    let dsc = "discoveryservicecertificates.operator.marin3r.3scale.net";
    let gw = "envoydeployments.operator.marin3r.3scale.net";
    // (account, verb, resource, allowed in its namespace)
    let expected = [
        ("viewer", "list", ec, true),
        ("viewer", "get", ecr, true),
        ("viewer", "watch", ds, true),
        ("viewer", "get", dsc, true),
        ("viewer", "list", gw, true),
        ("viewer", "create", ec, false),
        ("viewer", "delete", gw, false),
        ("editer", "create", ec, true),
        ("editer", "patch", gw, true),
        ("editer", "create", dsc, true),
        ("editer", "list", ecr, true),
        // Revisions are the discovery service's, written from validated EnvoyConfigs only.
        ("editer", "create", ecr, false),
        ("editer", "patch", ecr, false),
        ("editer", "create", ds, false),
        ("adminer", "create", ds, true),
        ("adminer", "create", ec, true),
        ("adminer", "create", ecr, false),
    ];
    let mut wrong = Vec::new();
    for (account, verb, resource, allowed) in expected {
        if can(account, verb, resource, ns).await != allowed {
            wrong.push(format!("{account} {verb} {resource}: expected {allowed}"));
        }
        // A RoleBinding grants nothing in another namespace.
        if can(account, verb, resource, &elsewhere).await {
            wrong.push(format!("{account} {verb} {resource} in {elsewhere}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
