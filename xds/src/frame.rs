//! Responses as they go on the wire, encoded once and shared by every stream.
//!
//! A discovery response differs between the streams of one snapshot only in its nonce. So
//! the rest of the message (version, resources, type URL, control plane) is encoded once per
//! distinct content and kept with the published snapshot ([`Encoded`]); each stream sends a
//! small head of its own (the gRPC length prefix and the nonce field) followed by that shared
//! body, which HTTP/2 writes from the same buffer for every stream. Protobuf lets fields come
//! in any order, so the nonce (field 5 of both response messages) may precede the others.
//!
//! The response body ([`FrameBody`]) is an HTTP body of those chunks ending with the gRPC
//! trailers; it replaces tonic's encoder, which copied every response into a per-stream
//! buffer that then kept the capacity of the largest response for the life of the stream.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codegen::http::{HeaderMap, HeaderValue};

/// Field 5 (`nonce`), length-delimited: the same tag in `DiscoveryResponse` and
/// `DeltaDiscoveryResponse`.
const NONCE_TAG: u8 = (5 << 3) | 2;

/// How many distinct responses one published snapshot remembers. Streams of one node ask for
/// the same names, so a handful is the norm; a client asking for ever new combinations gets
/// its responses encoded for it alone past this.
const MAX_REMEMBERED: usize = 256;

/// The bytes of bodies one published snapshot remembers beyond twice its resources' bytes:
/// every type's full response, and as much again for subsets and deltas, fit in that.
const MEMO_SLACK_BYTES: usize = 1 << 20;

/// One response of one stream: its own head, then the body it shares with other streams.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    head: Bytes,
    body: Bytes,
}

impl Frame {
    /// The gRPC message `nonce field ++ body`, length-prefixed.
    pub(crate) fn new(nonce: &str, body: Bytes) -> Result<Self, Status> {
        let nonce_len = if nonce.is_empty() {
            0
        } else {
            1 + prost::length_delimiter_len(nonce.len()) + nonce.len()
        };
        let len = u32::try_from(nonce_len + body.len())
            .map_err(|_| Status::resource_exhausted("a response over 4 GiB"))?;
        let mut head = BytesMut::with_capacity(5 + nonce_len);
        head.put_u8(0); // not compressed
        head.put_u32(len);
        if !nonce.is_empty() {
            head.put_u8(NONCE_TAG);
            prost::encode_length_delimiter(nonce.len(), &mut head)
                .map_err(|e| Status::internal(format!("encoding a nonce: {e}")))?;
            head.put_slice(nonce.as_bytes());
        }
        Ok(Self {
            head: head.freeze(),
            body,
        })
    }

    /// The whole gRPC message (prefix included), for tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        [&self.head[..], &self.body[..]].concat()
    }
}

/// The encoded bodies of one published snapshot's responses, by what they contain.
///
/// Keys are SHA-256 digests of what names a response within its snapshot (its type, version
/// and selection, or the snapshot entries it carries), so an entry costs its body and 32 bytes
/// however long the names a proxy asked for; and the bodies are bounded in bytes as well as in
/// count, relative to the snapshot they come from. A memo lives exactly as long as its
/// snapshot, which keys may rely on.
#[derive(Debug)]
pub(crate) struct Encoded {
    bodies: Mutex<Bodies>,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Bodies {
    by_key: HashMap<[u8; 32], Bytes>,
    bytes: usize,
}

impl Default for Encoded {
    fn default() -> Self {
        Self::for_snapshot_of(0)
    }
}

impl Encoded {
    /// The memo of a snapshot whose resources take `resource_bytes`.
    pub(crate) fn for_snapshot_of(resource_bytes: usize) -> Self {
        Self {
            bodies: Mutex::default(),
            max_bytes: resource_bytes
                .saturating_mul(2)
                .saturating_add(MEMO_SLACK_BYTES),
        }
    }

    /// The body for `key` (a byte string naming the response's content exactly), encoding
    /// `message` only if no stream has yet.
    pub(crate) fn body(&self, key: Vec<u8>, message: impl FnOnce() -> Bytes) -> Bytes {
        let key: [u8; 32] = Sha256::digest(&key).into();
        let mut bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(body) = bodies.by_key.get(&key) {
            return body.clone();
        }
        let body = message();
        let bytes = bodies.bytes.saturating_add(body.len());
        if bodies.by_key.len() < MAX_REMEMBERED && bytes <= self.max_bytes {
            bodies.by_key.insert(key, body.clone());
            bodies.bytes = bytes;
        }
        body
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bodies.lock().map(|b| b.by_key.len()).unwrap_or(0)
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bodies.lock().map(|b| b.bytes).unwrap_or(0)
    }
}

/// Appends `text` to a memo key, length first so that no two lists make the same key.
pub(crate) fn key_part(key: &mut Vec<u8>, text: &str) {
    key.extend_from_slice(&(text.len() as u64).to_le_bytes());
    key.extend_from_slice(text.as_bytes());
}

/// Encodes a message with no nonce (the stream adds its own).
pub(crate) fn encode(message: &impl Message) -> Bytes {
    Bytes::from(message.encode_to_vec())
}

/// What a stream's task hands its response body: a frame, or the status that ends the
/// stream. Boxed: tokio's channel allocates its slots 32 at a time whatever its capacity, so
/// a pointer per slot instead of a 64-byte message saves ~1.8 KiB per stream.
pub(crate) type Sent = Box<Result<Frame, Status>>;

/// The response body of one ADS stream: the frames its task sends, then the gRPC trailers
/// (`grpc-status: 0`, or the status the task ended the stream with).
pub(crate) struct FrameBody {
    rx: mpsc::Receiver<Sent>,
    body: Option<Bytes>,
    done: bool,
}

impl FrameBody {
    pub(crate) fn new(rx: mpsc::Receiver<Sent>) -> Self {
        Self {
            rx,
            body: None,
            done: false,
        }
    }
}

fn trailers(status: Option<&Status>) -> HeaderMap {
    let mut map = HeaderMap::new();
    match status {
        None => {
            map.insert("grpc-status", HeaderValue::from_static("0"));
        }
        Some(status) => {
            if status.add_header(&mut map).is_err() {
                // Only a message that cannot be a header value gets here: say so plainly.
                map.insert("grpc-status", HeaderValue::from(status.code() as i32));
            }
        }
    }
    map
}

impl http_body::Body for FrameBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(body) = this.body.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(body))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let frame = match this.rx.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(sent)) => match *sent {
                Ok(frame) => frame,
                Err(status) => {
                    this.done = true;
                    this.rx.close();
                    return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers(Some(
                        &status,
                    ))))));
                }
            },
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers(None)))));
            }
        };
        if !frame.body.is_empty() {
            this.body = Some(frame.body);
        }
        Poll::Ready(Some(Ok(http_body::Frame::data(frame.head))))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.body.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn a_frame_is_the_prefix_then_the_nonce_then_the_shared_body() {
        let body = Bytes::from_static(b"\x0a\x02v1");
        let f = Frame::new("17", body.clone()).unwrap();
        let bytes = f.to_vec();
        assert_eq!(bytes[0], 0);
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 5);
        assert_eq!(&bytes[5..], b"\x2a\x0217\x0a\x02v1");
        // The same body for every stream: no copy.
        assert_eq!(f.body.as_ptr(), body.as_ptr());
        let empty = Frame::new("", Bytes::new()).unwrap();
        assert_eq!(empty.to_vec(), [0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_body_is_encoded_once_per_key_and_the_memo_is_bounded() {
        let memo = Encoded::default();
        let mut calls = 0;
        let mut get = |k: &str| {
            memo.body(k.as_bytes().to_vec(), || {
                calls += 1;
                Bytes::from(k.to_owned())
            })
        };
        let a = get("a");
        let again = get("a");
        assert_eq!(a.as_ptr(), again.as_ptr());
        for i in 0..MAX_REMEMBERED + 10 {
            get(&format!("k{i}"));
        }
        assert_eq!(calls, 1 + MAX_REMEMBERED + 10);
        assert_eq!(memo.len(), MAX_REMEMBERED);
    }

    #[test]
    fn the_memo_is_bounded_in_bytes_relative_to_its_snapshot() {
        let memo = Encoded::for_snapshot_of(1000);
        let budget = 2000 + MEMO_SLACK_BYTES;
        let body = Bytes::from(vec![0u8; 64 << 10]);
        for i in 0..MAX_REMEMBERED {
            memo.body(format!("k{i}").into_bytes(), || body.clone());
        }
        assert!(memo.bytes() <= budget, "{} bytes remembered", memo.bytes());
        assert_eq!(memo.len(), budget / body.len());
        // Past the budget a body is still made, just not kept.
        let mut made = false;
        memo.body(b"another".to_vec(), || {
            made = true;
            body.clone()
        });
        assert!(made);
        assert_eq!(memo.len(), budget / body.len());
    }

    #[test]
    fn key_parts_do_not_run_together() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        key_part(&mut a, "ab");
        key_part(&mut a, "c");
        key_part(&mut b, "a");
        key_part(&mut b, "bc");
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn the_body_sends_each_frame_then_the_trailers() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Box::new(Ok(
            Frame::new("1", Bytes::from_static(b"body")).unwrap()
        )))
        .await
        .unwrap();
        drop(tx);
        let mut body = FrameBody::new(rx);
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap();
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            }
        }
        assert_eq!(&data[5..], b"\x2a\x011body");
        assert_eq!(trailers.unwrap()["grpc-status"], "0");

        let (tx, rx) = mpsc::channel(4);
        tx.send(Box::new(Err(Status::resource_exhausted(
            "too many streams",
        ))))
        .await
        .unwrap();
        let mut body = FrameBody::new(rx);
        let frame = body.frame().await.unwrap().unwrap();
        let t = frame.into_trailers().unwrap();
        assert_eq!(t["grpc-status"], "8");
        assert_eq!(t["grpc-message"], "too%20many%20streams");
        assert!(body.frame().await.is_none());
        assert!(http_body::Body::is_end_stream(&body));
    }
}
