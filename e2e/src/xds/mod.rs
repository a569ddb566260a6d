//! xDS test support: Envoy resources built from envoy-types' structs, and an mTLS ADS client.

pub mod client;
pub mod resources;
