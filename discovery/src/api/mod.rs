//! marin3r's Kubernetes API types (the specs of its custom resources), independent of any
//! client: the controllers, the validator and the CLI share them.

pub mod crds;
pub mod discovery_service;
pub mod duration;
pub mod envoy_config;
pub mod envoy_config_revision;
pub mod envoy_deployment;
pub mod envoy_deployment_resolve;
pub mod proxy_sync;
pub mod reference;
pub mod resources;
pub mod sidecar_defaults;

pub use envoy_config::{
    ConfigRevisionRef, EnvoyApi, EnvoyConfig, EnvoyConfigSpec, EnvoyConfigStatus, EnvoyResource,
    EnvoyResources, EnvoySecretResource, SecretReference, Serialization,
};
pub use envoy_config_revision::{
    EnvoyConfigRevision, EnvoyConfigRevisionSpec, EnvoyConfigRevisionStatus,
};
pub use resources::{
    Blueprint, EndpointSlicesSource, LabelSelector, OpaqueSecretSource, Resource, ResourceKind,
};
