//! The `marin3r` command line: argument parsing and dispatch. Every subcommand is one call
//! into library code; this module only turns results into output and exit codes.

mod certs;
mod inject;

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
    /// Work with certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Inject the Envoy sidecar into Pods and pod templates offline, as the webhook would.
    Inject(inject::InjectArgs),
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Certs(cmd) => certs::run(cmd),
        Command::Inject(args) => inject::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
