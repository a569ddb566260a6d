//! Checks on certificates we read back: who signed them and whether they are in their
//! validity window. Whether a private key belongs to one is in `keys`.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::error::CertError;
use crate::pem::first_block;

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CertError> {
    X509Certificate::from_der(der)
        .map(|(_, cert)| cert)
        .map_err(CertError::Certificate)
}

/// Checks that the first certificate of `cert_pem` was issued and signed by the first
/// certificate of `ca_pem`, and that the latter is a CA.
pub fn verify_signed_by(cert_pem: &str, ca_pem: &str) -> Result<(), CertError> {
    let cert_der = first_block(cert_pem, "CERTIFICATE")?;
    let ca_der = first_block(ca_pem, "CERTIFICATE")?;
    let cert = parse(&cert_der)?;
    let ca = parse(&ca_der)?;
    if !ca
        .basic_constraints()
        .map_err(CertError::Extension)?
        .is_some_and(|bc| bc.value.ca)
    {
        return Err(CertError::IssuerNotCa);
    }
    if cert.issuer() != ca.subject() {
        return Err(CertError::NotSignedBy {
            issuer: cert.issuer().to_string(),
            expected: format!("the CA's subject {}", ca.subject()),
        });
    }
    cert.verify_signature(Some(ca.public_key()))
        .map_err(CertError::BadSignature)
}

/// Checks that the first certificate of `cert_pem` is self-signed: its issuer is its subject
/// and its own key verifies its signature (a CA flag is not required).
pub fn verify_self_signed(cert_pem: &str) -> Result<(), CertError> {
    let der = first_block(cert_pem, "CERTIFICATE")?;
    let cert = parse(&der)?;
    if cert.issuer() != cert.subject() {
        return Err(CertError::NotSignedBy {
            issuer: cert.issuer().to_string(),
            expected: format!("the subject {}", cert.subject()),
        });
    }
    cert.verify_signature(None).map_err(CertError::BadSignature)
}

/// Checks that `at` is within the certificate's validity window.
pub fn check_validity(cert_pem: &str, at: OffsetDateTime) -> Result<(), CertError> {
    let der = first_block(cert_pem, "CERTIFICATE")?;
    let cert = parse(&der)?;
    let not_before = cert.validity().not_before.to_datetime();
    let not_after = cert.validity().not_after.to_datetime();
    let fmt = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_else(|_| t.to_string());
    if at < not_before {
        return Err(CertError::NotYetValid {
            not_before: fmt(not_before),
        });
    }
    if at > not_after {
        return Err(CertError::Expired {
            not_after: fmt(not_after),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::issue::{
        CertificateAuthority, CertificateRequest, IssuedCertificate, Usage, issue_self_signed,
        issue_self_signed_at,
    };
    use crate::keys::key_matches;
    use std::time::Duration;

    fn ca(name: &str) -> IssuedCertificate {
        issue_self_signed(&CertificateRequest::ca(name, Duration::from_secs(3600))).unwrap()
    }

    fn leaf(ca: &IssuedCertificate) -> IssuedCertificate {
        CertificateAuthority::from_issued(ca)
            .unwrap()
            .issue(&CertificateRequest::new(
                "leaf",
                Usage::Client,
                Duration::from_secs(60),
            ))
            .unwrap()
    }

    #[test]
    fn chain_verifies_against_its_ca_only() {
        let ours = ca("ours");
        let cert = leaf(&ours);
        verify_signed_by(&cert.cert_pem, &ours.cert_pem).unwrap();
        verify_signed_by(&ours.cert_pem, &ours.cert_pem).unwrap();

        // Another CA with a different name: refused by name.
        let theirs = ca("theirs");
        let err = verify_signed_by(&cert.cert_pem, &theirs.cert_pem).unwrap_err();
        assert!(matches!(err, CertError::NotSignedBy { .. }), "{err}");

        // Another CA with the same name (a renewed CA): refused by signature.
        let impostor = ca("ours");
        let err = verify_signed_by(&cert.cert_pem, &impostor.cert_pem).unwrap_err();
        assert!(matches!(err, CertError::BadSignature(_)), "{err}");

        // A leaf is not an issuer.
        assert!(matches!(
            verify_signed_by(&cert.cert_pem, &cert.cert_pem),
            Err(CertError::IssuerNotCa)
        ));
    }

    #[test]
    fn self_signed_leaves_verify_against_themselves_only() {
        let plain = issue_self_signed(&CertificateRequest::new(
            "plain",
            Usage::Server,
            Duration::from_secs(60),
        ))
        .unwrap();
        verify_self_signed(&plain.cert_pem).unwrap();
        let ours = ca("ours");
        verify_self_signed(&ours.cert_pem).unwrap();
        assert!(matches!(
            verify_self_signed(&leaf(&ours).cert_pem),
            Err(CertError::NotSignedBy { .. })
        ));
    }

    #[test]
    fn key_from_another_certificate_does_not_match() {
        let ours = ca("ours");
        let a = leaf(&ours);
        let b = leaf(&ours);
        key_matches(&a.cert_pem, &a.key_pem).unwrap();
        assert!(matches!(
            key_matches(&a.cert_pem, &b.key_pem),
            Err(CertError::KeyMismatch)
        ));
        assert!(matches!(
            key_matches(&a.cert_pem, "not a key"),
            Err(CertError::NoPemBlock { .. })
        ));
    }

    #[test]
    fn validity_window_is_enforced() {
        let issued_at = OffsetDateTime::now_utc() - time::Duration::days(10);
        let expired = issue_self_signed_at(
            &CertificateRequest::ca("old", Duration::from_secs(86_400)),
            issued_at,
        )
        .unwrap();
        let err = check_validity(&expired.cert_pem, OffsetDateTime::now_utc()).unwrap_err();
        assert!(matches!(err, CertError::Expired { .. }), "{err}");
        assert!(err.to_string().contains("expired"));
        check_validity(&expired.cert_pem, issued_at + time::Duration::hours(1)).unwrap();
        let err = check_validity(&expired.cert_pem, issued_at - time::Duration::hours(1));
        assert!(matches!(err, Err(CertError::NotYetValid { .. })));
    }
}
