//! The one error type of the PKI crate. A failure of a library underneath (the PEM, X.509 and
//! key parsers, the RSA key generator, the signer) is the variant's `source`, not a copy of its
//! text: `marin3r_controller::chain` shows both where a status or a log line needs them.

use thiserror::Error;
use x509_parser::error::{PEMError, X509Error};

/// Everything that can go wrong while issuing, reading or checking certificates.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("no PEM block of type {expected} found")]
    NoPemBlock { expected: &'static str },
    #[error("invalid PEM")]
    Pem(#[source] PEMError),
    #[error("invalid certificate")]
    Certificate(#[source] x509_parser::nom::Err<X509Error>),
    #[error("invalid certificate: trailing bytes after the certificate")]
    TrailingBytes,
    #[error("invalid certificate extension")]
    Extension(#[source] X509Error),
    /// The CA's certificate and key cannot be made a signer.
    #[error("invalid CA certificate")]
    Issuer(#[source] rcgen::Error),
    #[error("invalid private key")]
    PrivateKey(#[source] rcgen::Error),
    #[error(
        "invalid private key: {label} blocks are not supported; convert the key to PKCS#8 (openssl pkcs8 -topk8 -nocrypt)"
    )]
    KeyFormat { label: String },
    #[error("invalid private key: unsupported key type: expected an ECDSA P-256 or RSA key")]
    KeyType,
    #[error("invalid host {host:?}: {reason}")]
    InvalidHost { host: String, reason: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the issuer certificate is not a CA (basic constraints CA flag is not set)")]
    IssuerNotCa,
    #[error("the private key does not match the certificate's public key")]
    KeyMismatch,
    /// The certificate names another issuer than the CA (or, self-signed, than itself).
    #[error("the certificate was not signed by the given CA: issuer {issuer} is not {expected}")]
    NotSignedBy { issuer: String, expected: String },
    #[error("the certificate was not signed by the given CA: signature check failed")]
    BadSignature(#[source] X509Error),
    #[error("the certificate is not valid yet (not before {not_before})")]
    NotYetValid { not_before: String },
    #[error("the certificate has expired (not after {not_after})")]
    Expired { not_after: String },
    #[error("certificate generation failed")]
    Generation(#[from] rcgen::Error),
    #[error("RSA-{bits} key generation failed")]
    RsaKey {
        bits: usize,
        #[source]
        source: rsa::Error,
    },
    #[error("RSA key encoding failed")]
    RsaEncoding(#[source] rsa::pkcs8::Error),
    #[error("no randomness available for the serial number")]
    NoRandomness,
    /// The blocking task that issued panicked or was cancelled.
    #[cfg(feature = "kube")]
    #[error("the issuing task failed")]
    IssuingTask(#[source] tokio::task::JoinError),
}
