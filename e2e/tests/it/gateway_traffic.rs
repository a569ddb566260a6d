//! The traffic of the gateway e2e tests: a client pod with two loops through the gateway's
//! Service to the guide's backend (`docs/examples/gateway/backend.yaml`, answering `greeter
//! <path>`), a request every 50 ms each: one opens a new connection per request, the other
//! keeps one connection open (HTTP/1.1 keep-alive) as long as the gateway lets it, as most
//! HTTP clients do. Every answer is one
//! timestamped line of the client's log, with the gateway pod that answered (the
//! `x-gateway-pod` header the gateway's config adds) and whether it closed the connection
//! (`Connection: close`, what a draining Envoy answers); [`ClientLog`] reads them back.

use std::collections::BTreeSet;

use marin3r_e2e::real::Scenario;
use serde_json::json;

/// The client: one line per request, `<unix ms> <mode> OK <pod> <close|keep> <body>` or
/// `<unix ms> <mode> FAIL <what>`; a request that gets no complete answer within 5 s fails.
const CLIENT_PY: &str = r#"
import http.client, threading, time
lock = threading.Lock()
def out(line):
    with lock:
        print(line, flush=True)
def loop(mode):
    conn = None
    while True:
        at = int(time.time() * 1000)
        try:
            if conn is None:
                conn = http.client.HTTPConnection("front-door", 8080, timeout=5)
            conn.request("GET", "/hello")
            r = conn.getresponse()
            body = r.read().decode()
            closed = r.will_close
            if closed or mode == "fresh":
                conn.close()
                conn = None
            if r.status == 200:
                pod = r.getheader("x-gateway-pod", "-")
                out(f"{at} {mode} OK {pod} {'close' if closed else 'keep'} {body}")
            else:
                out(f"{at} {mode} FAIL status {r.status} {body!r}")
        except Exception as e:
            if conn is not None:
                conn.close()
                conn = None
            out(f"{at} {mode} FAIL {e!r}")
        time.sleep(0.05)
threading.Thread(target=loop, args=("keepalive",), daemon=True).start()
loop("fresh")
"#;

/// Pod Security `restricted` for the test's own pods.
fn restricted_container(name: &str, script: &str) -> serde_json::Value {
    json!({
        "name": name,
        "image": "marin3r-test/python:3",
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", script],
        "ports": [{"name": "http", "containerPort": 8080}],
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        },
    })
}

/// The client pod in `ns`.
pub fn client_pod(ns: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": "client", "namespace": ns},
        "spec": {"containers": [restricted_container("client", CLIENT_PY)]},
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// A new connection per request.
    Fresh,
    /// One connection for as long as the gateway keeps it open.
    KeepAlive,
}

pub const MODES: [Mode; 2] = [Mode::Fresh, Mode::KeepAlive];

/// One request of the client.
#[derive(Debug, Clone)]
pub struct Request {
    /// When it was sent, Unix milliseconds (the client and the test share the clock).
    pub at: u64,
    pub mode: Mode,
    pub outcome: Result<Answer, String>,
}

#[derive(Debug, Clone)]
pub struct Answer {
    /// The gateway pod that answered (`-` without the header).
    pub pod: String,
    /// Whether the gateway closed the connection after it.
    pub closed: bool,
    pub body: String,
}

/// The client's requests, as its log has them so far.
pub struct ClientLog {
    pub requests: Vec<Request>,
}

impl ClientLog {
    /// The client pod's log so far (`kubectl logs`), empty when it cannot be read yet.
    pub async fn read(scenario: &Scenario) -> Self {
        let log = scenario
            .kubectl
            .ok(&["logs", "client", "-n", &scenario.ns])
            .await
            .unwrap_or_default();
        Self {
            requests: log.lines().filter_map(parse).collect(),
        }
    }

    /// The requests of `mode` from its first answer on (before it, the gateway was not up).
    pub fn of(&self, mode: Mode) -> impl Iterator<Item = &Request> {
        self.requests
            .iter()
            .filter(move |r| r.mode == mode)
            .skip_while(|r| r.outcome.is_err())
    }

    /// The latest answer of `mode`.
    pub fn last(&self, mode: Mode) -> Option<&Answer> {
        self.of(mode).filter_map(|r| r.outcome.as_ref().ok()).last()
    }

    /// Every failed request after its mode's first answer.
    pub fn failures(&self) -> Vec<String> {
        MODES
            .iter()
            .flat_map(|m| self.of(*m))
            .filter_map(|r| {
                let e = r.outcome.as_ref().err()?;
                Some(format!("{} {:?}: {e}", r.at, r.mode))
            })
            .collect()
    }

    /// The answers of `mode` sent within `[from, to)`.
    pub fn answers(&self, mode: Mode, from: u64, to: u64) -> Vec<(u64, &Answer)> {
        self.of(mode)
            .filter(|r| (from..to).contains(&r.at))
            .filter_map(|r| Some((r.at, r.outcome.as_ref().ok()?)))
            .collect()
    }

    /// The time of the latest request of `mode`, answered or not.
    pub fn latest(&self, mode: Mode) -> Option<u64> {
        self.of(mode).map(|r| r.at).last()
    }
}

fn parse(line: &str) -> Option<Request> {
    let mut words = line.splitn(4, ' ');
    let at = words.next()?.parse().ok()?;
    let mode = match words.next()? {
        "fresh" => Mode::Fresh,
        "keepalive" => Mode::KeepAlive,
        _ => return None,
    };
    let outcome = match words.next()? {
        "OK" => {
            let mut rest = words.next()?.splitn(3, ' ');
            let pod = rest.next()?.to_owned();
            let closed = rest.next()? == "close";
            let body = rest.next().unwrap_or_default().to_owned();
            Ok(Answer { pod, closed, body })
        }
        "FAIL" => Err(words.next().unwrap_or_default().to_owned()),
        _ => return None,
    };
    Some(Request { at, mode, outcome })
}

/// The distinct pods among `answers`.
pub fn pods<'a>(answers: impl IntoIterator<Item = &'a (u64, &'a Answer)>) -> BTreeSet<String> {
    answers.into_iter().map(|(_, a)| a.pod.clone()).collect()
}

/// Milliseconds since the Unix epoch, the client's clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

#[test]
fn client_lines_are_read_back() {
    let log = ClientLog {
        requests: [
            "1 fresh FAIL ConnectionRefusedError()",
            "2 fresh OK pod-a keep greeter /v2/hello",
            "3 keepalive OK pod-b close greeter /hello",
            "4 fresh FAIL RemoteDisconnected('x y')",
            "garbage",
        ]
        .iter()
        .filter_map(|l| parse(l))
        .collect(),
    };
    assert_eq!(log.requests.len(), 4);
    assert_eq!(log.last(Mode::Fresh).unwrap().body, "greeter /v2/hello");
    let keepalive = log.last(Mode::KeepAlive).unwrap();
    assert!(keepalive.closed && keepalive.pod == "pod-b");
    assert_eq!(log.failures(), ["4 Fresh: RemoteDisconnected('x y')"]);
    assert_eq!(log.answers(Mode::Fresh, 0, 3).len(), 1);
    assert_eq!(log.latest(Mode::Fresh), Some(4));
}
