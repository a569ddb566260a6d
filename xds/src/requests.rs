//! A stream's discovery requests as they come off its HTTP/2 body, gRPC's length-prefixed
//! messages decoded here rather than by tonic so that what a request still being received
//! holds is counted: from its length prefix on, a request is charged its declared length
//! against its namespace's and the process's byte budgets (`marin3r_xds_request_bytes`), and
//! it must arrive whole within [`Limits::request_timeout`] of its first bytes. Before this a
//! client could make every stream hold up to a request's size, uncounted, for as long as it
//! liked.

use std::marker::PhantomData;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use prost::Message;
use tokio::time::Instant;
use tonic::Status;
use tonic::codegen::StdError;

use super::limits::{BytesCharge, Limit, Limits};

/// A request's body, whatever the HTTP stack's body type.
pub(crate) type RequestBody = UnsyncBoxBody<Bytes, StdError>;

/// `body` as a [`RequestBody`].
pub(crate) fn boxed<B>(body: B) -> RequestBody
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError>,
{
    body.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
        .map_err(Into::into)
        .boxed_unsync()
}

/// The gRPC message prefix: a compression flag and a big-endian length.
const PREFIX: usize = 5;

/// A buffer that held a large request is given back rather than kept for the stream's life.
const KEPT_CAPACITY: usize = 16 << 10;

/// Why reading a request failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The request went over a limit: the stream is closed with the limit's status.
    Limit(Limit),
    /// Anything else (a reset stream, bytes that are no request): the stream just ends.
    Broken(Status),
}

/// The requests of one stream.
pub(crate) struct Requests<M> {
    body: RequestBody,
    buf: BytesMut,
    /// The declared length of the request being received, once its prefix has arrived.
    declared: Option<usize>,
    /// When the request being received must be complete.
    deadline: Option<Instant>,
    charge: BytesCharge,
    max_request: usize,
    max_namespace: usize,
    timeout: Duration,
    message: PhantomData<fn() -> M>,
}

impl<M: Message + Default> Requests<M> {
    /// Reads `body`, charging what a request being received holds to `charge`.
    pub(crate) fn new(body: RequestBody, charge: BytesCharge, limits: &Limits) -> Self {
        Self {
            body,
            buf: BytesMut::new(),
            declared: None,
            deadline: None,
            charge,
            max_request: limits.max_request_bytes,
            max_namespace: limits.max_subscription_bytes_per_namespace,
            timeout: limits.request_timeout,
            message: PhantomData,
        }
    }

    /// The next request; `None` when the client ended the stream between requests.
    ///
    /// Cancel-safe: everything read is kept in `self`, so a `select!` may drop this future
    /// and call it again.
    pub(crate) async fn message(&mut self) -> Result<Option<M>, ReadError> {
        loop {
            if let Some(request) = self.take()? {
                return Ok(Some(request));
            }
            let frame = match self.deadline {
                Some(deadline) => tokio::select! {
                    frame = self.body.frame() => frame,
                    () = tokio::time::sleep_until(deadline) => {
                        return Err(ReadError::Limit(Limit::RequestTimeout));
                    }
                },
                None => self.body.frame().await,
            };
            match frame {
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    let message = "the stream ended in the middle of a request";
                    return Err(ReadError::Broken(Status::invalid_argument(message)));
                }
                Some(Err(e)) => return Err(ReadError::Broken(Status::from_error(e))),
                Some(Ok(frame)) => {
                    // Trailers carry nothing for us.
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        if self.buf.is_empty() {
                            self.deadline = Some(Instant::now() + self.timeout);
                        }
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The request the buffer holds whole, if any; charges what a request begun holds.
    fn take(&mut self) -> Result<Option<M>, ReadError> {
        if self.declared.is_none() && self.buf.len() >= PREFIX {
            if self.buf[0] != 0 {
                let message = "compressed requests are not supported; marin3r reads identity only";
                return Err(ReadError::Broken(Status::unimplemented(message)));
            }
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            if len > self.max_request {
                return Err(ReadError::Limit(Limit::RequestSize));
            }
            // The declared length, charged before it is buffered: a client that never
            // sends it all is refused at its prefix when its namespace has no room for it.
            self.charge
                .set(PREFIX.saturating_add(len), self.max_namespace)
                .map_err(ReadError::Limit)?;
            let whole = PREFIX.saturating_add(len);
            self.buf.reserve(whole.saturating_sub(self.buf.len()));
            self.declared = Some(len);
        }
        let Some(len) = self.declared else {
            self.charge
                .set(self.buf.len(), self.max_namespace)
                .map_err(ReadError::Limit)?;
            return Ok(None);
        };
        let whole = PREFIX.saturating_add(len);
        if self.buf.len() < whole {
            return Ok(None);
        }
        let mut message = self.buf.split_to(whole);
        message.advance(PREFIX);
        self.declared = None;
        if self.buf.is_empty() {
            // An idle stream keeps no buffer: the next request allocates its own. (The request
            // just split off shared this allocation; keeping it held a request's size per idle
            // stream.)
            self.buf = BytesMut::new();
        } else if self.buf.capacity() > KEPT_CAPACITY {
            self.buf = BytesMut::from(&self.buf[..]);
        }
        self.deadline = (!self.buf.is_empty()).then(|| Instant::now() + self.timeout);
        let _ = self.charge.set(self.buf.len(), usize::MAX);
        M::decode(message.freeze()).map(Some).map_err(|e| {
            ReadError::Broken(Status::invalid_argument(format!("decoding a request: {e}")))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;

    use bytes::BufMut;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use http_body_util::StreamBody;
    use prometheus_client::metrics::gauge::Gauge;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;
    use crate::limits::NamespaceBytes;

    type Chunks = mpsc::Sender<Result<http_body::Frame<Bytes>, Infallible>>;

    fn reader(
        limits: &Limits,
        counts: &Arc<NamespaceBytes>,
        gauge: &Gauge,
    ) -> (Chunks, Requests<DiscoveryRequest>) {
        let (tx, rx) = mpsc::channel(16);
        let body = boxed(StreamBody::new(ReceiverStream::new(rx)));
        let charge = counts.charge(&Arc::from("ns"), gauge);
        (tx, Requests::new(body, charge, limits))
    }

    fn framed(req: &DiscoveryRequest) -> Bytes {
        let mut out = BytesMut::new();
        out.put_u8(0);
        out.put_u32(u32::try_from(req.encoded_len()).unwrap());
        req.encode(&mut out).unwrap();
        out.freeze()
    }

    fn data(bytes: &[u8]) -> Result<http_body::Frame<Bytes>, Infallible> {
        Ok(http_body::Frame::data(Bytes::copy_from_slice(bytes)))
    }

    #[tokio::test]
    async fn requests_split_across_frames_and_sharing_one_are_read_in_order() {
        let counts = Arc::new(NamespaceBytes::new(usize::MAX));
        let gauge = Gauge::default();
        let (tx, mut requests) = reader(&Limits::default(), &counts, &gauge);
        let a = DiscoveryRequest {
            type_url: "a".into(),
            ..Default::default()
        };
        let b = DiscoveryRequest {
            type_url: "b".repeat(100),
            ..Default::default()
        };
        let both = [framed(&a), framed(&b)].concat();
        let (head, tail) = both.split_at(both.len() - 20);
        tx.send(data(&head[..3])).await.unwrap();
        tx.send(data(&head[3..])).await.unwrap();
        assert_eq!(requests.message().await.unwrap(), Some(a));
        // The second is charged its declared length while its last bytes are missing.
        let waiting = tokio::time::timeout(Duration::from_millis(50), requests.message()).await;
        assert!(waiting.is_err(), "a request read before it was whole");
        assert_eq!(gauge.get(), i64::try_from(framed(&b).len()).unwrap());
        tx.send(data(tail)).await.unwrap();
        assert_eq!(requests.message().await.unwrap(), Some(b));
        assert_eq!(gauge.get(), 0);
        // Nothing left to read: the stream holds no buffer while it waits.
        assert_eq!(requests.buf.capacity(), 0);
        drop(tx);
        assert_eq!(requests.message().await.unwrap(), None);
    }

    /// a request begun is charged its declared length, refused past the
    /// namespace's budget at its prefix, and must be finished within its deadline.
    #[tokio::test]
    async fn a_request_begun_is_charged_refused_past_the_budget_and_timed() {
        let limits = Limits {
            max_subscription_bytes_per_namespace: 3000,
            request_timeout: Duration::from_millis(400),
            ..Limits::default()
        };
        let counts = Arc::new(NamespaceBytes::new(usize::MAX));
        let gauge = Gauge::default();
        let (tx1, mut one) = reader(&limits, &counts, &gauge);
        let (tx2, mut two) = reader(&limits, &counts, &gauge);
        // A prefix declaring 2000 bytes, and 10 of them.
        let partial = |len: u32| [&[0u8][..], &len.to_be_bytes(), &[7u8; 10]].concat();
        tx1.send(data(&partial(2000))).await.unwrap();
        let first = tokio::time::timeout(Duration::from_millis(100), one.message()).await;
        assert!(first.is_err());
        assert_eq!(gauge.get(), 2005);
        tx2.send(data(&partial(2000))).await.unwrap();
        let over = two.message().await.unwrap_err();
        assert!(
            matches!(over, ReadError::Limit(Limit::SubscriptionBytesPerNamespace)),
            "{over:?}"
        );
        assert_eq!(gauge.get(), 2005, "the refused request was not charged");
        // The first never finishes: its deadline ends it 400 ms after its first bytes.
        let started = std::time::Instant::now();
        let late = one.message().await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(400));
        assert!(
            matches!(late, ReadError::Limit(Limit::RequestTimeout)),
            "{late:?}"
        );
        drop(one);
        assert_eq!(gauge.get(), 0, "a closed stream gives its bytes back");
        // A request over the size limit is refused from its prefix alone.
        let (tx3, mut three) = reader(&limits, &counts, &gauge);
        let huge = u32::try_from(limits.max_request_bytes + 1).unwrap();
        tx3.send(data(&partial(huge))).await.unwrap();
        let big = three.message().await.unwrap_err();
        assert!(
            matches!(big, ReadError::Limit(Limit::RequestSize)),
            "{big:?}"
        );
        drop((tx1, tx2));
    }
}
