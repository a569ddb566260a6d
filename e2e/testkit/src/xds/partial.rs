//! A state-of-the-world ADS stream written by hand, frame by frame, so that it can begin a
//! discovery request and never finish it: a gRPC length prefix declaring many bytes, and only
//! some of them. For the tests and the abuse bench of what such requests make the server hold.

use std::convert::Infallible;

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Service, http};
use tonic::transport::Channel;

use marin3r_xds::SOTW_PATH;

type Chunk = Result<Frame<Bytes>, Infallible>;

/// One SotW stream whose request body the caller writes.
pub struct PartialStream {
    tx: mpsc::Sender<Chunk>,
    response: http::Response<tonic::body::Body>,
}

/// `req` as a gRPC message: its length prefix, then its bytes.
pub fn framed(req: &DiscoveryRequest) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + req.encoded_len());
    out.put_u8(0);
    out.put_u32(u32::try_from(req.encoded_len()).unwrap_or(u32::MAX));
    // Cannot fail: the buffer has room for the whole message.
    let _ = req.encode(&mut out);
    out.freeze()
}

impl PartialStream {
    /// Opens a stream on `channel` and sends `first`, whole.
    pub async fn open(mut channel: Channel, first: &DiscoveryRequest) -> anyhow::Result<Self> {
        let (tx, rx) = mpsc::channel::<Chunk>(8);
        tx.send(Ok(Frame::data(framed(first))))
            .await
            .context("the request body")?;
        let body = tonic::body::Body::new(StreamBody::new(ReceiverStream::new(rx)));
        let request = http::Request::builder()
            .method(http::Method::POST)
            .uri(SOTW_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(body)?;
        std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
        let response = channel.call(request).await?;
        Ok(Self { tx, response })
    }

    /// Sends a length prefix declaring `declared` bytes, then `sent` bytes of them.
    pub async fn begin(&self, declared: u32, sent: usize) -> anyhow::Result<()> {
        let mut head = BytesMut::with_capacity(5);
        head.put_u8(0);
        head.put_u32(declared);
        self.send(head.freeze()).await?;
        const CHUNK: usize = 16 << 10;
        let mut left = sent;
        while left > 0 {
            let n = left.min(CHUNK);
            self.send(Bytes::from(vec![0x2a; n])).await?;
            left -= n;
        }
        Ok(())
    }

    async fn send(&self, bytes: Bytes) -> anyhow::Result<()> {
        self.tx
            .send(Ok(Frame::data(bytes)))
            .await
            .context("the server closed the request body")
    }

    /// Reads the responses until the stream ends, and returns the status it ended with (a
    /// refusal at the start comes in the response's headers).
    pub async fn status(&mut self) -> anyhow::Result<tonic::Status> {
        if let Some(status) = tonic::Status::from_header_map(self.response.headers()) {
            return Ok(status);
        }
        let body = self.response.body_mut();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("reading the response")?;
            if let Some(trailers) = frame.trailers_ref()
                && let Some(status) = tonic::Status::from_header_map(trailers)
            {
                return Ok(status);
            }
        }
        anyhow::bail!("the stream ended without a status")
    }
}
