//! The I/O side of one ADS stream: a task per stream that feeds requests and snapshot changes
//! into the pure protocol state ([`super::sotw`] or [`super::delta`]) and sends what it
//! decides, recording ACKs, NACKs, metrics and sync status along the way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::value::Kind;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::Extensions;
use tonic::{Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::resource::ResourceType;

use super::cache::{Cache, NodeKey, Published, Snapshot};
use super::delta::{DeltaResponse, DeltaState};
use super::frame::{Encoded, Frame};
use super::limits::{Limit, Limits, NamespaceStreams, StreamSlot};
use super::metrics::{LimitLabels, Metrics, Protocol, ProtocolLabels};
use super::protocol::{Ignored, Outcome};
use super::sotw::{SotwResponse, SotwState};
use super::status::{NackEvent, ProxyStatus, StatusRegistry, now_rfc3339};
use super::tls::PeerIdentity;
use super::wire;

/// Everything the streams share.
pub(crate) struct Shared {
    pub cache: Cache,
    pub metrics: Metrics,
    pub status: StatusRegistry,
    pub nacks: mpsc::Sender<NackEvent>,
    pub control_plane: ControlPlane,
    /// Cancelled at shutdown: every stream ends.
    pub stop: CancellationToken,
    pub limits: Limits,
    pub streams: Arc<NamespaceStreams>,
}

impl Shared {
    /// Counts and logs a stream going over `limit`; the status to close it with.
    fn refuse(&self, limit: Limit, namespace: &str) -> Status {
        self.metrics
            .refused_streams
            .get_or_create(&LimitLabels { limit })
            .inc();
        let status = self.limits.exceeded(limit);
        warn!(%namespace, message = status.message(), "closing an ADS stream over a limit");
        status
    }

    /// The status to close a stream with when reading a request failed for a limit.
    fn read_error(&self, status: &Status, namespace: &str) -> Option<Status> {
        // tonic's decoder refuses a message over the size limit from its length prefix, before
        // buffering it, with OUT_OF_RANGE; nothing else there uses that code.
        (status.code() == tonic::Code::OutOfRange)
            .then(|| self.refuse(Limit::RequestSize, namespace))
    }
}

/// One of the two ADS flavours, as the generic stream loop sees it.
trait Flavour: Send + 'static {
    type Req: Send + 'static;
    type Resp: Send;
    const PROTOCOL: Protocol;

    fn new(limits: &Limits) -> Self;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn type_url(req: &Self::Req) -> &str;
    fn on_request(&mut self, req: Self::Req, snapshot: Option<&Snapshot>) -> Outcome<Self::Resp>;
    fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<Self::Resp>;
    fn describe(resp: &Self::Resp) -> (ResourceType, &str);
    fn frame(
        resp: Self::Resp,
        control_plane: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, Status>;
}

impl Flavour for SotwState {
    type Req = DiscoveryRequest;
    type Resp = SotwResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;

    fn new(limits: &Limits) -> Self {
        SotwState::with_max_names(limits.max_names_per_type)
    }
    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_url(req: &DiscoveryRequest) -> &str {
        &req.type_url
    }
    fn on_request(&mut self, req: DiscoveryRequest, s: Option<&Snapshot>) -> Outcome<SotwResponse> {
        SotwState::on_request(self, &wire::sotw_request(req), s)
    }
    fn on_snapshot(&mut self, s: &Snapshot) -> Vec<SotwResponse> {
        SotwState::on_snapshot(self, s)
    }
    fn describe(resp: &SotwResponse) -> (ResourceType, &str) {
        (resp.kind, &resp.version)
    }
    fn frame(
        resp: SotwResponse,
        cp: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, Status> {
        wire::sotw_frame(resp, cp, memo)
    }
}

impl Flavour for DeltaState {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const PROTOCOL: Protocol = Protocol::Delta;

    fn new(limits: &Limits) -> Self {
        DeltaState::with_max_names(limits.max_names_per_type)
    }
    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_url(req: &DeltaDiscoveryRequest) -> &str {
        &req.type_url
    }
    fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        s: Option<&Snapshot>,
    ) -> Outcome<DeltaResponse> {
        DeltaState::on_request(self, &wire::delta_request(req), s)
    }
    fn on_snapshot(&mut self, s: &Snapshot) -> Vec<DeltaResponse> {
        DeltaState::on_snapshot(self, s)
    }
    fn describe(resp: &DeltaResponse) -> (ResourceType, &str) {
        (resp.kind, &resp.system_version)
    }
    fn frame(
        resp: DeltaResponse,
        cp: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, Status> {
        wire::delta_frame(resp, cp, memo)
    }
}

/// What a stream's task sends: frames, or the status that ends the stream.
pub(crate) type Outgoing = mpsc::Sender<Result<Frame, Status>>;
type Started = Result<mpsc::Receiver<Result<Frame, Status>>, Status>;

pub(crate) fn start_sotw(
    shared: Arc<Shared>,
    extensions: &Extensions,
    requests: Streaming<DiscoveryRequest>,
) -> Started {
    start::<SotwState>(shared, extensions, requests)
}

pub(crate) fn start_delta(
    shared: Arc<Shared>,
    extensions: &Extensions,
    requests: Streaming<DeltaDiscoveryRequest>,
) -> Started {
    start::<DeltaState>(shared, extensions, requests)
}

/// Starts the task of one stream (`extensions` carry the connection's verified identity).
fn start<F: Flavour>(
    shared: Arc<Shared>,
    extensions: &Extensions,
    requests: Streaming<F::Req>,
) -> Started
where
    Streaming<F::Req>: Send,
{
    let peer = extensions
        .get::<PeerIdentity>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no verified client certificate"))?;
    let slot = shared
        .streams
        .open(&peer.namespace, &peer.streams, &shared.limits)
        .map_err(|limit| shared.refuse(limit, &peer.namespace))?;
    // A small buffer: a proxy that does not read its responses stalls only its own task.
    let (tx, rx) = mpsc::channel(4);
    let span = info_span!(
        "xds_stream",
        protocol = ?F::PROTOCOL,
        namespace = %peer.namespace,
        peer = %peer.remote_addr,
        node = tracing::field::Empty,
    );
    tokio::spawn(run::<F>(shared, peer, slot, requests, tx).instrument(span));
    Ok(rx)
}

/// Decrements the connected-proxies gauge however the stream ends.
struct Connected<'a>(&'a Metrics, Protocol);

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0
            .connected_proxies
            .get_or_create(&ProtocolLabels { protocol: self.1 })
            .dec();
    }
}

fn pod_name(node: &Node) -> Option<String> {
    let value = node.metadata.as_ref()?.fields.get("pod_name")?;
    match &value.kind {
        Some(Kind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

async fn run<F: Flavour>(
    shared: Arc<Shared>,
    peer: PeerIdentity,
    _slot: StreamSlot,
    mut requests: Streaming<F::Req>,
    tx: Outgoing,
) where
    Streaming<F::Req>: Send,
{
    let stop = shared.stop.clone();
    let first = tokio::select! {
        () = stop.cancelled() => return,
        m = tokio::time::timeout(shared.limits.first_request_timeout, requests.message()) => m,
    };
    let first = match first {
        Err(_) => {
            let status = shared.refuse(Limit::FirstRequestTimeout, &peer.namespace);
            let _ = tx.send(Err(status)).await;
            return;
        }
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return,
        Ok(Err(status)) => {
            debug!(%status, "stream ended before its first request");
            if let Some(status) = shared.read_error(&status, &peer.namespace) {
                let _ = tx.send(Err(status)).await;
            }
            return;
        }
    };
    let Some(node) = F::node(&first).filter(|n| !n.id.is_empty()) else {
        warn!("refusing an ADS stream whose first request has no node.id");
        let _ = tx
            .send(Err(Status::invalid_argument(
                "the first discovery request must carry node.id",
            )))
            .await;
        return;
    };
    let key = NodeKey::new(&*peer.namespace, &node.id);
    let pod = pod_name(node);
    tracing::Span::current().record("node", key.node_id.as_str());
    info!(pod = pod.as_deref().unwrap_or(""), "proxy connected");

    let connected_at = Instant::now();
    let metrics = &shared.metrics;
    metrics
        .connected_proxies
        .get_or_create(&ProtocolLabels {
            protocol: F::PROTOCOL,
        })
        .inc();
    let _connected = Connected(metrics, F::PROTOCOL);
    let handle = shared.status.register(ProxyStatus {
        namespace: key.namespace.clone(),
        node_id: key.node_id.clone(),
        pod: pod.clone(),
        protocol: match F::PROTOCOL {
            Protocol::Sotw => "sotw".into(),
            Protocol::Delta => "delta".into(),
        },
        peer: peer.remote_addr.to_string(),
        connected_at: now_rfc3339(),
        types: Default::default(),
    });
    let mut watch = shared.cache.watch(key.clone());
    // The watch starts out "changed": this returns the current snapshot at once.
    let mut current: Option<Published> = watch.changed().await;
    let mut ctx = StreamCtx {
        shared: &shared,
        key: &key,
        pod: &pod,
        handle: &handle,
        connected_at,
        converged: HashMap::new(),
        tx: &tx,
        stop: &stop,
    };
    let mut state = F::new(&shared.limits);

    let mut next = Some(first);
    loop {
        if let Some(req) = next.take() {
            if let Some(kind) = ResourceType::from_type_url(F::type_url(&req)) {
                metrics.requests.get_or_create(&Metrics::kind(kind)).inc();
            }
            let out = state.on_request(req, current.as_ref().map(|p| &*p.snapshot));
            if !ctx.outcome::<F>(out, current.as_ref()).await {
                break;
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            m = requests.message() => match m {
                Ok(Some(req)) => next = Some(req),
                Ok(None) => break,
                Err(status) => {
                    debug!(%status, "stream error");
                    if let Some(status) = shared.read_error(&status, &peer.namespace) {
                        let _ = tx.send(Err(status)).await;
                    }
                    break;
                }
            },
            published = watch.changed() => {
                current = published;
                // A cleared snapshot sends nothing: the proxy keeps what it has.
                let Some(p) = &current else { continue };
                let mut open = true;
                for resp in state.on_snapshot(&p.snapshot) {
                    open = open && ctx.send::<F>(resp, current.as_ref()).await;
                }
                if !open {
                    break;
                }
            }
        }
    }
    info!("proxy disconnected");
}

struct StreamCtx<'a> {
    shared: &'a Shared,
    key: &'a NodeKey,
    pod: &'a Option<String>,
    handle: &'a super::status::ProxyHandle,
    connected_at: Instant,
    /// The version per type whose convergence was already measured.
    converged: HashMap<ResourceType, String>,
    tx: &'a Outgoing,
    stop: &'a CancellationToken,
}

/// How much of a NACK's message goes into the log line.
const LOGGED_NACK_CHARS: usize = 1_000;

impl StreamCtx<'_> {
    /// Latency is measured only for snapshots set while the proxy was connected: a proxy that
    /// connects hours after a set did not take hours to converge.
    fn set_while_connected(&self, current: Option<&Published>) -> Option<Instant> {
        current
            .map(|p| p.set_at)
            .filter(|set_at| *set_at >= self.connected_at)
    }

    /// Applies a request's outcome; false when the stream is gone.
    async fn outcome<F: Flavour>(
        &mut self,
        out: Outcome<F::Resp>,
        current: Option<&Published>,
    ) -> bool {
        let metrics = &self.shared.metrics;
        if let Some(limit) = out.exceeded {
            let status = self.shared.refuse(limit, &self.key.namespace);
            tokio::select! {
                _ = self.tx.send(Err(status)) => {}
                () = self.stop.cancelled() => {}
            }
            return false;
        }
        if let Some(ack) = out.ack {
            metrics.acks.get_or_create(&Metrics::kind(ack.kind)).inc();
            self.handle.acked(ack.kind, &ack.version);
            let is_current = current.is_some_and(|p| p.snapshot.version(ack.kind) == ack.version);
            if is_current && self.converged.get(&ack.kind) != Some(&ack.version) {
                if let Some(set_at) = self.set_while_connected(current) {
                    Metrics::observe(&metrics.convergence_latency, ack.kind, set_at.elapsed());
                }
                self.converged.insert(ack.kind, ack.version);
            }
        }
        if let Some(nack) = out.nack {
            metrics.nacks.get_or_create(&Metrics::kind(nack.kind)).inc();
            self.handle.nacked(nack.kind, &nack.version, &nack.message);
            let (rejecting, connected) = self.handle.tally(nack.kind, &nack.version);
            // The first line or so: the whole message is in the proxy status and the event.
            let head: String = nack.message.chars().take(LOGGED_NACK_CHARS).collect();
            warn!(
                resource_type = %nack.kind,
                version = %nack.version,
                error = %head,
                "Envoy rejected a configuration (NACK)"
            );
            let event = NackEvent {
                namespace: self.key.namespace.clone(),
                node_id: self.key.node_id.clone(),
                pod_name: self.pod.clone(),
                resource_type: nack.kind,
                type_url: nack.kind.type_url().to_owned(),
                version: nack.version,
                message: nack.message,
                rejecting,
                connected,
            };
            match self.shared.nacks.try_send(event) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    metrics.dropped_nack_events.inc();
                    tracing::error!("NACK event dropped: its consumer is not keeping up");
                }
                // Nobody consumes NACK events (e.g. a server run without controllers).
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        match out.ignored {
            Some(Ignored::UnknownType(t)) => {
                debug!(type_url = %t, "ignoring a request for a type marin3r does not serve")
            }
            Some(Ignored::StaleNonce) => debug!("ignoring a request with a stale nonce"),
            None => {}
        }
        for resp in out.response.into_iter().chain(out.also) {
            if !self.send::<F>(resp, current).await {
                return false;
            }
        }
        true
    }

    async fn send<F: Flavour>(&mut self, resp: F::Resp, current: Option<&Published>) -> bool {
        let (kind, version) = F::describe(&resp);
        let metrics = &self.shared.metrics;
        metrics.responses.get_or_create(&Metrics::kind(kind)).inc();
        self.handle.sent(kind, version);
        if let Some(set_at) = self.set_while_connected(current)
            && current.is_some_and(|p| p.snapshot.version(kind) == version)
        {
            Metrics::observe(&metrics.push_latency, kind, set_at.elapsed());
        }
        debug!(resource_type = %kind, %version, "sending");
        let memo = current.map(|p| &*p.encoded);
        let frame = F::frame(resp, &self.shared.control_plane, memo);
        let ok = frame.is_ok();
        tokio::select! {
            r = self.tx.send(frame) => r.is_ok() && ok,
            () = self.stop.cancelled() => false,
        }
    }
}
