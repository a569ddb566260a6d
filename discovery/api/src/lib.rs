//! marin3r's Kubernetes API types (the specs of its custom resources), independent of any
//! client: the controllers, the validator and the CLI share them. The resources derive
//! through `kube-derive` and `kube-core` (`crates(kube_core = ...)`), not the `kube` facade,
//! so this crate, and the EnvoyConfig pipeline built on it, cannot reach a kube client.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod discovery_service;
pub mod duration;
pub mod envoy_config;
pub mod envoy_config_revision;
pub mod envoy_deployment;
pub mod envoy_deployment_resolve;
pub mod proxy_sync;
pub mod reference;
pub mod resources;
pub mod rollout;
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
