//! SDS secrets built from a Kubernetes Secret's data (secrets in a spec are references, so
//! their resources are made here rather than parsed from a value).

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, GenericSecret, Secret, TlsCertificate, secret::Type,
};
use prost::Message as _;

use marin3r_xds::resource::{Resource, ResourceType};

/// A `kubernetes.io/tls` Secret's data that cannot become an Envoy TLS certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret \"{0}\": tls.crt is empty")]
    NoCertificate(String),
    #[error("secret \"{0}\": tls.key is empty")]
    NoKey(String),
}

/// The SDS `Secret` named `name` holding a certificate chain and its private key (PEM) as
/// inline bytes, the shape Envoy expects for `tls_certificate_sds_secret_configs`.
pub fn tls_secret(
    name: &str,
    certificate_chain_pem: &[u8],
    private_key_pem: &[u8],
) -> Result<Resource, SecretError> {
    if certificate_chain_pem.is_empty() {
        return Err(SecretError::NoCertificate(name.to_owned()));
    }
    if private_key_pem.is_empty() {
        return Err(SecretError::NoKey(name.to_owned()));
    }
    Ok(secret(
        name,
        Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(certificate_chain_pem)),
            private_key: Some(inline(private_key_pem)),
            ..Default::default()
        }),
    ))
}

/// The SDS `Secret` named `name` holding CA certificates (PEM) to validate peers with, the
/// shape Envoy expects for `validation_context_sds_secret_config`.
pub fn validation_context_secret(name: &str, ca_pem: &[u8]) -> Result<Resource, SecretError> {
    if ca_pem.is_empty() {
        return Err(SecretError::NoCertificate(name.to_owned()));
    }
    Ok(secret(
        name,
        Type::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(ca_pem)),
            ..Default::default()
        }),
    ))
}

/// The SDS `Secret` named `name` holding `value` as a generic secret (for filters such as
/// OAuth2 and HMAC).
pub fn generic_secret(name: &str, value: &[u8]) -> Resource {
    secret(
        name,
        Type::GenericSecret(GenericSecret {
            secret: Some(inline(value)),
            ..Default::default()
        }),
    )
}

fn inline(bytes: &[u8]) -> DataSource {
    DataSource {
        specifier: Some(Specifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    }
}

fn secret(name: &str, kind: Type) -> Resource {
    let secret = Secret {
        name: name.to_owned(),
        r#type: Some(kind),
    };
    Resource {
        kind: ResourceType::Secret,
        name: name.to_owned(),
        body: secret.encode_to_vec().into(),
    }
}
