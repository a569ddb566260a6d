//! What runs beside every Envoy the product injects, apart from the webhook's pod patch: the
//! bootstrap Envoy starts from (the xDS cluster over mutual TLS, file-based SDS for its client
//! certificate) and the shutdown manager that drains Envoy before its pod stops.

pub mod bootstrap;
pub mod shutdown_manager;
