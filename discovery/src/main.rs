use clap::Parser;
use marin3r_discovery::cli::{Cli, run};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run(Cli::parse()).await
}
