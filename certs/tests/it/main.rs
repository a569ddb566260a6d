//! One test binary for the certificates crate (each module was a binary of its own).

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

mod mtls;
