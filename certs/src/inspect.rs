//! Reading certificates: subject, SANs, usages, validity, the renewal instant and the hash
//! that the operator and the discovery pod's rollout use to notice a new certificate.

use std::fmt;
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use crate::error::CertError;
use crate::pem::blocks_labelled;

/// The share of a certificate's validity after which it is renewed.
pub const RENEWAL_FRACTION_PERCENT: i128 = 80;

/// One subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectAltName {
    Dns(String),
    Ip(IpAddr),
    Uri(String),
    Other(String),
}

impl fmt::Display for SubjectAltName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Dns(v) => write!(f, "DNS:{v}"),
            Self::Ip(v) => write!(f, "IP:{v}"),
            Self::Uri(v) => write!(f, "URI:{v}"),
            Self::Other(v) => write!(f, "{v}"),
        }
    }
}

/// What marin3r needs to know about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateInfo {
    pub subject: String,
    pub issuer: String,
    pub sans: Vec<SubjectAltName>,
    /// Colon-separated hex, as openssl prints it.
    pub serial: String,
    /// `ECDSA P-256`, `RSA 2048`, ...
    pub key_algorithm: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub is_ca: bool,
    pub server_auth: bool,
    pub client_auth: bool,
    /// The DER of the certificate.
    pub der: Vec<u8>,
}

impl CertificateInfo {
    /// Reads the first certificate of a PEM bundle.
    pub fn from_pem(pem: &str) -> Result<Self, CertError> {
        Self::all_from_pem(pem)?
            .into_iter()
            .next()
            .ok_or(CertError::NoPemBlock {
                expected: "CERTIFICATE",
            })
    }

    /// Reads every certificate of a PEM bundle, in order.
    pub fn all_from_pem(pem: &str) -> Result<Vec<Self>, CertError> {
        blocks_labelled(pem, "CERTIFICATE")?
            .into_iter()
            .map(|der| Self::from_der(&der))
            .collect()
    }

    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let (rest, cert) = X509Certificate::from_der(der).map_err(CertError::Certificate)?;
        if !rest.is_empty() {
            return Err(CertError::TrailingBytes);
        }
        let sans = match cert
            .subject_alternative_name()
            .map_err(CertError::Extension)?
        {
            Some(ext) => ext.value.general_names.iter().map(san).collect(),
            None => Vec::new(),
        };
        let (server_auth, client_auth) =
            match cert.extended_key_usage().map_err(CertError::Extension)? {
                Some(eku) => (eku.value.server_auth, eku.value.client_auth),
                None => (false, false),
            };
        let is_ca = cert
            .basic_constraints()
            .map_err(CertError::Extension)?
            .is_some_and(|bc| bc.value.ca);
        Ok(Self {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            sans,
            serial: cert.raw_serial_as_string(),
            key_algorithm: key_algorithm(&cert),
            not_before: cert.validity().not_before.to_datetime(),
            not_after: cert.validity().not_after.to_datetime(),
            is_ca,
            server_auth,
            client_auth,
            der: der.to_vec(),
        })
    }

    /// When the certificate is due for renewal: 80% of the way from not-before to not-after.
    pub fn renewal_time(&self) -> OffsetDateTime {
        renewal_instant(self.not_before, self.not_after)
    }

    /// The [`certificate_hash`] of this certificate on its own.
    pub fn hash(&self) -> String {
        hash_der(&[&self.der])
    }

    pub fn is_expired_at(&self, at: OffsetDateTime) -> bool {
        at > self.not_after
    }
}

fn san(name: &GeneralName<'_>) -> SubjectAltName {
    match name {
        GeneralName::DNSName(v) => SubjectAltName::Dns((*v).to_owned()),
        GeneralName::URI(v) => SubjectAltName::Uri((*v).to_owned()),
        GeneralName::IPAddress(bytes) => match bytes.len() {
            4 => {
                let octets: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
                SubjectAltName::Ip(IpAddr::from(octets))
            }
            16 => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(bytes);
                SubjectAltName::Ip(IpAddr::from(octets))
            }
            _ => SubjectAltName::Other(format!("IP:<{} bytes>", bytes.len())),
        },
        other => SubjectAltName::Other(other.to_string()),
    }
}

fn key_algorithm(cert: &X509Certificate<'_>) -> String {
    match cert.public_key().parsed() {
        Ok(PublicKey::RSA(key)) => format!("RSA {}", key.key_size()),
        Ok(PublicKey::EC(point)) => format!("ECDSA P-{}", point.key_size()),
        Ok(PublicKey::Unknown(_)) | Err(_) => {
            format!("unknown ({})", cert.public_key().algorithm.algorithm)
        }
        Ok(_) => format!("other ({})", cert.public_key().algorithm.algorithm),
    }
}

/// The renewal instant for a validity window: not-before + 80% of (not-after - not-before).
pub fn renewal_instant(not_before: OffsetDateTime, not_after: OffsetDateTime) -> OffsetDateTime {
    // Nanoseconds between two representable instants fit an i128 many times over; checked
    // anyway, because certificates are input.
    let lifetime_ns = not_after
        .unix_timestamp_nanos()
        .checked_sub(not_before.unix_timestamp_nanos())
        .unwrap_or(0)
        .max(0);
    let offset_ns = lifetime_ns
        .checked_mul(RENEWAL_FRACTION_PERCENT)
        .map_or(lifetime_ns, |n| n.div_euclid(100));
    // A lifetime that fits an OffsetDateTime fits an i64 of nanoseconds (~292 years) only
    // up to a point; fall back to whole seconds past that.
    match i64::try_from(offset_ns) {
        Ok(ns) => not_before
            .checked_add(time::Duration::nanoseconds(ns))
            .unwrap_or(not_after),
        Err(_) => {
            let secs = i64::try_from(offset_ns.div_euclid(1_000_000_000)).unwrap_or(i64::MAX);
            not_before.saturating_add(time::Duration::seconds(secs))
        }
    }
}

/// The certificate hash: lowercase hex of the first 16 bytes of SHA-256 over the DER of every
/// certificate in the PEM, in order. It ignores PEM formatting (line breaks, comments) and
/// fits in a Kubernetes label value.
pub fn certificate_hash(pem: &str) -> Result<String, CertError> {
    Ok(hash_der(&blocks_labelled(pem, "CERTIFICATE")?))
}

fn hash_der<D: AsRef<[u8]>>(ders: &[D]) -> String {
    let mut hasher = Sha256::new();
    for der in ders {
        hasher.update(der.as_ref());
    }
    hex(&hasher.finalize()[..16])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::issue::{CertificateRequest, issue_self_signed};
    use std::time::Duration;
    use time::macros::datetime;

    #[test]
    fn renewal_is_at_eighty_percent() {
        let nb = datetime!(2026-01-01 00:00:00 UTC);
        assert_eq!(
            renewal_instant(nb, datetime!(2026-01-11 00:00:00 UTC)),
            datetime!(2026-01-09 00:00:00 UTC)
        );
        assert_eq!(
            renewal_instant(nb, nb + time::Duration::seconds(5)),
            nb + time::Duration::seconds(4)
        );
        // A window that ends before it starts renews at once rather than in the past's future.
        assert_eq!(renewal_instant(nb, nb - time::Duration::days(1)), nb);
        // Very long windows do not overflow.
        let far = datetime!(9999-12-31 23:59:59 UTC);
        assert!(renewal_instant(datetime!(1950-01-01 00:00:00 UTC), far) < far);
    }

    #[test]
    fn hash_is_stable_across_pem_formatting_and_changes_with_the_certificate() {
        let req = CertificateRequest::ca("ca", Duration::from_secs(3600));
        let a = issue_self_signed(&req).unwrap().cert_pem;
        let b = issue_self_signed(&req).unwrap().cert_pem;
        let h = certificate_hash(&a).unwrap();
        assert_eq!(h.len(), 32);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, certificate_hash(&a).unwrap());
        let reformatted = format!("comment line\n{}\n\n", a.replace('\n', "\r\n"));
        assert_eq!(h, certificate_hash(&reformatted).unwrap());
        assert_ne!(h, certificate_hash(&b).unwrap());
        assert_ne!(h, certificate_hash(&format!("{a}{b}")).unwrap());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(matches!(
            CertificateInfo::from_pem("hello"),
            Err(CertError::NoPemBlock { .. })
        ));
        let fake = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            CertificateInfo::from_pem(fake),
            Err(CertError::Certificate(_))
        ));
        assert!(certificate_hash("").is_err());
    }

    #[test]
    fn bundles_are_read_in_order() {
        let req = CertificateRequest::ca("first", Duration::from_secs(3600));
        let a = issue_self_signed(&req).unwrap().cert_pem;
        let b = issue_self_signed(&CertificateRequest::ca("second", Duration::from_secs(60)))
            .unwrap()
            .cert_pem;
        let all = CertificateInfo::all_from_pem(&format!("{a}{b}")).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].subject, "CN=first");
        assert_eq!(all[1].subject, "CN=second");
        assert_eq!(all[1].hash(), certificate_hash(&b).unwrap());
        assert!(!all[1].is_expired_at(all[1].not_after));
        assert!(all[1].is_expired_at(all[1].not_after + time::Duration::seconds(1)));
    }
}
