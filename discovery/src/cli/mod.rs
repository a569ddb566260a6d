//! The `marin3r` command line: argument parsing and dispatch. Every subcommand is one call
//! into library code; this module only turns results into output and exit codes.

mod bootstrap;
mod certs;
mod proxy_status;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "marin3r",
    version,
    about = "Envoy control plane for Kubernetes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write an Envoy bootstrap (config.json and its SDS files) for a proxy.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Work with certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Show every proxy connected to a discovery service and its per-type sync state.
    ProxyStatus(proxy_status::ProxyStatusArgs),
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Bootstrap(args) => bootstrap::run(args).map(|()| ExitCode::SUCCESS),
        Command::Certs(cmd) => certs::run(cmd),
        Command::ProxyStatus(args) => proxy_status::run(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
