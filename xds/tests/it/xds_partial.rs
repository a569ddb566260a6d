//! Requests begun and never finished: each is charged its declared
//! length from its length prefix on, against its namespace's budget and the process's, shown
//! in `marin3r_xds_request_bytes`, and must arrive whole within the request deadline. Before,
//! every stream could hold up to a request's size, uncounted, until the client left.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use marin3r_testkit::pki::Pki;
use marin3r_testkit::xds::client::{ClientTls, connect};
use marin3r_testkit::xds::partial::PartialStream;
use marin3r_testkit::xds::server::XdsServer;
use marin3r_xds::Limits;
use tonic::Code;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const WAIT: Duration = Duration::from_secs(10);
/// What each partial request declares, and sends of it.
const DECLARED: u32 = 200 << 10;
const SENT: usize = 100 << 10;
/// What each is charged: its prefix and its declared length.
const CHARGED: f64 = 5.0 + DECLARED as f64;

use super::xds_limits::{start, tls};

fn first_request() -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(Node {
            id: "node".into(),
            ..Default::default()
        }),
        type_url: CDS.into(),
        ..Default::default()
    }
}

/// A stream of `tls` on a new connection that begins a request it never finishes.
async fn partial(server: &XdsServer, tls: &ClientTls) -> PartialStream {
    let channel = connect(server.addr, tls).await.unwrap();
    let stream = PartialStream::open(channel, &first_request())
        .await
        .unwrap();
    // A refused stream may be reset before all of it is sent.
    let _ = stream.begin(DECLARED, SENT).await;
    stream
}

/// Waits until the server's `sample` is `want`.
async fn metric_reaches(server: &XdsServer, sample: &str, want: f64) {
    let reached = tokio::time::timeout(WAIT, async {
        while server.metric(sample) != want {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{sample} is {}, not {want}",
        server.metric(sample)
    );
}

fn refused(server: &XdsServer, limit: &str) -> f64 {
    server.metric(&format!(
        r#"marin3r_xds_refused_streams_total{{limit="{limit}"}}"#
    ))
}

#[test]
fn partial_requests_are_charged_to_their_namespace_until_its_budget_refuses_them() {
    let pki = Pki::new();
    // Room for five partial requests of 200 KiB in a namespace, not six.
    let server = start(
        &pki,
        Limits {
            max_subscription_bytes_per_namespace: 1 << 20,
            request_timeout: Duration::from_secs(60),
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    server.rt.block_on(async {
        let mut held = Vec::new();
        for _ in 0..5 {
            held.push(partial(&server, &a).await);
        }
        metric_reaches(&server, "marin3r_xds_request_bytes", 5.0 * CHARGED).await;
        let mut over = partial(&server, &a).await;
        let s = tokio::time::timeout(WAIT, over.status())
            .await
            .expect("the 6th partial request was held")
            .unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 1048576 bytes of resource names subscribed and requests being received \
             for this namespace (--xds-max-subscription-bytes-per-namespace)"
        );
        assert_eq!(server.metric("marin3r_xds_request_bytes"), 5.0 * CHARGED);
        // Another namespace has its own budget.
        let other = partial(&server, &b).await;
        metric_reaches(&server, "marin3r_xds_request_bytes", 6.0 * CHARGED).await;
        // Streams that go away give their bytes back.
        drop((held, other));
        metric_reaches(&server, "marin3r_xds_request_bytes", 0.0).await;
    });
    assert_eq!(refused(&server, "subscription_bytes_per_namespace"), 1.0);
}

#[test]
fn partial_requests_of_every_namespace_are_refused_past_the_process_budget() {
    let pki = Pki::new();
    // Each namespace has room for four, the process for three.
    let server = start(
        &pki,
        Limits {
            max_subscription_bytes_per_namespace: 1 << 20,
            max_process_bytes: 700 << 10,
            request_timeout: Duration::from_secs(60),
            ..Limits::default()
        },
    );
    let (a, b) = (tls(&pki, "team-a"), tls(&pki, "team-b"));
    server.rt.block_on(async {
        let a1 = partial(&server, &a).await;
        let a2 = partial(&server, &a).await;
        let b1 = partial(&server, &b).await;
        metric_reaches(&server, "marin3r_xds_request_bytes", 3.0 * CHARGED).await;
        let mut over = partial(&server, &b).await;
        let s = tokio::time::timeout(WAIT, over.status())
            .await
            .expect("the partial request over the process's budget was held")
            .unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(
            s.message(),
            "more than 716800 bytes of resource names subscribed and requests being received \
             for all namespaces together (--xds-max-process-bytes)"
        );
        // Room again once another namespace's stream leaves.
        drop(a1);
        metric_reaches(&server, "marin3r_xds_request_bytes", 2.0 * CHARGED).await;
        let _b2 = partial(&server, &b).await;
        metric_reaches(&server, "marin3r_xds_request_bytes", 3.0 * CHARGED).await;
        drop((a2, b1));
    });
    assert_eq!(refused(&server, "process_bytes"), 1.0);
}

#[test]
fn a_request_begun_and_not_finished_in_time_closes_its_stream() {
    let pki = Pki::new();
    let server = start(
        &pki,
        Limits {
            request_timeout: Duration::from_millis(500),
            ..Limits::default()
        },
    );
    let a = tls(&pki, "team-a");
    server.rt.block_on(async {
        let mut stream = partial(&server, &a).await;
        let s = tokio::time::timeout(WAIT, stream.status())
            .await
            .expect("the unfinished request was waited for past its deadline")
            .unwrap();
        assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
        assert_eq!(
            s.message(),
            "a discovery request not received whole within 500ms of its first bytes \
             (--xds-request-timeout)"
        );
        metric_reaches(&server, "marin3r_xds_request_bytes", 0.0).await;
    });
    assert_eq!(refused(&server, "request_timeout"), 1.0);
}
