//! marin3r's Kubernetes API types (the specs of its custom resources), independent of any
//! client: the controllers, the validator and the CLI share them.

pub mod discovery_service;
pub mod duration;
pub mod envoy_config;

pub use envoy_config::{
    EnvoyApi, EnvoyConfigSpec, EnvoyResource, EnvoyResources, EnvoySecretResource, SecretReference,
    Serialization,
};
