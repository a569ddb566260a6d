//! A throwaway PKI for tests, issued by marin3r-certs as the product issues its own: one CA,
//! server certificates for given hosts, client certificates carrying a namespace's SPIFFE
//! identity, all valid for the CA's lifetime.

use std::time::Duration;

use marin3r_certs::{
    CertError, CertificateAuthority, CertificateRequest, IssuedCertificate, Usage,
    issue_self_signed, spiffe_id,
};

/// The trust domain of the client certificates' SPIFFE URIs.
pub use marin3r_certs::TRUST_DOMAIN;

pub struct TestPki {
    pub ca: CertificateAuthority,
    validity: Duration,
}

impl TestPki {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str, validity: Duration) -> Result<Self, CertError> {
        let ca = issue_self_signed(&CertificateRequest::ca(name, validity))?;
        Ok(Self {
            ca: CertificateAuthority::from_issued(&ca)?,
            validity,
        })
    }

    pub fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// A server certificate for `hosts` (DNS names or IP addresses).
    pub fn server<S: Into<String>>(
        &self,
        hosts: impl IntoIterator<Item = S>,
    ) -> Result<IssuedCertificate, CertError> {
        self.ca.issue(
            &CertificateRequest::new("marin3r", Usage::Server, self.validity).with_hosts(hosts),
        )
    }

    /// A proxy's client certificate for `namespace` (`None`: no SPIFFE URI at all).
    pub fn client(&self, namespace: Option<&str>) -> Result<IssuedCertificate, CertError> {
        let hosts: Vec<String> = match namespace {
            Some(ns) => vec![spiffe_id(TRUST_DOMAIN, ns)],
            None => vec!["envoy.example".into()],
        };
        self.ca.issue(
            &CertificateRequest::new("envoy", Usage::Client, self.validity).with_hosts(hosts),
        )
    }
}
