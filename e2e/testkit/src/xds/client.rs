//! A minimal ADS client over mutual TLS (tonic), subscribing the way Envoy does: for tests
//! that need a client other than Envoy (refused certificates, namespace isolation) and for
//! the xDS load generator.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use marin3r_xds::{DELTA_PATH, SOTW_PATH};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// What the client presents and trusts.
#[derive(Clone)]
pub struct ClientTls {
    pub ca_pem: String,
    /// Certificate and key; `None` connects without a client certificate.
    pub identity: Option<(String, String)>,
    /// The name the server certificate must carry.
    pub server_name: String,
}

/// Opens one TCP+TLS connection (a channel is one HTTP/2 connection).
pub async fn connect(addr: SocketAddr, tls: &ClientTls) -> anyhow::Result<Channel> {
    connect_from(addr, tls, None).await
}

/// [`connect`] from the local address `from` (another loopback address: the server tells
/// proxies apart by their address, as pods have their own IPs).
pub async fn connect_from(
    addr: SocketAddr,
    tls: &ClientTls,
    from: Option<std::net::IpAddr>,
) -> anyhow::Result<Channel> {
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca_pem))
        .domain_name(tls.server_name.clone());
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(config)?
        .connect_timeout(Duration::from_secs(10))
        // Envoy's HTTP/2 defaults: large windows, so a big response needs no WINDOW_UPDATE.
        .initial_stream_window_size(Some(256 << 20))
        .initial_connection_window_size(Some(256 << 20))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .local_address(from)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(channel)
}

fn node(node_id: &str, pod: Option<&str>) -> Node {
    let metadata = pod.map(|p| Struct {
        fields: HashMap::from([(
            "pod_name".to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(p.to_owned())),
            },
        )]),
    });
    Node {
        id: node_id.to_owned(),
        metadata,
        ..Default::default()
    }
}

/// Opens one ADS call at `path`, its responses decoded as `Resp`: Envoy's own message, or a
/// lighter one that leaves parts undecoded (the load generator's).
async fn open_call<Req, Resp>(
    channel: Channel,
    path: &'static str,
) -> anyhow::Result<(mpsc::Sender<Req>, Streaming<Resp>)>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    let (tx, rx) = mpsc::channel(16);
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
    grpc.ready()
        .await
        .map_err(|e| anyhow::anyhow!("the ADS channel is not ready: {e}"))?;
    let rx = grpc
        .streaming(
            tonic::Request::new(ReceiverStream::new(rx)),
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            tonic_prost::ProstCodec::<Req, Resp>::default(),
        )
        .await?
        .into_inner();
    Ok((tx, rx))
}

/// A state-of-the-world ADS stream, its responses decoded as `R` (Envoy's message unless
/// said otherwise).
pub struct SotwStream<R = DiscoveryResponse> {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<R>,
    node: Option<Node>,
}

impl SotwStream {
    pub async fn open(channel: Channel, node_id: &str, pod: Option<&str>) -> anyhow::Result<Self> {
        Self::open_as(channel, node_id, pod).await
    }

    pub async fn ack(&mut self, resp: &DiscoveryResponse, names: &[String]) -> anyhow::Result<()> {
        self.send(&resp.type_url, names, &resp.version_info, &resp.nonce, None)
            .await
    }
}

impl<R: prost::Message + Default + Send + 'static> SotwStream<R> {
    /// A stream whose responses are decoded as `R`.
    pub async fn open_as(
        channel: Channel,
        node_id: &str,
        pod: Option<&str>,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = open_call(channel, SOTW_PATH).await?;
        Ok(Self {
            tx,
            rx,
            node: Some(node(node_id, pod)),
        })
    }

    /// Sends a request; the node goes with the first one only, as Envoy's bootstrap says.
    pub async fn send(
        &mut self,
        type_url: &str,
        names: &[String],
        version: &str,
        nonce: &str,
        error: Option<&str>,
    ) -> anyhow::Result<()> {
        let req = DiscoveryRequest {
            node: self.node.take(),
            type_url: type_url.to_owned(),
            resource_names: names.to_vec(),
            version_info: version.to_owned(),
            response_nonce: nonce.to_owned(),
            error_detail: error.map(|m| RpcStatus {
                code: 3,
                message: m.to_owned(),
                details: vec![],
            }),
            ..Default::default()
        };
        self.tx
            .send(req)
            .await
            .context("the ADS stream is closed")?;
        Ok(())
    }

    pub async fn subscribe(&mut self, type_url: &str, names: &[String]) -> anyhow::Result<()> {
        self.send(type_url, names, "", "", None).await
    }

    pub async fn recv(&mut self) -> anyhow::Result<R> {
        self.rx
            .message()
            .await?
            .context("the server ended the ADS stream")
    }
}

/// A delta ADS stream, its responses decoded as `R` (Envoy's message unless said otherwise).
pub struct DeltaStream<R = DeltaDiscoveryResponse> {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<R>,
    node: Option<Node>,
}

impl DeltaStream {
    pub async fn open(channel: Channel, node_id: &str, pod: Option<&str>) -> anyhow::Result<Self> {
        Self::open_as(channel, node_id, pod).await
    }

    pub async fn ack(&mut self, resp: &DeltaDiscoveryResponse) -> anyhow::Result<()> {
        self.ack_nonce(&resp.type_url, &resp.nonce).await
    }
}

impl<R: prost::Message + Default + Send + 'static> DeltaStream<R> {
    /// A stream whose responses are decoded as `R`.
    pub async fn open_as(
        channel: Channel,
        node_id: &str,
        pod: Option<&str>,
    ) -> anyhow::Result<Self> {
        let (tx, rx) = open_call(channel, DELTA_PATH).await?;
        Ok(Self {
            tx,
            rx,
            node: Some(node(node_id, pod)),
        })
    }

    pub async fn send(&mut self, mut req: DeltaDiscoveryRequest) -> anyhow::Result<()> {
        req.node = self.node.take();
        self.tx
            .send(req)
            .await
            .context("the ADS stream is closed")?;
        Ok(())
    }

    /// Acknowledges the response of `type_url` carrying `nonce`.
    pub async fn ack_nonce(&mut self, type_url: &str, nonce: &str) -> anyhow::Result<()> {
        self.send(DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            response_nonce: nonce.to_owned(),
            ..Default::default()
        })
        .await
    }

    pub async fn recv(&mut self) -> anyhow::Result<R> {
        self.rx
            .message()
            .await?
            .context("the server ended the ADS stream")
    }
}
