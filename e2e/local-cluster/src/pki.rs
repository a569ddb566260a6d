//! The local cluster's own certificates, made with rcgen: one CA per API server and the
//! serving certificates it signs (the API's own, and those of HTTPS servers a test stands up
//! for the cluster to call, such as admission webhooks). ECDSA P-256, valid for a year from
//! an hour ago.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};

const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Clocks of clients may lag a little behind.
const BACKDATE: Duration = Duration::from_secs(3600);

pub use rcgen::Error;

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A self-signed certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

fn params(common_name: &str, hosts: &[String]) -> Result<CertificateParams, Error> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + VALIDITY;
    Ok(params)
}

impl Ca {
    /// A new CA whose subject is `common_name`.
    pub fn new(common_name: &str) -> Result<Self, Error> {
        let mut params = params(common_name, &[])?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        Ok(Self {
            issuer: CertifiedIssuer::self_signed(params, key)?,
        })
    }

    /// The CA certificate, what clients of its servers trust.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for `hosts` (DNS names or IP addresses).
    pub fn server(&self, common_name: &str, hosts: &[String]) -> Result<Issued, Error> {
        let mut params = params(common_name, hosts)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Whether `cert_pem` is valid for `host` under the CA `ca_pem` (as a TLS client checks it).
#[cfg(test)]
pub(crate) fn verifies(ca_pem: &str, cert_pem: &str, host: &str) -> bool {
    use rustls::client::danger::ServerCertVerifier;
    use std::sync::Arc;
    let der = |pem: &str| rustls_pemfile::certs(&mut pem.as_bytes()).next()?.ok();
    let (Some(ca), Some(leaf)) = (der(ca_pem), der(cert_pem)) else {
        return false;
    };
    let mut roots = rustls::RootCertStore::empty();
    if roots.add(ca).is_err() {
        return false;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(verifier) =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
    else {
        return false;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_owned()) else {
        return false;
    };
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
        .is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;

    #[test]
    fn a_server_certificate_is_signed_by_its_ca_for_its_hosts() {
        let ca = Ca::new("test-ca").unwrap();
        let issued = ca
            .server("api", &["localhost".into(), "127.0.0.1".into()])
            .unwrap();
        for host in ["localhost", "127.0.0.1"] {
            assert!(verifies(&ca.cert_pem(), &issued.cert_pem, host), "{host}");
        }
        assert!(!verifies(&ca.cert_pem(), &issued.cert_pem, "other.example"));
        let stranger = Ca::new("other-ca").unwrap();
        assert!(!verifies(
            &stranger.cert_pem(),
            &issued.cert_pem,
            "localhost"
        ));
    }
}
