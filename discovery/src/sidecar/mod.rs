//! What runs beside every Envoy the product injects, apart from the webhook's pod patch and
//! the bootstrap (both in marin3r-webhook): the shutdown manager that drains Envoy before its
//! pod stops.

pub mod shutdown_manager;
