//! Test support for marin3r: finding the real tools `hack/install-tools` installs, running
//! real Envoy processes, the local cluster's API server, the benchmarks behind `hack/bench`
//! and the quick start behind `hack/demo`.

pub mod apiserver;
pub mod bench;
pub mod cli;
pub mod cluster;
pub mod demo;
pub mod deployments;
pub mod envoy;
pub mod kubectl;
pub mod kubelet;
pub mod pki;
pub mod tasks;
pub mod tools;
pub mod wait;
pub mod xds;
