use marin3r_discovery::cli::{Cli, run};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    run(Cli::from_env()).await
}
