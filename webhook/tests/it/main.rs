//! The webhook's HTTPS server tests in one binary.

// Test code: it may unwrap, panic, and run past the product's 80-line bar on functions.
#![allow(
    clippy::expect_used,
    clippy::panic,
    clippy::too_many_lines,
    clippy::unwrap_used
)]

mod support;

mod cert_reload;
mod https;
mod judge_flood;
mod slow_clients;
