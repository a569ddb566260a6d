//! The one error type of the PKI crate.

use thiserror::Error;

/// Everything that can go wrong while issuing, reading or checking certificates.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("no PEM block of type {expected} found")]
    NoPemBlock { expected: &'static str },
    #[error("invalid PEM: {0}")]
    Pem(String),
    #[error("invalid certificate: {0}")]
    Certificate(String),
    #[error("invalid private key: {0}")]
    PrivateKey(String),
    #[error("invalid host {host:?}: {reason}")]
    InvalidHost { host: String, reason: String },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the issuer certificate is not a CA (basic constraints CA flag is not set)")]
    IssuerNotCa,
    #[error("the private key does not match the certificate's public key")]
    KeyMismatch,
    #[error("the certificate was not signed by the given CA: {0}")]
    NotSignedBy(String),
    #[error("the certificate is not valid yet (not before {not_before})")]
    NotYetValid { not_before: String },
    #[error("the certificate has expired (not after {not_after})")]
    Expired { not_after: String },
    #[error("certificate generation failed: {0}")]
    Generation(String),
}

impl From<rcgen::Error> for CertError {
    fn from(err: rcgen::Error) -> Self {
        CertError::Generation(err.to_string())
    }
}
