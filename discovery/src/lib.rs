//! marin3r's discovery service (its controllers, the sidecar's shutdown manager,
//! `proxy-config`) and the `marin3r` command line. The one binary runs every process (the
//! operator of `marin3r-operator`, the discovery service) and every subcommand, so it sits on
//! top of the crates beside this one: `marin3r-api`, `marin3r-envoyconfig`, `marin3r-operator`.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod cli;
pub mod controllers;
pub mod crds;
pub mod olm;
pub mod proxy_config;
pub mod sidecar;

/// The container image this `marin3r` binary ships in: the operator's default for discovery
/// pods, the name `manifests/` deploy (kustomize `images:` overrides it) and `hack/image`
/// builds. Its tag follows the binary's own version, so an operator never starts discovery
/// pods of another release. Not the original Go project's `quay.io/3scale/marin3r`.
pub const IMAGE: &str = concat!("marin3r:v", env!("CARGO_PKG_VERSION"));
/// The user the image runs as (the `Dockerfile`'s `USER`, distroless' `nonroot`).
pub const IMAGE_USER: i64 = 65532;
