//! Every admission comes from the API server's one address, over a few HTTP/2 connections. One
//! tenant flooding EnvoyConfig writes whose judging is slow (Envoy on a config that takes
//! seconds) must hold up neither another tenant's pod admissions nor its EnvoyConfig
//! validations: injections have their own capacity, validations take turns by namespace, and
//! the flooding tenant's excess is refused at once (429) instead of filling the address's
//! request share.

use crate::support;

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use marin3r_webhook::server::{MUTATE_PATH, VALIDATE_ENVOY_CONFIG_PATH};
use marin3r_webhook::{EnvoyConfigValidator, WebhookServerConfig};
use serde_json::json;

use support::*;

const API_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// How long judging one of the flooding tenant's configs takes.
const SLOW_JUDGE: Duration = Duration::from_secs(5);
const FLOOD: usize = 300;
/// Longer than an admission takes on a loaded machine (1.3 s seen with the whole suite
/// running), shorter than being held up: waiting for a slot a flooding judgment holds takes
/// `SLOW_JUDGE`, and a validation that waited its turn in vain is refused (429), not allowed.
const NOT_HELD_UP: Duration = Duration::from_millis(2_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_slow_validations_holds_up_no_other_tenants_admissions() {
    let pki = support::pki();
    let dir = SecretDir::new(&pki.server_cert());
    let validator = EnvoyConfigValidator::new(|namespace, _| {
        if namespace == "team-a" {
            std::thread::sleep(SLOW_JUDGE);
        }
        Vec::new()
    });
    // Every limit at its default.
    let server = Server::start(WebhookServerConfig {
        envoy_config_validator: Some(validator),
        ..config(&dir)
    })
    .await;
    let mut connections = Vec::new();
    for _ in 0..10 {
        connections.push(h2_client(API_SERVER, server.addr, pki.ca_pem()).await);
    }
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let send = connections[i % connections.len()].clone();
            let review = envoy_config_review(&format!("flood-{i}"), "team-a");
            tokio::spawn(async move { h2_post(&send, VALIDATE_ENVOY_CONFIG_PATH, &review).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Another tenant's pod, then its EnvoyConfig, from the same address.
    let api = h2_client(API_SERVER, server.addr, pki.ca_pem()).await;
    let started = Instant::now();
    let pod = admission_review("uid-pod", &real_looking_pod());
    let (status, out) = h2_post(&api, MUTATE_PATH, &pod).await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        (status, &out["response"]["allowed"]),
        (200, &json!(true)),
        "{out}"
    );
    assert!(took < NOT_HELD_UP, "the pod review took {took:?}");
    let started = Instant::now();
    let config = envoy_config_review("uid-team-b", "team-b");
    let (status, out) = h2_post(&api, VALIDATE_ENVOY_CONFIG_PATH, &config)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(
        (status, &out["response"]["allowed"]),
        (200, &json!(true)),
        "{out}"
    );
    assert!(took < NOT_HELD_UP, "team-b's validation took {took:?}");

    // The flooding tenant's own writes: a few judged, the rest refused with 429, every one
    // answered (in the first burst, some may have found the address's request share full).
    let (mut judged, mut throttled) = (0, 0);
    for task in flood {
        let (status, out) = tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .expect("a flooding validation was never answered")
            .unwrap()
            .unwrap();
        if status == 429 {
            throttled += 1;
            continue;
        }
        assert_eq!(status, 200, "{out}");
        match out["response"]["status"]["code"].as_u64() {
            None => {
                assert_eq!(out["response"]["allowed"], true, "{out}");
                judged += 1;
            }
            Some(429) => {
                assert_eq!(out["response"]["allowed"], false);
                let message = out["response"]["status"]["message"].as_str().unwrap();
                assert!(
                    message.contains("team-a") || message.contains("waited"),
                    "{message}"
                );
                throttled += 1;
            }
            Some(other) => panic!("code {other}: {out}"),
        }
    }
    assert_eq!(judged + throttled, FLOOD);
    assert!(
        judged >= 1 && throttled >= FLOOD - 10,
        "{judged} judged, {throttled} refused"
    );
    server.stop().await;
}
