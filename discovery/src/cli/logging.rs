//! How the long-running subcommands (`operator`, `discovery-service`, `shutdown-manager`)
//! log: to stderr, filtered by `RUST_LOG`, as text for people or as one JSON object per line
//! for log pipelines (`--log-format json`).

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One line per event, `LEVEL target: message key=value`, in colour on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message and
    /// the event's fields) and `spans` (the spans it happened in, with their fields).
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// How log lines are written to stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Logs to stderr at `default` unless `RUST_LOG` says otherwise, in `format`; text is in
/// colour only on a terminal (a container's stderr is a pipe or a file, where escape codes
/// are noise).
pub fn init(default: &str, format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::LogFormat;
    use crate::cli::{Cli, Command};

    #[test]
    fn every_long_running_subcommand_takes_a_log_format() {
        let format = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Operator(a) => a.log.log_format,
            Command::DiscoveryService(a) => a.log_format(),
            Command::ShutdownManager(a) => a.log.log_format,
            other => panic!("{other:?}"),
        };
        let commands: [&[&str]; 3] = [
            &["operator"],
            &["discovery-service", "--server-cert-dir", "/certs"],
            &["shutdown-manager"],
        ];
        for command in commands {
            let with = |extra: &[&'static str]| {
                let mut args = vec!["marin3r"];
                args.extend_from_slice(command);
                args.extend_from_slice(extra);
                args
            };
            assert_eq!(format(&with(&[])), LogFormat::Text);
            assert_eq!(format(&with(&["--log-format", "json"])), LogFormat::Json);
            assert!(Cli::try_parse_from(with(&["--log-format", "logfmt"])).is_err());
        }
    }
}
