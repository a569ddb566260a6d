//! The operator crate's integration tests in one binary: the DiscoveryService controller (with
//! the certificate controller) in-process on the real cluster's API server (`hack/cluster`,
//! or `MARIN3R_E2E_KUBECONFIG`), with this build's `marin3r` image
//! (`MARIN3R_BIN`, or the newest built `marin3r`).

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod operator_controller;
