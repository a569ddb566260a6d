//! The `marin3r` command line: argument parsing and dispatch. Every subcommand is one call
//! into library code; this module only turns results into output and exit codes.

mod certs;
mod validate;

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
    /// Validate EnvoyConfig manifests offline: every resource is parsed into its Envoy v3
    /// type; every problem is printed with its file and field path.
    Validate(validate::ValidateArgs),
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Certs(cmd) => certs::run(cmd),
        Command::Validate(args) => validate::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
