//! marin3r's discovery service and the `marin3r` command line.

pub mod api;
pub mod bootstrap;
pub mod cli;
pub mod controllers;
pub mod convert;
pub mod crds;
pub mod operator;
pub mod reference;
pub mod revisions;

/// The xDS server lives in its own crate (no Kubernetes in it); these keep the paths the
/// rest of this crate and its users know.
pub use marin3r_xds as xds;
pub use marin3r_xds::resource;
