//! marin3r's test helpers: the real tools `hack/install-tools` installs (`tools`), real Envoy
//! processes (`envoy`), kubectl bound to a kubeconfig (`kubectl`), the cluster commands the
//! docs show and the demo runs (`commands`), the one polling loop
//! (`wait`), free ports (`ports`), a Secret volume's folder as the kubelet writes it
//! (`secret_volume`); with the `pki` feature a throwaway PKI from marin3r-certs,
//! with `xds` an ADS client, Envoy resources and the xDS server as a fixture, with `webhook`
//! clients of the webhook's HTTPS server (by loopback address, slow bodies), with `cluster`
//! the real test cluster (`hack/cluster` or `MARIN3R_E2E_KUBECONFIG`), a client and the
//! namespaces a test makes on it (`namespaces`), and this build's `marin3r` with the images
//! made of it (`image`). Without
//! features it needs no marin3r crate.
// The 80-line bar on functions (the workspace's `too_many_lines`) is the product's; the
// scenarios, benchmarks and test helpers may run past it.
#![allow(clippy::too_many_lines)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod commands;
pub mod envoy;
#[cfg(feature = "cluster")]
pub mod image;
pub mod kubectl;
#[cfg(feature = "cluster")]
pub mod namespaces;
#[cfg(feature = "pki")]
pub mod pki;
pub mod ports;
pub mod readable;
pub mod secret_volume;
pub mod tools;
pub mod wait;
#[cfg(feature = "webhook")]
pub mod webhook;
#[cfg(feature = "xds")]
pub mod xds;
