//! The protobuf descriptors of every Envoy v3 message, decoded once and shared by every
//! conversion. They come from the descriptor set the `envoy-types` crate ships (see
//! `build.rs`), so they describe exactly the prost structs that crate compiles.

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

/// The descriptor set embedded by `build.rs`.
static DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin"));

// prost-reflect's own decoder keeps custom options (e.g. protoc-gen-validate rules) that a
// round trip through `prost_types::FileDescriptorSet` would drop.
static POOL: LazyLock<Result<DescriptorPool, PoolError>> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| PoolError(e.to_string())));

/// The embedded descriptor set could not be decoded (a build problem, not bad input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the embedded Envoy descriptor set is unusable: {0}")]
pub struct PoolError(String);

/// The shared pool, decoded on first use (~3 MB of descriptors).
pub fn descriptor_pool() -> Result<&'static DescriptorPool, PoolError> {
    POOL.as_ref().map_err(Clone::clone)
}
