//! One Envoy run, started through `marin3r judge-sandbox` (see `sandbox.rs`) in a process
//! group of its own: the bootstrap goes in a file of a private temporary folder (never on a
//! command line, where other processes could read it; Envoy reads no pipe, nor anything
//! under /dev or /proc), the one file besides its own Envoy may read,
//! what Envoy says is kept up to a bound, and at the deadline, or as soon as Envoy has ended,
//! the whole group is killed. Nothing here waits past the deadline: not the process, not its
//! pipes.

use std::io::Write as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::sandbox::Limits;

/// What is kept of each of Envoy's streams: its reason comes first (with `--log-level
/// critical` it is nearly all there is); a crash's backtrace after it is cut.
const KEPT: usize = 64 * 1024;

/// How long the pipes are read once the group is dead: they close at once then.
const DRAIN: Duration = Duration::from_millis(200);

/// Whether `stdout` has the line Envoy's validate mode ends an accepted configuration with:
/// `configuration '<path>' OK`.
fn accepted(stdout: &str) -> bool {
    stdout
        .lines()
        .any(|l| l.starts_with("configuration '") && l.trim_end().ends_with("' OK"))
}

/// What precedes Envoy's reason when it refuses a bootstrap.
const REFUSED: &str = "error initializing configuration '";

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Envoy ran and said the configuration is OK.
    Accepted,
    /// Envoy ran and refused it: its output (stdout, then stderr).
    Refused(String),
    /// Envoy died of a signal (a crash, or the CPU limit): no verdict.
    Killed(i32),
    /// The sandbox could not be entered, or what ran was no Envoy: no verdict.
    NoEnvoy(String),
    /// The deadline came first: no verdict.
    Late,
}

/// Runs `envoy ARGS -c <input in a file>` through `launcher judge-sandbox`.
pub fn run(
    launcher: &Path,
    envoy: &Path,
    limits: &Limits,
    args: &[&str],
    input: &[u8],
    deadline: Instant,
) -> Ended {
    let (_dir, config) = match private_file(input) {
        Ok(file) => file,
        Err(e) => return Ended::NoEnvoy(format!("a temporary file for the bootstrap: {e}")),
    };
    let mut command = Command::new(launcher);
    command
        .arg("judge-sandbox")
        .args(limits.args())
        .arg("--config")
        .arg(&config)
        .arg("--")
        .arg(envoy)
        .args(args)
        .env_clear()
        .current_dir("/")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Ended::NoEnvoy(format!("running {}: {e}", launcher.display())),
    };
    let group = child.id();
    let streams = Streams::start(&mut child);
    let status = wait_until(&mut child, deadline);
    kill_group(group);
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Ended::Late;
    };
    let (stdout, stderr) = streams.collect(deadline.min(Instant::now() + DRAIN));
    if let Some(signal) = status.signal() {
        return Ended::Killed(signal);
    }
    match status.code() {
        Some(0) if accepted(&stdout) => Ended::Accepted,
        Some(0) => Ended::NoEnvoy(format!(
            "{} exited 0 without Envoy's verdict",
            envoy.display()
        )),
        Some(code) if code == i32::from(super::sandbox::CANNOT_CONFINE) => {
            Ended::NoEnvoy(stderr.trim().to_owned())
        }
        _ => {
            let output = format!("{stdout}{stderr}");
            // Envoy says why in its own log format; anything else is no verdict of Envoy's.
            if output.contains(REFUSED) || output.contains("][critical][") {
                Ended::Refused(output)
            } else {
                Ended::NoEnvoy(format!(
                    "{} gave no verdict of Envoy's ({status}): {}",
                    envoy.display(),
                    output.lines().next().unwrap_or_default()
                ))
            }
        }
    }
}

/// `input` in `bootstrap.json` of a new folder only this user may enter (the temporary
/// folder: `TMPDIR`, a memory-backed `emptyDir` in the discovery pod), removed with the
/// returned guard.
fn private_file(input: &[u8]) -> std::io::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::Builder::new()
        .prefix("marin3r-judge-")
        .tempdir()?;
    let path = dir.path().join("bootstrap.json");
    std::fs::File::create(&path)?.write_all(input)?;
    Ok((dir, path))
}

/// Polls `child` until it exits or `deadline` passes (`None`).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => return None,
        }
    }
}

/// Kills every process of the group Envoy led (the sandbox lets Envoy start none, but the
/// group is killed all the same).
fn kill_group(group: u32) {
    if let Some(pid) = i32::try_from(group)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// Envoy's two outputs, each read by a thread of its own into a buffer of at most [`KEPT`]
/// bytes.
struct Streams {
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Receiver<()>,
}

impl Streams {
    fn start(child: &mut Child) -> Self {
        let (tx, done) = mpsc::channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        if let Some(out) = child.stdout.take() {
            keep(out, Arc::clone(&stdout), tx.clone());
        }
        if let Some(err) = child.stderr.take() {
            keep(err, Arc::clone(&stderr), tx);
        }
        Self {
            stdout,
            stderr,
            done,
        }
    }

    /// What both streams said, waiting for their end no later than `until`.
    fn collect(self, until: Instant) -> (String, String) {
        for _ in 0..2 {
            let left = until.saturating_duration_since(Instant::now());
            if self.done.recv_timeout(left).is_err() {
                break;
            }
        }
        let text = |buffer: &Mutex<Vec<u8>>| {
            let bytes = buffer.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        (text(&self.stdout), text(&self.stderr))
    }
}

fn keep(
    mut from: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match from.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Ok(mut kept) = into.lock() {
                        let room = KEPT.saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
            }
        }
        let _ = done.send(());
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A launcher that is a shell script (the arguments `judge-sandbox ...` are ignored).
    fn launcher(dir: &Path, body: &str) -> std::path::PathBuf {
        let path = dir.join("launcher");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn run_with(body: &str, budget: Duration) -> (Ended, Duration) {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let ended = run(
            &launcher(dir.path(), body),
            Path::new("/nonexistent/envoy"),
            &Limits::default(),
            &["--mode", "validate"],
            b"{}",
            started + budget,
        );
        (ended, started.elapsed())
    }

    fn running(marker: &str) -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
    }

    #[test]
    fn a_child_holding_the_pipes_neither_outlives_the_deadline_nor_the_run() {
        // A grandchild keeps Envoy's stdout open and sleeps.
        let marker = format!("{}.{}", 40 + std::process::id() % 50, std::process::id());
        let (ended, took) = run_with(
            &format!("sleep {marker} & echo started; exec sleep {marker}"),
            Duration::from_millis(500),
        );
        assert_eq!(ended, Ended::Late);
        assert!(took < Duration::from_millis(900), "took {took:?}");
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !running(&format!("sleep {marker}")),
            "a sleeper outlived the run"
        );

        // The same when the process itself ends at once and leaves the child behind.
        let (ended, took) = run_with(
            &format!("sleep {marker} & echo \"[0][1][critical][main] no\"; exit 1"),
            Duration::from_secs(5),
        );
        assert!(matches!(ended, Ended::Refused(_)), "{ended:?}");
        assert!(took < Duration::from_secs(1), "took {took:?}");
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !running(&format!("sleep {marker}")),
            "a sleeper outlived the run"
        );
    }

    #[test]
    fn a_crash_is_no_verdict_and_neither_is_silence() {
        let (ended, _) = run_with("kill -SEGV $$", Duration::from_secs(5));
        assert_eq!(ended, Ended::Killed(11));
        // Exit 0 without Envoy's "configuration '...' OK": not an acceptance.
        let (ended, _) = run_with("exit 0", Duration::from_secs(5));
        assert!(matches!(ended, Ended::NoEnvoy(_)), "{ended:?}");
        // Non-zero without Envoy's words: not a refusal either.
        let (ended, _) = run_with("echo oops; exit 3", Duration::from_secs(5));
        assert!(matches!(ended, Ended::NoEnvoy(_)), "{ended:?}");
        let (ended, _) = run_with(
            "echo \"configuration '/x' OK\"; exit 0",
            Duration::from_secs(5),
        );
        assert_eq!(ended, Ended::Accepted);
    }

    #[test]
    fn what_envoy_says_is_kept_up_to_a_bound() {
        let (ended, _) = run_with(
            "echo \"[0][1][critical][main] error initializing configuration 'x': why\"; head -c 1000000 /dev/zero | tr '\\0' 'a'; exit 1",
            Duration::from_secs(5),
        );
        let Ended::Refused(output) = ended else {
            panic!("{ended:?}")
        };
        assert!(output.len() <= 2 * KEPT, "{}", output.len());
        assert!(output.contains("why"));
    }
}
