//! The xDS server's own tests in one binary: a plain ADS client over real mutual TLS against
//! the server (`xds_server`), its limits on streams and requests (`xds_limits`), and what
//! requests begun and never finished may hold (`xds_partial`).

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod xds_limits;
mod xds_partial;
mod xds_server;
