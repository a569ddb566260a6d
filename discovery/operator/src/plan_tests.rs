//! The DiscoveryService controller's pure decisions.

use super::*;
use kube::runtime::events::EventType;

fn ds() -> DiscoveryService {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
        "kind": "DiscoveryService",
        "metadata": {"name": "instance", "namespace": "elsewhere", "generation": 2},
        "spec": {},
    }))
    .unwrap()
}

fn observe<'a>(ds: &'a DiscoveryService, config: &Config) -> Observed<'a> {
    Observed {
        ds,
        spec: check(ds, config),
        scope: scope(ds, config),
        namespaces: Vec::new(),
        clients: Vec::new(),
        now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

#[test]
fn a_problem_only_a_user_can_fix_warns_once_and_waits_for_a_change() {
    let mut ds = ds();
    ds.spec.enabled_namespaces = Some(vec!["elsewhere".into(), "other".into()]);
    let config = Config {
        trusted_namespaces: ["ops".to_owned()].into(),
        ..Default::default()
    };
    let obs = observe(&ds, &config);
    let Plan::NotReady(why) = decide(&obs) else {
        panic!("an untrusted namespace must not reach into another")
    };
    assert_eq!(why.reason, Reason::ForbiddenNamespace);
    assert!(
        why.message.starts_with(
            "spec.enabledNamespaces[1]: \"other\" is another namespace; a DiscoveryService \
             outside the operator's trusted namespaces (ops) serves only its own namespace \
             elsewhere."
        ),
        "{}",
        why.message
    );
    let outcome = not_ready(&obs, why.clone());
    assert_eq!(outcome.requeue, None);
    assert_eq!(outcome.events.len(), 1);
    assert_eq!(outcome.events[0].type_, EventType::Warning);
    assert_eq!(outcome.status.conditions[0].reason, "ForbiddenNamespace");
    let mut seen = ds.clone();
    seen.status = Some(outcome.status);
    assert!(not_ready(&observe(&seen, &config), why).events.is_empty());
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name, "labels": labels}}))
        .unwrap()
}

#[test]
fn outside_the_trusted_namespaces_it_serves_its_own_namespace_only() {
    let mut ds = ds();
    ds.spec.enabled_namespaces = Some(vec!["elsewhere".into()]);
    let config = Config {
        trusted_namespaces: ["ops".to_owned()].into(),
        ..Default::default()
    };
    let mut obs = observe(&ds, &config);
    // Another namespace labelled with its name (perhaps for a trusted namesake) is not
    // served.
    obs.namespaces = vec![
        namespace("elsewhere", serde_json::json!({})),
        namespace(
            "other",
            serde_json::json!({marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL: "instance"}),
        ),
    ];
    let Plan::Apply(plan) = decide(&obs) else {
        panic!("its own namespace may be served")
    };
    assert_eq!(plan.children.scope(), Scope::Namespace);
    assert_eq!(plan.enabled, ["elsewhere"]);
    assert!(
        plan.namespace_patches.is_empty(),
        "no Namespace is labelled"
    );
    assert!(plan.cluster_rbac.is_none(), "no cluster-wide access");
    assert_eq!(plan.clients.len(), 1);
    let (target, client, bootstrap) = &plan.clients[0];
    assert_eq!(target, "elsewhere");
    assert_eq!(
        client.spec.secret_ref.namespace.as_deref(),
        Some("elsewhere")
    );
    assert_eq!(bootstrap.metadata.namespace.as_deref(), Some("elsewhere"));
    // In a trusted namespace the same discovery service serves the labelled one too.
    let trusted = Config {
        trusted_namespaces: ["elsewhere".to_owned()].into(),
        ..Default::default()
    };
    let mut obs = observe(&ds, &trusted);
    obs.namespaces = vec![
        namespace("elsewhere", serde_json::json!({})),
        namespace(
            "other",
            serde_json::json!({marin3r_api::discovery_service::DISCOVERY_SERVICE_LABEL: "instance"}),
        ),
    ];
    let Plan::Apply(plan) = decide(&obs) else {
        panic!("a trusted discovery service is applied")
    };
    assert_eq!(plan.enabled, ["elsewhere", "other"]);
    assert!(plan.cluster_rbac.is_some());
}

#[test]
fn progress_is_normal_and_looked_at_again_soon() {
    let ds = ds();
    let config = Config {
        trusted_namespaces: ["elsewhere".to_owned()].into(),
        ..Default::default()
    };
    let obs = observe(&ds, &config);
    let waiting = NotReady {
        reason: Reason::CertificatesNotReady,
        message: "waiting".into(),
    };
    let outcome = finish(&obs, Default::default(), Err(waiting), &["gone".to_owned()]);
    assert_eq!(outcome.requeue, Some(NOT_READY_RETRY));
    assert_eq!(outcome.events[0].type_, EventType::Normal);
    assert_eq!(
        outcome.events[0].message,
        "waiting; listed namespaces not found: gone"
    );
    let ready = finish(&obs, Default::default(), Ok(()), &[]);
    assert_eq!(ready.requeue, Some(READY_RESYNC));
    assert_eq!(ready.status.conditions[0].status, "True");
    assert_eq!(ready.status.observed_generation, Some(2));
}

#[test]
fn the_oldest_discovery_service_of_a_namespace_serves_it_and_the_others_are_refused() {
    let at = |name: &str, secs: i64| -> DiscoveryService {
        let mut d: DiscoveryService = serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryService",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {},
        }))
        .unwrap();
        let t = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap();
        d.metadata.creation_timestamp = Some(Time(t));
        d
    };
    let all = [at("b", 0), at("a", 10), at("c", 10)];
    assert_eq!(first_in_namespace(&all[0], Scope::Namespace, &all), Ok(()));
    let refused = first_in_namespace(&all[1], Scope::Namespace, &all).unwrap_err();
    assert_eq!(refused.reason, Reason::NamespaceAlreadyServed);
    assert!(
        refused
            .message
            .starts_with("namespace shop is already served by the DiscoveryService \"b\""),
        "{}",
        refused.message
    );
    // Created in the same second: the first by name.
    let tied = [at("a", 10), at("c", 10)];
    assert_eq!(
        first_in_namespace(&tied[0], Scope::Namespace, &tied),
        Ok(())
    );
    assert!(first_in_namespace(&tied[1], Scope::Namespace, &tied).is_err());
    // One being deleted no longer holds the namespace.
    let mut deleting = at("b", 0);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    assert_eq!(
        first_in_namespace(&all[1], Scope::Namespace, &[deleting, at("a", 10)]),
        Ok(())
    );
    // In a trusted namespace several serve other namespaces side by side.
    assert_eq!(first_in_namespace(&all[1], Scope::Cluster, &all), Ok(()));
}

/// An operator run with `--log-format json` runs discovery pods that log JSON too (and pass
/// it on to the shutdown managers they inject); one logging text adds no flag.
#[test]
fn the_discovery_pods_log_as_the_operator_does() {
    let ds = ds();
    let args_with = |json_logs| {
        let config = Config {
            json_logs,
            ..Default::default()
        };
        let obs = observe(&ds, &config);
        let Plan::Apply(apply) = decide(&obs) else {
            panic!("a default spec is served")
        };
        let deployment = apply.children.deployment("hash");
        let pod = deployment.spec.template.spec.unwrap();
        pod.containers[0].args.clone().unwrap()
    };
    assert!(args_with(true).contains(&"--log-format=json".to_owned()));
    assert!(
        !args_with(false)
            .iter()
            .any(|a| a.starts_with("--log-format"))
    );
}
