//! TLS for the API server: its own CA and serving certificate (`crate::pki`), the rustls
//! acceptor, the accept loop shared with plain HTTP, and the kubeconfig clients use.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::StartError;
use crate::pki::{Ca, Issued};

/// A fresh CA and a serving certificate for loopback, the Kubernetes service names, the
/// listen address and `extra_hosts`.
pub fn issue(listen: IpAddr, extra_hosts: &[String]) -> Result<(Ca, Issued), StartError> {
    let ca = Ca::new("local-cluster-ca")?;
    let mut hosts: Vec<String> = [
        "localhost",
        "127.0.0.1",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if !listen.is_unspecified() && !listen.is_loopback() {
        hosts.push(listen.to_string());
    }
    hosts.extend(extra_hosts.iter().cloned());
    hosts.dedup();
    let serving = ca.server("kube-apiserver", &hosts)?;
    Ok((ca, serving))
}

pub fn certs_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid PEM certificate: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn acceptor(serving: &Issued) -> Result<TlsAcceptor, StartError> {
    let certs = certs_from_pem(&serving.cert_pem).map_err(StartError::Tls)?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| StartError::Tls(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| StartError::Tls(e.to_string()))?;
    // HTTP/1.1 only: watches stream as chunked responses, which every client handles.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections until aborted; dropping this future ends every open connection.
pub async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>, router: axum::Router) {
    let mut connections = JoinSet::new();
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Such as running out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let tls = tls.clone();
        let service = TowerToHyperService::new(router.clone());
        connections.spawn(async move {
            let http = hyper::server::conn::http1::Builder::new();
            let result = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        http.serve_connection(TokioIo::new(stream), service)
                            .with_upgrades()
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    http.serve_connection(TokioIo::new(tcp), service)
                        .with_upgrades()
                        .await
                }
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

/// A kubeconfig naming one cluster, user and context `local-cluster`, with the admin token
/// (`rbac::ADMIN_TOKEN`), which RBAC never limits.
pub fn kubeconfig(server: &str, ca_pem: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: local-cluster
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: local-cluster
  user:
    token: local-cluster
contexts:
- name: local-cluster
  context:
    cluster: local-cluster
    user: local-cluster
    namespace: default
current-context: local-cluster
"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::verifies;

    #[test]
    fn serving_certificate_names_loopback_services_and_extra_hosts() {
        let listen: IpAddr = "0.0.0.0".parse().unwrap();
        let (ca, serving) = issue(listen, &["10.244.0.1".into(), "api.example".into()]).unwrap();
        for want in [
            "127.0.0.1",
            "10.244.0.1",
            "api.example",
            "kubernetes.default.svc",
        ] {
            assert!(
                verifies(&ca.cert_pem(), &serving.cert_pem, want),
                "{want} missing"
            );
        }
        assert!(!verifies(&ca.cert_pem(), &serving.cert_pem, "0.0.0.0"));
    }

    #[test]
    fn kubeconfig_names_the_server_and_ca() {
        let config = kubeconfig("https://127.0.0.1:6443", "PEM");
        assert!(config.contains("server: https://127.0.0.1:6443"));
        assert!(config.contains("certificate-authority-data: UEVN"));
    }
}
