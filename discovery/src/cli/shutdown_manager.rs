//! `marin3r shutdown-manager`: the container the webhook injects beside an Envoy sidecar when
//! the pod sets `marin3r.3scale.net/shutdown-manager.enabled`; see
//! [`crate::sidecar::shutdown_manager`].

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use marin3r_webhook::config::{
    DEFAULT_ADMIN_PORT, DEFAULT_DRAIN_TIME, DEFAULT_SHUTDOWN_MANAGER_PORT,
};
use tracing::{info, warn};

use crate::sidecar::shutdown_manager::{Config, Manager, serve};

#[derive(Debug, Args)]
pub struct ShutdownManagerArgs {
    #[command(flatten)]
    pub(super) log: super::logging::LogArgs,
    /// Port of the HTTP server (/healthz, /drain, /shutdown): on every address with a
    /// --token (kubelet's preStop hooks call the pod's address), on 127.0.0.1 only without.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_MANAGER_PORT)]
    port: u16,
    /// Envoy's admin interface: HOST:PORT, or a URL as the original MARIN3R takes it
    /// (http://localhost:9901).
    #[arg(long, value_name = "ADDRESS", default_value_t = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_ADMIN_PORT), value_parser = admin_address)]
    envoy_admin_address: SocketAddr,
    /// The longest a drain waits for Envoy's connections to close; give Envoy the same
    /// --drain-time-s.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_DRAIN_TIME)]
    drain_time: u32,
    /// Seconds between the first /drain or /shutdown call and asking Envoy to drain.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    start_drain_delay: u32,
    /// Seconds after the drain starts before the connections are first counted (at most the
    /// drain time): clients may still connect while the pod leaves its Services.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    check_drain_delay: u32,
    /// Seconds between two counts of the open connections.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    check_drain_interval: u32,
    /// The drain ends once no more than this many connections are open.
    #[arg(long, value_name = "N", default_value_t = 0)]
    min_open_connections: u64,
    /// A file to create when the drain ends; /shutdown also returns once it exists (how the
    /// original MARIN3R's shutdown manager told its callers). None by default: the drain is
    /// shared in memory, and the container's root filesystem is read-only.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// Seconds between two checks of --ready-file.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    check_ready_interval: u32,
    /// /drain and /shutdown answer only requests with `Authorization: Bearer <TOKEN>` (the
    /// webhook sets a token per pod in the environment and in the pod's preStop hooks), so no
    /// other pod can drain this one's Envoy. Without it the manager listens on 127.0.0.1
    /// only: only its own pod (an `exec` hook) can call it, and kubelet's `httpGet` hooks,
    /// which call the pod's address, cannot.
    #[arg(long, value_name = "TOKEN", env = marin3r_webhook::sidecar::SHUTDOWN_TOKEN_ENV, hide_env_values = true)]
    token: Option<String>,
}

/// `HOST:PORT`, or `http://HOST:PORT` with an optional trailing `/`; the host an IP address
/// or a name resolved now (`localhost`).
fn admin_address(value: &str) -> Result<SocketAddr, String> {
    let address = match value.strip_prefix("http://") {
        Some(rest) => rest.strip_suffix('/').unwrap_or(rest),
        None if value.contains("://") => {
            return Err(format!("{value}: only http:// is spoken to Envoy's admin"));
        }
        None => value,
    };
    if address.contains('/') {
        return Err(format!("{value}: a path is not allowed, only HOST:PORT"));
    }
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return Ok(addr);
    }
    address
        .to_socket_addrs()
        .map_err(|e| format!("{value}: not HOST:PORT ({e})"))?
        .next()
        .ok_or_else(|| format!("{value}: {address} resolves to no address"))
}

/// Where the manager listens: with a token, every address of both families (kubelet calls
/// the pod's address, IPv4 or IPv6); without one, loopback only, since whoever reaches it
/// could drain Envoy.
fn listen_address(token: Option<&str>, port: u16) -> SocketAddr {
    match token {
        Some(_) => SocketAddr::new(super::listen::ANY, port),
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
    }
}

pub async fn run(args: ShutdownManagerArgs) -> anyhow::Result<()> {
    let token = args.token.filter(|t| !t.is_empty());
    let address = listen_address(token.as_deref(), args.port);
    let tokenless = token.is_none();
    // With IPV6_V6ONLY off whatever the node's sysctl says; IPv4 alone where the pod has no
    // IPv6.
    let listener =
        super::listen::bind(address).with_context(|| format!("listening on {address} (--port)"))?;
    let manager = Manager::new(Config {
        envoy_admin: args.envoy_admin_address,
        drain_time: Duration::from_secs(args.drain_time.into()),
        check_delay: Duration::from_secs(args.check_drain_delay.into()),
        check_interval: Duration::from_secs(args.check_drain_interval.into()),
        start_delay: Duration::from_secs(args.start_drain_delay.into()),
        min_open_connections: args.min_open_connections,
        ready_file: args.ready_file,
        ready_check_interval: Duration::from_secs(args.check_ready_interval.into()),
        token,
    });
    info!(%address, admin = %args.envoy_admin_address, drain_time = args.drain_time, "shutdown manager listening");
    if tokenless {
        warn!(
            %address,
            "no token ({}): listening on loopback only, so kubelet's httpGet hooks (which call the pod's address) cannot reach this manager; set a token and send it in the hooks as `Authorization: Bearer <token>`",
            marin3r_webhook::sidecar::SHUTDOWN_TOKEN_ENV
        );
    }
    serve(listener, manager, super::shutdown_signal())
        .await
        .context("the shutdown manager's HTTP server")?;
    info!("shutdown manager stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_token_the_manager_listens_on_loopback_only() {
        let without = listen_address(None, 8090);
        assert!(without.ip().is_loopback(), "{without}");
        assert_eq!(
            listen_address(Some("t"), 8090).ip(),
            super::super::listen::ANY
        );
    }

    #[test]
    fn the_admin_address_is_host_port_or_the_originals_url() {
        let local = SocketAddr::from(([127, 0, 0, 1], 9901));
        assert_eq!(admin_address("127.0.0.1:9901"), Ok(local));
        assert_eq!(admin_address("http://127.0.0.1:9901"), Ok(local));
        assert_eq!(admin_address("http://127.0.0.1:9901/"), Ok(local));
        assert_eq!(
            admin_address("[::1]:9000"),
            Ok(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 9000)))
        );
        let resolved = admin_address("http://localhost:9901").unwrap();
        assert!(resolved.ip().is_loopback() && resolved.port() == 9901);
        assert!(
            admin_address("https://127.0.0.1:9901")
                .unwrap_err()
                .contains("http://")
        );
        assert!(
            admin_address("http://127.0.0.1:9901/stats")
                .unwrap_err()
                .contains("path")
        );
        assert!(
            admin_address("127.0.0.1")
                .unwrap_err()
                .contains("HOST:PORT")
        );
    }

    #[test]
    fn the_originals_flags_are_accepted() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: ShutdownManagerArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "shutdown-manager",
            "--port=8090",
            "--ready-file=/tmp/shutdown-ok",
            "--check-ready-interval=2",
            "--check-drain-interval=5",
            "--check-drain-delay=15",
            "--start-drain-delay=3",
            "--envoy-admin-address=http://localhost:9901",
            "--min-open-connections=1",
        ])
        .unwrap();
        let args = cli.args;
        assert_eq!(args.ready_file, Some(PathBuf::from("/tmp/shutdown-ok")));
        assert_eq!((args.check_ready_interval, args.start_drain_delay), (2, 3));
        assert_eq!(args.min_open_connections, 1);
        assert_eq!(args.envoy_admin_address.port(), 9901);
    }
}
