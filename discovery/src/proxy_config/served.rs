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
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// Decodes every resource of `snapshot`.
pub fn render(namespace: &str, node: &str, snapshot: &Snapshot) -> anyhow::Result<Served> {
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
            .ok_or_else(|| anyhow::anyhow!("no descriptor for {}", kind.message_name()))?;
        for (name, r) in of_type.resources() {
            let message = DynamicMessage::decode(descriptor.clone(), r.resource.body.clone())
                .map_err(|e| anyhow::anyhow!("decoding {} {name}: {e}", kind.spec_field()))?;
            let mut config = message
                .serialize_with_options(serde_json::value::Serializer, &options)
                .map_err(|e| anyhow::anyhow!("encoding {} {name}: {e}", kind.spec_field()))?;
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
