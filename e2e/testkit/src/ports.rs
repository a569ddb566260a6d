//! Ports for servers a test must name before they start (an Envoy bootstrap, a restart on
//! the same address).

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::sync::Mutex;

/// Every port handed out in this process: tests sharing a process never get the same one.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// Whether `port` is free on IPv4 loopback and, where the host has IPv6, on `[::]` too:
/// servers that bind every address of both families (the sidecar's readiness listener) need
/// it free in both.
fn free_in_both_families(port: u16) -> bool {
    let v4 = TcpListener::bind(("127.0.0.1", port)).is_ok();
    let v6 = match TcpListener::bind(("::", port)) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::AddrInUse,
    };
    v4 && v6
}

/// A free loopback port, below the kernel's ephemeral range: a port from `bind(:0)` is free
/// only until someone else binds :0 (Envoy's admin, any client socket) and may be given it.
#[expect(
    clippy::panic,
    reason = "a test helper: no free port is the test's failure"
)]
pub fn free_port() -> u16 {
    let first_ephemeral: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let low = 10_000u32;
    let span = first_ephemeral.saturating_sub(low).max(1);
    let start = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as u32;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        let Ok(port) = u16::try_from(low + start.wrapping_add(i) % span) else {
            continue;
        };
        if !handed_out.contains(&port) && free_in_both_families(port) {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port between {low} and {first_ephemeral}");
}
