//! The operator crate's integration tests in one binary: the DiscoveryService controller (with
//! the certificate controller) in-process on the real cluster's API server (`hack/cluster`,
//! or `MARIN3R_E2E_KUBECONFIG`), with this build's `marin3r` image
//! (`MARIN3R_BIN`, or the newest built `marin3r`).

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

mod operator_controller;
