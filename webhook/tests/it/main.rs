//! The webhook's HTTPS server tests in one binary.

#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)] // test code

mod support;

mod cert_reload;
mod https;
mod judge_flood;
mod slow_clients;
