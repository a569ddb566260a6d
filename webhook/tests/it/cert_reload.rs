//! The serving certificate is read from files and swapped when they change: kubelet's
//! `..data` symlink rename is seen by new connections, a mismatched pair is never served, and
//! a missing or bad pair fails the start with the path.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use marin3r_certs::{CertificateInfo, IssuedCertificate};
use marin3r_webhook::WebhookServerConfig;
use tokio::net::TcpListener;

use support::*;

async fn wait_for_serial(addr: SocketAddr, ca_pem: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let client = connect(addr, ca_pem, rustls::DEFAULT_VERSIONS).await;
        if client.peer_serial == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still serving {} instead of {want}",
            client.peer_serial
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn serial(cert: &IssuedCertificate) -> String {
    CertificateInfo::from_pem(&cert.cert_pem).unwrap().serial
}

#[tokio::test]
async fn a_swapped_certificate_is_served_to_new_connections() {
    let pki = support::pki();
    let first = pki.server_cert();
    let mut dir = SecretDir::new(&first);
    let server = Server::start(config(&dir)).await;
    let mut old_conn = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    assert_eq!(old_conn.peer_serial, serial(&first));

    let second = pki.server_cert();
    assert_ne!(serial(&first), serial(&second));
    dir.write(&second.cert_pem, &second.key_pem);
    wait_for_serial(server.addr, pki.ca_pem(), &serial(&second)).await;

    // A mismatched pair (new certificate, another key) is not served; the last good one stays.
    let third = pki.server_cert();
    dir.write(&third.cert_pem, &first.key_pem);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    assert_eq!(client.peer_serial, serial(&second));
    // ...until the pair is completed.
    dir.write(&third.cert_pem, &third.key_pem);
    wait_for_serial(server.addr, pki.ca_pem(), &serial(&third)).await;

    // Connections opened before keep working.
    let out = old_conn
        .review(&admission_review("uid-5", &real_looking_pod()))
        .await;
    assert_eq!(out["response"]["allowed"], true);
    server.stop().await;
}

#[tokio::test]
async fn a_missing_or_bad_certificate_fails_at_start_with_the_path() {
    let pki = support::pki();
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let missing = dir.path().join("tls.crt");
    let err = marin3r_webhook::serve(
        WebhookServerConfig::new(&missing, dir.path().join("tls.key")),
        listener,
        std::future::pending(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with(&format!("reading {}", missing.display())),
        "{err}"
    );

    let cert = pki.server_cert();
    let other = pki.server_cert();
    write(dir.path(), "tls.crt", &cert.cert_pem);
    write(dir.path(), "tls.key", &other.key_pem);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = marin3r_webhook::serve(
        WebhookServerConfig::new(dir.path().join("tls.crt"), dir.path().join("tls.key")),
        listener,
        std::future::pending(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("do not form a usable pair"), "{err}");
}

fn write(dir: &Path, name: &str, content: &str) {
    std::fs::write(dir.join(name), content).unwrap();
}
