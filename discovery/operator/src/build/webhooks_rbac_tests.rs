//! The discovery service's Service, its two webhook configurations and its RBAC, as the
//! operator builds them (a child of the build tests, whose fixtures it uses).

use super::*;

#[test]
fn the_service_exposes_the_webhook_on_443() {
    let svc = with(
        serde_json::json!({"webhookPort": 9443, "serviceConfig": {"name": "xds", "type": "Headless"}}),
        |c| c.service(),
    );
    assert_eq!(svc.metadata.name.as_deref(), Some("xds"));
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    let ports: Vec<(String, i32, IntOrString)> = spec
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.port, p.target_port.unwrap()))
        .collect();
    assert_eq!(
        ports,
        [
            ("xds".into(), 18000, IntOrString::Int(18000)),
            ("webhook".into(), 443, IntOrString::Int(9443)),
            ("metrics".into(), 8383, IntOrString::Int(8383)),
        ]
    );
}

#[test]
fn the_webhook_trusts_the_ca_and_selects_labelled_pods_in_served_namespaces() {
    let (hook, name) = with(serde_json::json!({}), |c| {
        (c.webhook_configuration("PEM"), c.cluster_name())
    });
    assert_eq!(name, "marin3r-ops-instance");
    assert!(hook.metadata.owner_references.is_none());
    assert_eq!(hook.labels()[OWNER_NAMESPACE_LABEL], "ops");
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(w.client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
    let svc = w.client_config.service.as_ref().unwrap();
    assert_eq!(
        (
            svc.name.as_str(),
            svc.namespace.as_str(),
            svc.path.as_deref(),
            svc.port
        ),
        ("marin3r-instance", "ops", Some("/pod-v1-mutate"), Some(443))
    );
    assert_eq!(
        w.namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[DISCOVERY_SERVICE_LABEL],
        "instance"
    );
    assert_eq!(
        w.object_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[STATUS_LABEL],
        "enabled"
    );
    let rule = &w.rules.as_ref().unwrap()[0];
    assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
    assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]));
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.admission_review_versions, ["v1"]);
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.timeout_seconds, Some(WEBHOOK_TIMEOUT_SECONDS));
}

#[test]
fn the_validating_webhook_judges_envoyconfigs_of_served_namespaces() {
    let (hook, name) = with(serde_json::json!({}), |c| {
        (c.validating_webhook_configuration("PEM"), c.cluster_name())
    });
    assert_eq!(hook.metadata.name.as_deref(), Some(name.as_str()));
    assert!(hook.metadata.owner_references.is_none());
    assert_eq!(hook.labels()[OWNER_NAME_LABEL], "instance");
    assert_eq!(hook.labels()[OWNER_NAMESPACE_LABEL], "ops");
    let w = &hook.webhooks.unwrap()[0];
    assert_eq!(
        w.name,
        "instance.ops.envoyconfig-validator.marin3r.3scale.net"
    );
    assert_eq!(w.client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
    let svc = w.client_config.service.as_ref().unwrap();
    assert_eq!(
        (
            svc.name.as_str(),
            svc.namespace.as_str(),
            svc.path.as_deref(),
            svc.port
        ),
        (
            "marin3r-instance",
            "ops",
            Some("/validate-marin3r-3scale-net-v1alpha1-envoyconfig"),
            Some(443)
        )
    );
    // The same namespaces as the injection webhook: those labelled for this service.
    let mutating = with(serde_json::json!({}), |c| c.webhook_configuration("PEM"));
    assert_eq!(
        w.namespace_selector,
        mutating.webhooks.unwrap()[0].namespace_selector
    );
    assert!(w.object_selector.is_none());
    let rules = w.rules.as_ref().unwrap();
    assert_eq!(rules.len(), 1);
    let strings = |v: &Option<Vec<String>>| v.clone().unwrap();
    assert_eq!(strings(&rules[0].api_groups), ["marin3r.3scale.net"]);
    assert_eq!(strings(&rules[0].api_versions), ["v1alpha1"]);
    assert_eq!(strings(&rules[0].resources), ["envoyconfigs"]);
    assert_eq!(strings(&rules[0].operations), ["CREATE", "UPDATE"]);
    assert_eq!(rules[0].scope.as_deref(), Some("Namespaced"));
    assert_eq!(w.side_effects, "None");
    assert_eq!(w.admission_review_versions, ["v1"]);
    assert_eq!(w.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(w.timeout_seconds, Some(WEBHOOK_TIMEOUT_SECONDS));
}

#[test]
fn cluster_rbac_is_bound_to_the_service_account_only() {
    let (role, binding) = with(serde_json::json!({}), |c| {
        (c.cluster_role(), c.cluster_role_binding())
    });
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "marin3r-instance", Some("ops"))
    );
    let rules = role.rules.unwrap();
    assert!(
        rules.iter().all(|r| !r
            .resources
            .as_ref()
            .unwrap()
            .contains(&"secrets".to_owned())),
        "no cluster-wide Secret access: {rules:?}"
    );
    assert!(rules.iter().all(|r| !r.verbs.contains(&"*".to_owned())));
}

#[test]
fn secrets_are_readable_only_in_each_served_namespace() {
    let (role, binding) = with(serde_json::json!({}), |c| {
        (
            c.secret_reader_role("team-a"),
            c.secret_reader_binding("team-a"),
        )
    });
    assert_eq!(role.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(binding.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(role.metadata.name.as_deref(), Some("marin3r-ops-instance"));
    // Labelled like the other cross-namespace children, so leaving and cleanup find them.
    let labels = role.metadata.labels.unwrap();
    assert_eq!(labels[OWNER_NAME_LABEL], "instance");
    assert_eq!(labels[OWNER_NAMESPACE_LABEL], "ops");
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("Role", "marin3r-ops-instance")
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        ("ServiceAccount", "marin3r-instance", Some("ops"))
    );
    let rules = role.rules.unwrap();
    let granted: Vec<(&str, &str, &[String])> = rules
        .iter()
        .map(|r| {
            (
                r.api_groups.as_deref().unwrap()[0].as_str(),
                r.resources.as_deref().unwrap()[0].as_str(),
                r.verbs.as_slice(),
            )
        })
        .collect();
    let read = ["get", "list", "watch"].map(String::from);
    assert_eq!(
        granted,
        [
            ("", "secrets", &read[..]),
            ("discovery.k8s.io", "endpointslices", &read[..])
        ],
        "Secrets and EndpointSlices are read-only, nothing else"
    );
    assert!(
        rules
            .iter()
            .all(|r| r.resources.as_ref().unwrap().len() == 1)
    );
}
