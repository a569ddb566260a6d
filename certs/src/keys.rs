//! Private keys we read back: loading a PKCS#8 key of a type we sign with, and whether it is
//! the key of a certificate. Both issuing (a CA's key) and verifying (a Secret's key) use them.

use rcgen::{KeyPair, PKCS_ECDSA_P256_SHA256, PKCS_RSA_SHA256, PublicKeyData};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;

use crate::error::CertError;
use crate::pem::{first_block, private_key_der};

/// Parses a PKCS#8 private key (`PRIVATE KEY` PEM block).
pub(crate) fn load_key(key_pem: &str) -> Result<KeyPair, CertError> {
    let der = private_key_der(key_pem)?;
    let key = KeyPair::try_from(der.as_slice()).map_err(CertError::PrivateKey)?;
    // Reject keys rcgen can parse but we never sign with (such as Ed25519) early and clearly.
    if !key.is_compatible(&PKCS_ECDSA_P256_SHA256) && !key.is_compatible(&PKCS_RSA_SHA256) {
        return Err(CertError::KeyType);
    }
    Ok(key)
}

/// Checks that the PKCS#8 key in `key_pem` is the key of the first certificate in `cert_pem`.
pub fn key_matches(cert_pem: &str, key_pem: &str) -> Result<(), CertError> {
    let der = first_block(cert_pem, "CERTIFICATE")?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(CertError::Certificate)?;
    let key = load_key(key_pem)?;
    if key.subject_public_key_info() == cert.public_key().raw {
        Ok(())
    } else {
        Err(CertError::KeyMismatch)
    }
}
