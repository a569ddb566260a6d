//! The xDS server with a plain ADS client over real mutual TLS: who gets refused (and counted),
//! the newest-only push after a slow ACK, a first request without node id, health endpoints,
//! graceful shutdown, and how a NACK is tallied over the proxies of a node.

use std::time::Duration;

use marin3r_certs::{
    CertificateAuthority, CertificateRequest, IssuedCertificate, Usage, issue_self_signed,
};
use marin3r_testkit::pki::Pki;
use marin3r_testkit::xds::client::{ClientTls, SotwStream, connect, connect_from};
use marin3r_testkit::xds::resources::eds_cluster;
use marin3r_testkit::xds::server::{XdsServer, snapshot};
use marin3r_xds::resource::ResourceType;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

fn tls(pki: &Pki, client: Option<&IssuedCertificate>) -> ClientTls {
    ClientTls {
        ca_pem: pki.ca_pem().to_owned(),
        identity: client.map(|c| (c.cert_pem.clone(), c.key_pem.clone())),
        server_name: "127.0.0.1".into(),
    }
}

/// Connects, subscribes to clusters and waits for the first response.
async fn first_response(
    server: &XdsServer,
    tls: &ClientTls,
    node: &str,
) -> anyhow::Result<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse> {
    let session = async {
        let channel = connect(server.addr, tls).await?;
        let mut stream = SotwStream::open(channel, node, None).await?;
        stream.subscribe(CDS, &[]).await?;
        stream.recv().await
    };
    tokio::time::timeout(Duration::from_secs(10), session).await?
}

#[test]
fn clients_without_a_valid_namespace_certificate_are_refused() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    server
        .cache
        .set_snapshot("team-a", "node", snapshot(vec![eds_cluster("backend")]));
    let day = Duration::from_secs(86_400);
    let other_ca = issue_self_signed(&CertificateRequest::ca("other-ca", day)).unwrap();
    let other_ca = CertificateAuthority::from_issued(&other_ca).unwrap();
    let foreign = other_ca
        .issue(
            &CertificateRequest::new("envoy", Usage::Client, day)
                .with_hosts(["spiffe://cluster.local/ns/team-a"]),
        )
        .unwrap();
    let no_spiffe = pki.client(None);
    let good = pki.client(Some("team-a"));

    server.rt.block_on(async {
        for (what, client) in [
            ("no client certificate", None),
            ("a certificate from another CA", Some(&foreign)),
            ("a certificate without a namespace URI", Some(&no_spiffe)),
        ] {
            let r = first_response(&server, &tls(&pki, client), "node").await;
            assert!(r.is_err(), "a client with {what} got a response: {r:?}");
        }
        let ok = first_response(&server, &tls(&pki, Some(&good)), "node")
            .await
            .unwrap();
        assert_eq!(ok.resources.len(), 1);
        assert_eq!(ok.type_url, CDS);
    });
    for reason in [
        "no_client_certificate",
        "untrusted_client_certificate",
        "no_namespace_identity",
    ] {
        let sample = format!(r#"marin3r_xds_refused_connections_total{{reason="{reason}"}}"#);
        // tonic may retry a refused handshake: at least one refusal per reason.
        assert!(server.metric(&sample) >= 1.0, "{sample}");
    }
}

/// One holder of the namespace's certificate opening streams that each
/// claim another pod is one proxy in the NACK tally, not one per claimed pod; another
/// address is another proxy.
#[test]
fn streams_claiming_other_pods_from_one_address_are_one_proxy_in_the_nack_tally() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    server
        .cache
        .set_snapshot("ns", "node", snapshot(vec![eds_cluster("backend")]));
    let client = tls(&pki, Some(&pki.client(Some("ns"))));
    let streams = server.rt.block_on(async {
        // Three ACKing streams from 127.0.0.1, each naming its own pod.
        let mut acking = Vec::new();
        for pod in ["web-1", "web-2", "web-3"] {
            let channel = connect(server.addr, &client).await.unwrap();
            let mut stream = SotwStream::open(channel, "node", Some(pod)).await.unwrap();
            stream.subscribe(CDS, &[]).await.unwrap();
            let resp = stream.recv().await.unwrap();
            stream.ack(&resp, &[]).await.unwrap();
            acking.push(stream);
        }
        // A proxy at another address rejects the version.
        let from = std::net::IpAddr::from([127, 0, 0, 2]);
        let channel = connect_from(server.addr, &client, Some(from))
            .await
            .unwrap();
        let mut real = SotwStream::open(channel, "node", Some("web-4"))
            .await
            .unwrap();
        real.subscribe(CDS, &[]).await.unwrap();
        let resp = real.recv().await.unwrap();
        real.send(CDS, &[], "", &resp.nonce, Some("bad cluster"))
            .await
            .unwrap();
        (acking, real)
    });
    let event = server
        .next_nack(Duration::from_secs(10))
        .expect("a NACK event");
    drop(streams);
    assert_eq!(event.pod_name.as_deref(), Some("web-4"));
    assert_eq!((event.rejecting, event.connected), (1, 2));
}

#[test]
fn a_slow_ack_gets_only_the_newest_snapshot_and_does_not_hold_up_others() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    // Every generation has a different cluster, so a different clusters version.
    let mk = |i: u16| snapshot(vec![eds_cluster(&format!("cluster-{i}"))]);
    server.cache.set_snapshot("ns", "slow", mk(0));
    server.cache.set_snapshot("ns", "fast", mk(0));
    let client = tls(&pki, Some(&pki.client(Some("ns"))));
    server.rt.block_on(async {
        let mut slow = SotwStream::open(connect(server.addr, &client).await.unwrap(), "slow", None)
            .await
            .unwrap();
        slow.subscribe(CDS, &[]).await.unwrap();
        let first = slow.recv().await.unwrap();
        let mut fast = SotwStream::open(connect(server.addr, &client).await.unwrap(), "fast", None)
            .await
            .unwrap();
        fast.subscribe(CDS, &[]).await.unwrap();
        let mut last = fast.recv().await.unwrap();
        // While "slow" sits on its first response, four new snapshots come for both.
        for i in 1..=4 {
            server.cache.set_snapshot("ns", "slow", mk(i));
            server.cache.set_snapshot("ns", "fast", mk(i));
            fast.ack(&last, &[]).await.unwrap();
            last = tokio::time::timeout(Duration::from_secs(5), fast.recv())
                .await
                .expect("the fast stream was held up")
                .unwrap();
            assert_eq!(last.version_info, mk(i).version(ResourceType::Cluster));
        }
        // The slow stream's ACK brings the newest version, not the ones in between.
        slow.ack(&first, &[]).await.unwrap();
        let next = slow.recv().await.unwrap();
        assert_eq!(next.version_info, mk(4).version(ResourceType::Cluster));
        assert_ne!(next.nonce, first.nonce);
    });
}

#[test]
fn a_stream_without_node_id_is_refused_with_a_clear_status() {
    let pki = Pki::new();
    let server = XdsServer::start(&pki);
    let client = tls(&pki, Some(&pki.client(Some("ns"))));
    let err = server.rt.block_on(async {
        let mut s = SotwStream::open(connect(server.addr, &client).await.unwrap(), "", None)
            .await
            .unwrap();
        s.subscribe(CDS, &[]).await.unwrap();
        s.recv().await.unwrap_err()
    });
    let status = err.downcast_ref::<tonic::Status>().unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("node.id"), "{status}");
}

#[test]
fn graceful_shutdown_ends_streams_and_stops_accepting() {
    let pki = Pki::new();
    let mut server = XdsServer::start(&pki);
    assert_eq!(server.http("/healthz"), "ok\n");
    assert_eq!(server.http("/readyz"), "ready\n");
    server
        .cache
        .set_snapshot("ns", "n", snapshot(vec![eds_cluster("c")]));
    let client = tls(&pki, Some(&pki.client(Some("ns"))));
    let mut stream = server.rt.block_on(async {
        let mut s = SotwStream::open(connect(server.addr, &client).await.unwrap(), "n", None)
            .await
            .unwrap();
        s.subscribe(CDS, &[]).await.unwrap();
        s.recv().await.unwrap();
        s
    });
    assert_eq!(
        server.metric(r#"marin3r_xds_connected_proxies{protocol="sotw"}"#),
        1.0
    );
    let took = server.shutdown();
    assert!(took < Duration::from_secs(5), "shutdown took {took:?}");
    server.rt.block_on(async {
        let end = tokio::time::timeout(Duration::from_secs(5), stream.recv())
            .await
            .expect("the stream was not ended");
        assert!(end.is_err(), "{end:?}");
        assert!(
            tokio::time::timeout(
                Duration::from_secs(5),
                first_response(&server, &client, "n")
            )
            .await
            .map(|r| r.is_err())
            .unwrap_or(true),
            "a new connection was accepted after shutdown"
        );
    });
    assert!(server.http("/readyz").contains("not accepting"));
    assert!(server.sync_status().proxies.is_empty());
}

/// The serial of the certificate the server presents to a new connection.
async fn server_certificate_serial(
    server: &XdsServer,
    pki: &Pki,
    client: &IssuedCertificate,
) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem().as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    marin3r_certs::CertificateInfo::from_der(&der)
        .unwrap()
        .serial
}

#[test]
fn renewed_server_certificate_files_are_used_without_a_restart() {
    let pki = Pki::new();
    let server = XdsServer::start_with(
        &pki,
        "127.0.0.1:0".parse().unwrap(),
        Some(Duration::from_millis(100)),
    );
    let client = pki.client(Some("ns"));
    let serial = |cert: &IssuedCertificate| {
        marin3r_certs::CertificateInfo::from_pem(&cert.cert_pem)
            .unwrap()
            .serial
    };
    let first = server
        .rt
        .block_on(server_certificate_serial(&server, &pki, &client));
    assert_eq!(first, serial(&pki.server));

    let renewed = pki
        .ca
        .issue(
            &CertificateRequest::new("marin3r", Usage::Server, Duration::from_secs(3600))
                .with_hosts(["127.0.0.1"]),
        )
        .unwrap();
    // Written one file after the other: the server must ride out the mismatched pair.
    std::fs::write(server.tls_dir().join("tls.key"), &renewed.key_pem).unwrap();
    std::fs::write(server.tls_dir().join("tls.crt"), &renewed.cert_pem).unwrap();
    marin3r_testkit::wait::until_sync(
        "the renewed server certificate",
        Duration::from_secs(10),
        || {
            let now = server
                .rt
                .block_on(server_certificate_serial(&server, &pki, &client));
            (now == serial(&renewed)).then_some(())
        },
    );
}

/// A proxy moving to another replica (two servers sharing nothing but the snapshot content,
/// built separately) with what it has gets no resend: versions are content hashes, the same
/// on both. SotW: its version_info of a wildcard type (no response at all); delta: its
/// initial_resource_versions (one empty response).
/// A change on the new replica still reaches it.
#[test]
fn a_proxy_moving_to_another_replica_with_the_current_versions_gets_no_resend() {
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use marin3r_testkit::xds::client::DeltaStream;

    let pki = Pki::new();
    let a = XdsServer::start(&pki);
    let b = XdsServer::start(&pki);
    let content = || snapshot(vec![eds_cluster("backend"), eds_cluster("other")]);
    a.cache.set_snapshot("ns", "node", content());
    b.cache.set_snapshot("ns", "node", content());
    let client = tls(&pki, Some(&pki.client(Some("ns"))));
    let quiet = Duration::from_secs(2);
    a.rt.block_on(async {
        // SotW: what it got from a...
        let mut on_a = SotwStream::open(connect(a.addr, &client).await.unwrap(), "node", None)
            .await
            .unwrap();
        on_a.subscribe(CDS, &[]).await.unwrap();
        let got = on_a.recv().await.unwrap();
        on_a.ack(&got, &[]).await.unwrap();
        assert_eq!(got.resources.len(), 2);
        // ...it tells b on its first request (no nonce: a new stream): nothing comes.
        let mut on_b = SotwStream::open(connect(b.addr, &client).await.unwrap(), "node", None)
            .await
            .unwrap();
        on_b.send(CDS, &[], &got.version_info, "", None)
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(quiet, on_b.recv()).await.is_err(),
            "b resent what the proxy has"
        );
        // A change on b reaches it.
        let changed = snapshot(vec![eds_cluster("backend"), eds_cluster("third")]);
        let version = changed.version(ResourceType::Cluster).to_owned();
        b.cache.set_snapshot("ns", "node", changed);
        let pushed = tokio::time::timeout(Duration::from_secs(5), on_b.recv())
            .await
            .expect("the change on b")
            .unwrap();
        assert_eq!(pushed.version_info, version);
        b.cache.set_snapshot("ns", "node", content());
        on_b.ack(&pushed, &[]).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), on_b.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back.version_info, got.version_info);

        // Delta: the resource versions it got from a, given to b, bring nothing.
        let mut delta_a = DeltaStream::open(connect(a.addr, &client).await.unwrap(), "node", None)
            .await
            .unwrap();
        delta_a
            .send(DeltaDiscoveryRequest {
                type_url: CDS.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        let got = delta_a.recv().await.unwrap();
        delta_a.ack(&got).await.unwrap();
        assert_eq!(got.resources.len(), 2);
        let versions = got
            .resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone()))
            .collect();
        let mut delta_b = DeltaStream::open(connect(b.addr, &client).await.unwrap(), "node", None)
            .await
            .unwrap();
        delta_b
            .send(DeltaDiscoveryRequest {
                type_url: CDS.into(),
                initial_resource_versions: versions,
                ..Default::default()
            })
            .await
            .unwrap();
        // The first request of a type is answered, but with nothing in it (the delta
        // protocol's acknowledgement that the proxy is in sync), and nothing follows.
        let answer = tokio::time::timeout(Duration::from_secs(5), delta_b.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            answer.resources.is_empty() && answer.removed_resources.is_empty(),
            "b resent what the delta proxy has: {answer:?}"
        );
        delta_b.ack(&answer).await.unwrap();
        assert!(tokio::time::timeout(quiet, delta_b.recv()).await.is_err());
    });
}
