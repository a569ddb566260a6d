//! Which namespaces a `DiscoveryService` serves, and the label changes that get each
//! Namespace there: enabled when listed in `spec.enabledNamespaces` or labelled
//! `marin3r.3scale.net/discovery-service=<name>` by a user. Pure: the controller applies it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::build::{LABELLED_BY_ANNOTATION, Scope};
use marin3r_api::discovery_service::{DISCOVERY_SERVICE_LABEL, DiscoveryService, STATUS_LABEL};

/// The decisions for one reconcile.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    /// Served namespaces, sorted.
    pub enabled: Vec<String>,
    /// Listed in the spec but not in the cluster (or being deleted).
    pub missing: Vec<String>,
    /// Namespaces no longer served whose client certificate and bootstrap must go.
    pub leaving: Vec<String>,
    /// Merge patches to Namespaces, by name (adding or removing labels).
    pub patches: BTreeMap<String, Value>,
}

/// `listed`: `spec.enabledNamespaces`; `served`: the namespaces that have a client
/// certificate of this discovery service now; `owner`: `<namespace>/<name>` of it.
pub fn plan(
    name: &str,
    owner: &str,
    listed: &[String],
    namespaces: &[Namespace],
    served: &BTreeSet<String>,
) -> Plan {
    let by_name: BTreeMap<String, &Namespace> =
        namespaces.iter().map(|ns| (ns.name_any(), ns)).collect();
    let labelled_by_us = |ns: &Namespace| {
        ns.annotations()
            .get(LABELLED_BY_ANNOTATION)
            .map(String::as_str)
            == Some(owner)
    };
    let live = |ns: &Namespace| ns.metadata.deletion_timestamp.is_none();

    let mut enabled = BTreeSet::new();
    let mut missing = Vec::new();
    for ns in listed {
        match by_name.get(ns).filter(|n| live(n)) {
            Some(_) => {
                enabled.insert(ns.clone());
            }
            None => missing.push(ns.clone()),
        }
    }
    for (ns_name, ns) in &by_name {
        let labelled = ns.labels().get(DISCOVERY_SERVICE_LABEL).map(String::as_str) == Some(name);
        // A label the operator set, for a listing that is gone or for a namesake in another
        // namespace, does not enable by itself: only a user's label does.
        let labelled_by_operator = ns.annotations().contains_key(LABELLED_BY_ANNOTATION);
        if labelled && !labelled_by_operator && live(ns) {
            enabled.insert(ns_name.clone());
        }
    }

    let mut patches = BTreeMap::new();
    for ns_name in &enabled {
        let Some(ns) = by_name.get(ns_name) else {
            continue;
        };
        let listed = listed.contains(ns_name);
        if let Some(p) = enable_patch(name, owner, ns, labelled_by_us(ns) && !listed) {
            patches.insert(ns_name.clone(), p);
        }
    }

    let mut leaving: BTreeSet<String> = served.difference(&enabled).cloned().collect();
    for (ns_name, ns) in &by_name {
        if labelled_by_us(ns) && !enabled.contains(ns_name) {
            leaving.insert(ns_name.clone());
        }
    }
    for ns_name in &leaving {
        if let Some(p) = by_name
            .get(ns_name)
            .and_then(|ns| leave_patch(name, owner, ns))
        {
            patches.insert(ns_name.clone(), p);
        }
    }

    Plan {
        enabled: enabled.into_iter().collect(),
        missing,
        leaving: leaving.into_iter().collect(),
        patches,
    }
}

/// Whether a change to the Namespace `ns` may change what `ds` (of `scope`) serves, so a
/// Namespace event reconciles only the discovery services it concerns rather than every one.
/// A namespace-scoped one is concerned by its own namespace only; a
/// cluster-scoped one by a namespace it lists, one labelled for it (by a user, or by the
/// operator on its behalf), or one it serves now, which may have to leave.
pub fn concerns(ds: &DiscoveryService, scope: Scope, ns: &Namespace) -> bool {
    let ds_ns = ds.namespace().unwrap_or_default();
    let ns_name = ns.name_any();
    if scope == Scope::Namespace {
        return ns_name == ds_ns;
    }
    let name = ds.name_any();
    let listed = ds
        .spec
        .enabled_namespaces
        .iter()
        .flatten()
        .any(|n| *n == ns_name);
    let labelled = ns.labels().get(DISCOVERY_SERVICE_LABEL) == Some(&name);
    let owner = format!("{ds_ns}/{name}");
    let labelled_by_operator = ns.annotations().get(LABELLED_BY_ANNOTATION) == Some(&owner);
    let served = ds
        .status
        .iter()
        .flat_map(|s| &s.enabled_namespaces)
        .any(|n| *n == ns_name);
    listed || labelled || labelled_by_operator || served
}

/// The labels an enabled namespace must carry; `disowned`: the operator labelled it for a
/// listing that went away, and a user's label now stands for it, so the label is theirs.
fn enable_patch(name: &str, owner: &str, ns: &Namespace, disowned: bool) -> Option<Value> {
    let labels = ns.labels();
    let mut label_patch = serde_json::Map::new();
    let mut annotation_patch = serde_json::Map::new();
    if labels.get(STATUS_LABEL).map(String::as_str) != Some("enabled") {
        label_patch.insert(STATUS_LABEL.into(), "enabled".into());
    }
    if labels.get(DISCOVERY_SERVICE_LABEL).map(String::as_str) != Some(name) {
        label_patch.insert(DISCOVERY_SERVICE_LABEL.into(), name.into());
        annotation_patch.insert(LABELLED_BY_ANNOTATION.into(), owner.into());
    } else if disowned {
        annotation_patch.insert(LABELLED_BY_ANNOTATION.into(), Value::Null);
    }
    metadata_patch(label_patch, annotation_patch)
}

/// A discovery service that serves its own namespace `own` only: `own` while it exists and
/// is not being deleted. No Namespace is labelled (its webhook selects `own` by name); what
/// the operator labelled for it before (in a trusted namespace) is unlabelled, and every
/// other namespace it served leaves.
pub fn plan_own(
    name: &str,
    owner: &str,
    own: &str,
    namespaces: &[Namespace],
    served: &BTreeSet<String>,
) -> Plan {
    let enabled: Vec<String> = namespaces
        .iter()
        .filter(|ns| ns.name_any() == own && ns.metadata.deletion_timestamp.is_none())
        .map(ResourceExt::name_any)
        .collect();
    let mut leaving: BTreeSet<String> = served
        .iter()
        .filter(|ns| !enabled.contains(ns))
        .cloned()
        .collect();
    let mut patches = BTreeMap::new();
    for ns in namespaces {
        let ns_name = ns.name_any();
        let ours = ns
            .annotations()
            .get(LABELLED_BY_ANNOTATION)
            .map(String::as_str)
            == Some(owner);
        if ours && !enabled.contains(&ns_name) {
            leaving.insert(ns_name.clone());
        }
        if (ours || leaving.contains(&ns_name))
            && let Some(p) = leave_patch(name, owner, ns)
        {
            patches.insert(ns_name, p);
        }
    }
    Plan {
        enabled,
        missing: Vec::new(),
        leaving: leaving.into_iter().collect(),
        patches,
    }
}

/// The labels and annotations to remove from a namespace that is no longer served (also
/// every served namespace when the discovery service is deleted).
pub fn leave_patch(name: &str, owner: &str, ns: &Namespace) -> Option<Value> {
    let labels = ns.labels();
    let ds_label = labels.get(DISCOVERY_SERVICE_LABEL).map(String::as_str);
    let ours = ns
        .annotations()
        .get(LABELLED_BY_ANNOTATION)
        .map(String::as_str)
        == Some(owner);
    let mut label_patch = serde_json::Map::new();
    let mut annotation_patch = serde_json::Map::new();
    // The status label is shared by every discovery service: leave it to another one.
    if labels.contains_key(STATUS_LABEL) && (ds_label.is_none() || ds_label == Some(name)) {
        label_patch.insert(STATUS_LABEL.into(), Value::Null);
    }
    if ours {
        if ds_label == Some(name) {
            label_patch.insert(DISCOVERY_SERVICE_LABEL.into(), Value::Null);
        }
        annotation_patch.insert(LABELLED_BY_ANNOTATION.into(), Value::Null);
    }
    metadata_patch(label_patch, annotation_patch)
}

fn metadata_patch(
    labels: serde_json::Map<String, Value>,
    annotations: serde_json::Map<String, Value>,
) -> Option<Value> {
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut meta = serde_json::Map::new();
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Some(json!({ "metadata": meta }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "marin3r/ds";

    fn ns(name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Namespace {
        let mut n = Namespace::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        n.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        n
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The discovery service `marin3r/ds`, listing `listed` and serving `serving`.
    fn mk_ds(listed: &[&str], serving: &[&str]) -> DiscoveryService {
        let mut ds = DiscoveryService::new("ds", Default::default());
        ds.metadata.namespace = Some("marin3r".into());
        ds.spec.enabled_namespaces = Some(listed.iter().map(|n| (*n).to_owned()).collect());
        ds.status = Some(marin3r_api::discovery_service::DiscoveryServiceStatus {
            enabled_namespaces: serving.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        });
        ds
    }

    #[test]
    fn a_namespace_event_concerns_only_the_discovery_services_it_may_change() {
        let ds = mk_ds(&["listed"], &["served"]);
        let cluster = |n: &Namespace| concerns(&ds, Scope::Cluster, n);
        assert!(cluster(&ns("listed", &[], &[])));
        assert!(cluster(&ns(
            "user",
            &[(DISCOVERY_SERVICE_LABEL, "ds")],
            &[]
        )));
        // Served until a moment ago: unlabelled, it must leave.
        assert!(cluster(&ns("served", &[], &[])));
        // The operator's label was removed by hand, its mark stays.
        assert!(cluster(&ns(
            "marked",
            &[],
            &[(LABELLED_BY_ANNOTATION, OWNER)]
        )));
        // Another discovery service's namespaces, and unrelated ones, are none of its business.
        assert!(!cluster(&ns(
            "other",
            &[(DISCOVERY_SERVICE_LABEL, "ds2")],
            &[]
        )));
        assert!(!cluster(&ns("plain", &[], &[])));
        assert!(!cluster(&ns("marin3r", &[], &[])));
        let theirs = ns("theirs", &[], &[(LABELLED_BY_ANNOTATION, "elsewhere/ds")]);
        assert!(!cluster(&theirs));

        // A namespace-scoped one: its own namespace only, whatever the others say.
        let mut own = mk_ds(&[], &["team-a"]);
        own.metadata.namespace = Some("team-a".into());
        let namespaced = |n: &Namespace| concerns(&own, Scope::Namespace, n);
        assert!(namespaced(&ns("team-a", &[], &[])));
        assert!(!namespaced(&ns(
            "team-b",
            &[(DISCOVERY_SERVICE_LABEL, "ds")],
            &[]
        )));
        assert!(!namespaced(&ns("listed", &[], &[])));
    }

    #[test]
    fn listed_namespaces_are_labelled_and_marked_as_ours() {
        let p = plan(
            "ds",
            OWNER,
            &["a".into(), "gone".into()],
            &[ns("a", &[], &[])],
            &set(&[]),
        );
        assert_eq!(p.enabled, vec!["a"]);
        assert_eq!(p.missing, vec!["gone"]);
        assert_eq!(
            p.patches["a"],
            json!({"metadata": {
                "labels": {STATUS_LABEL: "enabled", DISCOVERY_SERVICE_LABEL: "ds"},
                "annotations": {LABELLED_BY_ANNOTATION: OWNER},
            }})
        );
    }

    #[test]
    fn a_user_label_enables_and_only_the_status_label_is_added() {
        let p = plan(
            "ds",
            OWNER,
            &[],
            &[ns("b", &[(DISCOVERY_SERVICE_LABEL, "ds")], &[])],
            &set(&[]),
        );
        assert_eq!(p.enabled, vec!["b"]);
        assert_eq!(
            p.patches["b"],
            json!({"metadata": {"labels": {STATUS_LABEL: "enabled"}}})
        );
        // Another discovery service's label does not enable.
        let p = plan(
            "ds",
            OWNER,
            &[],
            &[ns("c", &[(DISCOVERY_SERVICE_LABEL, "other")], &[])],
            &set(&[]),
        );
        assert!(p.enabled.is_empty() && p.patches.is_empty());
    }

    #[test]
    fn an_enabled_namespace_in_shape_needs_no_patch() {
        let labels = [(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")];
        let p = plan("ds", OWNER, &[], &[ns("b", &labels, &[])], &set(&["b"]));
        assert!(p.patches.is_empty() && p.leaving.is_empty());
        let listed = plan(
            "ds",
            OWNER,
            &["b".into()],
            &[ns("b", &labels, &[(LABELLED_BY_ANNOTATION, OWNER)])],
            &set(&["b"]),
        );
        assert!(listed.patches.is_empty());
    }

    #[test]
    fn unlisting_removes_what_the_operator_added() {
        let labels = [(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")];
        let a = ns("a", &labels, &[(LABELLED_BY_ANNOTATION, OWNER)]);
        let p = plan("ds", OWNER, &[], &[a], &set(&["a"]));
        assert!(p.enabled.is_empty());
        assert_eq!(p.leaving, vec!["a"]);
        assert_eq!(
            p.patches["a"],
            json!({"metadata": {
                "labels": {STATUS_LABEL: null, DISCOVERY_SERVICE_LABEL: null},
                "annotations": {LABELLED_BY_ANNOTATION: null},
            }})
        );
    }

    #[test]
    fn a_user_removing_their_label_leaves_and_loses_the_status_label() {
        let b = ns("b", &[(STATUS_LABEL, "enabled")], &[]);
        let p = plan("ds", OWNER, &[], &[b], &set(&["b"]));
        assert_eq!(p.leaving, vec!["b"]);
        assert_eq!(
            p.patches["b"],
            json!({"metadata": {"labels": {STATUS_LABEL: null}}})
        );
        // Moved to another discovery service: its status label is not ours to remove.
        let c = ns(
            "c",
            &[
                (STATUS_LABEL, "enabled"),
                (DISCOVERY_SERVICE_LABEL, "other"),
            ],
            &[],
        );
        let p = plan("ds", OWNER, &[], &[c], &set(&["c"]));
        assert_eq!(p.leaving, vec!["c"]);
        assert!(p.patches.is_empty());
    }

    #[test]
    fn a_label_the_operator_set_for_a_namesake_elsewhere_does_not_enable() {
        let labels = [(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")];
        let a = ns("a", &labels, &[(LABELLED_BY_ANNOTATION, "other-ns/ds")]);
        let p = plan("ds", OWNER, &[], &[a], &set(&[]));
        assert!(p.enabled.is_empty() && p.patches.is_empty() && p.leaving.is_empty());
    }

    #[test]
    fn its_own_namespace_only_unlabelled_and_everything_else_leaves() {
        // Served before from a trusted namespace: "mine" listed (labelled by us), "b"
        // labelled by a user, "c" another namespace that is no longer served.
        let labels = [(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")];
        let nss = [
            ns("mine", &labels, &[(LABELLED_BY_ANNOTATION, OWNER)]),
            ns("b", &labels, &[]),
            ns("c", &[], &[]),
        ];
        let p = plan_own("ds", OWNER, "mine", &nss, &set(&["mine", "b"]));
        assert_eq!(p.enabled, vec!["mine"]);
        assert_eq!(p.leaving, vec!["b"]);
        assert_eq!(
            p.patches["mine"],
            json!({"metadata": {
                "labels": {STATUS_LABEL: null, DISCOVERY_SERVICE_LABEL: null},
                "annotations": {LABELLED_BY_ANNOTATION: null},
            }})
        );
        assert_eq!(
            p.patches["b"],
            json!({"metadata": {"labels": {STATUS_LABEL: null}}})
        );
        assert!(!p.patches.contains_key("c"));
        // Its namespace being deleted: nothing is served.
        let mut gone = ns("mine", &[], &[]);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let p = plan_own("ds", OWNER, "mine", &[gone], &set(&["mine"]));
        assert!(p.enabled.is_empty());
        assert_eq!(p.leaving, vec!["mine"]);
    }

    #[test]
    fn terminating_namespaces_are_not_enabled() {
        let mut a = ns("a", &[(DISCOVERY_SERVICE_LABEL, "ds")], &[]);
        a.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let p = plan("ds", OWNER, &["a".into()], &[a], &set(&["a"]));
        assert!(p.enabled.is_empty());
        assert_eq!(p.missing, vec!["a"]);
        assert_eq!(p.leaving, vec!["a"]);
    }

    #[test]
    fn release_strips_every_mark() {
        let a = ns(
            "a",
            &[(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")],
            &[(LABELLED_BY_ANNOTATION, OWNER)],
        );
        let patch = leave_patch("ds", OWNER, &a).unwrap();
        assert_eq!(
            patch["metadata"]["labels"][DISCOVERY_SERVICE_LABEL],
            Value::Null
        );
        let user = ns(
            "b",
            &[(STATUS_LABEL, "enabled"), (DISCOVERY_SERVICE_LABEL, "ds")],
            &[],
        );
        let patch = leave_patch("ds", OWNER, &user).unwrap();
        assert_eq!(patch, json!({"metadata": {"labels": {STATUS_LABEL: null}}}));
    }
}
