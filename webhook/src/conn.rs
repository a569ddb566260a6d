//! One webhook connection: its slot, its TLS handshake, and HTTP until it ends, is idle for
//! too long, or is closed to make room; with its client address's share of connections and
//! requests (see [`crate::clients`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::clients::{Clients, Place};
use crate::metrics::{Refusal, WebhookMetrics};
use crate::server::WebhookServerConfig;

/// How long a closing connection is given to acknowledge its GOAWAY.
const CLOSE_ACK_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct ConnLimits {
    handshake_timeout: Duration,
    body_timeout: Duration,
    idle_timeout: Duration,
    max_concurrent_streams: u32,
    /// A connection with requests in flight and none finished for this long is stalled.
    stalled_after: Duration,
}

impl From<&WebhookServerConfig> for ConnLimits {
    fn from(c: &WebhookServerConfig) -> Self {
        Self {
            handshake_timeout: c.handshake_timeout,
            body_timeout: c.body_timeout,
            idle_timeout: c.idle_timeout,
            max_concurrent_streams: c.max_concurrent_streams.max(1),
            // A review's body arrives in milliseconds; one that takes a tenth of the body
            // deadline to arrive is not the API server's.
            // (At least 50 ms: a waiting connection asks again that often.)
            stalled_after: (c.body_timeout / 10).max(Duration::from_millis(50)),
        }
    }
}

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
        let service = Tracked {
            inner: TowerToHyperService::new(app),
            active: Arc::new(active),
            progress: progress.clone(),
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
                    (&progress, limits.stalled_after),
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

/// Whether a connection has had no request finish or start for `after` (`progress`: when
/// one last finished, when the connection last became busy, or when it was accepted).
fn stalled((progress, after): (&Mutex<tokio::time::Instant>, Duration)) -> bool {
    let since = *progress.lock().unwrap_or_else(|e| e.into_inner());
    since.elapsed() > after
}

/// Resolves when the server shuts down, or when the connection has had no request in flight
/// for `idle`; or, while another connection waits for a slot, when it has been idle (to close
/// gracefully) or stalled (to close now) for the stall time (see [`stalled`]).
async fn until_idle_or_pressed(
    active: &mut watch::Receiver<usize>,
    pressure: &mut watch::Receiver<u64>,
    closing: &mut watch::Receiver<bool>,
    idle: Duration,
    progress: (&Mutex<tokio::time::Instant>, Duration),
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
            // Idle, or stalled, for a while: a connection just accepted, or one that has just
            // answered, gets that long for its next request (the API server's call on a new
            // connection would fail if closed between its handshake and its request).
            if !stalled(progress) {
                continue;
            }
            if *in_flight.borrow() == 0 {
                return Close::Gracefully;
            }
            return Close::Now;
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
/// request.
/// Requests beyond their address's share are answered `429` at once, before their body is
/// read.
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    active: Arc<watch::Sender<usize>>,
    /// When a request last finished, or the connection last became busy.
    progress: Arc<Mutex<tokio::time::Instant>>,
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

impl<S, R> hyper::service::Service<R> for Tracked<S>
where
    S: hyper::service::Service<R, Response = Response>,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send>>;

    fn call(&self, req: R) -> Self::Future {
        let Some(place) = self.clients.request(self.peer.ip()) else {
            tracing::debug!(peer = %self.peer, "too many requests from this address");
            self.metrics.refused(Refusal::RequestsPerAddress);
            let refusal = (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests in flight from this address\n",
            );
            return Box::pin(std::future::ready(Ok(refusal.into_response())));
        };
        self.active.send_modify(|n| {
            if *n == 0 {
                *self.progress.lock().unwrap_or_else(|e| e.into_inner()) =
                    tokio::time::Instant::now();
            }
            *n = n.saturating_add(1);
        });
        let guard = InFlight {
            active: self.active.clone(),
            progress: self.progress.clone(),
            _place: place,
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await;
            drop(guard);
            response
        })
    }
}
