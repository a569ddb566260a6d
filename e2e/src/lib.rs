//! marin3r's end-to-end support: what the scenarios take from the product (`product`), what
//! ties it to the real cluster of `hack/cluster` (`real`), `marin3r` run as a user runs it
//! (`cli`), the benchmarks behind `hack/bench` and the quick start behind `hack/demo`. The
//! test helpers are `marin3r-testkit`, the API fault proxy `marin3r-api-faults`.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's; the
// scenarios, benchmarks and test helpers may run past it.
#![allow(clippy::too_many_lines)]

pub mod bench;
pub mod cli;
pub mod demo;
pub mod monitoring;
pub mod product;
pub mod real;
pub mod rejected;
