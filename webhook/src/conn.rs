//! One webhook connection: its slot, its TLS handshake, and HTTP until it ends, is idle for
//! too long, or is closed to make room; with its client address's share of connections and
//! requests (see [`crate::clients`]).

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::{Body as _, Bytes, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::clients::{Clients, Place};
use crate::metrics::{Refusal, WebhookMetrics};

/// How long a closing connection is given to acknowledge its GOAWAY.
const CLOSE_ACK_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct ConnLimits {
    handshake_timeout: Duration,
    body_timeout: Duration,
    idle_timeout: Duration,
    max_concurrent_streams: u32,
    /// A request whose body is still arriving this long after its headers is stalled; a
    /// connection with no request in flight for this long may be closed for a new one.
    stalled_after: Duration,
}

impl ConnLimits {
    pub(crate) fn new(
        handshake_timeout: Duration,
        body_timeout: Duration,
        idle_timeout: Duration,
        max_concurrent_streams: u32,
    ) -> Self {
        Self {
            handshake_timeout,
            body_timeout,
            idle_timeout,
            max_concurrent_streams: max_concurrent_streams.max(1),
            // A review's body arrives in milliseconds; one that takes a tenth of the body
            // deadline to arrive is not the API server's.
            // (At least 50 ms: a waiting connection asks again that often.)
            stalled_after: (body_timeout / 10).max(Duration::from_millis(50)),
        }
    }
}

/// The client address of a request, which the connection puts in its extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) IpAddr);

pub(crate) enum Slot {
    Taken(OwnedSemaphorePermit),
    /// Every slot was taken: this connection waits (holding a waiting permit) for one.
    Wait(OwnedSemaphorePermit),
}

impl Slot {
    /// A free slot, else a place among those waiting for one; None when both are full.
    pub(crate) fn offer(slots: &Arc<Semaphore>, waiting: &Arc<Semaphore>) -> Option<Self> {
        match slots.clone().try_acquire_owned() {
            Ok(slot) => Some(Self::Taken(slot)),
            Err(_) => waiting.clone().try_acquire_owned().ok().map(Self::Wait),
        }
    }
}

/// One accepted connection and what it shares with the server.
pub(crate) struct Conn {
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) pressure: Arc<watch::Sender<u64>>,
    pub(crate) closing: watch::Receiver<bool>,
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) app: Router,
    pub(crate) limits: ConnLimits,
    pub(crate) clients: Arc<Clients>,
    pub(crate) metrics: Arc<WebhookMetrics>,
}

impl Conn {
    /// Waits for a slot, completes the TLS handshake and serves HTTP until the connection
    /// ends or is closed.
    /// `place` is the connection's in its address's count, held as long as it is open.
    pub(crate) async fn run(
        self,
        tcp: TcpStream,
        peer: std::net::SocketAddr,
        slot: Slot,
        place: Place,
    ) {
        let _place = place;
        let Some(_slot) = self.take_slot(slot, peer).await else {
            return;
        };
        let Some(tls) = self.handshake(tcp, peer).await else {
            return;
        };
        self.serve(tls, peer).await;
    }

    /// The connection's slot: the one it was given, or one freed within the handshake
    /// timeout after telling idle and stalled connections that someone waits. It tells them
    /// again every `stalled_after`: a connection busy at first may be stalled by then.
    async fn take_slot(
        &self,
        slot: Slot,
        peer: std::net::SocketAddr,
    ) -> Option<OwnedSemaphorePermit> {
        let _waiting = match slot {
            Slot::Taken(slot) => return Some(slot),
            Slot::Wait(waiting) => waiting,
        };
        let deadline = tokio::time::Instant::now() + self.limits.handshake_timeout;
        loop {
            self.pressure.send_modify(|n| *n = n.wrapping_add(1));
            let until = deadline.min(tokio::time::Instant::now() + self.limits.stalled_after);
            let wait = self.slots.clone().acquire_owned();
            match tokio::time::timeout_at(until, wait).await {
                Ok(Ok(slot)) => return Some(slot),
                Err(_) if until < deadline => continue,
                _ => break,
            }
        }
        tracing::warn!(%peer, "too many connections; closing this one");
        self.metrics.refused(Refusal::Connections);
        None
    }

    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: std::net::SocketAddr,
    ) -> Option<TlsStream<TcpStream>> {
        let accept = self.acceptor.accept(tcp);
        match tokio::time::timeout(self.limits.handshake_timeout, accept).await {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                None
            }
        }
    }

    /// Serves HTTP/1 or HTTP/2 on the connection until the client closes it, or until it is
    /// idle (or pressed, or the server stops) and then closed gracefully.
    async fn serve(self, tls: TlsStream<TcpStream>, peer: std::net::SocketAddr) {
        let Conn {
            pressure,
            mut closing,
            app,
            limits,
            clients,
            metrics,
            ..
        } = self;
        let (active, mut active_rx) = watch::channel(0usize);
        let progress = Arc::new(Mutex::new(tokio::time::Instant::now()));
        let bodies = Arc::new(Bodies::default());
        let service = Tracked {
            inner: TowerToHyperService::new(app),
            active: Arc::new(active),
            progress: progress.clone(),
            bodies: bodies.clone(),
            clients,
            peer,
            metrics,
        };
        let builder = http_builder(&limits);
        let conn = builder.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(conn);
        let mut pressure_rx = pressure.subscribe();
        pressure_rx.mark_unchanged();
        // Once closing, open requests get this long (their body deadline and some) to finish.
        let grace = limits.body_timeout.saturating_add(limits.handshake_timeout);
        let mut closed_at: Option<tokio::time::Instant> = None;
        loop {
            let hard_stop = hard_stop(closed_at, grace, active_rx.clone());
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = hard_stop => {
                    tracing::debug!(%peer, "connection still busy after closing; dropping it");
                    return;
                }
                close = until_idle_or_pressed(
                    &mut active_rx,
                    &mut pressure_rx,
                    &mut closing,
                    limits.idle_timeout,
                    Progress { idle_since: &progress, bodies: &bodies, after: limits.stalled_after },
                ), if closed_at.is_none() => {
                    if close == Close::Now {
                        tracing::warn!(%peer, "dropping a stalled connection: another one waits for its slot");
                        return;
                    }
                    tracing::debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closed_at = Some(tokio::time::Instant::now());
                }
            }
        }
    }
}

/// The HTTP/1 and HTTP/2 settings of a connection.
fn http_builder(limits: &ConnLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        // Pings find peers that vanished without closing.
        .keep_alive_interval(Some(limits.idle_timeout))
        .keep_alive_timeout(limits.handshake_timeout);
    builder
}

/// A closing connection ends by itself once its client acknowledges the GOAWAY; one that
/// does not is dropped when it has no request in flight (after a second for the
/// acknowledgement), or after `grace` in any case. Never resolves before it is closed.
async fn hard_stop(
    closed_at: Option<tokio::time::Instant>,
    grace: Duration,
    mut in_flight: watch::Receiver<usize>,
) {
    let Some(at) = closed_at else {
        return std::future::pending().await;
    };
    tokio::time::sleep_until(at + CLOSE_ACK_WAIT).await;
    let _ = tokio::time::timeout_at(at + grace, in_flight.wait_for(|n| *n == 0)).await;
}

/// How a connection is to be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    /// GOAWAY, letting requests in flight finish.
    Gracefully,
    /// At once: its requests are stalled, and a new connection waits for its slot.
    Now,
}

/// What a connection pressed for its slot is judged on: when it last had no request in
/// flight (or was accepted), and how its requests' bodies are arriving.
struct Progress<'a> {
    idle_since: &'a Mutex<tokio::time::Instant>,
    bodies: &'a Bodies,
    after: Duration,
}

impl Progress<'_> {
    /// How a connection with `in_flight` requests should be closed for a new one, if at all.
    /// Idle for the stall time: gracefully. A body still arriving the stall time after its
    /// headers is stalled (the API server sends a review's body in milliseconds): when every
    /// request in flight is such, at once; when others on the connection have been read in
    /// full, gracefully, so that their answers are sent. A connection whose requests have all
    /// been read is never closed here, however long their decisions take.
    fn close(&self, in_flight: usize) -> Option<Close> {
        if in_flight == 0 {
            let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
            return (since.elapsed() > self.after).then_some(Close::Gracefully);
        }
        let (arriving, oldest) = self.bodies.arriving();
        if oldest.is_none_or(|t| t.elapsed() <= self.after) {
            return None;
        }
        Some(if arriving >= in_flight {
            Close::Now
        } else {
            Close::Gracefully
        })
    }
}

/// Resolves when the server shuts down, or when the connection has had no request in flight
/// for `idle`; or, while another connection waits for a slot, when it is idle or its bodies
/// stalled (see [`Progress::close`]).
async fn until_idle_or_pressed(
    active: &mut watch::Receiver<usize>,
    pressure: &mut watch::Receiver<u64>,
    closing: &mut watch::Receiver<bool>,
    idle: Duration,
    progress: Progress<'_>,
) -> Close {
    let in_flight = active.clone();
    let idle_for_long = async {
        loop {
            if active.wait_for(|n| *n == 0).await.is_err() {
                return std::future::pending().await;
            }
            tokio::select! {
                () = tokio::time::sleep(idle) => return,
                changed = active.changed() => if changed.is_err() {
                    return std::future::pending().await;
                },
            }
        }
    };
    let pressed_while_idle = async {
        loop {
            if pressure.changed().await.is_err() {
                return std::future::pending().await;
            }
            // Idle for a while only: a connection just accepted, or one that has just
            // answered, gets that long for its next request (the API server's call on a new
            // connection would fail if closed between its handshake and its request).
            let in_flight = *in_flight.borrow();
            if let Some(close) = progress.close(in_flight) {
                return close;
            }
        }
    };
    let shutting_down = async {
        if closing.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = idle_for_long => Close::Gracefully,
        close = pressed_while_idle => close,
        () = shutting_down => Close::Gracefully,
    }
}

/// Counts the connection's requests in flight, so that idleness can be told apart from a slow
/// request, and watches their bodies arrive; tells the handlers the client's address.
/// Requests beyond their address's share are answered `429` at once, before their body is
/// read.
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    active: Arc<watch::Sender<usize>>,
    /// When the connection last had no request in flight, or was accepted.
    progress: Arc<Mutex<tokio::time::Instant>>,
    bodies: Arc<Bodies>,
    clients: Arc<Clients>,
    peer: std::net::SocketAddr,
    metrics: Arc<WebhookMetrics>,
}

/// A request in flight: counted on its connection and, by its place, for its address.
struct InFlight {
    active: Arc<watch::Sender<usize>>,
    progress: Arc<Mutex<tokio::time::Instant>>,
    _place: Place,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = tokio::time::Instant::now();
        self.active.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The bodies of a connection's requests still arriving: an id each and when its headers
/// came. At most one per request in flight (hyper bounds those by the streams allowed).
#[derive(Default)]
struct Bodies {
    arriving: Mutex<(u64, Vec<(u64, tokio::time::Instant)>)>,
}

impl Bodies {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Vec<(u64, tokio::time::Instant)>)> {
        self.arriving.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A body starts arriving now; it counts until its receipt is dropped.
    fn start(self: &Arc<Self>) -> Receipt {
        let mut arriving = self.lock();
        let id = arriving.0;
        arriving.0 = id.wrapping_add(1);
        arriving.1.push((id, tokio::time::Instant::now()));
        Receipt {
            bodies: Arc::clone(self),
            id,
        }
    }

    /// How many bodies are arriving, and since when the oldest has been.
    fn arriving(&self) -> (usize, Option<tokio::time::Instant>) {
        let arriving = self.lock();
        let oldest = arriving.1.iter().map(|(_, t)| *t).min();
        (arriving.1.len(), oldest)
    }
}

/// A body still arriving; dropped when it has arrived in full, failed, or was dropped unread.
struct Receipt {
    bodies: Arc<Bodies>,
    id: u64,
}

impl Drop for Receipt {
    fn drop(&mut self) {
        let mut arriving = self.bodies.lock();
        arriving.1.retain(|(id, _)| *id != self.id);
    }
}

/// A request body that gives its [`Receipt`] up once it has arrived in full.
pub(crate) struct Watched {
    inner: Incoming,
    receipt: Option<Receipt>,
}

impl hyper::body::Body for Watched {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let frame = std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) || this.inner.is_end_stream() {
            this.receipt = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<S> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Watched>, Response = Response>,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let Some(place) = self.clients.request(self.peer.ip()) else {
            tracing::debug!(peer = %self.peer, "too many requests from this address");
            self.metrics.refused(Refusal::RequestsPerAddress);
            let refusal = (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests in flight from this address\n",
            );
            return Box::pin(std::future::ready(Ok(refusal.into_response())));
        };
        self.active.send_modify(|n| *n = n.saturating_add(1));
        let guard = InFlight {
            active: self.active.clone(),
            progress: self.progress.clone(),
            _place: place,
        };
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(Peer(self.peer.ip()));
        let receipt = (!body.is_end_stream()).then(|| self.bodies.start());
        let body = Watched {
            inner: body,
            receipt,
        };
        let fut = self.inner.call(Request::from_parts(parts, body));
        Box::pin(async move {
            let response = fut.await;
            drop(guard);
            response
        })
    }
}
