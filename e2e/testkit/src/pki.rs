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

/// A [`TestPki`] valid for a day with one server certificate, for tests (a failure to issue
/// fails the test): the CA and `server` for the given hosts, more on demand.
pub struct Pki {
    pki: TestPki,
    hosts: Vec<String>,
    pub server: IssuedCertificate,
}

const DAY: Duration = Duration::from_secs(86_400);

#[expect(
    clippy::expect_used,
    reason = "a test helper: a PKI that cannot issue is the test's failure"
)]
impl Pki {
    /// Server certificates for 127.0.0.1 and localhost, as a test server on loopback has.
    pub fn new() -> Self {
        Self::for_hosts(["127.0.0.1", "localhost"])
    }

    /// Server certificates for `hosts` (DNS names or IP addresses).
    pub fn for_hosts<S: Into<String>>(hosts: impl IntoIterator<Item = S>) -> Self {
        let pki = TestPki::new("marin3r-test-ca", DAY).expect("issuing the test CA");
        let hosts: Vec<String> = hosts.into_iter().map(Into::into).collect();
        let server = pki
            .server(hosts.clone())
            .expect("issuing a server certificate");
        Self { pki, hosts, server }
    }

    /// A new server certificate for the same hosts (another serial: a renewal).
    pub fn server_cert(&self) -> IssuedCertificate {
        self.pki
            .server(self.hosts.clone())
            .expect("issuing a server certificate")
    }

    /// A client certificate for a namespace (`None`: no SPIFFE URI at all).
    pub fn client(&self, namespace: Option<&str>) -> IssuedCertificate {
        self.pki
            .client(namespace)
            .expect("issuing a client certificate")
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for Pki {
    type Target = TestPki;

    fn deref(&self) -> &TestPki {
        &self.pki
    }
}
