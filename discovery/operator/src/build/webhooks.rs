//! The injection and EnvoyConfig validation webhook configurations, and which namespaces
//! they select.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use marin3r_api::discovery_service::{DISCOVERY_SERVICE_LABEL, STATUS_LABEL};

use super::{
    Children, NAMESPACE_NAME_LABEL, Scope, VALIDATING_WEBHOOK_FAILURE_POLICY,
    VALIDATING_WEBHOOK_PATH, WEBHOOK_FAILURE_POLICY, WEBHOOK_PATH, WEBHOOK_TIMEOUT_SECONDS,
};

impl Children<'_> {
    /// The namespaces both webhooks see: those labelled for this discovery service, or, for a
    /// namespace-scoped one, its own namespace only.
    fn namespace_selector(&self) -> LabelSelector {
        let (key, value) = match self.scope {
            Scope::Cluster => (DISCOVERY_SERVICE_LABEL, &self.name),
            Scope::Namespace => (NAMESPACE_NAME_LABEL, &self.namespace),
        };
        LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_owned(), value.clone())])),
            ..Default::default()
        }
    }

    /// How the API server reaches a webhook `path` of the discovery pod: through the Service,
    /// trusting the CA.
    fn webhook_client(&self, ca_pem: &str, path: &str) -> WebhookClientConfig {
        WebhookClientConfig {
            ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
            service: Some(ServiceReference {
                name: self.spec.service_name.clone(),
                namespace: self.namespace.clone(),
                path: Some(path.into()),
                port: Some(443),
            }),
            url: None,
        }
    }

    /// The injection webhook: pods labelled `status=enabled`, created in a namespace labelled
    /// for this discovery service, are sent to the discovery pod.
    pub fn webhook_configuration(&self, ca_pem: &str) -> MutatingWebhookConfiguration {
        let selector = |key: &str, value: &str| LabelSelector {
            match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
            ..Default::default()
        };
        MutatingWebhookConfiguration {
            metadata: self.unowned_meta(&self.webhook_configuration_name(), None),
            webhooks: Some(vec![MutatingWebhook {
                name: format!(
                    "{}.{}.sidecar-injector.marin3r.3scale.net",
                    self.name, self.namespace
                ),
                admission_review_versions: vec!["v1".into()],
                client_config: self.webhook_client(ca_pem, WEBHOOK_PATH),
                failure_policy: Some(WEBHOOK_FAILURE_POLICY.into()),
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(self.namespace_selector()),
                object_selector: Some(selector(STATUS_LABEL, "enabled")),
                reinvocation_policy: Some("Never".into()),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into()]),
                    resources: Some(vec!["pods".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                side_effects: "None".into(),
                timeout_seconds: Some(WEBHOOK_TIMEOUT_SECONDS),
                ..Default::default()
            }]),
        }
    }

    /// The EnvoyConfig validation webhook: creates and updates of EnvoyConfigs in a namespace
    /// labelled for this discovery service are judged by the discovery pod, which refuses
    /// what it could not serve (what `marin3r validate` refuses, with the same field paths).
    pub fn validating_webhook_configuration(&self, ca_pem: &str) -> ValidatingWebhookConfiguration {
        ValidatingWebhookConfiguration {
            metadata: self.unowned_meta(&self.webhook_configuration_name(), None),
            webhooks: Some(vec![ValidatingWebhook {
                name: format!(
                    "{}.{}.envoyconfig-validator.marin3r.3scale.net",
                    self.name, self.namespace
                ),
                admission_review_versions: vec!["v1".into()],
                client_config: self.webhook_client(ca_pem, VALIDATING_WEBHOOK_PATH),
                failure_policy: Some(VALIDATING_WEBHOOK_FAILURE_POLICY.into()),
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(self.namespace_selector()),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec![marin3r_webhook::validate::GROUP.into()]),
                    api_versions: Some(vec!["v1alpha1".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["envoyconfigs".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                side_effects: "None".into(),
                timeout_seconds: Some(WEBHOOK_TIMEOUT_SECONDS),
                ..Default::default()
            }]),
        }
    }
}
