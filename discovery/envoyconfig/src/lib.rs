//! marin3r's EnvoyConfig pipeline, shared by the EnvoyConfig controller, the revision loader,
//! the validating webhook and `marin3r validate`: conversion of a spec into Envoy's typed
//! resources (`convert`), why a spec is refused (`rules`), what is only warned about
//! (`warnings`), and Envoy's own verdict from a sandboxed run (`judge`). It depends on no kube
//! client, as the xDS server does not: the callers read the cluster and hand over what it holds.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's: unit
// tests may run past it.
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod convert;
pub mod guard;
pub mod judge;
pub mod rules;
pub mod warnings;
