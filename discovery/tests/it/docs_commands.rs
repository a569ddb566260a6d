//! Every command the documentation shows is run, so the docs cannot rot. Shell examples in
//! `README.md` and `docs/**/*.md` are fenced ```` ```console ```` blocks: a `$ ` line is a command,
//! the lines below it (up to the next `$ `) its expected output. Offline `marin3r` commands are
//! run here against the checked-in files and their output compared; every other command must
//! be one that `hack/demo` (or, for the EnvoyDeployment and rollout guides, their end-to-end
//! tests) runs, word for word (`marin3r_testkit::commands`).

use std::path::{Path, PathBuf};
use std::process::Command;

use marin3r_testkit::commands;

/// `marin3r` subcommands that need nothing but files: run by this test.
const OFFLINE: &[&str] = &[
    "validate",
    "inject",
    "bootstrap",
    "certs inspect",
    "crds",
    "--help",
    "--version",
];

/// The two scripts the README shows: `hack/test` runs every test, `hack/demo` the demo.
const SCRIPTS: &[&str] = &["hack/demo", "hack/test"];

/// Whether the demo, or the end-to-end test of the EnvoyDeployment or the rollout guide,
/// runs this cluster command as the docs show it (`marin3r_testkit::commands`).
fn run_by_the_demo(command: &str) -> bool {
    commands::ALL.contains(&command)
        || commands::GATEWAY.contains(&command)
        || commands::ROLLOUT.contains(&command)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[derive(Debug)]
struct Example {
    file: String,
    line: usize,
    command: String,
    output: Vec<String>,
}

/// The `$ ` commands of every ```` ```console ```` block in `text`.
fn examples(file: &str, text: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut in_block = false;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_block = !in_block && trimmed == "```console";
            continue;
        }
        if !in_block {
            continue;
        }
        if let Some(command) = trimmed.strip_prefix("$ ") {
            out.push(Example {
                file: file.to_owned(),
                line: n + 1,
                command: command.trim().to_owned(),
                output: Vec::new(),
            });
        } else if let Some(last) = out.last_mut() {
            if !trimmed.is_empty() {
                last.output.push(line.trim_end().to_owned());
            }
        } else {
            panic!(
                "{file}:{}: a console block must start with a `$ ` command",
                n + 1
            );
        }
    }
    out
}

fn markdown_files(dir: &Path, into: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "md") {
            into.push(path);
        }
    }
}

fn all_examples() -> Vec<Example> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    files.sort();
    files
        .iter()
        .flat_map(|path| {
            let name = path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            examples(&name, &std::fs::read_to_string(path).unwrap())
        })
        .collect()
}

/// The command without a trailing `# exits N` note, and N (0 without one).
fn split_exit(command: &str) -> (&str, i32) {
    match command.split_once(" # exits ") {
        Some((cmd, code)) => (cmd.trim(), code.trim().parse().unwrap()),
        None => (command, 0),
    }
}

fn is_offline(command: &str) -> bool {
    let Some(rest) = command.strip_prefix("marin3r ") else {
        return false;
    };
    !command.contains('|') && OFFLINE.iter().any(|sub| rest.starts_with(sub))
}

/// An expected line matches an actual one exactly, or, with `...` in it, by the text before
/// and after the dots; a line of just `...` stands for anything.
fn matches(expected: &str, actual: &str) -> bool {
    match expected.split_once("...") {
        None => expected.trim_end() == actual.trim_end(),
        Some((head, tail)) => {
            actual.starts_with(head)
                && actual.trim_end().ends_with(tail.trim_end())
                && actual.len() >= head.len() + tail.trim_end().len()
        }
    }
}

/// Runs one offline example in a scratch folder that sees the repo's `docs/` and
/// `manifests/`, so relative output folders never land in the repo.
fn run(example: &Example, scratch: &Path) {
    let (command, want_code) = split_exit(&example.command);
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let output = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(&args)
        .env("PATH", crate::support::path_with_envoy())
        .current_dir(scratch)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let at = format!("{}:{}: `{}`", example.file, example.line, example.command);
    assert_eq!(
        output.status.code(),
        Some(want_code),
        "{at} exited with {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let actual: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
    for want in &example.output {
        if want.trim() == "..." {
            continue;
        }
        assert!(
            actual.iter().any(|have| matches(want, have)),
            "{at}: the docs show the line\n  {want}\nbut the command printed:\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
}

#[test]
fn every_offline_command_in_the_docs_prints_what_the_docs_show() {
    let scratch = tempfile::tempdir().unwrap();
    for dir in ["docs", "manifests"] {
        std::os::unix::fs::symlink(root().join(dir), scratch.path().join(dir)).unwrap();
    }
    let examples = all_examples();
    let offline: Vec<&Example> = examples.iter().filter(|e| is_offline(&e.command)).collect();
    assert!(
        offline.len() >= 8,
        "expected the docs to show the offline commands, found {}",
        offline.len()
    );
    for example in offline {
        run(example, scratch.path());
    }
}

#[test]
fn every_other_command_in_the_docs_is_run_by_the_demo() {
    let mut unknown = Vec::new();
    for e in all_examples() {
        if is_offline(&e.command) {
            continue;
        }
        if !run_by_the_demo(&e.command) && !SCRIPTS.contains(&e.command.as_str()) {
            unknown.push(format!("{}:{}: {}", e.file, e.line, e.command));
        }
    }
    assert!(
        unknown.is_empty(),
        "commands shown in the docs that nothing runs (make them offline examples, or have \
         the demo run them: marin3r_testkit::commands):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_parser_finds_commands_output_and_exit_codes() {
    let text = "intro\n```console\n$ marin3r validate -f a.yaml # exits 1\na.yaml: ... bad\n\n$ kubectl get ec\n```\n```sh\n$ not a console block\n```\n";
    let found = examples("x.md", text);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].line, 3);
    assert_eq!(found[0].output, ["a.yaml: ... bad"]);
    assert_eq!(
        split_exit(&found[0].command),
        ("marin3r validate -f a.yaml", 1)
    );
    assert!(is_offline("marin3r certs inspect x.crt"));
    assert!(!is_offline("marin3r certs renew x"));
    assert!(!is_offline("marin3r inject -f x | kubectl apply -f -"));
    assert!(matches("a.yaml: ... bad", "a.yaml: EnvoyConfig x: bad"));
    assert!(!matches("a.yaml: ... bad", "b.yaml: bad"));
    assert!(!matches("exact", "exactly"));
}

/// Writes the example certificates under `docs/examples/tls/` (a CA and a client certificate
/// for namespace `demo`, valid 10 years). Run by hand when they must change:
/// `cargo test -p marin3r-discovery --test docs_commands -- --ignored`.
#[test]
#[ignore = "regenerates checked-in files"]
fn regenerate_example_certificates() {
    use marin3r_certs::{CertificateAuthority, CertificateRequest, Usage, issue_self_signed};
    use std::time::Duration;
    let ten_years = Duration::from_secs(10 * 365 * 24 * 3600);
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca-example", ten_years)).unwrap();
    let authority = CertificateAuthority::from_issued(&ca).unwrap();
    let client = authority
        .issue(
            &CertificateRequest::new("envoy-sidecar-client-cert", Usage::Client, ten_years)
                .with_hosts([marin3r_certs::spiffe_id("cluster.local", "demo")]),
        )
        .unwrap();
    let dir = root().join("docs/examples/tls");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &client.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &client.key_pem).unwrap();
    std::fs::write(dir.join("ca.crt"), &ca.cert_pem).unwrap();
}
