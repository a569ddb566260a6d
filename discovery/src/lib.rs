//! marin3r's discovery service and the `marin3r` command line.

pub mod api;
pub mod bootstrap;
pub mod cli;
pub mod controllers;
pub mod convert;
pub mod crds;
pub mod operator;
pub mod reference;
pub mod resource;
pub mod revisions;
pub mod xds;
