//! `marin3r shutdown-manager`: the container the webhook injects beside an Envoy sidecar when
//! the pod sets `marin3r.3scale.net/shutdown-manager.enabled`; see
//! [`crate::sidecar::shutdown_manager`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use marin3r_webhook::config::{
    DEFAULT_ADMIN_PORT, DEFAULT_DRAIN_TIME, DEFAULT_SHUTDOWN_MANAGER_PORT,
};
use tokio::net::TcpListener;
use tracing::info;

use crate::sidecar::shutdown_manager::{Config, Manager, serve};

#[derive(Debug, Args)]
pub struct ShutdownManagerArgs {
    /// Port of the HTTP server (/healthz, /drain, /shutdown) on every address: kubelet's
    /// preStop hooks call the pod's address.
    #[arg(long, default_value_t = DEFAULT_SHUTDOWN_MANAGER_PORT)]
    port: u16,
    /// Envoy's admin interface.
    #[arg(long, value_name = "HOST:PORT", default_value_t = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_ADMIN_PORT))]
    envoy_admin_address: SocketAddr,
    /// The longest a drain waits for Envoy's connections to close; give Envoy the same
    /// --drain-time-s.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_DRAIN_TIME)]
    drain_time: u32,
    /// Seconds after the drain starts before the connections are first counted (at most the
    /// drain time): clients may still connect while the pod leaves its Services.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    check_drain_delay: u32,
    /// Seconds between two counts of the open connections.
    #[arg(long, value_name = "SECONDS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    check_drain_interval: u32,
}

pub async fn run(args: ShutdownManagerArgs) -> anyhow::Result<()> {
    // Every address of both families (kubelet calls the pod's address, IPv4 or IPv6); IPv4
    // alone where the pod has no IPv6.
    let any_v6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), args.port);
    let any_v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), args.port);
    let listener = match TcpListener::bind(any_v6).await {
        Ok(listener) => listener,
        Err(_) => TcpListener::bind(any_v4)
            .await
            .with_context(|| format!("listening on port {} (--port)", args.port))?,
    };
    let manager = Manager::new(Config {
        envoy_admin: args.envoy_admin_address,
        drain_time: Duration::from_secs(args.drain_time.into()),
        check_delay: Duration::from_secs(args.check_drain_delay.into()),
        check_interval: Duration::from_secs(args.check_drain_interval.into()),
    });
    info!(port = args.port, admin = %args.envoy_admin_address, drain_time = args.drain_time, "shutdown manager listening");
    serve(listener, manager, super::shutdown_signal())
        .await
        .context("the shutdown manager's HTTP server")?;
    info!("shutdown manager stopped");
    Ok(())
}
