//! marin3r's discovery service and the `marin3r` command line.

pub mod bootstrap;
pub mod cli;
pub mod resource;
pub mod xds;
