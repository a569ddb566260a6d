//! The discovery pod's side: `GET /served-config?namespace=NS&node=NODE` on its loopback
//! admin port answers the snapshot it serves that node, every resource decoded to proto3 JSON
//! (proto field names, as Envoy's `/config_dump` prints them) with secret fields redacted.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prost_reflect::{DynamicMessage, SerializeOptions};
use serde::{Deserialize, Serialize};

use super::Entry;
use super::redact::redact_resource;
use marin3r_envoyconfig::convert::descriptor_pool;
use marin3r_xds::resource::ResourceType;
use marin3r_xds::{Cache, Snapshot};

/// The path of the endpoint.
pub const SERVED_CONFIG_PATH: &str = "/served-config";

/// The answer of the endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Served {
    pub namespace: String,
    pub node_id: String,
    /// The version of each type served (`clusters`, `listeners`, ...).
    pub versions: std::collections::BTreeMap<String, String>,
    pub resources: Vec<Entry>,
}

/// `/served-config` on `cache`.
pub fn router(cache: Cache) -> axum::Router {
    axum::Router::new()
        .route(SERVED_CONFIG_PATH, get(handle))
        .with_state(cache)
}

async fn handle(State(cache): State<Cache>, Query(q): Query<HashMap<String, String>>) -> Response {
    let (Some(namespace), Some(node)) = (q.get("namespace"), q.get("node")) else {
        let message = "query parameters `namespace` and `node` are required\n";
        return (StatusCode::BAD_REQUEST, message).into_response();
    };
    let Some(snapshot) = cache.snapshot(namespace, node) else {
        let message = format!("nothing is served to node {node:?} of namespace {namespace:?}\n");
        return (StatusCode::NOT_FOUND, message).into_response();
    };
    match render(namespace, node, &snapshot) {
        Ok(served) => Json(served).into_response(),
        Err(e) => {
            let message = format!("{}\n", marin3r_controller::chain(&e));
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    }
}

/// Why a served resource cannot be shown: the cache holds only what was encoded from
/// Envoy's types, so each of these is a build's fault, not a tenant's.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Descriptors(#[from] marin3r_envoyconfig::convert::PoolError),
    #[error("no descriptor for {0}")]
    NoDescriptor(&'static str),
    #[error("decoding {kind} {name}")]
    Decode {
        kind: &'static str,
        name: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("encoding {kind} {name} as JSON")]
    Encode {
        kind: &'static str,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Decodes every resource of `snapshot`.
pub fn render(namespace: &str, node: &str, snapshot: &Snapshot) -> Result<Served, RenderError> {
    let pool = descriptor_pool()?;
    let options = SerializeOptions::new().use_proto_field_name(true);
    let mut resources = Vec::new();
    let mut versions = std::collections::BTreeMap::new();
    for kind in ResourceType::ALL {
        let of_type = snapshot.of_type(kind);
        if of_type.resources().is_empty() {
            continue;
        }
        versions.insert(kind.spec_field().to_owned(), of_type.version().to_owned());
        let descriptor = pool
            .get_message_by_name(kind.message_name())
            .ok_or(RenderError::NoDescriptor(kind.message_name()))?;
        for (name, r) in of_type.resources() {
            let message = DynamicMessage::decode(descriptor.clone(), r.resource.body.clone())
                .map_err(|source| RenderError::Decode {
                    kind: kind.spec_field(),
                    name: name.to_string(),
                    source,
                })?;
            let mut config = message
                .serialize_with_options(serde_json::value::Serializer, &options)
                .map_err(|source| RenderError::Encode {
                    kind: kind.spec_field(),
                    name: name.to_string(),
                    source,
                })?;
            redact_resource(kind.spec_field(), &mut config);
            resources.push(Entry {
                kind: kind.spec_field().to_owned(),
                name: name.to_string(),
                state: "served".into(),
                version: Some(of_type.version().to_owned()),
                last_updated: None,
                config,
            });
        }
    }
    Ok(Served {
        namespace: namespace.to_owned(),
        node_id: node.to_owned(),
        versions,
        resources,
    })
}
