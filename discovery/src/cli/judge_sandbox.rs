//! `marin3r judge-sandbox [LIMITS] -- ENVOY ARGS...`: the process the Envoy judge starts for
//! each verdict. It confines itself (judge/sandbox.rs) and becomes Envoy; when confining fails,
//! Envoy never runs and the exit code is 125, with the reason on standard error.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use marin3r_envoyconfig::judge::sandbox::{self, CANNOT_CONFINE, Limits};

#[derive(Debug, Args)]
pub struct JudgeSandboxArgs {
    /// CPU seconds Envoy may use.
    #[arg(long, default_value_t = Limits::default().cpu_seconds)]
    cpu_seconds: u64,
    /// Bytes of address space.
    #[arg(long, default_value_t = Limits::default().address_space)]
    address_space: u64,
    /// Open descriptors.
    #[arg(long, default_value_t = Limits::default().open_files)]
    open_files: u64,
    /// The bootstrap, the one file Envoy may read besides its own.
    #[arg(long, value_name = "PATH", required_unless_present = "check")]
    config: Option<PathBuf>,
    /// Only confine this process and say how much of the sandbox the kernel enforces.
    #[arg(long)]
    check: bool,
    /// The Envoy binary, then its arguments.
    #[arg(last = true, value_name = "ENVOY ARGS")]
    command: Vec<OsString>,
}

pub fn run(args: &JudgeSandboxArgs) -> ExitCode {
    let limits = Limits {
        cpu_seconds: args.cpu_seconds,
        address_space: args.address_space,
        open_files: args.open_files,
    };
    let Some((envoy, rest)) = args.command.split_first() else {
        if args.check {
            let this = std::env::current_exe().unwrap_or_default();
            return match sandbox::confine(&this, None, &limits) {
                Ok(enforced) => {
                    println!("{enforced:?}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("marin3r judge-sandbox: {e}");
                    ExitCode::from(CANNOT_CONFINE)
                }
            };
        }
        eprintln!("marin3r judge-sandbox: no Envoy binary after --");
        return ExitCode::from(CANNOT_CONFINE);
    };
    let Some(config) = &args.config else {
        eprintln!("marin3r judge-sandbox: no --config");
        return ExitCode::from(CANNOT_CONFINE);
    };
    let error = sandbox::exec(&PathBuf::from(envoy), rest, config, &limits);
    eprintln!("marin3r judge-sandbox: {error}");
    ExitCode::from(CANNOT_CONFINE)
}
