//! marin3r's discovery service and the `marin3r` command line.

pub mod bootstrap;
pub mod cli;
pub mod crds;
pub mod resource;
pub mod revisions;
