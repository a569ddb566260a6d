//! The xDS server's own tests in one binary: a plain ADS client over real mutual TLS against
//! the server (`xds_server`) and its limits on streams and requests (`xds_limits`).

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod xds_limits;
mod xds_server;
