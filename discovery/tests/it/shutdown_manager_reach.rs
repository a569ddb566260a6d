//! Who can reach `marin3r shutdown-manager`: in a network namespace of its own, joined to the
//! host by a veth pair as a pod is to its node, a manager with a token answers the pod's
//! address (kubelet's hooks call it) but drains only for the token; one started without a
//! token listens on loopback only, so an unauthenticated `/shutdown` from another address
//! drains nothing (it used to listen everywhere and drain for anyone).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use marin3r_testkit::envoy::request;

/// A network namespace and a veth pair to it, the host's end `host`, the namespace's `pod`;
/// deleted on drop (the pair goes with the namespace).
struct PodNetwork {
    name: String,
    host_link: String,
    host: String,
    pod: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PodNetwork {
    fn new() -> Self {
        let id = std::process::id() % 100_000;
        let name = format!("m3r-smgr-{id}");
        let (host_link, pod_link) = (format!("m3s{id}h"), format!("m3s{id}p"));
        let subnet = format!("10.213.{}", id % 250);
        // Made first, so that a failure below still deletes what was made.
        let net = Self {
            name: name.clone(),
            host_link: host_link.clone(),
            host: format!("{subnet}.1"),
            pod: format!("{subnet}.2"),
        };
        ip(&["netns", "add", &name]);
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &pod_link,
        ]);
        ip(&["link", "set", &pod_link, "netns", &name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", net.host),
            "dev",
            &host_link,
        ]);
        ip(&["link", "set", &host_link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &name, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{}/30", net.pod), "dev", &pod_link]);
        inside(&["link", "set", &pod_link, "up"]);
        inside(&["link", "set", "lo", "up"]);
        net
    }

    /// `marin3r shutdown-manager` in the namespace on `port`, asking `admin` to drain.
    fn manager(&self, port: u16, admin: SocketAddr, token: Option<&str>) -> Process {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name])
            .arg(env!("CARGO_BIN_EXE_marin3r"))
            .args([
                "shutdown-manager",
                &format!("--port={port}"),
                &format!("--envoy-admin-address={admin}"),
                "--drain-time=1",
                "--check-drain-delay=0",
            ])
            .env_remove(marin3r_webhook::sidecar::SHUTDOWN_TOKEN_ENV)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(token) = token {
            command.env(marin3r_webhook::sidecar::SHUTDOWN_TOKEN_ENV, token);
        }
        let process = Process(command.spawn().unwrap());
        // Up once it answers inside its namespace.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let probe = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &self.name,
                    "curl",
                    "-sf",
                    "-o",
                    "/dev/null",
                ])
                .arg(format!("http://127.0.0.1:{port}/healthz"))
                .status()
                .unwrap();
            if probe.success() {
                return process;
            }
            assert!(Instant::now() < deadline, "the manager never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .stderr(Stdio::null())
            .status();
    }
}

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stand-in for Envoy's admin on the host's end: answers every request with an empty 200
/// and records its request line.
fn fake_admin(at: &str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind((at, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            record.lock().unwrap().push(line.trim().to_owned());
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (addr, seen)
}

fn drains(seen: &Mutex<Vec<String>>) -> usize {
    let seen = seen.lock().unwrap();
    seen.iter()
        .filter(|l| l.contains("/drain_listeners"))
        .count()
}

#[test]
fn an_unauthenticated_shutdown_from_another_address_drains_nothing() {
    let net = PodNetwork::new();
    let (admin, seen) = fake_admin(&net.host);
    let port = 18_090;

    // With a token: the pod's address answers (as kubelet calls it), and only the token drains.
    let manager = net.manager(port, admin, Some("s3cret"));
    let base = format!("http://{}:{port}", net.pod);
    assert_eq!(request("GET", &format!("{base}/healthz")).unwrap().0, 200);
    assert_eq!(request("GET", &format!("{base}/shutdown")).unwrap().0, 401);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(drains(&seen), 0);
    drop(manager);

    // Without a token: nothing answers on the pod's address, and nothing drains.
    let _manager = net.manager(port, admin, None);
    let answer = request("GET", &format!("{base}/shutdown"));
    assert!(answer.is_err(), "the manager answered: {answer:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        drains(&seen),
        0,
        "an unauthenticated caller started a drain"
    );

    // Its own pod still can (an exec hook calling loopback), which proves the admin reachable.
    let inside = Command::new("ip")
        .args(["netns", "exec", &net.name, "curl", "-sf", "-o", "/dev/null"])
        .arg(format!("http://127.0.0.1:{port}/drain"))
        .status()
        .unwrap();
    assert!(inside.success());
    assert_eq!(drains(&seen), 1);
}
