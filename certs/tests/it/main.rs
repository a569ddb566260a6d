//! One test binary for the certificates crate (each module was a binary of its own).

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod mtls;
