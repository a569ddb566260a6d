//! The certificates of a `DiscoveryService` (its CA, the server certificate, a client
//! certificate per served namespace) and the per-namespace sidecar bootstrap.

use k8s_openapi::api::core::v1::ConfigMap;
use marin3r_certs::api::{
    CaSigned, DiscoveryServiceCertificate, DiscoveryServiceCertificateSpec, SecretReference,
    SelfSigned, Signer,
};
use marin3r_webhook::config::{DEFAULT_BOOTSTRAP_CONFIG_MAP, DEFAULT_CLIENT_CERTIFICATE};

use marin3r_webhook::bootstrap::{BootstrapError, BootstrapOptions, render};

use super::{CLIENT_NAMESPACE_LABEL, Children, TRUST_DOMAIN};

impl Children<'_> {
    /// The self-signed CA that signs the server and every client certificate.
    pub fn ca_certificate(&self) -> DiscoveryServiceCertificate {
        let spec = DiscoveryServiceCertificateSpec {
            common_name: format!("marin3r-ca-{}", self.name),
            server: None,
            is_ca: Some(true),
            valid_for: Self::secs(self.spec.ca_duration),
            hosts: None,
            signer: Signer {
                self_signed: Some(SelfSigned {}),
                ca_signed: None,
            },
            secret_ref: SecretReference {
                name: self.spec.ca_secret.clone(),
                namespace: Some(self.namespace.clone()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let mut dsc = DiscoveryServiceCertificate::new(self.ca_name(), spec);
        dsc.metadata = self.owned_meta(self.ca_name());
        dsc
    }

    fn ca_signer(&self) -> Signer {
        Signer {
            self_signed: None,
            ca_signed: Some(CaSigned {
                ca_secret_ref: SecretReference {
                    name: self.spec.ca_secret.clone(),
                    namespace: Some(self.namespace.clone()),
                },
            }),
        }
    }

    /// The discovery pod's certificate for xDS and the webhook: every Service DNS form.
    pub fn server_certificate(&self) -> DiscoveryServiceCertificate {
        let hosts = self.server_hosts();
        let spec = DiscoveryServiceCertificateSpec {
            common_name: hosts[2].clone(),
            server: Some(true),
            is_ca: None,
            valid_for: Self::secs(self.spec.server_duration),
            hosts: Some(hosts),
            signer: self.ca_signer(),
            secret_ref: SecretReference {
                name: self.spec.server_secret.clone(),
                namespace: Some(self.namespace.clone()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let mut dsc = DiscoveryServiceCertificate::new(self.server_name(), spec);
        dsc.metadata = self.owned_meta(self.server_name());
        dsc
    }

    /// The sidecars' client certificate of one enabled namespace. The resource lives (owned)
    /// beside the CA; its Secret is written into the enabled namespace.
    pub fn client_certificate(&self, namespace: &str) -> DiscoveryServiceCertificate {
        let id = marin3r_certs::spiffe_id(TRUST_DOMAIN, namespace);
        let spec = DiscoveryServiceCertificateSpec {
            common_name: format!("envoy-sidecar.{namespace}"),
            server: Some(false),
            is_ca: None,
            valid_for: Self::secs(self.spec.client_duration),
            hosts: Some(vec![id]),
            signer: self.ca_signer(),
            secret_ref: SecretReference {
                name: DEFAULT_CLIENT_CERTIFICATE.into(),
                namespace: Some(namespace.to_owned()),
            },
            certificate_renewal: None,
            key_algorithm: None,
            certificate_renewal_notification: None,
        };
        let name = self.client_certificate_name(namespace);
        let mut dsc = DiscoveryServiceCertificate::new(&name, spec);
        dsc.metadata = self.owned_meta(&name);
        dsc.metadata
            .labels
            .get_or_insert_default()
            .insert(CLIENT_NAMESPACE_LABEL.into(), namespace.to_owned());
        dsc
    }

    /// The shared bootstrap of the sidecars in `namespace` (see `marin3r_webhook::bootstrap`).
    pub fn bootstrap_config_map(&self, namespace: &str) -> Result<ConfigMap, BootstrapError> {
        let bootstrap = render(&BootstrapOptions::new(self.xds_host(), self.spec.xds_port))?;
        let data = bootstrap
            .files()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Ok(ConfigMap {
            metadata: self.unowned_meta(DEFAULT_BOOTSTRAP_CONFIG_MAP, Some(namespace)),
            data: Some(data),
            ..Default::default()
        })
    }
}
