//! The `marin3r` command line: argument parsing and dispatch. Every subcommand is one call
//! into library code; this module only turns results into output and exit codes.

mod admin;
mod bootstrap;
mod certs;
mod check;
mod cluster;
mod crds;
mod differences;
mod discovery_pods;
mod discovery_service;
mod inject;
mod judge_sandbox;
mod limits;
mod listen;
mod logging;
mod operator;
mod output;
pub mod port_forward;
mod proxy_config;
mod proxy_status;
mod rollout;
mod rollout_control;
mod rollout_status;
mod shutdown_manager;
mod sidecar_defaults;
mod table;
pub(crate) mod validate;
mod validate_document;
mod version;
mod wait_for_proxy;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The xDS server's limits as `marin3r discovery-service` reads them from its flags (the
/// benchmarks set them as a user would).
pub use limits::XdsLimitArgs;

/// The oldest Kubernetes minor (1.x) marin3r installs on, as `marin3r check --pre` enforces.
pub use check::OLDEST_MINOR as OLDEST_KUBERNETES_MINOR;

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

/// The name kubectl finds a plugin by: with `kubectl-marin3r` on `PATH` (a link to `marin3r`
/// or a copy), `kubectl marin3r ARGS...` runs it with ARGS.
pub const PLUGIN_BINARY: &str = "kubectl-marin3r";

impl Cli {
    /// Parses the process's arguments, exiting with clap's message on an error. Run as the
    /// kubectl plugin, help and errors name the command as typed: `kubectl marin3r`.
    pub fn from_env() -> Self {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let invoked = std::env::args_os().next();
        let mut command = Self::command();
        if invoked.as_deref().is_some_and(is_plugin) {
            command = command.bin_name("kubectl marin3r");
        }
        let matches = command.get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// Whether the program was run by its plugin name (kubectl runs it by its full path).
fn is_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .is_some_and(|name| name == PLUGIN_BINARY)
}

#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write an Envoy bootstrap (config.json and its SDS files) for a proxy.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Check the installation on the current cluster: CRDs, operator, discovery services,
    /// webhooks, per-namespace certificates and bootstraps, expiring certificates, proxies
    /// out of sync; each failure says what to do. Exit code 0 when none fails (a warning
    /// does not).
    Check(check::CheckArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or PowerShell (for bash:
    /// `source <(marin3r completion bash)`).
    Completion(CompletionArgs),
    /// Work with certificates.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Print the CustomResourceDefinitions marin3r serves.
    Crds(crds::CrdsArgs),
    /// Run the discovery service: the xDS server, the EnvoyConfig and EnvoyConfigRevision
    /// controllers, the metrics/health HTTP server and the webhook (sidecar injection,
    /// EnvoyConfig validation).
    DiscoveryService(Box<discovery_service::DiscoveryServiceArgs>),
    /// Run the operator's controllers against the cluster of the current kubeconfig (or the
    /// in-cluster configuration).
    Operator(operator::OperatorArgs),
    /// Become Envoy inside the judge's sandbox (what `validate` and the discovery service
    /// run; not for people).
    #[command(hide = true)]
    JudgeSandbox(judge_sandbox::JudgeSandboxArgs),
    /// Validate EnvoyConfig manifests offline: every resource is parsed into its Envoy v3
    /// type; every problem is printed with its file and field path.
    Validate(validate::ValidateArgs),
    /// Inject the Envoy sidecar into Pods and pod templates offline, as the webhook would.
    Inject(inject::InjectArgs),
    /// Show the configuration a pod's Envoy holds (its /config_dump, secrets redacted) and
    /// how it differs from what the control plane serves the pod's node.
    ProxyConfig(proxy_config::ProxyConfigArgs),
    /// Show every proxy connected to a discovery service and its per-type sync state.
    ProxyStatus(proxy_status::ProxyStatusArgs),
    /// Read an EnvoyConfig's revisions: their history, and what changes between two of them.
    #[command(subcommand)]
    Rollout(rollout::RolloutCommand),
    /// Drain an Envoy sidecar when its pod terminates (the container the webhook injects
    /// with marin3r.3scale.net/shutdown-manager.enabled): /healthz, /drain, /shutdown.
    ShutdownManager(shutdown_manager::ShutdownManagerArgs),
    /// Print this client's version and, when a cluster is reachable, the operator's image,
    /// each DiscoveryService's discovery image and the Envoy releases of connected proxies.
    Version(version::VersionArgs),
    /// Wait until Envoy answers its readiness URL (the container the webhook injects with
    /// marin3r.3scale.net/hold-application-until-proxy-starts, in the classic layout).
    WaitForProxy(wait_for_proxy::WaitForProxyArgs),
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Bootstrap(args) => bootstrap::run(args).map(|()| ExitCode::SUCCESS),
        Command::Certs(cmd) => certs::run(cmd).await,
        Command::Check(args) => check::run(args).await,
        Command::Completion(args) => {
            use clap::CommandFactory as _;
            let mut cli = Cli::command();
            clap_complete::generate(args.shell, &mut cli, "marin3r", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds(args) => crds::run(args).map(|()| ExitCode::SUCCESS),
        Command::DiscoveryService(args) => {
            logging::init(
                if args.debug() { "debug" } else { "info" },
                args.log_format(),
            );
            discovery_service::run(*args)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Inject(args) => inject::run(args),
        Command::Operator(args) => {
            logging::init("info", args.log.log_format);
            operator::run(args).await.map(|()| ExitCode::SUCCESS)
        }
        Command::ProxyConfig(args) => proxy_config::run(args).await,
        Command::ProxyStatus(args) => proxy_status::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Rollout(command) => rollout::run(command).await,
        Command::ShutdownManager(args) => {
            logging::init("info", args.log.log_format);
            shutdown_manager::run(args)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::JudgeSandbox(args) => Ok(judge_sandbox::run(&args)),
        Command::Validate(args) => validate::run(args),
        Command::Version(args) => version::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::WaitForProxy(args) => wait_for_proxy::run(args).await,
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {}", error_line(&err));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: some errors (kube's configuration
/// errors) already print their sources in their own message, which `{:#}` would repeat.
pub(crate) fn error_line(err: &anyhow::Error) -> String {
    marin3r_controller::chain(err.as_ref())
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::error_line;

    /// An error that prints its source in its own message, as kube's do.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed to read the file: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(Wrapping(io)).context("loading the kubeconfig");
        assert_eq!(
            error_line(&err),
            "loading the kubeconfig: failed to read the file: no such file"
        );
        // Causes that add something are all kept, in order.
        let err = anyhow::anyhow!("the root")
            .context("the middle")
            .context("the top");
        assert_eq!(error_line(&err), "the top: the middle: the root");
    }
}
