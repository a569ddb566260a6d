//! The ADS service on the wire. Responses use message types of our own that are
//! wire-identical to Envoy's `DiscoveryResponse`/`DeltaDiscoveryResponse` but hold each
//! resource as shared [`Bytes`], so a resource is encoded once per snapshot and only copied
//! into each stream's send buffer. Requests are decoded with envoy-types' generated messages.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{Body, BoxFuture, Service, StdError, http};

use super::delta::{DeltaRequest, DeltaResponse};
use super::sotw::{SotwRequest, SotwResponse};
use super::stream::{self, Shared};

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

pub fn sotw_request(req: &DiscoveryRequest) -> SotwRequest {
    SotwRequest {
        type_url: req.type_url.clone(),
        version_info: req.version_info.clone(),
        resource_names: req.resource_names.clone(),
        response_nonce: req.response_nonce.clone(),
        error: req.error_detail.as_ref().map(|s| nack_message(&s.message)),
    }
}

pub fn delta_request(req: &DeltaDiscoveryRequest) -> DeltaRequest {
    DeltaRequest {
        type_url: req.type_url.clone(),
        subscribe: req.resource_names_subscribe.clone(),
        unsubscribe: req.resource_names_unsubscribe.clone(),
        initial_resource_versions: req
            .initial_resource_versions
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        response_nonce: req.response_nonce.clone(),
        error: req.error_detail.as_ref().map(|s| nack_message(&s.message)),
    }
}

pub fn sotw_response(resp: SotwResponse, control_plane: &ControlPlane) -> WireResponse {
    let type_url = resp.kind.type_url();
    WireResponse {
        version_info: resp.version,
        resources: resp
            .resources
            .into_iter()
            .map(|r| AnyBytes {
                type_url: type_url.to_owned(),
                value: r.body,
            })
            .collect(),
        type_url: type_url.to_owned(),
        nonce: resp.nonce,
        control_plane: Some(control_plane.clone()),
    }
}

pub fn delta_response(resp: DeltaResponse, control_plane: &ControlPlane) -> WireDeltaResponse {
    let type_url = resp.kind.type_url();
    WireDeltaResponse {
        system_version_info: resp.system_version,
        resources: resp
            .resources
            .into_iter()
            .map(|r| WireResource {
                version: r.version,
                name: r.resource.name,
                resource: Some(AnyBytes {
                    type_url: type_url.to_owned(),
                    value: r.resource.body,
                }),
            })
            .collect(),
        type_url: type_url.to_owned(),
        nonce: resp.nonce,
        removed_resources: resp.removed,
        control_plane: Some(control_plane.clone()),
    }
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
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

struct SotwMethod(Arc<Shared>);

impl tonic::server::StreamingService<DiscoveryRequest> for SotwMethod {
    type Response = WireResponse;
    type ResponseStream = ReceiverStream<Result<WireResponse, tonic::Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(
        &mut self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Self::Future {
        let shared = Arc::clone(&self.0);
        Box::pin(async move { stream::start_sotw(shared, request) })
    }
}

struct DeltaMethod(Arc<Shared>);

impl tonic::server::StreamingService<DeltaDiscoveryRequest> for DeltaMethod {
    type Response = WireDeltaResponse;
    type ResponseStream = ReceiverStream<Result<WireDeltaResponse, tonic::Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(
        &mut self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Self::Future {
        let shared = Arc::clone(&self.0);
        Box::pin(async move { stream::start_delta(shared, request) })
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
        let max_request = shared.limits.max_request_bytes;
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<WireResponse, DiscoveryRequest>::default();
                Ok(tonic::server::Grpc::new(codec)
                    .max_decoding_message_size(max_request)
                    .streaming(SotwMethod(shared), req)
                    .await)
            }),
            DELTA_PATH => Box::pin(async move {
                let codec =
                    tonic_prost::ProstCodec::<WireDeltaResponse, DeltaDiscoveryRequest>::default();
                Ok(tonic::server::Grpc::new(codec)
                    .max_decoding_message_size(max_request)
                    .streaming(DeltaMethod(shared), req)
                    .await)
            }),
            _ => Box::pin(async move {
                Ok(tonic::Status::unimplemented("marin3r serves only the ADS methods").into_http())
            }),
        }
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
        let kept = sotw_request(&req).error.unwrap();
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
        assert_eq!(delta_request(&delta).error.unwrap(), kept);
        assert_eq!(nack_message("bad cluster"), "bad cluster");
    }

    #[test]
    fn our_responses_decode_as_envoys_messages() {
        let body = Bytes::from_static(b"\x0a\x04name");
        let kind = ResourceType::Cluster;
        let cp = ControlPlane {
            identifier: "marin3r".into(),
        };
        let wire = sotw_response(
            SotwResponse {
                kind,
                version: "v1".into(),
                nonce: "7".into(),
                resources: vec![Resource {
                    kind,
                    name: "name".into(),
                    body: body.clone(),
                }],
            },
            &cp,
        );
        let decoded = DiscoveryResponse::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.version_info, "v1");
        assert_eq!(decoded.nonce, "7");
        assert_eq!(decoded.type_url, kind.type_url());
        assert_eq!(decoded.resources[0].type_url, kind.type_url());
        assert_eq!(decoded.resources[0].value, body.to_vec());
        assert_eq!(decoded.control_plane.unwrap().identifier, "marin3r");

        let snap = Snapshot::new([Resource {
            kind,
            name: "name".into(),
            body: body.clone(),
        }])
        .unwrap();
        let versioned = snap.of_type(kind).resources()["name"].clone();
        let wire = delta_response(
            DeltaResponse {
                kind,
                system_version: "sv".into(),
                nonce: "8".into(),
                resources: vec![versioned.clone()],
                removed: vec!["old".into()],
            },
            &cp,
        );
        let d = DeltaDiscoveryResponse::decode(wire.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            (d.system_version_info.as_str(), d.nonce.as_str()),
            ("sv", "8")
        );
        assert_eq!(d.removed_resources, ["old"]);
        assert_eq!(d.resources[0].name, "name");
        assert_eq!(d.resources[0].version, versioned.version);
        assert_eq!(
            d.resources[0].resource.as_ref().unwrap().value,
            body.to_vec()
        );
    }
}
