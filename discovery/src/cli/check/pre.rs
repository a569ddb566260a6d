//! `marin3r check --pre`: whether a cluster can take marin3r, before it is installed. The
//! API server's version; whether the caller may create every object the install holds (the
//! CRDs and the objects of `manifests/operator/`, read from those very files, so the list
//! cannot drift from what is installed), including the operator's ClusterRole, which RBAC lets
//! only someone holding its permissions (or `escalate`) create; and what is already there that
//! would clash: marin3r's CRDs or webhooks from an earlier install or the original MARIN3R,
//! and other webhooks that mutate pods.

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};

use super::{Report, said};
use crate::crds;
use marin3r_operator::build::OWNER_NAME_LABEL;

/// The oldest Kubernetes minor (1.x) marin3r installs on: its CRDs carry validation rules
/// (`x-kubernetes-validations`, GA in 1.29) and its sidecars are native from 1.29.
pub const OLDEST_MINOR: u32 = 29;

/// The minor the tests run on (`hack/cluster`'s Kubernetes).
const TESTED_MINOR: u32 = 36;

/// The operator's objects, as `kubectl apply -k manifests/` creates them.
const OPERATOR_MANIFESTS: [&str; 4] = [
    include_str!("../../../../manifests/operator/namespace.yaml"),
    include_str!("../../../../manifests/operator/rbac.yaml"),
    include_str!("../../../../manifests/operator/user-roles.yaml"),
    include_str!("../../../../manifests/operator/deployment.yaml"),
];

/// The ClusterRole the operator runs with.
const OPERATOR_ROLE: &str = "marin3r-operator";

pub(super) async fn check(client: &kube::Client, operator_ns: &str, report: &mut Report) {
    check_version(client, report).await;
    check_permissions(client, operator_ns, report).await;
    check_crds(client, report).await;
    check_webhooks(client, report).await;
}

async fn check_version(client: &kube::Client, report: &mut Report) {
    let check = "Kubernetes version";
    match client.apiserver_version().await {
        Err(e) => report.fail(
            check,
            format!("cannot ask the API server: {}", said(&e)),
            "check your kubeconfig and that the cluster is up",
        ),
        Ok(info) => match minor_of(&info.major, &info.minor) {
            Some(minor) if minor < OLDEST_MINOR => report.fail(
                check,
                format!("{} is older than 1.{OLDEST_MINOR}", info.git_version),
                format!("marin3r needs Kubernetes 1.{OLDEST_MINOR} or newer: upgrade the cluster"),
            ),
            Some(minor) => report.pass(
                check,
                format!(
                    "{} (1.{OLDEST_MINOR} or newer is needed; 1.{TESTED_MINOR} is tested{})",
                    info.git_version,
                    if minor == TESTED_MINOR {
                        ", this one"
                    } else {
                        ""
                    }
                ),
            ),
            None => report.warn(
                check,
                format!("{} is not a version this check reads", info.git_version),
                format!("make sure it is Kubernetes 1.{OLDEST_MINOR} or newer"),
            ),
        },
    }
}

/// The Kubernetes 1.x minor from `/version`'s `major` and `minor` (`"1"`, `"36+"`); `None`
/// for anything else.
fn minor_of(major: &str, minor: &str) -> Option<u32> {
    let number = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    };
    match number(major)? {
        1 => number(minor),
        // A Kubernetes 2 is newer than every 1.x.
        _ => Some(u32::MAX),
    }
}

/// One request the installer makes of the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Access {
    verb: String,
    group: String,
    resource: String,
    namespace: Option<String>,
}

impl Access {
    fn new(verb: &str, group: &str, resource: &str, namespace: Option<&str>) -> Self {
        Self {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            namespace: namespace.map(Into::into),
        }
    }

    /// `create deployments.apps in NS`, as the report says it.
    #[cfg(test)]
    fn describe(&self) -> String {
        format!("{} {}", self.verb, self.target())
    }

    /// What it is done to: `deployments.apps in NS`, `namespaces`.
    fn target(&self) -> String {
        let group = match self.group.as_str() {
            "" => String::new(),
            g => format!(".{g}"),
        };
        match &self.namespace {
            Some(ns) => format!("{}{group} in {ns}", self.resource),
            None => format!("{}{group}", self.resource),
        }
    }
}

/// The group and plural of each kind the install creates.
fn resource_of(kind: &str) -> Option<(&'static str, &'static str)> {
    Some(match kind {
        "CustomResourceDefinition" => ("apiextensions.k8s.io", "customresourcedefinitions"),
        "Namespace" => ("", "namespaces"),
        "ServiceAccount" => ("", "serviceaccounts"),
        "ClusterRole" => ("rbac.authorization.k8s.io", "clusterroles"),
        "ClusterRoleBinding" => ("rbac.authorization.k8s.io", "clusterrolebindings"),
        "Role" => ("rbac.authorization.k8s.io", "roles"),
        "RoleBinding" => ("rbac.authorization.k8s.io", "rolebindings"),
        "Deployment" => ("apps", "deployments"),
        "Service" => ("", "services"),
        _ => return None,
    })
}

/// The objects of the operator's manifests, parsed; the namespace they name is replaced by
/// `operator_ns` as `--operator-namespace` says.
fn operator_objects() -> anyhow::Result<Vec<serde_json::Value>> {
    let mut objects = Vec::new();
    for file in OPERATOR_MANIFESTS {
        for doc in serde_saphyr::from_multiple::<serde_json::Value>(file)? {
            if doc.is_object() {
                objects.push(doc);
            }
        }
    }
    Ok(objects)
}

/// What installing asks: `create` on every object of the install, in its namespace.
fn install_accesses(operator_ns: &str) -> anyhow::Result<Vec<Access>> {
    let mut accesses = vec![Access::new(
        "create",
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        None,
    )];
    for object in operator_objects()? {
        let kind = object["kind"].as_str().unwrap_or_default();
        let (group, resource) = resource_of(kind).ok_or_else(|| {
            anyhow::anyhow!("the install holds a {kind}, which --pre cannot check")
        })?;
        let namespaced = object["metadata"]["namespace"].is_string();
        let access = Access::new("create", group, resource, namespaced.then_some(operator_ns));
        if !accesses.contains(&access) {
            accesses.push(access);
        }
    }
    Ok(accesses)
}

/// What creating the operator's ClusterRole asks when the caller may not `escalate`: every
/// permission it grants, cluster-wide. (The users' roles of `user-roles.yaml` grant a part of
/// the same.)
fn granted_accesses() -> anyhow::Result<Vec<Access>> {
    let mut accesses = Vec::new();
    for object in operator_objects()? {
        if object["kind"] != "ClusterRole" || object["metadata"]["name"] != OPERATOR_ROLE {
            continue;
        }
        let role: ClusterRole = serde_json::from_value(object)?;
        for rule in role.rules.iter().flatten() {
            let groups = rule.api_groups.iter().flatten();
            for group in groups {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        accesses.push(Access::new(verb, group, resource, None));
                    }
                }
            }
        }
    }
    Ok(accesses)
}

/// Asks the API server whether the caller may do `access`.
async fn allowed(client: &kube::Client, access: &Access) -> anyhow::Result<bool> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(access.verb.clone()),
                group: Some(access.group.clone()),
                resource: Some(access.resource.clone()),
                namespace: access.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The accesses of `wanted` the caller lacks, said per resource: `get, list discoveryservices.
/// operator.marin3r.3scale.net; create namespaces`.
async fn lacking(client: &kube::Client, wanted: &[Access]) -> anyhow::Result<Vec<String>> {
    let answers = futures::future::join_all(wanted.iter().map(|a| allowed(client, a))).await;
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for (access, answer) in wanted.iter().zip(answers) {
        if answer? {
            continue;
        }
        let resource = access.target();
        match missing.iter_mut().find(|(r, _)| *r == resource) {
            Some((_, verbs)) => verbs.push(&access.verb),
            None => missing.push((resource, vec![&access.verb])),
        }
    }
    Ok(missing
        .into_iter()
        .map(|(resource, verbs)| format!("{} {resource}", verbs.join(", ")))
        .collect())
}

async fn check_permissions(client: &kube::Client, operator_ns: &str, report: &mut Report) {
    let fix = "install as a cluster administrator, or have one grant you these";
    let wanted = match install_accesses(operator_ns) {
        Ok(wanted) => wanted,
        Err(e) => return report.fail("permissions to install", e.to_string(), fix),
    };
    match lacking(client, &wanted).await {
        Err(e) => report.fail(
            "permissions to install",
            format!("cannot ask: {}", crate::cli::error_line(&e)),
            fix,
        ),
        Ok(missing) if missing.is_empty() => report.pass(
            "permissions to install",
            format!(
                "you may create the {} kinds of object the install holds",
                wanted.len()
            ),
        ),
        Ok(missing) => report.fail(
            "permissions to install",
            format!("you may not {}", missing.join("; ")),
            fix,
        ),
    }
    let check = "permissions the operator is granted";
    let escalate = Access::new(
        "escalate",
        "rbac.authorization.k8s.io",
        "clusterroles",
        None,
    );
    if let Ok(true) = allowed(client, &escalate).await {
        return report.pass(
            check,
            "you may grant any permission (escalate on clusterroles)",
        );
    }
    let granted = match granted_accesses() {
        Ok(granted) => granted,
        Err(e) => return report.fail(check, e.to_string(), fix),
    };
    match lacking(client, &granted).await {
        Err(e) => report.fail(
            check,
            format!("cannot ask: {}", crate::cli::error_line(&e)),
            fix,
        ),
        Ok(missing) if missing.is_empty() => report.pass(
            check,
            "you hold every permission the operator's ClusterRole grants, so you may grant it",
        ),
        Ok(missing) => report.fail(
            check,
            format!(
                "RBAC refuses a ClusterRole granting what you do not hold: {}",
                missing.join("; ")
            ),
            fix,
        ),
    }
}

async fn check_crds(client: &kube::Client, report: &mut Report) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut ours = Vec::new();
    for want in crds::all() {
        let name = want.name_any();
        let check = format!("CRD {name}");
        match api.get_opt(&name).await {
            Ok(None) => {}
            Ok(Some(have)) if super::same_schema(&have, &want) => ours.push(name),
            Ok(Some(have)) => {
                let served: Vec<&str> =
                    have.spec.versions.iter().map(|v| v.name.as_str()).collect();
                report.warn(
                    check,
                    format!(
                        "already installed with another schema (versions {}): an earlier \
                         marin3r or the original MARIN3R",
                        served.join(", ")
                    ),
                    "installing replaces its schema and keeps the objects; from the original, \
                     read docs/migrating.md first",
                );
            }
            Err(e) => report.fail(
                check,
                format!("cannot read it: {}", said(&e)),
                "check your RBAC",
            ),
        }
    }
    if !ours.is_empty() {
        report.warn(
            "CRDs",
            format!(
                "this release's CRDs are already installed ({})",
                ours.join(", ")
            ),
            "marin3r is installed: `marin3r check` (without --pre) tells whether it works",
        );
    }
}

/// Whether a webhook intercepts pod creation, as an injector does.
fn mutates_pods(webhook: &MutatingWebhook) -> bool {
    webhook.rules.iter().flatten().any(|rule| {
        let resources = rule.resources.iter().flatten();
        let operations = rule.operations.iter().flatten();
        resources.into_iter().any(|r| r == "pods" || r == "*")
            && operations.into_iter().any(|o| o == "CREATE" || o == "*")
    })
}

async fn check_webhooks(client: &kube::Client, report: &mut Report) {
    let check = "webhooks mutating pods";
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(e) => {
            return report.fail(
                check,
                format!("cannot list them: {}", said(&e)),
                "check your RBAC",
            );
        }
    };
    let (mut marin3r, mut other_marin3r, mut others) = (Vec::new(), Vec::new(), Vec::new());
    for config in &list.items {
        let name = config.name_any();
        if config.labels().contains_key(OWNER_NAME_LABEL) {
            marin3r.push(name);
        } else if name.contains("marin3r") {
            other_marin3r.push(name);
        } else if config.webhooks.iter().flatten().any(mutates_pods) {
            others.push(name);
        }
    }
    if !other_marin3r.is_empty() {
        report.warn(
            "webhooks of another marin3r",
            format!(
                "{} (not ours: the original MARIN3R?)",
                other_marin3r.join(", ")
            ),
            "two injectors each add a sidecar: remove the original's DiscoveryService first \
             (docs/migrating.md)",
        );
    }
    if !marin3r.is_empty() {
        report.warn(
            "webhooks of marin3r",
            format!("a DiscoveryService already serves: {}", marin3r.join(", ")),
            "marin3r is installed: `marin3r check` (without --pre) tells whether it works",
        );
    }
    if others.is_empty() {
        report.pass(check, "no other webhook mutates pods");
    } else {
        report.warn(
            check,
            format!("{} also mutate(s) pods", others.join(", ")),
            "they run beside marin3r's injection: make sure none adds its own Envoy (Istio's \
             injector) in the namespaces you enable",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_as_the_api_server_gives_them() {
        assert_eq!(minor_of("1", "36"), Some(36));
        assert_eq!(minor_of("1", "28+"), Some(28));
        assert_eq!(minor_of("2", "0"), Some(u32::MAX));
        assert_eq!(minor_of("", ""), None);
        assert_eq!(minor_of("1", "x"), None);
    }

    /// Every object the install holds is checked, in the namespace it goes to, so a kind
    /// added to manifests/operator/ cannot be forgotten here.
    #[test]
    fn installing_asks_to_create_every_kind_of_the_install() {
        let wanted = install_accesses("custom-ns").unwrap();
        let described: Vec<String> = wanted.iter().map(Access::describe).collect();
        assert_eq!(
            described,
            [
                "create customresourcedefinitions.apiextensions.k8s.io",
                "create namespaces",
                "create serviceaccounts in custom-ns",
                "create clusterroles.rbac.authorization.k8s.io",
                "create clusterrolebindings.rbac.authorization.k8s.io",
                "create deployments.apps in custom-ns",
            ]
        );
    }

    #[test]
    fn granting_the_operators_role_asks_for_each_of_its_permissions() {
        let granted = granted_accesses().unwrap();
        let has = |verb: &str, group: &str, resource: &str| {
            granted.contains(&Access::new(verb, group, resource, None))
        };
        assert!(has(
            "create",
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations"
        ));
        assert!(has(
            "watch",
            "operator.marin3r.3scale.net",
            "discoveryservices"
        ));
        assert!(has("patch", "", "namespaces"));
        assert!(!has("delete", "", "namespaces"));
    }

    #[test]
    fn an_injector_is_a_webhook_on_pod_creation() {
        let webhook = |resources: &[&str], operations: &[&str]| -> MutatingWebhook {
            serde_json::from_value(serde_json::json!({
                "name": "w.example.com",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "clientConfig": {"url": "https://example.com"},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                           "resources": resources, "operations": operations}],
            }))
            .unwrap()
        };
        assert!(mutates_pods(&webhook(&["pods"], &["CREATE"])));
        assert!(mutates_pods(&webhook(&["*"], &["*"])));
        assert!(!mutates_pods(&webhook(&["pods"], &["UPDATE"])));
        assert!(!mutates_pods(&webhook(&["services"], &["CREATE"])));
    }
}
