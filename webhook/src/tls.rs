//! The serving certificate, read from PEM files and swapped in when they change on disk.
//! Kubernetes updates a mounted Secret by renaming a `..data` symlink, so the files' content
//! is polled (not one inode watched); a half-written or mismatched pair keeps the old one.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
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

/// A certificate resolver that always answers with the newest valid pair from disk.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// Hash of the file contents last tried, good or bad, so a bad pair is logged once.
    last_seen: Mutex<[u8; 32]>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair; fails (naming the file and the problem) when it is not usable.
    pub fn load(
        cert_path: impl Into<PathBuf>,
        key_path: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let cert_path = cert_path.into();
        let key_path = key_path.into();
        let (cert_pem, key_pem) = read_pair(&cert_path, &key_path)?;
        let key = certified_key(&cert_path, &key_path, &cert_pem, &key_pem, &provider)?;
        Ok(Self {
            last_seen: Mutex::new(fingerprint(&cert_pem, &key_pem)),
            cert_path,
            key_path,
            provider,
            current: ArcSwap::from_pointee(key),
        })
    }

    /// Re-reads the files; swaps the served pair when they changed and form a valid pair.
    /// Returns whether a new pair is now served.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let (cert_pem, key_pem) = read_pair(&self.cert_path, &self.key_path)?;
        let seen = fingerprint(&cert_pem, &key_pem);
        {
            let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
            if *last == seen {
                return Ok(false);
            }
            *last = seen;
        }
        let key = certified_key(
            &self.cert_path,
            &self.key_path,
            &cert_pem,
            &key_pem,
            &self.provider,
        )?;
        self.current.store(Arc::new(key));
        Ok(true)
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// Polls the files every `interval` until `shutdown` resolves.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving a new certificate")
                }
                Ok(false) => {}
                // Mid-rotation the pair can be mismatched for a moment: keep the old one.
                Err(e) => tracing::warn!(error = %e, "keeping the previous certificate"),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// A server config for TLS 1.2 and 1.3 serving whatever `cert` currently holds.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(cert.provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?))
}

fn fingerprint(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert.len() as u64).to_be_bytes());
    h.update(cert);
    h.update(key);
    h.finalize().into()
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
