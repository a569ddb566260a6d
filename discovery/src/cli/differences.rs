//! What `marin3r validate` says about the documents it does not validate (pods, workloads,
//! DiscoveryServices and their certificates) where marin3r deliberately differs from the
//! original MARIN3R: the same words as docs/migrating.md and the webhook's admission
//! warnings, so a manifest written for the original is read with the difference in view.

use marin3r_webhook::annotations::{DISCOVERY_SERVICE_NAME, NATIVE_SIDECAR, STATUS_LABEL};
use marin3r_webhook::{InjectionConfig, inject_json};
use serde_json::Value;

/// Where each kind that runs pods keeps its pod template.
const POD_TEMPLATES: [(&str, &str); 8] = [
    ("Pod", ""),
    ("Deployment", "/spec/template"),
    ("StatefulSet", "/spec/template"),
    ("DaemonSet", "/spec/template"),
    ("ReplicaSet", "/spec/template"),
    ("ReplicationController", "/spec/template"),
    ("Job", "/spec/template"),
    ("CronJob", "/spec/jobTemplate/spec/template"),
];

/// The notes for one document of `kind`.
pub fn notes(kind: &str, doc: &Value) -> Vec<String> {
    if kind == "DiscoveryServiceCertificate" {
        return certificate_notes(doc);
    }
    if kind == "DiscoveryService" {
        return discovery_service_spec_notes(doc);
    }
    match POD_TEMPLATES.iter().find(|(k, _)| *k == kind) {
        Some((_, pointer)) => doc.pointer(pointer).map(pod_notes).unwrap_or_default(),
        None => Vec::new(),
    }
}

/// The default placement of the discovery pods, narrower in the original.
fn discovery_service_spec_notes(doc: &Value) -> Vec<String> {
    if !doc["spec"]["affinity"].is_null() {
        return Vec::new();
    }
    vec![
        "spec.affinity unset: the discovery pods go to Linux nodes of any architecture; the \
         original also required amd64 or arm64"
            .into(),
    ]
}

/// The v0.6 renewal switch, honoured with one difference.
fn certificate_notes(doc: &Value) -> Vec<String> {
    let spec = &doc["spec"];
    let switched_off = spec["certificateRenewalNotification"]["enabled"] == false;
    if !switched_off || !spec["certificateRenewal"].is_null() {
        return Vec::new();
    }
    vec![
        "certificateRenewalNotification.enabled: false turns renewal off, as in v0.6; unlike \
         v0.6, marin3r still reissues the certificate when its Secret is missing or broken or \
         its spec changes"
            .into(),
    ]
}

/// What the injection webhook says of a pod (or template) selected for injection, and where
/// its sidecar goes.
fn pod_notes(template: &Value) -> Vec<String> {
    let labels = &template["metadata"]["labels"];
    if labels[STATUS_LABEL] != "enabled" {
        return Vec::new();
    }
    let annotations = &template["metadata"]["annotations"];
    let mut pod = template.clone();
    pod["apiVersion"] = "v1".into();
    pod["kind"] = "Pod".into();
    let config = InjectionConfig {
        native_sidecars: true,
        ..InjectionConfig::default()
    };
    let mut notes = match inject_json(&mut pod, &config) {
        Ok((_, warnings)) => warnings,
        Err(denial) => vec![format!("the injection webhook denies it: {denial}")],
    };
    if annotations.get(NATIVE_SIDECAR).is_none() {
        notes.push(format!(
            "on Kubernetes 1.29 and newer Envoy is injected as a native sidecar (an init \
             container that always restarts), where the original appended it to the \
             containers; {NATIVE_SIDECAR}: \"false\" keeps the original's layout"
        ));
    }
    if let Some(name) = annotations
        .get(DISCOVERY_SERVICE_NAME)
        .and_then(Value::as_str)
    {
        notes.push(format!(
            "{DISCOVERY_SERVICE_NAME}={name:?}: a namespace has one DiscoveryService in \
             marin3r (the original let pods choose among several); the pod is denied unless \
             {name:?} is the one serving its namespace"
        ));
    }
    notes
}

/// Notes on the DiscoveryServices of a set of documents (`(index, namespace, name)` of
/// each): every one after the first of a namespace, by index.
pub fn discovery_service_notes(services: &[(usize, String, String)]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, (index, namespace, _)) in services.iter().enumerate() {
        if let Some((_, _, first)) = services[..i].iter().find(|(_, ns, _)| ns == namespace) {
            out.push((
                *index,
                format!(
                    "{first:?} is another DiscoveryService in namespace {namespace}: outside the \
                     operator's trusted namespaces a namespace has one, the oldest, and the \
                     others are refused (NamespaceAlreadyServed), where the original let pods \
                     choose with {DISCOVERY_SERVICE_NAME}"
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotations: Value) -> Value {
        json!({
            "metadata": {
                "name": "web",
                "labels": {"marin3r.3scale.net/status": "enabled"},
                "annotations": annotations,
            },
            "spec": {"containers": [{"name": "app", "image": "app"}]},
        })
    }

    #[test]
    fn a_pod_hears_of_the_native_layout_and_of_the_one_discovery_service() {
        let notes = notes(
            "Pod",
            &pod(json!({
                "marin3r.3scale.net/node-id": "web",
                "marin3r.3scale.net/discovery-service.name": "edge",
                "marin3r.3scale.net/init-manager.image": "init:1",
            })),
        );
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("init-manager.image"), "{notes:?}");
        assert!(notes[1].contains("native sidecar"), "{notes:?}");
        assert!(
            notes[2].contains("a namespace has one DiscoveryService"),
            "{notes:?}"
        );
        // Saying the layout leaves only what else there is.
        let classic = pod(json!({
            "marin3r.3scale.net/node-id": "web",
            "marin3r.3scale.net/native-sidecar": "false",
        }));
        assert!(super::notes("Pod", &classic).is_empty());
    }

    #[test]
    fn a_workloads_template_is_read_and_a_denial_is_said() {
        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": pod(json!({}))}}}});
        let notes = notes("CronJob", &cron);
        assert!(
            notes[0].starts_with(
                "the injection webhook denies it: marin3r.3scale.net/node-id: \"\": the \
                 annotation is required"
            ),
            "{notes:?}"
        );
        // Not selected for injection: nothing to say.
        let plain = json!({"spec": {"template": {"metadata": {}, "spec": {}}}});
        assert!(super::notes("Deployment", &plain).is_empty());
    }

    #[test]
    fn an_unset_affinity_is_noted() {
        assert!(notes("DiscoveryService", &json!({"spec": {}}))[0].contains("amd64 or arm64"));
        let set = json!({"spec": {"affinity": {"nodeAffinity": {}}}});
        assert!(notes("DiscoveryService", &set).is_empty());
    }

    #[test]
    fn the_v0_6_renewal_switch_is_noted_unless_certificate_renewal_decides() {
        let off = json!({"spec": {"certificateRenewalNotification": {"enabled": false}}});
        assert!(notes("DiscoveryServiceCertificate", &off)[0].contains("still reissues"));
        let both = json!({"spec": {
            "certificateRenewalNotification": {"enabled": false},
            "certificateRenewal": {"enabled": true},
        }});
        assert!(notes("DiscoveryServiceCertificate", &both).is_empty());
    }

    #[test]
    fn a_second_discovery_service_of_a_namespace_is_noted() {
        let services = [
            (1, "shop".to_owned(), "a".to_owned()),
            (2, "other".to_owned(), "b".to_owned()),
            (4, "shop".to_owned(), "c".to_owned()),
        ];
        let notes = discovery_service_notes(&services);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].0, 4);
        assert!(
            notes[0]
                .1
                .starts_with("\"a\" is another DiscoveryService in namespace shop")
        );
    }
}
