//! SDS secrets built from a Kubernetes TLS Secret's data (`spec.envoyResources.secrets` are
//! references, so their resources are made here rather than parsed from a value).

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    Secret, TlsCertificate, secret::Type,
};
use prost::Message as _;

use crate::resource::{Resource, ResourceType};

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
    let inline = |bytes: &[u8]| DataSource {
        specifier: Some(Specifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    };
    let secret = Secret {
        name: name.to_owned(),
        r#type: Some(Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(certificate_chain_pem)),
            private_key: Some(inline(private_key_pem)),
            ..Default::default()
        })),
    };
    Ok(Resource {
        kind: ResourceType::Secret,
        name: name.to_owned(),
        body: secret.encode_to_vec().into(),
    })
}
