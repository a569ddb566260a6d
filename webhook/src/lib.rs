//! marin3r's sidecar injection webhook (SPEC §4): pod annotations parsed into a sidecar spec,
//! the pure `mutate(&Pod, &InjectionConfig) -> Result<Patch, Denial>`, the AdmissionReview v1
//! codec, the validating admission of EnvoyConfigs (judged by a validator the binary
//! supplies), the HTTPS server (certificate reloaded from disk) and offline injection of YAML;
//! and the bootstrap the injected sidecar starts from (`bootstrap`), which the operator writes
//! into each namespace, so that the sidecar's whole shape lives in this crate.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod annotations;
pub mod bootstrap;
mod clients;
pub mod config;
mod conn;
pub mod inject;
pub mod metrics;
pub mod mutate;
mod quantity;
pub mod readiness;
pub mod review;
pub mod server;
pub mod sidecar;
pub mod tls;
pub mod validate;
pub mod validate_turns;

pub use config::InjectionConfig;
pub use inject::{InjectError, Injected, inject_yaml};
pub use metrics::WebhookMetrics;
pub use mutate::{
    Denial, Mutation, Selection, inject_json, mutate, mutation, selection, sidecar_command_line,
};
pub use quantity::parse_quantity;
pub use review::{BadRequest, review};
pub use server::{WebhookServerConfig, router, serve};
pub use validate::EnvoyConfigValidator;
