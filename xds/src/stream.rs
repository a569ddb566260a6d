//! The I/O side of one ADS stream: a task per stream that feeds requests and snapshot changes
//! into the pure protocol state ([`super::sotw`] or [`super::delta`]) and sends what it
//! decides, recording ACKs, NACKs, metrics and sync status along the way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::codegen::http::Extensions;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::resource::ResourceType;
use crate::tracks::Track;

use super::cache::{Cache, NodeKey, Published, Snapshot};
use super::frame::{Encoded, Frame, Sent};
use super::limits::{BytesCharge, Limit, Limits, NamespaceBytes, NamespaceStreams, StreamSlot};
use super::metrics::{LimitLabels, Metrics, Protocol, ProtocolLabels};
use super::node::{envoy_version, pod_name, stats_port};
use super::protocol::{Ack, Ignored, Outcome, Rejection};
use super::requests::{ReadError, RequestBody, Requests};
use super::status::{NackEvent, ProxyStatus, StatusRegistry, now_rfc3339};
use super::tls::PeerIdentity;

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
    pub bytes: Arc<NamespaceBytes>,
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
    fn read_error(&self, error: ReadError, namespace: &str) -> Option<Status> {
        match error {
            ReadError::Limit(limit) => Some(self.refuse(limit, namespace)),
            ReadError::Broken(status) => {
                debug!(%status, "stream error");
                None
            }
        }
    }
}

/// One of the two ADS flavours, as the generic stream loop sees it (implemented beside the
/// flavours' wire forms, in `wire`).
pub(crate) trait Flavour: Send + 'static {
    type Req: prost::Message + Default + Send + 'static;
    type Resp: Send;
    const PROTOCOL: Protocol;

    fn new(limits: &Limits) -> Self;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn type_url(req: &Self::Req) -> &str;
    fn on_request(&mut self, req: Self::Req, snapshot: Option<&Snapshot>) -> Outcome<Self::Resp>;
    fn on_snapshot(&mut self, snapshot: &Snapshot) -> Vec<Self::Resp>;
    /// The bytes the stream's state keeps of its own (names the proxy brought).
    fn held_bytes(&self) -> usize;
    fn describe(resp: &Self::Resp) -> (ResourceType, &str);
    /// The frame of `resp`, decided on `snapshot`, its body shared through `memo`.
    fn frame(
        resp: Self::Resp,
        snapshot: Option<&Snapshot>,
        control_plane: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, Status>;
}

/// What a stream's task sends: frames, or the status that ends the stream.
pub(crate) type Outgoing = mpsc::Sender<Sent>;
pub(crate) type Started = Result<mpsc::Receiver<Sent>, Status>;

/// Starts the task of one stream (`extensions` carry the connection's verified identity).
pub(crate) fn start<F: Flavour>(
    shared: Arc<Shared>,
    extensions: &Extensions,
    body: RequestBody,
) -> Started {
    let peer = extensions
        .get::<PeerIdentity>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no verified client certificate"))?;
    let slot = shared
        .streams
        .open(&peer.namespace, &peer.streams, &shared.limits)
        .map_err(|limit| shared.refuse(limit, &peer.namespace))?;
    let charge = shared
        .bytes
        .charge(&peer.namespace, &shared.metrics.request_bytes);
    let requests = Requests::new(body, charge, &shared.limits);
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

/// Counts a connected proxy, and decrements the connected-proxies gauge however the stream
/// ends.
struct Connected<'a>(&'a Metrics, Protocol);

impl<'a> Connected<'a> {
    fn new(metrics: &'a Metrics, protocol: Protocol) -> Self {
        metrics
            .connected_proxies
            .get_or_create(&ProtocolLabels { protocol })
            .inc();
        Self(metrics, protocol)
    }
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.0
            .connected_proxies
            .get_or_create(&ProtocolLabels { protocol: self.1 })
            .dec();
    }
}

/// What the sync-status registry shows of a stream that just connected.
fn proxy_status(
    key: &NodeKey,
    node: &Node,
    pod: &Option<String>,
    peer: &PeerIdentity,
    protocol: Protocol,
) -> ProxyStatus {
    ProxyStatus {
        namespace: key.namespace.clone(),
        node_id: key.node_id.clone(),
        pod: pod.clone(),
        protocol: protocol.as_str().into(),
        envoy_version: envoy_version(node),
        peer: peer.remote_addr.to_string(),
        connected_at: now_rfc3339(),
        types: Default::default(),
        track: None,
        stats_port: stats_port(node),
    }
}

/// The task of one stream. An `async` block rather than an `async fn`, whose future would
/// keep a second copy of every argument (the request stream alone is 232 bytes).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn's future copies its arguments"
)]
fn run<F: Flavour>(
    shared: Arc<Shared>,
    peer: PeerIdentity,
    slot: StreamSlot,
    mut requests: Requests<F::Req>,
    tx: Outgoing,
) -> impl Future<Output = ()> {
    async move {
        let _slot = slot;
        let stop = shared.stop.clone();
        // Boxed, as are the handling of a request and a push below: the task's future is as big
        // as the largest state it may be in, and it spends its life waiting, not in these.
        let Some(first) = Box::pin(first_request::<F>(&shared, &peer, &mut requests, &tx)).await
        else {
            return;
        };
        let Some(node) = F::node(&first).filter(|n| !n.id.is_empty()) else {
            Box::pin(refuse_without_node(&tx)).await;
            return;
        };
        let mut ctx = StreamCtx::open::<F>(&shared, &peer, node, &tx, &stop);
        // As the proxy its address makes it (see `proxy_identity`): what puts it on a track.
        let identity = peer.remote_addr.ip().to_canonical().to_string();
        let mut watch = shared.cache.watch(ctx.key.clone(), identity);
        // The watch starts out "changed": this returns the current snapshot at once.
        let mut current: Option<Published> = watch.changed().await;
        // Registered on the stable track; the registry's lock is taken only on a change.
        let mut track = Track::Stable;
        follow_track(&ctx.handle, &mut track, watch.track());
        let mut state = F::new(&shared.limits);

        let mut next = Some(first);
        // The status to end the stream with, when reading a request failed over a limit.
        let mut ended = None;
        loop {
            if let Some(req) = next.take()
                && !Box::pin(ctx.request(&mut state, req, current.as_ref())).await
            {
                break;
            }
            let published = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                m = requests.message() => match m {
                    // Boxed: a request is ~600 bytes the task would otherwise reserve for life.
                    Ok(Some(req)) => {
                        next = Some(Box::new(req));
                        continue;
                    }
                    Ok(None) => break,
                    Err(error) => {
                        // Sent after the loop: an await in here would keep this select's
                        // (request-sized) output in the task's future.
                        ended = shared.read_error(error, &peer.namespace);
                        break;
                    }
                },
                published = watch.changed() => published,
            };
            current = published;
            follow_track(&ctx.handle, &mut track, watch.track());
            // A cleared snapshot sends nothing: the proxy keeps what it has.
            let Some(p) = &current else { continue };
            let pushed = state.on_snapshot(&p.snapshot);
            if !Box::pin(ctx.send_all::<F>(pushed, current.as_ref())).await {
                break;
            }
        }
        if let Some(status) = ended {
            let _ = Box::pin(tx.send(Box::new(Err(status)))).await;
        }
        info!("proxy disconnected");
    }
}

/// Tells the registry the stream's track when it changed from `track`.
fn follow_track(handle: &super::status::ProxyHandle, track: &mut Track, now: Track) {
    if now != *track {
        *track = now;
        handle.on_track(now);
    }
}

/// Ends a stream whose first request names no node.
async fn refuse_without_node(tx: &Outgoing) {
    warn!("refusing an ADS stream whose first request has no node.id");
    let refusal = Status::invalid_argument("the first discovery request must carry node.id");
    let _ = tx.send(Box::new(Err(refusal))).await;
}

/// Waits for a stream's first request (which names the node); `None` when the stream ends
/// before it, after telling the client why if it went over a limit.
async fn first_request<F: Flavour>(
    shared: &Shared,
    peer: &PeerIdentity,
    requests: &mut Requests<F::Req>,
    tx: &Outgoing,
) -> Option<Box<F::Req>> {
    let first = tokio::select! {
        () = shared.stop.cancelled() => return None,
        m = tokio::time::timeout(shared.limits.first_request_timeout, requests.message()) => m,
    };
    match first {
        Err(_) => {
            let status = shared.refuse(Limit::FirstRequestTimeout, &peer.namespace);
            let _ = tx.send(Box::new(Err(status))).await;
            None
        }
        Ok(Ok(Some(r))) => Some(Box::new(r)),
        Ok(Ok(None)) => None,
        Ok(Err(error)) => {
            debug!("stream ended before its first request");
            if let Some(status) = shared.read_error(error, &peer.namespace) {
                let _ = tx.send(Box::new(Err(status))).await;
            }
            None
        }
    }
}

/// One connected proxy's stream, as the request and push handlers see it.
struct StreamCtx<'a> {
    shared: &'a Shared,
    key: NodeKey,
    pod: Option<String>,
    /// Its entry in the sync-status registry, removed when the stream ends.
    handle: super::status::ProxyHandle,
    _connected: Connected<'a>,
    connected_at: Instant,
    /// The version per type whose convergence was already measured.
    converged: HashMap<ResourceType, String>,
    /// The stream's share of its namespace's subscription bytes.
    charge: BytesCharge,
    tx: &'a Outgoing,
    stop: &'a CancellationToken,
}

impl<'a> StreamCtx<'a> {
    /// The stream of the proxy `node` names, now connected: logged, counted and registered.
    fn open<F: Flavour>(
        shared: &'a Shared,
        peer: &PeerIdentity,
        node: &Node,
        tx: &'a Outgoing,
        stop: &'a CancellationToken,
    ) -> Self {
        let key = NodeKey::new(&*peer.namespace, &node.id);
        let pod = pod_name(node);
        tracing::Span::current().record("node", key.node_id.as_str());
        info!(pod = pod.as_deref().unwrap_or(""), "proxy connected");
        let connected_at = Instant::now();
        let connected = Connected::new(&shared.metrics, F::PROTOCOL);
        let handle = shared
            .status
            .register(proxy_status(&key, node, &pod, peer, F::PROTOCOL));
        Self {
            shared,
            key,
            pod,
            handle,
            _connected: connected,
            connected_at,
            converged: HashMap::new(),
            charge: shared
                .bytes
                .charge(&peer.namespace, &shared.metrics.subscription_bytes),
            tx,
            stop,
        }
    }
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

    /// Handles one request and applies its outcome; false when the stream is gone.
    async fn request<F: Flavour>(
        &mut self,
        state: &mut F,
        req: Box<F::Req>,
        current: Option<&Published>,
    ) -> bool {
        if let Some(kind) = ResourceType::from_type_url(F::type_url(&req)) {
            let requests = &self.shared.metrics.requests;
            requests.get_or_create(&Metrics::kind(kind)).inc();
        }
        let mut out = state.on_request(*req, current.map(|p| &*p.snapshot));
        let max = self.shared.limits.max_subscription_bytes_per_namespace;
        if out.exceeded.is_none()
            && let Err(limit) = self.charge.set(state.held_bytes(), max)
        {
            out.exceeded = Some(limit);
        }
        self.outcome::<F>(out, current).await
    }

    /// Applies a request's outcome; false when the stream is gone.
    async fn outcome<F: Flavour>(
        &mut self,
        out: Outcome<F::Resp>,
        current: Option<&Published>,
    ) -> bool {
        if let Some(limit) = out.exceeded {
            let status = self.shared.refuse(limit, &self.key.namespace);
            tokio::select! {
                _ = self.tx.send(Box::new(Err(status))) => {}
                () = self.stop.cancelled() => {}
            }
            return false;
        }
        if let Some(ack) = out.ack {
            self.acked(ack, current);
        }
        if let Some(nack) = out.nack {
            self.nacked(nack);
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

    /// Records an ACK; the first of the current version also measures convergence.
    fn acked(&mut self, ack: Ack, current: Option<&Published>) {
        let metrics = &self.shared.metrics;
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

    /// Records a NACK, logs its head and tells the NACK consumer. A NACK below the node's
    /// threshold is only counted and logged: the version is being sent again.
    fn nacked(&self, nack: Rejection) {
        let metrics = &self.shared.metrics;
        metrics.nacks.get_or_create(&Metrics::kind(nack.kind)).inc();
        if !nack.counts {
            let head: String = nack.message.chars().take(LOGGED_NACK_CHARS).collect();
            info!(
                resource_type = %nack.kind,
                version = %nack.version,
                error = %head,
                "Envoy rejected a configuration (NACK) fewer times than the node's threshold; sending it again"
            );
            return;
        }
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

    /// Sends a push's responses in order; false when the stream is gone.
    async fn send_all<F: Flavour>(
        &mut self,
        responses: Vec<F::Resp>,
        current: Option<&Published>,
    ) -> bool {
        for resp in responses {
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
        let snapshot = current.map(|p| &*p.snapshot);
        let frame = F::frame(resp, snapshot, &self.shared.control_plane, memo);
        let ok = frame.is_ok();
        tokio::select! {
            r = self.tx.send(Box::new(frame)) => r.is_ok() && ok,
            () = self.stop.cancelled() => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::DeltaState;
    use crate::sotw::SotwState;

    /// The size of the future a stream-task function returns, without calling it.
    fn future_size<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every connected proxy keeps one such future for the life of its stream, sized for the
    /// largest state it can be in: the rare paths (the first request, handling a request,
    /// a push, a refusal) are boxed, and no request is held in it. It was 5.7 KiB (SotW) and
    /// 6.2 KiB (delta) before it was measured; `-Zprint-type-sizes` shows what it holds.
    #[test]
    fn stream_task_futures_are_small() {
        let sotw = future_size(run::<SotwState>);
        let delta = future_size(run::<DeltaState>);
        println!("stream task future: sotw {sotw} bytes, delta {delta} bytes");
        assert!(
            sotw <= 1280,
            "the SotW stream task's future is {sotw} bytes"
        );
        assert!(
            delta <= 1280,
            "the delta stream task's future is {delta} bytes"
        );
    }
}
