//! The serving certificate, read from PEM files and swapped in when they change on disk (by
//! the reloader the xDS server uses too); a half-written or mismatched pair keeps the old one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use marin3r_certs::reload::{ReadError, Reloading};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("certificate {cert} and key {key} do not form a usable pair: {reason}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The serving pair, re-read from its two files (certificate, key) while the server runs.
pub type ReloadingCert = Reloading<CertifiedKey, TlsError, 2>;

/// Loads the pair; fails (naming the file and the problem) when it is not usable.
pub fn load_cert(
    cert_path: impl Into<PathBuf>,
    key_path: impl Into<PathBuf>,
    provider: Arc<CryptoProvider>,
) -> Result<ReloadingCert, TlsError> {
    let cert_path = cert_path.into();
    let key_path = key_path.into();
    let (cert, key) = (cert_path.clone(), key_path.clone());
    Reloading::load(
        [cert_path, key_path],
        Box::new(move |[cert_pem, key_pem]| {
            certified_key(&cert, &key, cert_pem, key_pem, &provider)
        }),
    )
}

/// Answers every handshake with the pair served now.
#[derive(Debug)]
struct Resolver(Arc<ReloadingCert>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// A server config for TLS 1.2 and 1.3 serving whatever `cert` currently holds.
pub fn server_config(
    cert: Arc<ReloadingCert>,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(cert)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let pem_err = |path: &Path, reason: String| TlsError::Pem {
        path: path.to_owned(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(cert_path, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(pem_err(cert_path, "no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| pem_err(key_path, format!("no usable private key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::Pair {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
        reason: e.to_string(),
    })
}
