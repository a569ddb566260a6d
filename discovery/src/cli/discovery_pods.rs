//! Finding the discovery pods to ask (`proxy-status`, `proxy-config`, `version`): by their
//! labels, of one DiscoveryService, and when several run in a cluster (one per namespace), of
//! the one serving a namespace.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use marin3r_api::discovery_service::DiscoveryService;

/// The labels every discovery pod carries (the operator's Deployment template).
pub(super) const DISCOVERY_POD_SELECTOR: &str =
    "app.kubernetes.io/name=marin3r,app.kubernetes.io/component=discovery-service";

/// The discovery pods to ask: `--pod`, or every running pod of `--discovery-service`, or of
/// the only discovery service there is, or, when several run, of the one serving
/// `namespace` ([`serving`]).
pub(super) async fn find_pods(
    client: &kube::Client,
    discovery_service: Option<&str>,
    pod: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    if let Some(pod) = pod {
        let (ns, name) = pod
            .split_once('/')
            .with_context(|| format!("--pod {pod:?} must be NAMESPACE/NAME"))?;
        return Ok(vec![(ns.to_owned(), name.to_owned())]);
    }
    let (selector, running) = running_pods(client, discovery_service).await?;
    one_instance(client, &selector, running, namespace).await
}

/// A running discovery pod: (namespace, its DiscoveryService's name, pod name).
pub(super) type RunningPod = (String, String, String);

/// Every running pod of `--discovery-service`, or of every discovery service when it is not
/// given, with the label selector that found them.
pub(super) async fn running_pods(
    client: &kube::Client,
    discovery_service: Option<&str>,
) -> anyhow::Result<(String, Vec<RunningPod>)> {
    let mut selector = DISCOVERY_POD_SELECTOR.to_owned();
    let api: Api<Pod> = match discovery_service.map(|d| d.split_once('/')) {
        Some(Some((ns, name))) => {
            selector.push_str(&format!(",app.kubernetes.io/instance={name}"));
            Api::namespaced(client.clone(), ns)
        }
        Some(None) => {
            let name = discovery_service.unwrap_or_default();
            selector.push_str(&format!(",app.kubernetes.io/instance={name}"));
            Api::all(client.clone())
        }
        None => Api::all(client.clone()),
    };
    let pods = api
        .list(&ListParams::default().labels(&selector))
        .await
        .context("listing the discovery pods")?;
    let running = pods
        .items
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .map(|p| {
            let instance = p.labels().get("app.kubernetes.io/instance").cloned();
            (
                p.namespace().unwrap_or_default(),
                instance.unwrap_or_default(),
                p.name_any(),
            )
        })
        .collect();
    Ok((selector, running))
}

/// The (namespace, pod) of `running` that belong to one discovery service: the only one, or,
/// when several run, the one serving `namespace` ([`serving`]); an error naming them when
/// none is found or none can be chosen.
pub(super) async fn one_instance(
    client: &kube::Client,
    selector: &str,
    running: Vec<RunningPod>,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<(String, String)>> {
    let instances: BTreeSet<String> = running
        .iter()
        .map(|(ns, instance, _)| format!("{ns}/{instance}"))
        .collect();
    let chosen = match (instances.len(), namespace) {
        (0, _) => bail!(
            "no running discovery pod found (labels {selector}); name one with --discovery-service or --pod"
        ),
        (1, _) => instances.first().cloned(),
        (_, Some(ns)) => {
            let enabled = enabled_namespaces(client, &instances).await;
            serving(&instances, ns, &enabled)
        }
        (_, None) => None,
    };
    let Some(chosen) = chosen else {
        bail!(
            "several discovery services run ({}){}; choose one with --discovery-service NAMESPACE/NAME",
            instances.into_iter().collect::<Vec<_>>().join(", "),
            namespace
                .map(|ns| format!(", and not exactly one serves namespace {ns}"))
                .unwrap_or_default()
        )
    };
    Ok(running
        .into_iter()
        .filter(|(ns, instance, _)| format!("{ns}/{instance}") == chosen)
        .map(|(ns, _, pod)| (ns, pod))
        .collect())
}

/// The namespaces each of `instances` (`NAMESPACE/NAME`) enables, from its DiscoveryService's
/// status; an instance whose DiscoveryService cannot be read has none.
async fn enabled_namespaces(
    client: &kube::Client,
    instances: &BTreeSet<String>,
) -> BTreeMap<String, Vec<String>> {
    let mut enabled = BTreeMap::new();
    for instance in instances {
        let Some((ns, name)) = instance.split_once('/') else {
            continue;
        };
        let api: Api<DiscoveryService> = Api::namespaced(client.clone(), ns);
        if let Ok(ds) = api.get(name).await {
            let namespaces = ds.status.map(|s| s.enabled_namespaces).unwrap_or_default();
            enabled.insert(instance.clone(), namespaces);
        }
    }
    enabled
}

/// Of several discovery services (`NAMESPACE/NAME`), the one that serves proxies of
/// `namespace`: the one in that namespace (a DiscoveryService of an application namespace
/// serves its own), or the one whose status enables it (`enabled`); none when not exactly one
/// does. One namespace has one discovery service, so with several in a cluster, each in its
/// own namespace, a proxy's namespace names its own.
pub fn serving(
    instances: &BTreeSet<String>,
    namespace: &str,
    enabled: &BTreeMap<String, Vec<String>>,
) -> Option<String> {
    let serves = |instance: &String| {
        instance.split_once('/').map(|(ns, _)| ns) == Some(namespace)
            || enabled
                .get(instance)
                .is_some_and(|e| e.iter().any(|n| n == namespace))
    };
    let mut found = instances.iter().filter(|i| serves(i));
    match (found.next(), found.next()) {
        (Some(one), None) => Some(one.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    #[test]
    fn of_several_discovery_services_the_one_serving_the_namespace_is_chosen() {
        let instances: BTreeSet<String> = [
            "team-a/instance",
            "team-b/instance",
            "marin3r-system/instance",
        ]
        .map(String::from)
        .into();
        let enabled = BTreeMap::from([
            (
                "marin3r-system/instance".to_owned(),
                vec!["shop".to_owned()],
            ),
            ("team-a/instance".to_owned(), vec!["team-a".to_owned()]),
        ]);
        // Its own namespace's, whether or not its status lists it.
        for ns in ["team-a", "team-b"] {
            assert_eq!(
                serving(&instances, ns, &enabled),
                Some(format!("{ns}/instance"))
            );
        }
        // A namespace the operator's instance enables.
        assert_eq!(
            serving(&instances, "shop", &enabled).as_deref(),
            Some("marin3r-system/instance")
        );
        // None serves it, or two claim it: no choice.
        assert_eq!(serving(&instances, "elsewhere", &enabled), None);
        let both = BTreeMap::from([(
            "marin3r-system/instance".to_owned(),
            vec!["team-a".to_owned()],
        )]);
        assert_eq!(serving(&instances, "team-a", &both), None);
    }
}
