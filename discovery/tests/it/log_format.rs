//! `--log-format json`: the long-running processes write one JSON object per log line, as
//! a log pipeline reads them; text stays the default.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::free_port;

/// The process, killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first line `stderr` writes, within 20 s.
fn first_line(stderr: ChildStderr) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("no log line within 20 s")
}

fn shutdown_manager(format: Option<&str>) -> (Process, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_marin3r"));
    command
        .args(["shutdown-manager", "--port", &free_port().to_string()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(format) = format {
        command.args(["--log-format", format]);
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    (Process(child), first_line(stderr))
}

#[test]
fn json_log_lines_parse_and_text_stays_the_default() {
    let (_json, line) = shutdown_manager(Some("json"));
    let event: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!("not a JSON log line ({e}): {line:?}");
    });
    assert_eq!(event["level"], "INFO", "{event}");
    assert_eq!(
        event["fields"]["message"], "shutdown manager listening",
        "{event}"
    );
    assert_eq!(event["fields"]["drain_time"], 300, "{event}");
    assert!(event["timestamp"].is_string(), "{event}");
    assert!(event["target"].is_string(), "{event}");

    let (_text, line) = shutdown_manager(None);
    assert!(
        serde_json::from_str::<serde_json::Value>(&line).is_err(),
        "{line}"
    );
    assert!(line.contains("INFO"), "{line}");
    assert!(line.contains("shutdown manager listening"), "{line}");
}
