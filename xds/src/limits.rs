//! What one client, or one namespace, may take of the shared xDS server: connections per
//! namespace, streams per connection and per namespace, time to the first request and to the
//! rest of a request once begun, request size, and the bytes the server holds for clients
//! (names subscribed and requests still being received: per type per stream, per namespace
//! across its streams, and for the whole process). A stream over a limit is closed with a
//! gRPC status naming the limit and counted in `marin3r_xds_refused_streams_total{limit}`;
//! other streams, and other namespaces, go on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

/// The limits; [`Limits::default`] suits a pod serving a few thousand proxies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// ADS streams open at once on one HTTP/2 connection. Envoy opens one.
    pub max_streams_per_connection: u32,
    /// ADS streams open at once for one namespace, across its connections: about one per
    /// proxy of the namespace.
    pub max_streams_per_namespace: usize,
    /// Authenticated connections open at once for one namespace (one client certificate),
    /// with or without streams: about one per proxy of the namespace. A connection over it
    /// is closed right after its handshake.
    pub max_connections_per_namespace: usize,
    /// A stream that sends no request within this is closed.
    pub first_request_timeout: Duration,
    /// A request whose first bytes have arrived must arrive whole within this (the first
    /// request has [`Limits::first_request_timeout`] as well).
    pub request_timeout: Duration,
    /// The largest discovery request accepted, in bytes (encoded).
    pub max_request_bytes: usize,
    /// Resource names one stream may subscribe to (or declare it holds) per type.
    pub max_names_per_type: usize,
    /// The longest resource name (or version a proxy reports) a request may carry, in bytes.
    pub max_name_bytes: usize,
    /// The bytes of resource names (and of the versions a proxy reports holding) one stream
    /// may make the server keep for one type: the count limit alone lets a stream keep
    /// `max_names_per_type` names of up to a request's size each.
    pub max_subscription_bytes_per_type: usize,
    /// The same bytes summed over every stream of one namespace (one client certificate),
    /// with the requests its streams are still receiving (each charged its declared length
    /// from its length prefix on).
    pub max_subscription_bytes_per_namespace: usize,
    /// Those bytes (names subscribed and requests being received) summed over every
    /// namespace: the most the server holds for all its clients together.
    pub max_process_bytes: usize,
    /// A connection older than this is asked to go away (HTTP/2 GOAWAY) and closed
    /// [`CONNECTION_AGE_GRACE`] later; Envoy reconnects, so its certificate and namespace are
    /// checked again (a renewed CA, a disabled namespace) at least this often.
    pub max_connection_age: Duration,
}

/// How long a connection past its age may still finish its streams. ADS streams do not end on
/// their own, so this is a short delay before the close, not a wait for idleness.
pub const CONNECTION_AGE_GRACE: Duration = Duration::from_secs(5);

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_streams_per_connection: 16,
            max_streams_per_namespace: 4096,
            max_connections_per_namespace: 4096,
            first_request_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_request_bytes: 1 << 20,
            max_names_per_type: 10_000,
            max_name_bytes: 4096,
            max_subscription_bytes_per_type: 4 << 20,
            max_subscription_bytes_per_namespace: 128 << 20,
            max_process_bytes: 256 << 20,
            max_connection_age: Duration::from_secs(30 * 60),
        }
    }
}

/// Which limit a stream went over: the `limit` label of `marin3r_xds_refused_streams_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    StreamsPerConnection,
    StreamsPerNamespace,
    FirstRequestTimeout,
    RequestTimeout,
    RequestSize,
    NamesPerType,
    NameSize,
    SubscriptionBytesPerType,
    SubscriptionBytesPerNamespace,
    ProcessBytes,
}

impl Limit {
    /// Every limit, each a series of `marin3r_xds_refused_streams_total` from the start.
    pub const ALL: [Self; 10] = [
        Self::StreamsPerConnection,
        Self::StreamsPerNamespace,
        Self::FirstRequestTimeout,
        Self::RequestTimeout,
        Self::RequestSize,
        Self::NamesPerType,
        Self::NameSize,
        Self::SubscriptionBytesPerType,
        Self::SubscriptionBytesPerNamespace,
        Self::ProcessBytes,
    ];

    /// Its `limit` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StreamsPerConnection => "streams_per_connection",
            Self::StreamsPerNamespace => "streams_per_namespace",
            Self::FirstRequestTimeout => "first_request_timeout",
            Self::RequestTimeout => "request_timeout",
            Self::RequestSize => "request_size",
            Self::NamesPerType => "names_per_type",
            Self::NameSize => "name_size",
            Self::SubscriptionBytesPerType => "subscription_bytes_per_type",
            Self::SubscriptionBytesPerNamespace => "subscription_bytes_per_namespace",
            Self::ProcessBytes => "process_bytes",
        }
    }
}

impl Limits {
    /// The message of the status a stream over `limit` is closed with.
    pub(crate) fn exceeded(&self, limit: Limit) -> tonic::Status {
        match limit {
            Limit::StreamsPerConnection => tonic::Status::resource_exhausted(format!(
                "more than {} ADS streams on one connection (--xds-max-streams-per-connection)",
                self.max_streams_per_connection
            )),
            Limit::StreamsPerNamespace => tonic::Status::resource_exhausted(format!(
                "more than {} ADS streams for this namespace (--xds-max-streams-per-namespace)",
                self.max_streams_per_namespace
            )),
            Limit::FirstRequestTimeout => tonic::Status::deadline_exceeded(format!(
                "no discovery request within {:?} of opening the stream (--xds-first-request-timeout)",
                self.first_request_timeout
            )),
            Limit::RequestTimeout => tonic::Status::deadline_exceeded(format!(
                "a discovery request not received whole within {:?} of its first bytes \
                 (--xds-request-timeout)",
                self.request_timeout
            )),
            Limit::RequestSize => tonic::Status::resource_exhausted(format!(
                "a discovery request larger than {} bytes (--xds-max-request-bytes)",
                self.max_request_bytes
            )),
            Limit::NamesPerType => tonic::Status::resource_exhausted(format!(
                "more than {} resource names of one type on one stream (--xds-max-names-per-type)",
                self.max_names_per_type
            )),
            Limit::NameSize => tonic::Status::resource_exhausted(format!(
                "a resource name or version longer than {} bytes (--xds-max-name-bytes)",
                self.max_name_bytes
            )),
            Limit::SubscriptionBytesPerType => tonic::Status::resource_exhausted(format!(
                "more than {} bytes of resource names of one type on one stream \
                 (--xds-max-subscription-bytes-per-type)",
                self.max_subscription_bytes_per_type
            )),
            Limit::SubscriptionBytesPerNamespace => tonic::Status::resource_exhausted(format!(
                "more than {} bytes of resource names subscribed and requests being received \
                 for this namespace (--xds-max-subscription-bytes-per-namespace)",
                self.max_subscription_bytes_per_namespace
            )),
            Limit::ProcessBytes => tonic::Status::resource_exhausted(format!(
                "more than {} bytes of resource names subscribed and requests being received \
                 for all namespaces together (--xds-max-process-bytes)",
                self.max_process_bytes
            )),
        }
    }
}

/// Streams open on one connection; shared by the connection's requests.
#[derive(Debug, Clone, Default)]
pub struct ConnectionStreams(Arc<AtomicUsize>);

/// Streams open per namespace.
#[derive(Debug, Default)]
pub(crate) struct NamespaceStreams(Mutex<HashMap<Arc<str>, usize>>);

/// A stream's place in both counts, given back when it is dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    connection: ConnectionStreams,
    namespace: Arc<str>,
    namespaces: Arc<NamespaceStreams>,
}

impl NamespaceStreams {
    /// Takes a place for a new stream of `namespace` on `connection`, or names the limit.
    pub(crate) fn open(
        self: &Arc<Self>,
        namespace: &Arc<str>,
        connection: &ConnectionStreams,
        limits: &Limits,
    ) -> Result<StreamSlot, Limit> {
        let per_connection =
            usize::try_from(limits.max_streams_per_connection).unwrap_or(usize::MAX);
        let taken = connection.0.fetch_add(1, Ordering::SeqCst);
        if taken >= per_connection {
            connection.0.fetch_sub(1, Ordering::SeqCst);
            return Err(Limit::StreamsPerConnection);
        }
        {
            let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let count = counts.entry(Arc::clone(namespace)).or_insert(0);
            if *count >= limits.max_streams_per_namespace {
                if *count == 0 {
                    counts.remove(namespace);
                }
                drop(counts);
                connection.0.fetch_sub(1, Ordering::SeqCst);
                return Err(Limit::StreamsPerNamespace);
            }
            *count = count.saturating_add(1);
        }
        Ok(StreamSlot {
            connection: connection.clone(),
            namespace: Arc::clone(namespace),
            namespaces: Arc::clone(self),
        })
    }

    #[cfg(test)]
    fn count(&self, namespace: &str) -> usize {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(namespace).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.connection.0.fetch_sub(1, Ordering::SeqCst);
        let mut counts = self.namespaces.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.namespace);
            }
        }
    }
}

/// Authenticated connections open per namespace (see
/// [`Limits::max_connections_per_namespace`]).
#[derive(Debug, Default)]
pub(crate) struct NamespaceConnections(Mutex<HashMap<Arc<str>, usize>>);

/// A connection's place in its namespace's count, given back when the connection closes.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    namespace: Arc<str>,
    counts: Arc<NamespaceConnections>,
}

impl NamespaceConnections {
    /// Takes a place for a new connection of `namespace`, unless it already has `max`.
    pub(crate) fn open(
        self: &Arc<Self>,
        namespace: &Arc<str>,
        max: usize,
    ) -> Option<ConnectionSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.get(namespace).copied().unwrap_or(0);
        if count >= max {
            return None;
        }
        counts.insert(Arc::clone(namespace), count.saturating_add(1));
        Some(ConnectionSlot {
            namespace: Arc::clone(namespace),
            counts: Arc::clone(self),
        })
    }

    #[cfg(test)]
    fn count(&self, namespace: &str) -> usize {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(namespace).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.namespace) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.namespace);
            }
        }
    }
}

/// The bytes the server holds for clients, per namespace (see
/// [`Limits::max_subscription_bytes_per_namespace`]) and in all (see
/// [`Limits::max_process_bytes`]). Each charge also moves the gauge of what it holds (names
/// subscribed: `marin3r_xds_subscription_bytes`; requests being received:
/// `marin3r_xds_request_bytes`).
#[derive(Debug, Default)]
pub(crate) struct NamespaceBytes {
    held: Mutex<Held>,
    max_total: usize,
}

#[derive(Debug, Default)]
struct Held {
    by_namespace: HashMap<Arc<str>, usize>,
    total: usize,
}

/// What one stream has charged, for one purpose, to its namespace's bytes; given back when
/// it is dropped.
#[derive(Debug)]
pub(crate) struct BytesCharge {
    namespace: Arc<str>,
    counts: Arc<NamespaceBytes>,
    gauge: Gauge,
    charged: usize,
}

impl NamespaceBytes {
    /// Counts refusing to grow their sum over every namespace past `max_total`.
    pub(crate) fn new(max_total: usize) -> Self {
        Self {
            held: Mutex::default(),
            max_total,
        }
    }

    /// A stream's charge, empty until it is [set](BytesCharge::set), shown in `gauge`.
    pub(crate) fn charge(self: &Arc<Self>, namespace: &Arc<str>, gauge: &Gauge) -> BytesCharge {
        BytesCharge {
            namespace: Arc::clone(namespace),
            counts: Arc::clone(self),
            gauge: gauge.clone(),
            charged: 0,
        }
    }

    #[cfg(test)]
    fn total(&self, namespace: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.by_namespace.get(namespace).copied().unwrap_or(0)
    }
}

impl BytesCharge {
    /// Makes this charge `bytes`; when that grows its namespace's total past `max`, or the
    /// total over every namespace past the process's, names the limit instead and leaves the
    /// charge as it was. Shrinking always succeeds.
    pub(crate) fn set(&mut self, bytes: usize, max: usize) -> Result<(), Limit> {
        if bytes == self.charged {
            return Ok(());
        }
        let mut held = self.counts.held.lock().unwrap_or_else(|e| e.into_inner());
        let ns = held
            .by_namespace
            .get(&self.namespace)
            .copied()
            .unwrap_or(0)
            .saturating_sub(self.charged)
            .saturating_add(bytes);
        let total = held
            .total
            .saturating_sub(self.charged)
            .saturating_add(bytes);
        if bytes > self.charged {
            if ns > max {
                return Err(Limit::SubscriptionBytesPerNamespace);
            }
            if total > self.counts.max_total {
                return Err(Limit::ProcessBytes);
            }
        }
        let change = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.gauge.inc_by(change(bytes));
        self.gauge.dec_by(change(self.charged));
        self.charged = bytes;
        held.total = total;
        if ns == 0 {
            held.by_namespace.remove(&self.namespace);
        } else {
            held.by_namespace.insert(Arc::clone(&self.namespace), ns);
        }
        Ok(())
    }
}

impl Drop for BytesCharge {
    fn drop(&mut self) {
        let _ = self.set(0, usize::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_connection_and_per_namespace_and_given_back() {
        let limits = Limits {
            max_streams_per_connection: 2,
            max_streams_per_namespace: 3,
            ..Limits::default()
        };
        let counts = Arc::new(NamespaceStreams::default());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let (c1, c2, c3) = (
            ConnectionStreams::default(),
            ConnectionStreams::default(),
            ConnectionStreams::default(),
        );
        let s1 = counts.open(&a, &c1, &limits).unwrap();
        let s2 = counts.open(&a, &c1, &limits).unwrap();
        assert_eq!(
            counts.open(&a, &c1, &limits).unwrap_err(),
            Limit::StreamsPerConnection
        );
        let s3 = counts.open(&a, &c2, &limits).unwrap();
        assert_eq!(
            counts.open(&a, &c2, &limits).unwrap_err(),
            Limit::StreamsPerNamespace
        );
        // The refusal took nothing: c2 still has room for another namespace.
        let other = counts.open(&b, &c2, &limits).unwrap();
        assert_eq!((counts.count("a"), counts.count("b")), (3, 1));
        drop(s1);
        let s4 = counts.open(&a, &c3, &limits).unwrap();
        drop((s2, s3, s4, other));
        assert_eq!((counts.count("a"), counts.count("b")), (0, 0));
        assert!(
            counts.0.lock().unwrap().is_empty(),
            "no entry is left behind"
        );
        assert_eq!(c1.0.load(Ordering::SeqCst), 0);
    }

    /// Connections are capped per namespace, not only streams.
    #[test]
    fn connections_are_counted_per_namespace_and_given_back() {
        let counts = Arc::new(NamespaceConnections::default());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let a1 = counts.open(&a, 2).unwrap();
        let a2 = counts.open(&a, 2).unwrap();
        assert!(counts.open(&a, 2).is_none());
        // Another namespace has its own count.
        let b1 = counts.open(&b, 2).unwrap();
        assert_eq!((counts.count("a"), counts.count("b")), (2, 1));
        drop(a1);
        let a3 = counts.open(&a, 2).unwrap();
        drop((a2, a3, b1));
        assert!(
            counts.0.lock().unwrap().is_empty(),
            "no entry is left behind"
        );
    }

    #[test]
    fn bytes_are_charged_per_namespace_refused_past_the_limit_and_given_back() {
        let counts = Arc::new(NamespaceBytes::new(usize::MAX));
        let gauge = Gauge::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let (mut a1, mut a2, mut b1) = (
            counts.charge(&a, &gauge),
            counts.charge(&a, &gauge),
            counts.charge(&b, &gauge),
        );
        a1.set(600, 1000).unwrap();
        assert_eq!(
            a2.set(500, 1000).unwrap_err(),
            Limit::SubscriptionBytesPerNamespace
        );
        // The refusal charged nothing; other namespaces have their own total.
        a2.set(400, 1000).unwrap();
        b1.set(1000, 1000).unwrap();
        assert_eq!((counts.total("a"), counts.total("b")), (1000, 1000));
        assert_eq!(gauge.get(), 2000, "the sum over namespaces");
        // Shrinking is always allowed, even over the limit.
        a1.set(100, 10).unwrap();
        assert_eq!(counts.total("a"), 500);
        drop((a1, a2, b1));
        let held = counts.held.lock().unwrap();
        assert!(held.by_namespace.is_empty(), "no entry is left behind");
        assert_eq!((held.total, gauge.get()), (0, 0));
    }

    /// No namespace is over its budget, but together they are over the
    /// process's; each gauge shows its own charges.
    #[test]
    fn bytes_over_every_namespace_are_refused_past_the_process_budget() {
        let counts = Arc::new(NamespaceBytes::new(1500));
        let (names, requests) = (Gauge::default(), Gauge::default());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut a1 = counts.charge(&a, &names);
        let mut b1 = counts.charge(&b, &requests);
        let mut b2 = counts.charge(&b, &names);
        a1.set(800, 1000).unwrap();
        b1.set(600, 1000).unwrap();
        assert_eq!(b2.set(200, 1000).unwrap_err(), Limit::ProcessBytes);
        b2.set(100, 1000).unwrap();
        assert_eq!((names.get(), requests.get()), (900, 600));
        // Given back, room for the same bytes again.
        drop(a1);
        b2.set(900, 1000).unwrap_err();
        b2.set(400, 1000).unwrap();
        assert_eq!(counts.total("b"), 1000);
        drop((b1, b2));
        assert_eq!(counts.held.lock().unwrap().total, 0);
        assert_eq!((names.get(), requests.get()), (0, 0));
    }
}
