//! The ADS service on the wire. Responses use message types of our own that are
//! wire-identical to Envoy's `DiscoveryResponse`/`DeltaDiscoveryResponse` but hold each
//! resource as shared [`Bytes`]; a response is encoded once per snapshot and content and its
//! bytes shared by every stream that sends it (see [`super::frame`]). Requests are decoded
//! with envoy-types' generated messages.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::sync::mpsc;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};

use super::cache::Snapshot;
use super::delta::{DeltaRequest, DeltaResponse, DeltaState};
use super::frame::{self, Encoded, Frame, FrameBody, Sent, key_part};
use super::limits::Limits;
use super::metrics::Protocol;
use super::protocol::{Bounds, Outcome};
use super::requests;
use super::sotw::{SotwRequest, SotwResponse, SotwState};
use super::stream::{self, Flavour, Shared};
use crate::resource::ResourceType;

/// `google.protobuf.Any` with a shared value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyBytes {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<AnyBytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(message, optional, tag = "6")]
    pub control_plane: Option<ControlPlane>,
}

/// `envoy.service.discovery.v3.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireResource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<AnyBytes>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireDeltaResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<WireResource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
    #[prost(message, optional, tag = "7")]
    pub control_plane: Option<ControlPlane>,
}

/// The longest NACK message kept (in the proxy status, the NACK event and from there the
/// revision's condition, which the API server caps at 32,000 characters anyway).
pub const MAX_NACK_MESSAGE: usize = 32_000;

/// Envoy's error message, cut at [`MAX_NACK_MESSAGE`] bytes (a request may carry megabytes).
pub fn nack_message(message: &str) -> String {
    if message.len() <= MAX_NACK_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_NACK_MESSAGE;
    while !message.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    let rest = message.len().saturating_sub(end);
    format!("{}… ({rest} more bytes)", &message[..end])
}

/// The protocol's view of a request, taking its fields (an ACK carries every subscribed
/// name; copying them for every request of every stream showed in profiles).
pub fn sotw_request(req: DiscoveryRequest) -> SotwRequest {
    SotwRequest {
        error: req.error_detail.as_ref().map(|s| nack_message(&s.message)),
        type_url: req.type_url,
        version_info: req.version_info,
        resource_names: req.resource_names,
        response_nonce: req.response_nonce,
    }
}

pub fn delta_request(req: DeltaDiscoveryRequest) -> DeltaRequest {
    DeltaRequest {
        error: req.error_detail.as_ref().map(|s| nack_message(&s.message)),
        type_url: req.type_url,
        subscribe: req.resource_names_subscribe,
        unsubscribe: req.resource_names_unsubscribe,
        initial_resource_versions: req.initial_resource_versions.into_iter().collect(),
        response_nonce: req.response_nonce,
    }
}

/// The frame of a state-of-the-world response: its body encoded once per snapshot and
/// content (the memo of the snapshot it came from, when there is one), the nonce its own.
/// `snapshot` is the one the response was decided on.
pub(crate) fn sotw_frame(
    resp: SotwResponse,
    snapshot: &Snapshot,
    control_plane: &ControlPlane,
    memo: Option<&Encoded>,
) -> Result<Frame, tonic::Status> {
    let type_url = resp.kind.type_url();
    let message = || {
        frame::encode(&WireResponse {
            version_info: resp.version.clone(),
            resources: resp
                .resources(snapshot)
                .into_iter()
                .map(|r| AnyBytes {
                    type_url: type_url.to_owned(),
                    value: r.body,
                })
                .collect(),
            type_url: type_url.to_owned(),
            nonce: String::new(),
            control_plane: Some(control_plane.clone()),
        })
    };
    // A response with stand-ins holds names the proxy made up: it is the stream's own.
    let body = match memo.filter(|_| !resp.has_stand_ins(snapshot)) {
        // Within one snapshot a type's version and what the response selects say exactly
        // what it holds.
        Some(memo) => {
            let mut key = Vec::with_capacity(128);
            key_part(&mut key, "sotw");
            key_part(&mut key, type_url);
            key_part(&mut key, &resp.version);
            key.extend_from_slice(resp.selection());
            memo.body(key, message)
        }
        None => message(),
    };
    Frame::new(&resp.nonce, body)
}

/// The frame of a delta response, encoded once per snapshot and content like
/// [`sotw_frame`].
pub(crate) fn delta_frame(
    resp: DeltaResponse,
    control_plane: &ControlPlane,
    memo: Option<&Encoded>,
) -> Result<Frame, tonic::Status> {
    let type_url = resp.kind.type_url();
    let message = || {
        frame::encode(&WireDeltaResponse {
            system_version_info: resp.system_version.clone(),
            resources: resp
                .resources
                .iter()
                .map(|r| WireResource {
                    version: r.version.to_string(),
                    name: r.resource.name.clone(),
                    resource: Some(AnyBytes {
                        type_url: type_url.to_owned(),
                        value: r.resource.body.clone(),
                    }),
                })
                .collect(),
            type_url: type_url.to_owned(),
            nonce: String::new(),
            removed_resources: resp.removed.clone(),
            control_plane: Some(control_plane.clone()),
        })
    };
    let body = match memo.filter(|_| !resp.stand_ins) {
        Some(memo) => {
            let mut key = Vec::with_capacity(64 + resp.resources.len() * 8);
            key_part(&mut key, "delta");
            key_part(&mut key, type_url);
            key_part(&mut key, &resp.system_version);
            // Without stand-ins every resource is one of the snapshot's entries, and the
            // memo lives no longer than that snapshot: the address of an entry's shared name
            // names it (name, version, body) for the memo's whole life, in 8 bytes instead of
            // its name and version. (Hashing those showed in profiles of 2,000 streams.)
            for r in &resp.resources {
                key.extend_from_slice(&(Arc::as_ptr(&r.name).cast::<u8>() as usize).to_le_bytes());
            }
            // A name cannot be both sent and removed; the marker keeps the lists apart.
            key_part(&mut key, "\0removed");
            for name in &resp.removed {
                key_part(&mut key, name);
            }
            memo.body(key, message)
        }
        None => message(),
    };
    Frame::new(&resp.nonce, body)
}

// How each flavour's requests and responses look on the wire, for the stream loop.

impl Flavour for SotwState {
    type Req = DiscoveryRequest;
    type Resp = SotwResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;

    fn new(limits: &Limits) -> Self {
        SotwState::with_bounds(Bounds::of(limits))
    }
    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn type_url(req: &DiscoveryRequest) -> &str {
        &req.type_url
    }
    fn on_request(&mut self, req: DiscoveryRequest, s: Option<&Snapshot>) -> Outcome<SotwResponse> {
        SotwState::on_request(self, &sotw_request(req), s)
    }
    fn on_snapshot(&mut self, s: &Snapshot) -> Vec<SotwResponse> {
        SotwState::on_snapshot(self, s)
    }
    fn held_bytes(&self) -> usize {
        SotwState::held_bytes(self)
    }
    fn describe(resp: &SotwResponse) -> (ResourceType, &str) {
        (resp.kind, &resp.version)
    }
    fn frame(
        resp: SotwResponse,
        snapshot: Option<&Snapshot>,
        cp: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, tonic::Status> {
        // A response is only ever decided on a snapshot; without one it holds nothing.
        match snapshot {
            Some(snapshot) => sotw_frame(resp, snapshot, cp, memo),
            None => sotw_frame(resp, &Snapshot::empty(), cp, None),
        }
    }
}

impl Flavour for DeltaState {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const PROTOCOL: Protocol = Protocol::Delta;

    fn new(limits: &Limits) -> Self {
        DeltaState::with_bounds(Bounds::of(limits))
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
        DeltaState::on_request(self, &delta_request(req), s)
    }
    fn on_snapshot(&mut self, s: &Snapshot) -> Vec<DeltaResponse> {
        DeltaState::on_snapshot(self, s)
    }
    fn held_bytes(&self) -> usize {
        DeltaState::held_bytes(self)
    }
    fn describe(resp: &DeltaResponse) -> (ResourceType, &str) {
        (resp.kind, &resp.system_version)
    }
    fn frame(
        resp: DeltaResponse,
        _snapshot: Option<&Snapshot>,
        cp: &ControlPlane,
        memo: Option<&Encoded>,
    ) -> Result<Frame, tonic::Status> {
        delta_frame(resp, cp, memo)
    }
}

/// The gRPC path of the state-of-the-world ADS call.
pub const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// The gRPC path of the delta ADS call.
pub const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The `AggregatedDiscoveryService` as a tower service for tonic's router.
#[derive(Clone)]
pub struct AdsService {
    shared: Arc<Shared>,
}

impl AdsService {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl tonic::server::NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

/// The `grpc-encoding` of a request, when it is one marin3r cannot read (only identity).
fn unsupported_encoding(headers: &http::HeaderMap) -> Option<String> {
    let encoding = headers.get("grpc-encoding")?;
    (encoding != "identity").then(|| String::from_utf8_lossy(encoding.as_bytes()).into_owned())
}

/// A response streaming `rx`'s frames, or the status alone when the stream was refused.
fn grpc_response(
    started: Result<mpsc::Receiver<Sent>, tonic::Status>,
) -> http::Response<tonic::body::Body> {
    match started {
        Ok(rx) => {
            let mut response = http::Response::new(tonic::body::Body::new(FrameBody::new(rx)));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(status) => status.into_http(),
    }
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        let (parts, body) = req.into_parts();
        if let Some(encoding) = unsupported_encoding(&parts.headers) {
            let status = tonic::Status::unimplemented(format!(
                "request encoding {encoding:?} is not supported; marin3r reads identity only"
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let response = match parts.uri.path() {
            SOTW_PATH => grpc_response(stream::start::<SotwState>(
                shared,
                &parts.extensions,
                requests::boxed(body),
            )),
            DELTA_PATH => grpc_response(stream::start::<DeltaState>(
                shared,
                &parts.extensions,
                requests::boxed(body),
            )),
            _ => tonic::Status::unimplemented("marin3r serves only the ADS methods").into_http(),
        };
        Box::pin(async move { Ok(response) })
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;

    use super::*;
    use crate::cache::Snapshot;
    use crate::resource::{Resource, ResourceType};

    #[test]
    fn a_nack_message_of_megabytes_is_kept_to_its_first_32000_bytes() {
        let huge = format!(
            "{}é{}",
            "x".repeat(MAX_NACK_MESSAGE - 1),
            "y".repeat(4 << 20)
        );
        let req = DiscoveryRequest {
            error_detail: Some(envoy_types::pb::google::rpc::Status {
                code: 3,
                message: huge.clone(),
                details: vec![],
            }),
            ..Default::default()
        };
        let kept = sotw_request(req.clone()).error.unwrap();
        // Cut before the two-byte character that straddles the limit.
        let rest = huge.len() - (MAX_NACK_MESSAGE - 1);
        assert_eq!(
            kept,
            format!("{}… ({rest} more bytes)", "x".repeat(MAX_NACK_MESSAGE - 1))
        );
        let delta = DeltaDiscoveryRequest {
            error_detail: req.error_detail.clone(),
            ..Default::default()
        };
        assert_eq!(delta_request(delta).error.unwrap(), kept);
        assert_eq!(nack_message("bad cluster"), "bad cluster");
    }

    /// The message of a frame, without the gRPC prefix.
    fn message(frame: &Frame) -> Vec<u8> {
        let bytes = frame.to_vec();
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 5, "the prefix holds the message length");
        bytes[5..].to_vec()
    }

    #[test]
    fn our_responses_decode_as_envoys_messages() {
        let body = Bytes::from_static(b"\x0a\x04name");
        let kind = ResourceType::Cluster;
        let cp = ControlPlane {
            identifier: "marin3r".into(),
        };
        let memo = Encoded::default();
        let snap = Snapshot::new([Resource {
            kind,
            name: "name".into(),
            body: body.clone(),
        }])
        .unwrap();
        let mut st = SotwState::default();
        let request = |names: &[&str]| DiscoveryRequest {
            type_url: kind.type_url().into(),
            resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        };
        let resp = st
            .on_request(&sotw_request(request(&[])), Some(&snap))
            .response
            .unwrap();
        let version = resp.version.clone();
        let frame = sotw_frame(resp.clone(), &snap, &cp, Some(&memo)).unwrap();
        let decoded = DiscoveryResponse::decode(message(&frame).as_slice()).unwrap();
        assert_eq!(decoded.version_info, version);
        assert_eq!(decoded.nonce, resp.nonce);
        assert_eq!(decoded.type_url, kind.type_url());
        assert_eq!(decoded.resources[0].type_url, kind.type_url());
        assert_eq!(decoded.resources[0].value, body.to_vec());
        assert_eq!(decoded.control_plane.unwrap().identifier, "marin3r");
        // Another stream: its own nonce, the same encoded body; without a memo, the same bytes.
        let mut other = resp.clone();
        other.nonce = "8".into();
        let other = sotw_frame(other, &snap, &cp, Some(&memo)).unwrap();
        assert_eq!(
            DiscoveryResponse::decode(message(&other).as_slice())
                .unwrap()
                .nonce,
            "8"
        );
        assert_eq!(memo.len(), 1);
        let alone = sotw_frame(resp, &snap, &cp, None).unwrap();
        assert_eq!(message(&alone), message(&frame));
        // A response holding stand-ins (runtime layers the proxy named and the snapshot
        // lacks) is not remembered.
        let mut rtds = SotwState::default();
        let made_up = rtds
            .on_request(
                &sotw_request(DiscoveryRequest {
                    type_url: ResourceType::Runtime.type_url().into(),
                    resource_names: vec!["made-up".into()],
                    ..Default::default()
                }),
                Some(&snap),
            )
            .response
            .unwrap();
        assert!(made_up.has_stand_ins(&snap));
        let frame = sotw_frame(made_up, &snap, &cp, Some(&memo)).unwrap();
        let decoded = DiscoveryResponse::decode(message(&frame).as_slice()).unwrap();
        assert_eq!(decoded.resources.len(), 1, "an empty layer stands in");
        assert_eq!(memo.len(), 1);

        let versioned = snap.of_type(kind).resources()["name"].clone();
        let delta = |removed: &str| DeltaResponse {
            kind,
            system_version: "sv".into(),
            nonce: "8".into(),
            resources: vec![versioned.clone()],
            removed: vec![removed.into()],
            stand_ins: false,
        };
        let frame = delta_frame(delta("old"), &cp, Some(&memo)).unwrap();
        let d = DeltaDiscoveryResponse::decode(message(&frame).as_slice()).unwrap();
        assert_eq!(
            (d.system_version_info.as_str(), d.nonce.as_str()),
            ("sv", "8")
        );
        assert_eq!(d.removed_resources, ["old"]);
        assert_eq!(d.resources[0].name, "name");
        assert_eq!(*d.resources[0].version, *versioned.version);
        assert_eq!(
            d.resources[0].resource.as_ref().unwrap().value,
            body.to_vec()
        );
        assert_eq!(d.control_plane.unwrap().identifier, "marin3r");
        // A different removal is a different response, not the remembered one.
        let other = delta_frame(delta("older"), &cp, Some(&memo)).unwrap();
        let d = DeltaDiscoveryResponse::decode(message(&other).as_slice()).unwrap();
        assert_eq!(d.removed_resources, ["older"]);
        assert_eq!(memo.len(), 3);
    }
}
