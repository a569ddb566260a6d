//! Slow and idle clients cannot stall admissions: a trickled body holds no review permit and
//! gets 408 after the body deadline; idle connections (HTTP/1 keep-alive, HTTP/2 after its
//! preface, TLS with nothing after it) give their slot up after the idle timeout, and soon
//! (a tenth of the body deadline after they last did anything) when a new connection needs it. One client address holding slow requests on many HTTP/2
//! connections takes at most its own share of connections and requests: the API server's
//! calls from another address are answered at once. With `failurePolicy: Fail`, a stalled
//! webhook would block pod creation in every enabled namespace.

use crate::support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use marin3r_testkit::webhook::{self, SlowH2, TlsClient};
use marin3r_webhook::WebhookServerConfig;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use support::*;

/// The HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads until the server closes the connection; returns what it sent. Panics when it is
/// still open after `within`.
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin), within: Duration) -> Vec<u8> {
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server kept the connection open for {within:?}; it sent {:?}",
        String::from_utf8_lossy(&out)
    );
    out
}

#[tokio::test]
async fn a_trickled_body_holds_no_permit_and_gets_408_after_the_body_deadline() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_in_flight: 2,
        body_timeout: Duration::from_secs(2),
        ..config(&dir)
    })
    .await;
    // As many stalled requests as there are review permits: headers and part of the body.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = tls_stream(server.addr, pki.ca_pem(), &[b"http/1.1"]).await;
        s.write_all(
            format!(
                "POST /pod-v1-mutate HTTP/1.1\r\nhost: {HOST}\r\ncontent-type: application/json\r\n\
                 content-length: 100000\r\n\r\n{{\"apiVersion\":"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        s.flush().await.unwrap();
        stalled.push(s);
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    let out = tokio::time::timeout(
        Duration::from_secs(1),
        client.review(&admission_review("uid-slow", &real_looking_pod())),
    )
    .await
    .expect("a real review waited behind clients that trickle their bodies");
    assert_eq!(out["response"]["uid"], "uid-slow");
    assert_eq!(out["response"]["allowed"], true);

    for mut s in stalled {
        let sent = read_until_closed(&mut s, Duration::from_secs(5)).await;
        let sent = String::from_utf8_lossy(&sent);
        assert!(sent.starts_with("HTTP/1.1 408 "), "{sent}");
        assert!(
            sent.ends_with("the body did not arrive within 2s\n"),
            "{sent}"
        );
    }
    // Not before the deadline (less some slack for the 200 ms head start).
    assert!(started.elapsed() >= Duration::from_millis(1700));
    server.stop().await;
}

#[tokio::test]
async fn idle_connections_give_their_slots_up_to_a_new_connection() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_connections: 3,
        // Long: the slots must come free because a new connection needs them, not by timeout.
        idle_timeout: Duration::from_secs(60),
        ..config(&dir)
    })
    .await;
    // Fill every slot: an HTTP/2 connection that sent its preface, one that finished TLS and
    // sent nothing, and an HTTP/1.1 keep-alive connection after one answered request.
    let mut h2 = tls_stream(server.addr, pki.ca_pem(), &[b"h2"]).await;
    h2.write_all(H2_PREFACE).await.unwrap();
    h2.flush().await.unwrap();
    let mut silent = tls_stream(server.addr, pki.ca_pem(), &[b"h2"]).await;
    let mut keep_alive = tls_stream(server.addr, pki.ca_pem(), &[b"http/1.1"]).await;
    keep_alive
        .write_all(format!("GET /healthz HTTP/1.1\r\nhost: {HOST}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = keep_alive.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 "));
    tokio::time::sleep(Duration::from_millis(200)).await;

    let answered = tokio::time::timeout(Duration::from_secs(3), async {
        let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
        client
            .review(&admission_review("uid-idle", &real_looking_pod()))
            .await
    })
    .await
    .expect("a new connection waited behind idle ones");
    assert_eq!(answered["response"]["uid"], "uid-idle");

    // The idle connections were closed to make room.
    for stream in [&mut h2, &mut silent] {
        read_until_closed(stream, Duration::from_secs(3)).await;
    }
    read_until_closed(&mut keep_alive, Duration::from_secs(3)).await;
    server.stop().await;
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        idle_timeout: Duration::from_millis(500),
        ..config(&dir)
    })
    .await;
    let mut h2 = tls_stream(server.addr, pki.ca_pem(), &[b"h2"]).await;
    h2.write_all(H2_PREFACE).await.unwrap();
    h2.flush().await.unwrap();
    let mut silent = tls_stream(server.addr, pki.ca_pem(), &[b"http/1.1"]).await;
    let started = Instant::now();
    read_until_closed(&mut h2, Duration::from_secs(3)).await;
    read_until_closed(&mut silent, Duration::from_secs(3)).await;
    assert!(started.elapsed() >= Duration::from_millis(400));

    // A connection in use is not idle: an HTTP/1.1 client asking every 300 ms keeps it.
    let mut client = connect(server.addr, pki.ca_pem(), rustls::DEFAULT_VERSIONS).await;
    for i in 0..4 {
        let out = client
            .review(&admission_review(&format!("uid-{i}"), &real_looking_pod()))
            .await;
        assert_eq!(out["response"]["allowed"], true);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    server.stop().await;
}

/// The attacker's address and the API server's.
const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// An HTTP/2 connection from `from`, or None when the server closes it first.
async fn h2_from(from: IpAddr, addr: SocketAddr, ca_pem: &str) -> Option<SlowH2> {
    let tls = TlsClient::new(ca_pem, HOST, &[b"h2"]).unwrap();
    webhook::h2_from(&tls, Some(from), addr).await.ok()
}

/// Starts a review whose body never ends; the task yields its status, if it gets one.
fn slow_review(send: &mut SlowH2) -> tokio::task::JoinHandle<Option<u16>> {
    webhook::slow_review(send, HOST)
}

/// A valid review from the API server's address, answered within a second.
async fn review_in_time(addr: SocketAddr, ca_pem: &str, uid: &str) {
    let answered = tokio::time::timeout(Duration::from_secs(1), async {
        let mut client =
            connect_from(Some(API_SERVER), addr, ca_pem, rustls::DEFAULT_VERSIONS).await;
        client
            .review(&admission_review(uid, &real_looking_pod()))
            .await
    })
    .await
    .expect("a valid review waited behind another address's slow requests");
    assert_eq!(answered["response"]["uid"], uid);
    assert_eq!(answered["response"]["allowed"], true);
}

#[tokio::test]
async fn slow_requests_on_many_connections_from_one_address_do_not_starve_another() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_connections: 8,
        max_connections_per_address: 4,
        ..config(&dir)
    })
    .await;
    // Twice as many connections as there are slots, each always busy with a slow body: never
    // idle, so none gives its slot up.
    let mut attack = Vec::new();
    for _ in 0..16 {
        if let Some(mut send) = h2_from(ATTACKER, server.addr, pki.ca_pem()).await {
            let pending = slow_review(&mut send);
            attack.push((send, pending));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        attack.iter().filter(|(s, _)| !s.is_closed()).count() <= 4,
        "one address kept more connections than its share"
    );
    review_in_time(server.addr, pki.ca_pem(), "uid-starved").await;
    server.stop().await;
}

#[tokio::test]
async fn requests_over_the_per_address_limit_are_refused_at_once() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_requests_per_address: 2,
        ..config(&dir)
    })
    .await;
    let mut send = h2_from(ATTACKER, server.addr, pki.ca_pem()).await.unwrap();
    let _slow = [slow_review(&mut send), slow_review(&mut send)];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = tokio::time::timeout(Duration::from_secs(1), slow_review(&mut send))
        .await
        .expect("a request over the address's limit waited")
        .unwrap();
    assert_eq!(third, Some(429));
    review_in_time(server.addr, pki.ca_pem(), "uid-other-address").await;
    server.stop().await;
}

#[tokio::test]
async fn stalled_connections_from_several_addresses_make_room_for_a_new_one() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_connections: 8,
        max_connections_per_address: 4,
        // Stalled after a tenth of it: 200 ms without a request finished.
        body_timeout: Duration::from_secs(2),
        ..config(&dir)
    })
    .await;
    // Three addresses within their shares, together more than every slot, each connection
    // busy with a body that never ends.
    let mut attack = Vec::new();
    for last in [1, 3, 4] {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
        for _ in 0..4 {
            if let Some(mut send) = h2_from(from, server.addr, pki.ca_pem()).await {
                let pending = slow_review(&mut send);
                attack.push((send, pending));
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    review_in_time(server.addr, pki.ca_pem(), "uid-several").await;
    server.stop().await;
}

/// A connection just accepted has not had time to send its first request: it is not idle to
/// a connection waiting for its slot. The local API server opens one connection per call;
/// while attackers kept every slot wanted, one was closed between its handshake and its
/// request, and the pod creation failed (found by the tenants e2e test).
#[tokio::test]
async fn a_new_connection_keeps_its_slot_for_its_first_request() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let server = Server::start(WebhookServerConfig {
        max_connections: 1,
        idle_timeout: Duration::from_secs(60),
        ..config(&dir)
    })
    .await;
    let mut api = connect_from(
        Some(API_SERVER),
        server.addr,
        pki.ca_pem(),
        rustls::DEFAULT_VERSIONS,
    )
    .await;
    // Another address's connection now waits for the only slot, and the request comes a
    // moment after the handshake.
    let (addr, ca_pem) = (server.addr, pki.ca_pem().to_owned());
    let waiting =
        tokio::spawn(async move { try_tls_stream(Some(ATTACKER), addr, &ca_pem, &[]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answered = tokio::time::timeout(
        Duration::from_secs(2),
        api.review(&admission_review("uid-first", &real_looking_pod())),
    )
    .await
    .expect("the review was not answered");
    assert_eq!(answered["response"]["uid"], "uid-first");
    // Once the connection has been idle for a while, the waiting one gets its slot.
    let waited = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiting connection never got the slot");
    assert!(waited.unwrap().is_ok());
    server.stop().await;
}

/// A connection from `from` kept busy with a body that never ends, and made again 100 ms
/// after the server drops it: while there are more than slots, one always waits for a slot.
async fn keep_pressing(from: IpAddr, addr: SocketAddr, ca_pem: String) {
    loop {
        if let Some(mut send) = h2_from(from, addr, &ca_pem).await {
            let _ = slow_review(&mut send).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A review whose decision takes two seconds (Envoy judging a large config) is in flight with
/// its body read in full: under the pressure of slow-body connections from several addresses,
/// it is answered, not dropped as stalled (the stall rule counted
/// slow decisions as stalled requests, and the API server's review failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowly_decided_review_is_answered_under_slow_body_pressure() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let validator = marin3r_webhook::EnvoyConfigValidator::new(|_, _| {
        std::thread::sleep(Duration::from_secs(2));
        Vec::new()
    });
    let server = Server::start(WebhookServerConfig {
        max_connections: 8,
        max_connections_per_address: 4,
        // Stalled 200 ms after its headers if its body has not arrived.
        body_timeout: Duration::from_secs(2),
        envoy_config_validator: Some(validator),
        ..config(&dir)
    })
    .await;
    let attack: Vec<_> = [1, 3, 4]
        .into_iter()
        .flat_map(|last| std::iter::repeat_n(last, 4))
        .map(|last| {
            let from = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
            tokio::spawn(keep_pressing(from, server.addr, pki.ca_pem().to_owned()))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..2 {
        let started = Instant::now();
        let answered = tokio::time::timeout(Duration::from_secs(8), async {
            let api = h2_client(API_SERVER, server.addr, pki.ca_pem()).await;
            let review = envoy_config_review(&format!("uid-slow-{i}"), "shop");
            h2_post(
                &api,
                marin3r_webhook::server::VALIDATE_ENVOY_CONFIG_PATH,
                &review,
            )
            .await
        })
        .await
        .expect("the slow review was never answered");
        let (status, out) = answered.expect("the slow review's connection was dropped");
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["response"]["allowed"], true, "{out}");
        assert!(started.elapsed() >= Duration::from_secs(2));
    }
    for task in attack {
        task.abort();
    }
    server.stop().await;
}
