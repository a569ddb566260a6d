//! Test support for marin3r: finding the real tools `hack/install-tools` installs, running
//! real Envoy processes, and the benchmarks behind `hack/bench`.

pub mod bench;
pub mod envoy;
pub mod kubelet;
pub mod tools;
