//! Issuing certificates: self-signed CAs and CA-signed server or client certificates.
//! Keys are ECDSA P-256 unless RSA is asked for; every certificate gets a random serial.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, SanType,
    SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use rsa::pkcs8::EncodePrivateKey;
use time::OffsetDateTime;

use crate::error::CertError;
use crate::keys::{key_matches, load_key};
use crate::pem::first_block;

/// The most a certificate's validity starts before it is issued (see `params`).
const MAX_BACKDATE_SECONDS: i64 = 60;
/// The key type of a certificate we issue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyAlgorithm {
    #[default]
    EcdsaP256,
    Rsa2048,
    Rsa4096,
}

impl KeyAlgorithm {
    pub const ALL: [KeyAlgorithm; 3] = [Self::EcdsaP256, Self::Rsa2048, Self::Rsa4096];

    /// The name used in specs and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EcdsaP256 => "ecdsa-p256",
            Self::Rsa2048 => "rsa-2048",
            Self::Rsa4096 => "rsa-4096",
        }
    }

    fn generate(self) -> Result<KeyPair, CertError> {
        let rsa_bits = match self {
            Self::EcdsaP256 => return Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?),
            Self::Rsa2048 => 2048,
            Self::Rsa4096 => 4096,
        };
        // ring signs with RSA keys but cannot generate them, so the `rsa` crate makes the key
        // and ring does every signature.
        let key =
            rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, rsa_bits).map_err(|source| {
                CertError::RsaKey {
                    bits: rsa_bits,
                    source,
                }
            })?;
        let der = key.to_pkcs8_der().map_err(CertError::RsaEncoding)?;
        Ok(KeyPair::from_pkcs8_der_and_sign_algo(
            &der.as_bytes().into(),
            &PKCS_RSA_SHA256,
        )?)
    }
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyAlgorithm {
    type Err = CertError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "ecdsa-p256" | "ecdsa" | "ec" | "p256" => Ok(Self::EcdsaP256),
            "rsa-2048" | "rsa2048" | "rsa" => Ok(Self::Rsa2048),
            "rsa-4096" | "rsa4096" => Ok(Self::Rsa4096),
            _ => Err(CertError::InvalidRequest(format!(
                "unknown key algorithm {s:?}: expected one of ecdsa-p256, rsa-2048, rsa-4096"
            ))),
        }
    }
}

/// What a leaf certificate is for. CA certificates carry neither extended usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

/// Everything needed to issue one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRequest {
    pub common_name: String,
    /// DNS names, IP addresses and URIs (such as SPIFFE IDs); empty means `[common_name]`.
    pub hosts: Vec<String>,
    pub is_ca: bool,
    pub usage: Usage,
    pub valid_for: Duration,
    pub key_algorithm: KeyAlgorithm,
}

impl CertificateRequest {
    pub fn new(common_name: impl Into<String>, usage: Usage, valid_for: Duration) -> Self {
        Self {
            common_name: common_name.into(),
            hosts: Vec::new(),
            is_ca: false,
            usage,
            valid_for,
            key_algorithm: KeyAlgorithm::default(),
        }
    }

    /// A request for a CA certificate.
    pub fn ca(common_name: impl Into<String>, valid_for: Duration) -> Self {
        Self {
            is_ca: true,
            ..Self::new(common_name, Usage::Server, valid_for)
        }
    }

    pub fn with_hosts<I, S>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.hosts = hosts.into_iter().map(Into::into).collect();
        self
    }

    pub fn with_key_algorithm(mut self, key_algorithm: KeyAlgorithm) -> Self {
        self.key_algorithm = key_algorithm;
        self
    }

    /// The hosts the certificate is issued for: `hosts`, or the common name when empty.
    pub fn effective_hosts(&self) -> impl Iterator<Item = &str> {
        let fallback = self.hosts.is_empty().then_some(self.common_name.as_str());
        self.hosts.iter().map(String::as_str).chain(fallback)
    }

    fn params(&self, now: OffsetDateTime) -> Result<CertificateParams, CertError> {
        if self.common_name.trim().is_empty() {
            return Err(CertError::InvalidRequest(
                "common name must not be empty".into(),
            ));
        }
        let seconds = i64::try_from(self.valid_for.as_secs())
            .map_err(|_| CertError::InvalidRequest("validity is too long".into()))?;
        if seconds == 0 {
            return Err(CertError::InvalidRequest(
                "validity must be at least one second".into(),
            ));
        }
        // X.509 times have whole seconds; start on one so the arithmetic on the issued
        // certificate gives back exactly the requested validity. Start a little in the past
        // (a minute, or a tenth of a short validity) so a peer whose clock is behind ours
        // does not see a certificate that is not valid yet, as Vault backdates its own.
        let whole = now.replace_nanosecond(0).unwrap_or(now);
        let backdate = time::Duration::seconds((seconds / 10).min(MAX_BACKDATE_SECONDS));
        let not_before = whole.checked_sub(backdate).unwrap_or(whole);
        let not_after = not_before
            .checked_add(time::Duration::seconds(seconds))
            .filter(|t| t.year() <= 9999)
            .ok_or_else(|| CertError::InvalidRequest("validity is too long".into()))?;

        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, self.common_name.as_str());
        params.distinguished_name = dn;
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial()?);
        params.subject_alt_names = self
            .effective_hosts()
            .map(subject_alt_name)
            .collect::<Result<_, _>>()?;
        if self.is_ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
        } else {
            params.is_ca = IsCa::ExplicitNoCa;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            if self.key_algorithm != KeyAlgorithm::EcdsaP256 {
                params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
            }
            params.extended_key_usages = vec![match self.usage {
                Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
                Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
            }];
            params.use_authority_key_identifier_extension = true;
        }
        Ok(params)
    }
}

/// The latest instant a certificate this crate issued with validity `not_before..not_after`
/// can have been issued: its start undone of the backdating of `params` and of the truncation
/// to whole seconds.
pub fn latest_issuance(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let seconds = not_after
        .unix_timestamp()
        .checked_sub(not_before.unix_timestamp())?;
    let backdate = (seconds / 10).clamp(0, MAX_BACKDATE_SECONDS);
    not_before.checked_add(time::Duration::seconds(backdate.checked_add(1)?))
}

/// A certificate with its key, as stored in a `kubernetes.io/tls` Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
    /// The issuer's certificate; the certificate itself when self-signed.
    pub ca_pem: String,
}

impl fmt::Debug for IssuedCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print private keys, not even in debug logs.
        f.debug_struct("IssuedCertificate")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("ca_pem", &self.ca_pem)
            .finish()
    }
}

/// A CA certificate and its key, ready to sign.
pub struct CertificateAuthority {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl CertificateAuthority {
    /// Loads a CA from PEM, checking that it is a CA and that the key is its own.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let info = crate::inspect::CertificateInfo::from_pem(cert_pem)?;
        if !info.is_ca {
            return Err(CertError::IssuerNotCa);
        }
        key_matches(cert_pem, key_pem)?;
        let key = load_key(key_pem)?;
        let der = first_block(cert_pem, "CERTIFICATE")?;
        let issuer = Issuer::from_ca_cert_der(&der.into(), key).map_err(CertError::Issuer)?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            issuer,
        })
    }

    /// Loads the CA of an issued self-signed CA certificate.
    pub fn from_issued(issued: &IssuedCertificate) -> Result<Self, CertError> {
        Self::from_pem(&issued.cert_pem, &issued.key_pem)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Issues a certificate signed by this CA.
    pub fn issue(&self, request: &CertificateRequest) -> Result<IssuedCertificate, CertError> {
        self.issue_at(request, OffsetDateTime::now_utc())
    }

    pub(crate) fn issue_at(
        &self,
        request: &CertificateRequest,
        now: OffsetDateTime,
    ) -> Result<IssuedCertificate, CertError> {
        let params = request.params(now)?;
        let key = request.key_algorithm.generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }
}

/// Issues a self-signed certificate (usually a CA).
pub fn issue_self_signed(request: &CertificateRequest) -> Result<IssuedCertificate, CertError> {
    issue_self_signed_at(request, OffsetDateTime::now_utc())
}

pub(crate) fn issue_self_signed_at(
    request: &CertificateRequest,
    now: OffsetDateTime,
) -> Result<IssuedCertificate, CertError> {
    let params = request.params(now)?;
    let key = request.key_algorithm.generate()?;
    let cert = params.self_signed(&key)?;
    let cert_pem = cert.pem();
    Ok(IssuedCertificate {
        ca_pem: cert_pem.clone(),
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

fn random_serial() -> Result<SerialNumber, CertError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CertError::NoRandomness)?;
    // Positive and without a leading zero byte, as RFC 5280 asks of serial numbers.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

/// Turns a host into the SAN of the matching type: IP address, URI (has a scheme) or DNS name.
pub fn subject_alt_name(host: &str) -> Result<SanType, CertError> {
    let invalid = |reason: &str| CertError::InvalidHost {
        host: host.to_owned(),
        reason: reason.to_owned(),
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    if let Some((scheme, rest)) = host.split_once("://") {
        let scheme_ok = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return Err(invalid(
                "URI scheme must be letters, digits, '+', '-' or '.'",
            ));
        }
        if rest.is_empty() {
            return Err(invalid("URI has nothing after the scheme"));
        }
        if !host.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid("URI must be printable ASCII without spaces"));
        }
        return host
            .try_into()
            .map(SanType::URI)
            .map_err(|e: rcgen::Error| invalid(&e.to_string()));
    }
    validate_dns_name(host).map_err(invalid)?;
    host.try_into()
        .map(SanType::DnsName)
        .map_err(|e: rcgen::Error| invalid(&e.to_string()))
}

fn validate_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > 253 {
        return Err("DNS name longer than 253 characters");
    }
    let name = name.strip_prefix("*.").unwrap_or(name);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() {
            return Err("DNS name has an empty label");
        }
        if label.len() > 63 {
            return Err("DNS label longer than 63 characters");
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(
                "not a DNS name, IP address or URI (DNS labels are letters, digits and '-')",
            );
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("DNS labels must not start or end with '-'");
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "issue_tests.rs"]
mod tests;
