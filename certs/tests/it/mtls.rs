//! Certificates from this crate complete a real mutual-TLS handshake (rustls, in memory), and a
//! client certificate from another CA is refused.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use marin3r_certs::{
    CertificateAuthority, CertificateRequest, IssuedCertificate, Usage, issue_self_signed,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca_pem: &str) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    roots
}

fn chain(issued: &IssuedCertificate) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let certs = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    (certs, key)
}

fn server_config(server: &IssuedCertificate, client_ca_pem: &str) -> Arc<ServerConfig> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_ca_pem)), provider())
            .build()
            .unwrap();
    let (certs, key) = chain(server);
    Arc::new(
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .unwrap(),
    )
}

fn client_config(client: &IssuedCertificate, server_ca_pem: &str) -> Arc<ClientConfig> {
    let (certs, key) = chain(client);
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(server_ca_pem))
            .with_client_auth_cert(certs, key)
            .unwrap(),
    )
}

/// Runs a handshake and one round trip of application data entirely in memory.
fn handshake(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> Result<(), rustls::Error> {
    let name = ServerName::try_from("marin3r.default.svc").unwrap();
    let mut client = ClientConnection::new(client, name)?;
    let mut server = ServerConnection::new(server)?;
    io::Write::write_all(&mut client.writer(), b"ping").unwrap();
    for _ in 0..20 {
        let mut buf = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut buf).unwrap();
        }
        let mut rd = buf.as_slice();
        while !rd.is_empty() {
            server.read_tls(&mut rd).unwrap();
        }
        server.process_new_packets()?;

        let mut buf = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut buf).unwrap();
        }
        let mut rd = buf.as_slice();
        while !rd.is_empty() {
            client.read_tls(&mut rd).unwrap();
        }
        client.process_new_packets()?;

        let mut got = [0u8; 4];
        if !server.is_handshaking()
            && !client.is_handshaking()
            && io::Read::read_exact(&mut server.reader(), &mut got).is_ok()
        {
            assert_eq!(&got, b"ping");
            assert!(server.peer_certificates().is_some_and(|c| !c.is_empty()));
            return Ok(());
        }
    }
    panic!("handshake did not finish");
}

fn pki() -> (IssuedCertificate, IssuedCertificate, IssuedCertificate) {
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca", day)).unwrap();
    let signer = CertificateAuthority::from_issued(&ca).unwrap();
    let server = signer
        .issue(
            &CertificateRequest::new("marin3r", Usage::Server, day)
                .with_hosts(["marin3r", "marin3r.default.svc"]),
        )
        .unwrap();
    let client = signer
        .issue(
            &CertificateRequest::new("envoy", Usage::Client, day)
                .with_hosts(["spiffe://cluster.local/ns/default"]),
        )
        .unwrap();
    (ca, server, client)
}

#[test]
fn server_and_client_from_one_ca_complete_mutual_tls() {
    let (ca, server, client) = pki();
    handshake(
        server_config(&server, &ca.cert_pem),
        client_config(&client, &ca.cert_pem),
    )
    .unwrap();
}

#[test]
fn client_certificate_from_another_ca_is_refused() {
    let (ca, server, _) = pki();
    let (_, _, stranger) = pki();
    let err = handshake(
        server_config(&server, &ca.cert_pem),
        client_config(&stranger, &ca.cert_pem),
    )
    .unwrap_err();
    assert!(
        matches!(err, rustls::Error::InvalidCertificate(_)),
        "unexpected error: {err:?}"
    );
}

#[test]
fn client_refuses_a_server_from_another_ca() {
    let (ca, _, client) = pki();
    let (_, stranger_server, _) = pki();
    let err = handshake(
        server_config(&stranger_server, &ca.cert_pem),
        client_config(&client, &ca.cert_pem),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
        ),
        "unexpected error: {err:?}"
    );
}

#[test]
fn a_client_certificate_cannot_serve() {
    // A clientAuth-only certificate for the right name lacks serverAuth, so a client
    // refuses it as a server.
    let (ca, _, client) = pki();
    let signer = CertificateAuthority::from_issued(&ca).unwrap();
    let wrong_usage = signer
        .issue(
            &CertificateRequest::new("marin3r", Usage::Client, Duration::from_secs(60))
                .with_hosts(["marin3r.default.svc"]),
        )
        .unwrap();
    let err = handshake(
        server_config(&wrong_usage, &ca.cert_pem),
        client_config(&client, &ca.cert_pem),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
        ),
        "unexpected error: {err:?}"
    );
}
