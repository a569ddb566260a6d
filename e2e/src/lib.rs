//! marin3r's end-to-end support: what ties the product to the local cluster (`product`) and
//! to a real one (`real`),
//! `marin3r` run as a user runs it (`cli`), the benchmarks behind `hack/bench` and the quick
//! start behind `hack/demo`. The local cluster is `marin3r-local-cluster`; the test helpers
//! are `marin3r-testkit`.

pub mod bench;
pub mod cli;
pub mod demo;
pub mod monitoring;
pub mod product;
pub mod real;
pub mod rejected;
