//! `docs/install.md` on the real cluster, word for word: every line of its ```` ```sh
//! hack-cluster ```` blocks runs, in the page's order, through `bash -c` from the repository's
//! root (as root, with `.tools/bin` and this build's `marin3r` on `PATH`, `KUBECONFIG` naming
//! `hack/cluster`'s and `MARIN3R_BIN` naming this build's `marin3r`, so `hack/image` images it
//! instead of building a release). A line that fails, or runs longer than
//! [`COMMAND_TIMEOUT`], fails the test with its `file:line` and output. The page ends by
//! uninstalling, so the test then checks that nothing of marin3r is left on the cluster.
//!
//! Whatever the scenario before left (the demo leaves marin3r installed and the namespace
//! `demo`), the test first removes it the way the page's uninstall does, so the page starts
//! on a cluster without marin3r, as a new user's; if the page fails half-way, the same clean-up
//! runs, so no webhook configuration is left behind without its discovery pod. It holds the
//! cluster ([`Cluster::exclusive`]) for its whole run. On a cluster attached through
//! `MARIN3R_E2E_KUBECONFIG` there is no `hack/cluster` to run the page on, and it says so.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use marin3r_testkit::cluster::Cluster;

/// The page, relative to the repository's root.
const PAGE: &str = "docs/install.md";

/// The opening fence of the blocks this test runs.
const FENCE: &str = "```sh hack-cluster";

/// How long one line of the page may run (`hack/install-tools` and `hack/image` are quick
/// once their caches are warm; the waits in the page carry their own shorter timeouts).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// What any installation walkthrough must go through; the test refuses a page that lost one.
const REQUIRED: &[&str] = &[
    "hack/cluster up --reuse",
    "kubectl apply --server-side -k manifests/",
    "kubectl apply -f manifests/examples/discoveryservice.yaml",
    "marin3r check",
    "kubectl delete discoveryservices --all -A --wait",
    "kubectl delete -k manifests/",
];

/// One command of the page and the line it starts on.
#[derive(Debug, PartialEq)]
struct Line {
    number: usize,
    command: String,
}

/// The commands of the marked blocks of `text`: one a line, blank lines and `#` comments
/// skipped, a line ending in `\` joined with the next.
fn marked_commands(text: &str) -> Result<Vec<Line>, String> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<Line> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim();
        if line.starts_with("```") {
            if in_block {
                if let Some(open) = pending.take() {
                    return Err(format!(
                        "line {}: a continued command runs into the end of its block",
                        open.number
                    ));
                }
                in_block = false;
            } else {
                in_block = line == FENCE;
            }
            continue;
        }
        if !in_block || (pending.is_none() && (line.is_empty() || line.starts_with('#'))) {
            continue;
        }
        let (part, continues) = match line.strip_suffix('\\') {
            Some(head) => (head.trim_end(), true),
            None => (line, false),
        };
        let mut current = pending.take().unwrap_or(Line {
            number,
            command: String::new(),
        });
        if !current.command.is_empty() {
            current.command.push(' ');
        }
        current.command.push_str(part);
        if continues {
            pending = Some(current);
        } else {
            out.push(current);
        }
    }
    if in_block {
        return Err("a marked block is never closed".to_owned());
    }
    Ok(out)
}

/// What every command of the page, and the test's own kubectl, runs with.
struct Shell {
    repo: PathBuf,
    path: String,
    kubeconfig: PathBuf,
    marin3r: PathBuf,
}

impl Shell {
    /// `bash -c command` from the repository's root, stopped (with its children) after
    /// `timeout`.
    fn run(&self, command: &str, timeout: Duration) -> Output {
        Command::new("timeout")
            .arg("--kill-after=10s")
            .arg(format!("{}s", timeout.as_secs()))
            .args(["bash", "-c", command])
            .current_dir(&self.repo)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("MARIN3R_BIN", &self.marin3r)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// kubectl's stdout, or its failure as text.
    fn kubectl(&self, args: &str) -> Result<String, String> {
        let out = self.run(&format!("kubectl {args}"), Duration::from_secs(240));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`kubectl {args}` failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// What is left of marin3r on the cluster: its CRDs, webhook configurations, ClusterRoles
    /// and bindings, its namespace and the example's.
    fn leftovers(&self) -> Result<Vec<String>, String> {
        let names = r#"-o 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}'"#;
        let mut left = Vec::new();
        for kind in marin3r_e2e::real::INSTALLED_KINDS {
            let out = self.kubectl(&format!("get {kind} {names}"))?;
            left.extend(
                out.lines()
                    .filter(|name| marin3r_e2e::real::is_marin3rs(kind, name))
                    .map(|name| format!("{kind}/{name}")),
            );
        }
        Ok(left)
    }

    /// Removes whatever of marin3r and the example is installed, in the page's uninstall
    /// order (workloads, DiscoveryServices while the operator runs, then `manifests/`).
    fn remove_marin3r(&self) -> Result<(), String> {
        self.kubectl("delete namespace demo --ignore-not-found --timeout=180s")?;
        let crd = self.kubectl(
            "get customresourcedefinition discoveryservices.operator.marin3r.3scale.net \
             --ignore-not-found -o name",
        )?;
        if !crd.trim().is_empty() {
            self.kubectl("delete discoveryservices --all -A --timeout=180s")?;
        }
        self.kubectl("delete -k manifests/ --ignore-not-found --timeout=180s")?;
        match self.leftovers()? {
            left if left.is_empty() => Ok(()),
            left => Err(format!("still there: {}", left.join(", "))),
        }
    }
}

/// Removes marin3r when the page stopped half-way (a panic drops it armed).
struct CleanUp<'a> {
    shell: &'a Shell,
    armed: bool,
}

impl Drop for CleanUp<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(e) = self.shell.remove_marin3r()
        {
            eprintln!("install_guide: cleaning up after the failure failed: {e}");
        }
    }
}

#[test]
fn the_install_guide_runs_word_for_word_on_hack_cluster() {
    let repo = marin3r_testkit::tools::repo_root();
    let text = std::fs::read_to_string(repo.join(PAGE)).unwrap();
    let lines = marked_commands(&text).unwrap_or_else(|e| panic!("{PAGE}: {e}"));
    for required in REQUIRED {
        assert!(
            lines.iter().any(|l| l.command == *required),
            "{PAGE} no longer runs `{required}` in a {FENCE} block"
        );
    }

    let cluster = Cluster::start_or_attach().unwrap();
    if !cluster.is_local() {
        eprintln!("install_guide: the page's commands need hack/cluster, not an attached cluster");
        return;
    }
    let waited = Instant::now();
    let _held = cluster.exclusive().unwrap();
    eprintln!(
        "install_guide: the cluster is ours after {:.1} s",
        waited.elapsed().as_secs_f64()
    );
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("a built marin3r");
    // The reader's PATH: the tools of hack/install-tools and a `marin3r` CLI.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&marin3r, bin.path().join("marin3r")).unwrap();
    let shell = Shell {
        path: format!(
            "{}:{}:{}",
            bin.path().display(),
            repo.join(".tools/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        ),
        repo,
        kubeconfig: cluster.kubeconfig().to_path_buf(),
        marin3r,
    };

    let t = Instant::now();
    shell
        .remove_marin3r()
        .unwrap_or_else(|e| panic!("removing what the scenario before left: {e}"));
    eprintln!(
        "install_guide: what the scenario before left removed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut clean_up = CleanUp {
        shell: &shell,
        armed: true,
    };
    let started = Instant::now();
    for line in &lines {
        let at = format!("{PAGE}:{}", line.number);
        let t = Instant::now();
        let out = shell.run(&line.command, COMMAND_TIMEOUT);
        eprintln!(
            "{at}: $ {} ({:.1} s)",
            line.command,
            t.elapsed().as_secs_f64()
        );
        assert!(
            out.status.success(),
            "{at}: `{}` failed ({}; 124 is the timeout of {} s)\nstdout:\n{}\nstderr:\n{}",
            line.command,
            out.status,
            COMMAND_TIMEOUT.as_secs(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if line.command == "marin3r check" {
            // Installed: what the final check must find gone is there now.
            let installed = shell.leftovers().unwrap();
            for part in [
                "customresourcedefinitions/discoveryservices.operator.marin3r.3scale.net",
                "mutatingwebhookconfigurations/marin3r-marin3r-system-instance",
                "validatingwebhookconfigurations/marin3r-marin3r-system-instance",
                "clusterroles/marin3r-operator",
                "namespaces/marin3r-system",
                "namespaces/demo",
            ] {
                assert!(
                    installed.iter().any(|l| l == part),
                    "{at}: installed, yet {part} is not seen: {installed:?}"
                );
            }
        }
    }
    eprintln!(
        "install_guide: {} commands in {:.1} s",
        lines.len(),
        started.elapsed().as_secs_f64()
    );
    // The page ended with the uninstall: nothing of marin3r may be left for the next test.
    let left = shell.leftovers().unwrap();
    assert!(
        left.is_empty(),
        "{PAGE}'s uninstall left: {}",
        left.join(", ")
    );
    clean_up.armed = false;
}

#[test]
fn only_marked_blocks_are_taken_with_their_line_numbers() {
    let text = "\
intro
```sh
hack/cluster down
```
```sh hack-cluster
# a comment
hack/cluster up --reuse

kubectl apply \\
  -f a.yaml   \\
  -f b.yaml
```
```console
$ marin3r check
```
```sh hack-cluster
marin3r check
```
";
    let lines = marked_commands(text).unwrap();
    assert_eq!(
        lines,
        [
            Line {
                number: 7,
                command: "hack/cluster up --reuse".to_owned()
            },
            Line {
                number: 9,
                command: "kubectl apply -f a.yaml -f b.yaml".to_owned()
            },
            Line {
                number: 17,
                command: "marin3r check".to_owned()
            },
        ]
    );
    assert!(marked_commands("```sh hack-cluster\nkubectl get pods \\\n```\n").is_err());
    assert!(marked_commands("```sh hack-cluster\nkubectl get pods\n").is_err());
}

#[test]
fn the_page_has_marked_blocks_in_the_order_of_an_install() {
    let text = std::fs::read_to_string(marin3r_testkit::tools::repo_root().join(PAGE)).unwrap();
    let lines = marked_commands(&text).unwrap();
    let position = |command: &str| {
        lines
            .iter()
            .position(|l| l.command == command)
            .unwrap_or_else(|| panic!("{PAGE} does not run `{command}`"))
    };
    let order: Vec<usize> = REQUIRED.iter().map(|c| position(c)).collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "{PAGE} runs {REQUIRED:?} out of order: {order:?}"
    );
    assert_eq!(
        lines.last().map(|l| l.command.as_str()),
        Some("kubectl delete -k manifests/"),
        "{PAGE} must end with the uninstall"
    );
}
