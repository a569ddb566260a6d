//! The checks of what one DiscoveryService serves: its webhook configurations (CA bundle,
//! ready pods behind the Service) and, in each namespace it serves, the client certificate and
//! the bootstrap.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use time::OffsetDateTime;

use super::{Report, said};
use marin3r_api::discovery_service::{DISCOVERY_SERVICE_LABEL, DiscoveryService};
use marin3r_operator::build;
use marin3r_webhook::config::{DEFAULT_BOOTSTRAP_CONFIG_MAP, DEFAULT_CLIENT_CERTIFICATE};

/// The namespaces `ds` serves, which `marin3r check` looks at: those its status says the
/// operator enabled; for one in the operator's namespace, the namespaces `labelled` with its
/// name too (so a label the operator has not acted on yet shows); for one elsewhere, its own
/// namespace, the one it may serve. The label names a DiscoveryService of the operator's
/// namespace only: another namespace's of the same name serves none of those.
fn served_namespaces(
    ds: &DiscoveryService,
    operator_ns: &str,
    labelled: Vec<String>,
) -> Vec<String> {
    let ns = ds.namespace().unwrap_or_default();
    let mut served: Vec<String> = ds
        .status
        .as_ref()
        .map(|s| s.enabled_namespaces.clone())
        .unwrap_or_default();
    if ns == operator_ns {
        served.extend(labelled);
    } else {
        served.push(ns);
    }
    served.sort();
    served.dedup();
    served
}

/// A webhook: its configuration and name, its caBundle, its Service (namespace, name).
type Hook = (String, Option<Vec<u8>>, Option<(String, String)>);

pub(super) async fn check_webhooks(
    client: &kube::Client,
    ds: &DiscoveryService,
    ca: &str,
    report: &mut Report,
) {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let params = ListParams::default().labels(&build::owner_selector(&name, &ns));
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut hooks: Vec<Hook> = Vec::new();
    let service = |s: &Option<k8s_openapi::api::admissionregistration::v1::ServiceReference>| {
        s.as_ref().map(|s| (s.namespace.clone(), s.name.clone()))
    };
    match (mutating.list(&params).await, validating.list(&params).await) {
        (Ok(m), Ok(v)) => {
            for c in &m.items {
                for w in c.webhooks.iter().flatten() {
                    let bundle = w.client_config.ca_bundle.as_ref().map(|b| b.0.clone());
                    hooks.push((
                        format!("{} ({})", c.name_any(), w.name),
                        bundle,
                        service(&w.client_config.service),
                    ));
                }
            }
            for c in &v.items {
                for w in c.webhooks.iter().flatten() {
                    let bundle = w.client_config.ca_bundle.as_ref().map(|b| b.0.clone());
                    hooks.push((
                        format!("{} ({})", c.name_any(), w.name),
                        bundle,
                        service(&w.client_config.service),
                    ));
                }
            }
        }
        (Err(e), _) | (_, Err(e)) => {
            report.fail(
                format!("webhooks of {ns}/{name}"),
                format!("cannot list them: {}", said(&e)),
                "check your RBAC",
            );
            return;
        }
    }
    if hooks.is_empty() {
        report.fail(
            format!("webhooks of {ns}/{name}"),
            "no webhook configuration: pods are not injected",
            "check that the operator runs (above)",
        );
    }
    let fix = "the operator rewrites it: check its logs, or delete the webhook configuration for it to be created again".to_owned();
    for (hook, bundle, svc) in hooks {
        let check = format!("webhook {hook}");
        if bundle.as_deref() != Some(ca.as_bytes()) {
            report.fail(
                check,
                format!("its caBundle is not the CA of {ns}/{name}: the API server cannot call it"),
                fix.clone(),
            );
            continue;
        }
        let Some((sns, sname)) = svc else {
            report.fail(check, "it names no Service", fix.clone());
            continue;
        };
        let ready = ready_backends(client, &sns, &sname).await;
        match ready {
            Ok(0) => report.fail(check, format!("Service {sns}/{sname} has no ready pod: pod creation in served namespaces fails"), format!("the discovery pods of {ns}/{name} are down (above)")),
            Ok(n) => report.pass(check, format!("trusts the CA; {n} ready pod(s) behind {sns}/{sname}")),
            Err(e) => report.fail(check, format!("cannot read the pods behind {sns}/{sname}: {}", crate::cli::error_line(&e)), "check your RBAC"),
        }
    }
}

/// How many ready pods the Service `ns/name` selects (what its endpoints are made of).
async fn ready_backends(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<usize> {
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let service = services.get(name).await?;
    let selector = service.spec.and_then(|s| s.selector).unwrap_or_default();
    if selector.is_empty() {
        return Ok(0);
    }
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&labels.join(",")))
        .await?;
    let ready = |p: &Pod| {
        let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
        p.metadata.deletion_timestamp.is_none()
            && conditions
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    };
    Ok(list.items.iter().filter(|p| ready(p)).count())
}

/// Each namespace the discovery service serves has its client certificate, valid and signed
/// by the CA, and its bootstrap.
pub(super) async fn check_namespaces(
    client: &kube::Client,
    ds: &DiscoveryService,
    operator_ns: &str,
    ca: &str,
    report: &mut Report,
) {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let labelled = if ns == operator_ns {
        labelled_namespaces(client, &name).await
    } else {
        Vec::new()
    };
    let served = served_namespaces(ds, operator_ns, labelled);
    let now = OffsetDateTime::now_utc();
    let served_by = (ns.as_str(), name.as_str());
    for served_ns in served {
        check_namespace(client, served_by, &served_ns, ca, now, report).await;
    }
}

/// The namespaces labelled for the DiscoveryService `name` of the operator's namespace.
async fn labelled_namespaces(client: &kube::Client, name: &str) -> Vec<String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let params = ListParams::default().labels(&format!("{DISCOVERY_SERVICE_LABEL}={name}"));
    // A namespace admin may not list Namespaces: those of the status then.
    namespaces
        .list(&params)
        .await
        .ok()
        .map(|l| l.items.iter().map(ResourceExt::name_any).collect())
        .unwrap_or_default()
}

/// One namespace the DiscoveryService `ns/name` serves: its client certificate is there,
/// signed by `ca` and valid `now`, and so is the bootstrap.
async fn check_namespace(
    client: &kube::Client,
    (ns, name): (&str, &str),
    served_ns: &str,
    ca: &str,
    now: OffsetDateTime,
    report: &mut Report,
) {
    let check = format!("namespace {served_ns}");
    let fix = format!(
        "the operator issues them for namespaces labelled {DISCOVERY_SERVICE_LABEL}={name}: check its logs"
    );
    let Some(cert) = client_certificate(client, served_ns, &check, &fix, report).await else {
        return;
    };
    // During a CA rotation the bundle holds two CAs; either may have signed it.
    let signed = ca
        .split_inclusive("-----END CERTIFICATE-----")
        .filter(|block| block.contains("-----BEGIN CERTIFICATE-----"))
        .any(|block| marin3r_certs::verify_signed_by(&cert, block).is_ok());
    if !signed {
        report.fail(&check, format!("the client certificate is not signed by the CA of {ns}/{name}: Envoy's TLS handshake fails"), fix);
        return;
    }
    if let Err(e) = marin3r_certs::check_validity(&cert, now) {
        report.fail(
            &check,
            format!(
                "the client certificate is not valid now: {}",
                marin3r_controller::chain(&e)
            ),
            fix,
        );
        return;
    }
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), served_ns);
    match maps.get_opt(DEFAULT_BOOTSTRAP_CONFIG_MAP).await {
        Ok(Some(_)) => report.pass(
            check,
            "client certificate valid and signed by the CA; bootstrap present",
        ),
        Ok(None) => report.fail(
            check,
            format!("no bootstrap ConfigMap {DEFAULT_BOOTSTRAP_CONFIG_MAP}"),
            fix,
        ),
        Err(e) => report.fail(
            check,
            format!(
                "cannot read ConfigMap {DEFAULT_BOOTSTRAP_CONFIG_MAP}: {}",
                said(&e)
            ),
            "check your RBAC",
        ),
    }
}

/// The client certificate (`tls.crt`) of `served_ns`; else its absence is reported.
async fn client_certificate(
    client: &kube::Client,
    served_ns: &str,
    check: &str,
    fix: &str,
    report: &mut Report,
) -> Option<String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), served_ns);
    let cert = match secrets.get_opt(DEFAULT_CLIENT_CERTIFICATE).await {
        Ok(Some(s)) => s
            .data
            .unwrap_or_default()
            .get("tls.crt")
            .map(|b| String::from_utf8_lossy(&b.0).into_owned()),
        Ok(None) => {
            report.fail(check, format!("no client certificate Secret {DEFAULT_CLIENT_CERTIFICATE}: injected sidecars cannot start"), fix);
            return None;
        }
        Err(e) => {
            report.fail(
                check,
                format!(
                    "cannot read Secret {DEFAULT_CLIENT_CERTIFICATE}: {}",
                    said(&e)
                ),
                "check your RBAC",
            );
            return None;
        }
    };
    if cert.is_none() {
        report.fail(
            check,
            format!("Secret {DEFAULT_CLIENT_CERTIFICATE} has no tls.crt"),
            fix,
        );
    }
    cert
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(namespace: &str, enabled: &[&str]) -> DiscoveryService {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.marin3r.3scale.net/v1alpha1",
            "kind": "DiscoveryService",
            "metadata": {"name": "instance", "namespace": namespace},
            "spec": {},
            "status": {"enabledNamespaces": enabled},
        }))
        .unwrap()
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_discovery_service_of_its_own_namespace_has_that_namespace_checked() {
        // No namespace carries the label for it: its own is checked all the same.
        let own = ds("team-a", &["team-a"]);
        assert_eq!(
            served_namespaces(&own, "marin3r-system", vec![]),
            ["team-a"]
        );
        // Before the operator wrote its status.
        let new = ds("team-a", &[]);
        assert_eq!(
            served_namespaces(&new, "marin3r-system", vec![]),
            ["team-a"]
        );
    }

    #[test]
    fn the_label_names_the_operator_namespaces_discovery_service_only() {
        // `demo` is labelled `instance` for marin3r-system/instance: team-a/instance, of the
        // same name, does not serve it.
        let own = ds("team-a", &["team-a"]);
        assert_eq!(
            served_namespaces(&own, "marin3r-system", names(&["demo"])),
            ["team-a"]
        );
        let trusted = ds("marin3r-system", &["listed"]);
        assert_eq!(
            served_namespaces(&trusted, "marin3r-system", names(&["demo", "listed"])),
            ["demo", "listed"]
        );
    }
}
