//! marin3r's end-to-end scenarios, with real Envoy and kubectl, in one binary, on the real
//! cluster of `hack/cluster` (`marin3r_e2e::real`).

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

mod abuse_smoke;
mod api_conventions_e2e;
mod ca_rotation_e2e;
mod certificate_controller;
mod check_e2e;
mod check_structure;
mod convert_envoy;
mod demo;
mod envoy_deployment_e2e;
mod envoy_deployment_replicas_e2e;
mod envoy_judge_e2e;
mod envoy_smoke;
mod gateway_traffic;
mod helm_chart;
mod helm_e2e;
mod install_guide;
mod monitoring_e2e;
mod monitoring_rules;
mod native_sidecars_e2e;
mod operator_e2e;
mod own_namespace_e2e;
mod proxy_config_e2e;
mod ratelimit_example;
mod real_cluster;
mod real_faults;
mod real_journey;
mod release;
mod replicas_e2e;
mod rollout_e2e;
mod rollout_guide_e2e;
mod rollout_steps_e2e;
mod shutdown_manager_e2e;
mod soak_smoke;
mod tenants_e2e;
mod webhook_sidecar_envoy;
mod xds_protocol_e2e;
