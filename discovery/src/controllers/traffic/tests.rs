//! What a replica reads of its proxies' stats, and how it keeps it per step.

#![allow(clippy::unwrap_used)] // test code

use std::io::{Read, Write};

use super::*;

fn counters(requests: u64, errors_5xx: u64) -> Counters {
    Counters {
        requests,
        errors_5xx,
        ..Counters::default()
    }
}

fn at(version: &str, step: u32) -> Target {
    Target {
        version: version.into(),
        step,
        proxies: Vec::new(),
    }
}

fn key() -> ConfigKey {
    ("team-a".into(), "web".into())
}

#[test]
fn the_growth_since_the_step_began_is_summed_per_track() {
    let book = Book::default();
    let t = at("v2", 1);
    book.record(
        key(),
        &t,
        vec![
            ("10.0.0.1".into(), Track::Canary, Some(counters(100, 1))),
            ("10.0.0.2".into(), Track::Stable, Some(counters(500, 0))),
            ("10.0.0.3".into(), Track::Stable, None),
        ],
    );
    // The first read is the base: nothing grew yet.
    let first = book.traffic("team-a", "web", "v2", 1).unwrap();
    assert_eq!((first.canary.proxies, first.canary.requests), (1, 0));
    assert_eq!((first.stable.proxies, first.unread), (1, 1));
    book.record(
        key(),
        &t,
        vec![
            ("10.0.0.1".into(), Track::Canary, Some(counters(130, 31))),
            ("10.0.0.2".into(), Track::Stable, Some(counters(540, 0))),
            // Restarted: counts from zero.
            ("10.0.0.3".into(), Track::Stable, Some(counters(7, 0))),
        ],
    );
    let later = book.traffic("team-a", "web", "v2", 1).unwrap();
    assert_eq!((later.canary.requests, later.canary.errors_5xx), (30, 30));
    assert_eq!((later.stable.proxies, later.stable.requests), (2, 40));
    book.record(
        key(),
        &t,
        vec![("10.0.0.3".into(), Track::Stable, Some(counters(2, 0)))],
    );
    let restarted = book.traffic("team-a", "web", "v2", 1).unwrap();
    // .1 and .2 are gone (disconnected); .3 restarted again, from zero.
    assert_eq!(
        (restarted.canary.proxies, restarted.stable.requests),
        (0, 2)
    );
    // Another step or version: nothing yet, and its own base.
    assert_eq!(book.traffic("team-a", "web", "v2", 2), None);
    book.record(
        key(),
        &at("v2", 2),
        vec![("10.0.0.3".into(), Track::Canary, Some(counters(9, 0)))],
    );
    let next = book.traffic("team-a", "web", "v2", 2).unwrap();
    assert_eq!((next.canary.proxies, next.canary.requests), (1, 0));
    assert_eq!(book.traffic("team-a", "web", "v2", 1), None);
    book.retain(&BTreeSet::new());
    assert_eq!(book.traffic("team-a", "web", "v2", 2), None);
}

#[test]
fn a_new_step_is_read_at_once_and_then_every_period() {
    let book = Book::default();
    assert!(book.due(&key(), "v2", 1), "never read");
    book.record(key(), &at("v2", 1), Vec::new());
    assert!(!book.due(&key(), "v2", 1), "just read");
    assert!(book.due(&key(), "v2", 2), "a new step");
    assert!(book.due(&key(), "v3", 1), "a new version");
    if let Ok(mut steps) = book.steps.lock() {
        let b = steps.get_mut(&key()).unwrap();
        b.read_at = std::time::Instant::now().checked_sub(PERIOD).unwrap();
    }
    assert!(book.due(&key(), "v2", 1), "a period later");
}

#[test]
fn addresses_this_pod_must_not_read_are_refused() {
    assert_eq!(
        stats_address("10.1.2.3", None),
        Some("10.1.2.3:9902".parse().unwrap())
    );
    assert_eq!(
        stats_address("fd00::5", Some(15021)),
        Some("[fd00::5]:15021".parse().unwrap())
    );
    for refused in [
        "127.0.0.1",
        "::1",
        "0.0.0.0",
        "169.254.169.254",
        "fe80::1",
        "224.0.0.1",
        "pod-a",
    ] {
        assert_eq!(stats_address(refused, None), None, "{refused}");
    }
}

/// A server on loopback answering each connection with `answer` (after `delay`).
fn serve(answer: Vec<u8>, delay: Duration) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let answer = answer.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                std::thread::sleep(delay);
                let _ = conn.write_all(&answer);
            });
        }
    });
    addr
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .max_redirects(0)
        .proxy(None)
        .build()
        .into()
}

fn http(status: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn a_proxys_answer_is_read_within_bounds() {
    let body = "envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix=\"in\"} 12\n";
    let ok = serve(http("200 OK", "", body), Duration::ZERO);
    assert_eq!(read_one(&agent(), ok).unwrap().requests, 12);
    // Not followed: a redirect elsewhere (another pod, the API server) is a failed read.
    let elsewhere = format!("location: http://{ok}/stats/prometheus\r\n");
    let redirect = serve(http("302 Found", &elsewhere, ""), Duration::ZERO);
    assert!(read_one(&agent(), redirect).is_err());
    let limited = serve(http("429 Too Many Requests", "", ""), Duration::ZERO);
    assert!(read_one(&agent(), limited).unwrap_err().contains("429"));
    // More than a MiB: refused, not buffered.
    let huge = "#".repeat(usize::try_from(MAX_BODY).unwrap() + 10);
    let big = serve(http("200 OK", "", &huge), Duration::ZERO);
    assert!(read_one(&agent(), big).is_err());
    // Slower than the timeout: given up on in about that time.
    let slow = serve(http("200 OK", "", body), TIMEOUT + Duration::from_secs(2));
    let started = std::time::Instant::now();
    assert!(read_one(&agent(), slow).is_err());
    assert!(started.elapsed() < TIMEOUT + Duration::from_secs(1));
}
