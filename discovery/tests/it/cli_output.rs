//! What every `marin3r` command prints for people shows no Rust `Debug` formatting
//! (`Some("Rollback")`, `Os { code: 2, .. }`): the help of every command and subcommand (found
//! by walking the parser, so a new command is covered without being listed here), the
//! outputs of the commands that run offline, and the errors of every command that needs a
//! cluster when there is none or it does not answer. The commands' outputs on a real cluster
//! get the same check in `e2e/tests/it/check_e2e.rs` and `proxy_config_e2e.rs`.

use std::path::Path;
use std::process::{Command, Output};

use clap::CommandFactory as _;
use marin3r_discovery::cli::Cli;
use marin3r_testkit::readable::debug_line;

use crate::support::{BAD_CONFIG as BAD, GOOD_CONFIG as GOOD};

const DEPLOYMENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../manifests/examples/deployment.yaml"
);

fn run(args: &[&str], kubeconfig: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .env("PATH", crate::support::path_with_envoy())
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run marin3r")
}

/// Fails the test on a line of `out` (stdout and stderr) that shows `Debug` formatting.
fn readable(args: &[&str], out: &Output) {
    for stream in [&out.stdout, &out.stderr] {
        let text = String::from_utf8_lossy(stream);
        if let Some(line) = debug_line(&text) {
            panic!(
                "marin3r {}: Debug formatting: {line}\n{text}",
                args.join(" ")
            );
        }
    }
}

/// Every command path: `[]`, `["check"]`, `["certs", "inspect"]`...
fn command_paths(command: &clap::Command, path: &[String], all: &mut Vec<Vec<String>>) {
    all.push(path.to_vec());
    for sub in command.get_subcommands() {
        let mut next = path.to_vec();
        next.push(sub.get_name().to_owned());
        command_paths(sub, &next, all);
    }
}

#[test]
fn no_command_prints_rust_debug_formatting() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no-kubeconfig");
    // A cluster whose API server is not listening.
    let refused = crate::support::refusing_kubeconfig(dir.path());
    let garbage = dir.path().join("garbage.crt");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let garbage = garbage.to_str().unwrap();

    let mut paths = Vec::new();
    command_paths(&Cli::command(), &[], &mut paths);
    assert!(paths.len() > 15, "{paths:?}");
    for path in &paths {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = run(&args, &nowhere);
        assert!(out.status.success(), "marin3r {}: {out:?}", args.join(" "));
        readable(&args, &out);
    }

    let offline: &[&[&str]] = &[
        &["version", "--client"],
        &["version", "--client", "-o", "json"],
        &["version", "--client", "-o", "yaml"],
        &["validate", "-f", GOOD, BAD, "/nonexistent.yaml"],
        &["validate", "-o", "yaml", "-f", GOOD, BAD],
        &["validate", "--no-envoy", "-f", GOOD],
        &["certs", "inspect", garbage, "/nonexistent.crt"],
        &["inject", "-f", DEPLOYMENT],
        &["inject", "-f", garbage],
        &["completion", "tcsh"],
        &["check", "-o", "wide"],
        &["proxy-status", "--url", "127.0.0.1:1"],
        &["proxy-status", "--url", "http://127.0.0.1:9/sync-status"],
        &["no-such-command"],
    ];
    for args in offline {
        readable(args, &run(args, &nowhere));
    }

    // Every command that needs a cluster, with none configured and with one that refuses.
    let on_a_cluster: &[&[&str]] = &[
        &["check"],
        &["check", "--pre"],
        &["check", "-o", "json"],
        &["proxy-status"],
        &["proxy-config", "some-pod"],
        &["certs", "status", "some-cert"],
        &["certs", "renew", "some-cert"],
        &["version"],
        &["version", "-o", "yaml"],
    ];
    for kubeconfig in [&nowhere, &refused] {
        for args in on_a_cluster {
            let out = run(args, kubeconfig);
            readable(args, &out);
        }
    }
}
