//! The xDS server's limits over real mutual TLS with a plain ADS client: streams per
//! connection and per namespace, the first-request deadline, request size, and subscription
//! size in names and in bytes (per name, per stream and type, per namespace). A stream over a limit is closed with a status naming the limit and counted by limit;
//! other namespaces keep being served.

use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use marin3r_testkit::pki::Pki;
use marin3r_testkit::xds::client::{ClientTls, DeltaStream, SotwStream, connect};
use marin3r_testkit::xds::resources::eds_cluster;
use marin3r_testkit::xds::server::{XdsServer, snapshot};
use marin3r_xds::Limits;
use tonic::Code;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const RTDS: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";
const WAIT: Duration = Duration::from_secs(10);

/// A client of `namespace`'s certificate (also the partial-request tests').
pub(crate) fn tls(pki: &Pki, namespace: &str) -> ClientTls {
    let client = pki.client(Some(namespace));
    ClientTls {
        ca_pem: pki.ca_pem().to_owned(),
        identity: Some((client.cert_pem, client.key_pem)),
        server_name: "127.0.0.1".into(),
    }
}

/// A server under `limits` with a snapshot for `team-a` and `team-b`.
pub(crate) fn start(pki: &Pki, limits: Limits) -> XdsServer {
    let server = XdsServer::start_limited(pki, "127.0.0.1:0".parse().unwrap(), None, limits);
    for ns in ["team-a", "team-b"] {
        server
            .cache
            .set_snapshot(ns, "node", snapshot(vec![eds_cluster("backend")]));
    }
    server
}

/// Opens a SotW stream on `channel`, waits for its first clusters response and ACKs it.
async fn served(channel: tonic::transport::Channel) -> anyhow::Result<SotwStream> {
    let mut stream = SotwStream::open(channel, "node", None).await?;
    stream.subscribe(CDS, &[]).await?;
    let resp = tokio::time::timeout(WAIT, stream.recv()).await??;
    anyhow::ensure!(resp.resources.len() == 1, "{resp:?}");
    stream.ack(&resp, &[]).await?;
    Ok(stream)
}

/// The gRPC status an ADS call or stream ended with.
fn status(e: &anyhow::Error) -> &tonic::Status {
    e.downcast_ref::<tonic::Status>()
        .unwrap_or_else(|| panic!("not a gRPC status: {e:#}"))
}

fn refused(server: &XdsServer, limit: &str) -> f64 {
    server.metric(&format!(
        r#"marin3r_xds_refused_streams_total{{limit="{limit}"}}"#
    ))
}

#[test]
fn streams_beyond_the_per_connection_limit_are_refused() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_streams_per_connection: 3,
            ..Limits::default()
        },
    );
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(served(channel.clone()).await.unwrap());
        }
        let e = served(channel.clone()).await.err().expect("a 4th stream");
        let s = status(&e);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 3 ADS streams on one connection (--xds-max-streams-per-connection)"
        );
        // Another connection of the same namespace has its own count.
        let other = connect(server.addr, &tls).await.unwrap();
        served(other).await.unwrap();
        // A closed stream gives its place back.
        drop(open.pop());
        let again = tokio::time::timeout(WAIT, async {
            loop {
                match served(channel.clone()).await {
                    Ok(s) => break s,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
        .await;
        assert!(
            again.is_ok(),
            "the closed stream's place was not given back"
        );
    });
    assert!(refused(&server, "streams_per_connection") >= 1.0);
}

#[test]
fn one_namespace_at_its_limit_does_not_stop_another() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_streams_per_namespace: 2,
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    server.rt.block_on(async {
        // team-a uses its two streams over two connections; a third is refused.
        let mut a1 = served(connect(server.addr, &a).await.unwrap())
            .await
            .unwrap();
        let _a2 = served(connect(server.addr, &a).await.unwrap())
            .await
            .unwrap();
        let e = served(connect(server.addr, &a).await.unwrap())
            .await
            .err()
            .expect("a 3rd team-a stream");
        let s = status(&e);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 2 ADS streams for this namespace (--xds-max-streams-per-namespace)"
        );
        // team-b is served, and so are team-a's open streams: both get the next push.
        let mut b1 = served(connect(server.addr, &b).await.unwrap())
            .await
            .unwrap();
        let _b2 = served(connect(server.addr, &b).await.unwrap())
            .await
            .unwrap();
        server.cache.set_snapshot(
            "team-a",
            "node",
            snapshot(vec![eds_cluster("backend"), eds_cluster("new")]),
        );
        server
            .cache
            .set_snapshot("team-b", "node", snapshot(vec![eds_cluster("other")]));
        let pushed_a = tokio::time::timeout(WAIT, a1.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pushed_a.resources.len(), 2);
        let pushed_b = tokio::time::timeout(WAIT, b1.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pushed_b.resources.len(), 1);
    });
    assert_eq!(refused(&server, "streams_per_namespace"), 1.0);
}

/// A namespace's certificate holds at most so many connections, idle ones
/// included; a connection over the cap is closed after its handshake and counted, another
/// namespace is unaffected, and a closed connection gives its place back.
#[test]
fn connections_beyond_the_per_namespace_limit_are_refused() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_connections_per_namespace: 2,
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    let refused_connections = || {
        server
            .metric(r#"marin3r_xds_refused_connections_total{reason="connections_per_namespace"}"#)
    };
    server.rt.block_on(async {
        // Two team-a connections, served once to be sure they are in, then idle.
        let mut held = Vec::new();
        for _ in 0..2 {
            let channel = connect(server.addr, &a).await.unwrap();
            drop(served(channel.clone()).await.unwrap());
            held.push(channel);
        }
        // A third is closed before it is served (the client may see it at connect time or
        // at its first call).
        let third = match connect(server.addr, &a).await {
            Ok(channel) => served(channel).await.err(),
            Err(e) => Some(e),
        };
        assert!(third.is_some(), "a 3rd team-a connection was served");
        assert!(refused_connections() >= 1.0);
        // team-b has its own count.
        served(connect(server.addr, &b).await.unwrap())
            .await
            .unwrap();
        // Closing a team-a connection makes room for another.
        drop(held.pop());
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let attempt = match connect(server.addr, &a).await {
                Ok(channel) => served(channel).await.map(drop),
                Err(e) => Err(e),
            };
            if attempt.is_ok() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{attempt:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn a_stream_without_a_first_request_is_closed_after_the_deadline() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            first_request_timeout: Duration::from_millis(500),
            ..Limits::default()
        },
    );
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut silent = SotwStream::open(channel.clone(), "node", None)
            .await
            .unwrap();
        // A stream that asked in time is not affected by the deadline.
        let mut asked = served(channel).await.unwrap();
        let e = tokio::time::timeout(WAIT, silent.recv())
            .await
            .expect("the silent stream was kept open")
            .expect_err("a response to a stream that asked nothing");
        let s = status(&e);
        assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
        assert_eq!(
            s.message(),
            "no discovery request within 500ms of opening the stream (--xds-first-request-timeout)"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
        server
            .cache
            .set_snapshot("team-a", "node", snapshot(vec![eds_cluster("later")]));
        let pushed = tokio::time::timeout(WAIT, asked.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pushed.resources.len(), 1);
    });
    assert_eq!(refused(&server, "first_request_timeout"), 1.0);
}

#[test]
fn an_oversized_request_closes_its_stream() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_request_bytes: 4096,
            ..Limits::default()
        },
    );
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut stream = SotwStream::open(channel.clone(), "node", None)
            .await
            .unwrap();
        let names: Vec<String> = (0..1000).map(|i| format!("cluster-{i:05}")).collect();
        stream.subscribe(CDS, &names).await.unwrap();
        let e = tokio::time::timeout(WAIT, stream.recv())
            .await
            .unwrap()
            .expect_err("a response to an oversized request");
        let s = status(&e);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "a discovery request larger than 4096 bytes (--xds-max-request-bytes)"
        );
        // The connection is fine: the next stream on it is served.
        served(channel).await.unwrap();
    });
    assert_eq!(refused(&server, "request_size"), 1.0);
}

#[test]
fn a_delta_subscription_over_the_name_limit_closes_its_stream() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_names_per_type: 100,
            ..Limits::default()
        },
    );
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut stream = DeltaStream::open(channel, "node", None).await.unwrap();
        let batch = |from: usize| -> Vec<String> {
            (from..from + 60).map(|i| format!("layer-{i}")).collect()
        };
        stream
            .send(DeltaDiscoveryRequest {
                type_url: RTDS.into(),
                resource_names_subscribe: batch(0),
                ..Default::default()
            })
            .await
            .unwrap();
        let first = tokio::time::timeout(WAIT, stream.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.resources.len(), 60);
        // Within the limit one request at a time, over it in total.
        stream
            .send(DeltaDiscoveryRequest {
                type_url: RTDS.into(),
                response_nonce: first.nonce.clone(),
                resource_names_subscribe: batch(60),
                ..Default::default()
            })
            .await
            .unwrap();
        let e = tokio::time::timeout(WAIT, stream.recv())
            .await
            .unwrap()
            .expect_err("a response to a subscription over the limit");
        let s = status(&e);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 100 resource names of one type on one stream (--xds-max-names-per-type)"
        );
    });
    assert_eq!(refused(&server, "names_per_type"), 1.0);
}

/// Reads a stream's responses until it ends; the status it ended with.
async fn closed_with(stream: &mut DeltaStream) -> tonic::Status {
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            if let Err(e) = stream.recv().await {
                break e;
            }
        }
    })
    .await
    .expect("the stream was kept open");
    status(&ended).clone()
}

/// `count` distinct names of `len` bytes each, starting at `from`.
fn long_names(from: usize, count: usize, len: usize) -> Vec<String> {
    (from..from + count)
        .map(|i| format!("{i:08}-{}", "x".repeat(len - 9)))
        .collect()
}

/// Subscribes a delta stream of `tls` to `count` CDS names of 64 KiB, eight per request
/// (each request within the 1 MiB request limit), without reading the responses.
async fn subscribe_long_names(server: &XdsServer, tls: &ClientTls, count: usize) -> DeltaStream {
    let channel = connect(server.addr, tls).await.unwrap();
    let mut stream = DeltaStream::open(channel, "node", None).await.unwrap();
    for from in (0..count).step_by(8) {
        let names = long_names(from, 8.min(count - from), 64 << 10);
        let req = DeltaDiscoveryRequest {
            type_url: CDS.into(),
            resource_names_subscribe: names,
            ..Default::default()
        };
        if stream.send(req).await.is_err() {
            break;
        }
    }
    stream
}

#[test]
fn a_delta_subscription_over_its_bytes_closes_its_stream_and_no_other() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_name_bytes: 128 << 10,
            max_subscription_bytes_per_type: 1 << 20,
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    server.rt.block_on(async {
        let mut other = served(connect(server.addr, &b).await.unwrap())
            .await
            .unwrap();
        // 64 names of 64 KiB: 4 MiB, within the name count limit and each request's size.
        let mut stream = subscribe_long_names(&server, &a, 64).await;
        let s = closed_with(&mut stream).await;
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 1048576 bytes of resource names of one type on one stream \
             (--xds-max-subscription-bytes-per-type)"
        );
        server
            .cache
            .set_snapshot("team-b", "node", snapshot(vec![eds_cluster("other")]));
        let pushed = tokio::time::timeout(WAIT, other.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pushed.resources.len(), 1);
    });
    assert_eq!(refused(&server, "subscription_bytes_per_type"), 1.0);
}

#[test]
fn a_sotw_subscription_over_its_bytes_closes_its_stream() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_name_bytes: 128 << 10,
            max_subscription_bytes_per_type: 512 << 10,
            ..Limits::default()
        },
    );
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut stream = SotwStream::open(channel.clone(), "node", None)
            .await
            .unwrap();
        // 12 names of 64 KiB: 768 KiB, within the request limit, over the subscription's.
        stream
            .subscribe(CDS, &long_names(0, 12, 64 << 10))
            .await
            .unwrap();
        let e = tokio::time::timeout(WAIT, stream.recv())
            .await
            .unwrap()
            .expect_err("a response to a subscription over its bytes");
        let s = status(&e);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 524288 bytes of resource names of one type on one stream \
             (--xds-max-subscription-bytes-per-type)"
        );
        served(channel).await.unwrap();
    });
    assert_eq!(refused(&server, "subscription_bytes_per_type"), 1.0);
}

#[test]
fn a_name_over_the_length_limit_closes_its_stream() {
    let pki = Pki::new();
    let server = start(&pki, Limits::default());
    let tls = tls(&pki, "team-a");
    server.rt.block_on(async {
        let channel = connect(server.addr, &tls).await.unwrap();
        let mut stream = DeltaStream::open(channel, "node", None).await.unwrap();
        let req = DeltaDiscoveryRequest {
            type_url: RTDS.into(),
            resource_names_subscribe: long_names(0, 1, 4097),
            ..Default::default()
        };
        stream.send(req).await.unwrap();
        let s = closed_with(&mut stream).await;
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "a resource name or version longer than 4096 bytes (--xds-max-name-bytes)"
        );
    });
    assert_eq!(refused(&server, "name_size"), 1.0);
}

#[test]
fn one_namespace_over_its_subscription_bytes_does_not_stop_another() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            max_name_bytes: 128 << 10,
            max_subscription_bytes_per_namespace: 1 << 20,
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    server.rt.block_on(async {
        // Two streams of 512 KiB each fit; a third stream of the namespace does not.
        let mut first = subscribe_long_names(&server, &a, 7).await;
        tokio::time::timeout(WAIT, first.recv())
            .await
            .unwrap()
            .unwrap();
        let mut second = subscribe_long_names(&server, &a, 7).await;
        tokio::time::timeout(WAIT, second.recv())
            .await
            .unwrap()
            .unwrap();
        let mut third = subscribe_long_names(&server, &a, 7).await;
        let s = closed_with(&mut third).await;
        // The server's own accounting: two streams' names, not the refused one's.
        let kept = server.metric("marin3r_xds_subscription_bytes");
        assert!(
            (2.0 * 7.0 * 65536.0..=1048576.0).contains(&kept),
            "{kept} bytes kept"
        );
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 1048576 bytes of resource names subscribed and requests being received \
             for this namespace (--xds-max-subscription-bytes-per-namespace)"
        );
        // Another namespace has its own budget.
        let _b1 = subscribe_long_names(&server, &b, 7).await;
        let mut b2 = subscribe_long_names(&server, &b, 7).await;
        tokio::time::timeout(WAIT, b2.recv())
            .await
            .unwrap()
            .unwrap();
        // A closed stream gives its bytes back.
        drop(first);
        let again = tokio::time::timeout(WAIT, async {
            loop {
                let mut s = subscribe_long_names(&server, &a, 7).await;
                if s.recv().await.is_ok() {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let again = again.expect("the closed stream's bytes were not given back");
        drop((again, second, b2, _b1));
        let released = tokio::time::timeout(WAIT, async {
            while server.metric("marin3r_xds_subscription_bytes") > 0.0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(released.is_ok(), "closed streams kept their bytes");
    });
    assert!(refused(&server, "subscription_bytes_per_namespace") >= 1.0);
}
