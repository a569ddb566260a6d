//! The discovery crate's integration tests in one binary: the CLI, the controllers on the
//! real cluster's API server (`hack/cluster`, or `MARIN3R_E2E_KUBECONFIG`), the discovery
//! service, the sidecar's bootstrap against real Envoy.

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

mod support;

mod admission_envoy;
mod api_outage;
mod bootstrap;
mod certs_cluster;
mod cli_certs;
mod cli_completion;
mod cli_inject;
mod cli_output;
mod cli_validate;
mod convergence;
mod crds;
mod differential;
mod discovery_service;
mod docs_architecture;
mod docs_commands;
mod envoy_config;
mod envoy_config_judged;
mod envoy_config_resources;
mod envoy_config_secrets;
mod image;
mod image_archive;
mod judge_untrusted;
mod kubectl_explain;
mod kubectl_plugin;
mod leader_election;
mod log_format;
mod metrics_conventions;
mod olm_bundle;
mod operator_process;
mod proxy_status;
mod reference;
mod replicas;
mod runtime_rejection;
mod shutdown_manager;
mod shutdown_manager_reach;
mod support_matrix;
mod version;
mod watches;
mod xds_envoy;
mod xds_envoy_nack_threshold;
mod xds_envoy_scoped;
mod xds_tracks;
