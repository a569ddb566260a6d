//! xDS test support: Envoy resources built from envoy-types' structs, an mTLS ADS client, and
//! the xDS server under test with its own runtime and PKI.

pub mod client;
pub mod partial;
pub mod resources;
pub mod server;
