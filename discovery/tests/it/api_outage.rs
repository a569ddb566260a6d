//! SIGTERM during an API server outage: `marin3r discovery-service` and
//! `marin3r operator` must exit within their grace period even though their controllers never
//! listed anything, whether the API server refuses connections (down) or accepts them and
//! never answers (unreachable behind a black hole). Before the fix they stayed up until
//! SIGKILL: kube's controller runner waits for its store to be ready before it ends.
//! And the same after several seconds of outage, once every watch is backing off and the
//! controllers wait for their first list (only SIGTERM within the first half
//! second was tested, and a later one was ignored until SIGKILL).
//! And the controllers' client against a request that is never answered.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Pki, free_port, wait_for};
use marin3r_testkit::envoy::get_body;

/// How the API server is missing.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// Nothing listens on its port: every connection is refused at once.
    Refused,
    /// Its port accepts TCP connections (the kernel's backlog) but nothing ever answers.
    Silent,
}

/// A kubeconfig naming an API server that is not there, and what keeps the silent one's port.
struct DeadApi {
    _dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    _listener: Option<TcpListener>,
}

impl DeadApi {
    fn new(outage: Outage) -> Self {
        let (port, listener) = match outage {
            Outage::Refused => (free_port(), None),
            Outage::Silent => {
                // Never accepted: connections complete in the backlog and then hang.
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                (listener.local_addr().unwrap().port(), Some(listener))
            }
        };
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\n\
                 clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', \
                 insecure-skip-tls-verify: true}}}}]\n\
                 users: [{{name: u, user: {{token: t}}}}]\n\
                 contexts: [{{name: x, context: {{cluster: c, user: u, namespace: ops}}}}]\n\
                 current-context: x\n"
            ),
        )
        .unwrap();
        Self {
            _dir: dir,
            kubeconfig,
            _listener: listener,
        }
    }
}

/// A process killed on drop if the test did not see it exit.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `health` to answer and `after` more, sends SIGTERM, and asserts a clean exit
/// within `limit`.
fn terminate_within(
    mut process: Process,
    health: &str,
    (after, limit): (Duration, Duration),
    log: &Path,
) {
    let read_log = || std::fs::read_to_string(log).unwrap_or_default();
    wait_for(
        "the process to serve its health",
        Duration::from_secs(20),
        || get_body(health).ok().filter(|b| b == "ok\n"),
    );
    // The signal handler is installed right after the servers start.
    std::thread::sleep(after);
    let term = Instant::now();
    let pid = process.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            term.elapsed() < limit,
            "still running {:?} after SIGTERM\n{}",
            term.elapsed(),
            read_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}\n{}", read_log());
}

fn discovery_service(outage: Outage, leader_election: bool, after: Duration) {
    let api = DeadApi::new(outage);
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let certs = dir.path().join("server-cert");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), &pki.server.cert_pem).unwrap();
    std::fs::write(certs.join("tls.key"), &pki.server.key_pem).unwrap();
    std::fs::write(certs.join("ca.crt"), pki.ca_pem()).unwrap();
    let metrics = free_port();
    let log = dir.path().join("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_marin3r"));
    command
        .arg("discovery-service")
        .arg("--server-cert-dir")
        .arg(&certs)
        .args(["--bind-address", "127.0.0.1"])
        .args(["--xds-port", &free_port().to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .args(["--probe-port", &free_port().to_string()])
        .args(["--webhook-port", &free_port().to_string()])
        .args(["--admin-address", &format!("127.0.0.1:{}", free_port())])
        .args(["--shutdown-delay", "0", "--shutdown-grace-period", "1"])
        .args(["--discovery-service-name", "ds"])
        // No API server to ask its version.
        .args(["--native-sidecars", "true"]);
    // The delay (0) and the grace period (1 s), plus start-up slack.
    let pod = ("discovery-0", leader_election);
    sigterm_within_10s(command, &api, pod, (metrics, after), &log);
}

/// Starts `command` against `api` as pod `pod` (with leader election or not), then, `after`
/// its health answers, SIGTERM: it must exit within 10 s.
fn sigterm_within_10s(
    mut command: Command,
    api: &DeadApi,
    (pod, leader_election): (&str, bool),
    (health_port, after): (u16, Duration),
    log: &std::path::Path,
) {
    command
        .env("KUBECONFIG", &api.kubeconfig)
        .env("POD_NAMESPACE", "ops")
        .env("POD_NAME", pod)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    if !leader_election {
        command.arg("--no-leader-election");
    }
    let process = Process(command.spawn().unwrap());
    terminate_within(
        process,
        &format!("http://127.0.0.1:{health_port}/healthz"),
        (after, Duration::from_secs(10)),
        log,
    );
}

/// Right after start, before any watch has backed off.
const EARLY: Duration = Duration::from_millis(500);
/// Several seconds into the outage: watches in backoff, controllers waiting for their list.
const LATE: Duration = Duration::from_secs(6);

#[test]
fn the_discovery_service_exits_on_sigterm_while_the_api_refuses_connections() {
    discovery_service(Outage::Refused, false, EARLY);
}

#[test]
fn the_discovery_service_exits_on_sigterm_while_the_api_never_answers() {
    discovery_service(Outage::Silent, true, EARLY);
}

#[test]
fn the_discovery_service_exits_on_sigterm_seconds_into_an_outage() {
    discovery_service(Outage::Refused, false, LATE);
}

#[test]
fn the_discovery_service_exits_on_sigterm_seconds_into_an_outage_with_leader_election() {
    discovery_service(Outage::Silent, true, LATE);
}

fn operator(outage: Outage, leader_election: bool, after: Duration) {
    let api = DeadApi::new(outage);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_marin3r"));
    command
        .arg("operator")
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")]);
    let pod = ("operator-0", leader_election);
    sigterm_within_10s(command, &api, pod, (port, after), &log);
}

#[test]
fn the_operator_exits_on_sigterm_while_the_api_refuses_connections() {
    operator(Outage::Refused, false, EARLY);
}

#[test]
fn the_operator_exits_on_sigterm_while_the_api_never_answers() {
    operator(Outage::Silent, true, EARLY);
}

#[test]
fn the_operator_exits_on_sigterm_seconds_into_an_outage() {
    operator(Outage::Refused, true, LATE);
}

/// The controllers' client fails a request that is never answered after its
/// read timeout instead of waiting for good, while a watch through the same client stays
/// open past that timeout and still delivers (watches keep kube's idle deadline instead).
#[test]
fn the_controllers_client_times_out_requests_but_not_quiet_watches() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams, WatchEvent, WatchParams};

    let rt = crate::support::plane::runtime();
    rt.block_on(async {
        let cluster = marin3r_testkit::namespaces::cluster();
        let admin = cluster.client().await.unwrap();
        let space = marin3r_testkit::namespaces::Namespaces::new(&cluster, &admin).await;
        let ns = space.create("client-timeout", &[]).await;
        // The client reaches the API server through the proxy, which leaves one request
        // unanswered.
        let proxy = marin3r_api_faults::FaultProxy::start(cluster.config().await.unwrap())
            .await
            .unwrap();
        let endpoint = proxy.endpoint("controllers").await.unwrap();
        let timeout = Duration::from_secs(1);
        let client =
            marin3r_controller::client::with_read_timeout(endpoint.config(), timeout).unwrap();
        let maps: Api<ConfigMap> = Api::namespaced(client, &ns);

        let from = maps
            .list_metadata(&Default::default())
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let mut watch = maps
            .watch(&WatchParams::default().timeout(30), &from)
            .await
            .unwrap()
            .boxed();
        proxy
            .faults()
            .never_answer(&format!("/api/v1/namespaces/{ns}/configmaps/stuck"), 1);
        let sent = Instant::now();
        let err = maps.get("stuck").await.unwrap_err();
        let waited = sent.elapsed();
        assert!(
            waited >= timeout && waited < timeout * 5,
            "{waited:?}: {err}"
        );
        // The watch has been quiet for longer than the read timeout: it still delivers.
        tokio::time::sleep(timeout * 2).await;
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("late".into());
        maps.create(&PostParams::default(), &cm).await.unwrap();
        // (The cluster publishes its CA's ConfigMap into every new namespace meanwhile.)
        let late = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match watch.next().await {
                    Some(Ok(WatchEvent::Added(c)))
                        if c.metadata.name.as_deref() == Some("late") =>
                    {
                        break Ok(c);
                    }
                    Some(Ok(WatchEvent::Added(c)))
                        if c.metadata.name.as_deref() == Some("kube-root-ca.crt") => {}
                    other => break Err(format!("{other:?}")),
                }
            }
        })
        .await;
        assert!(matches!(late, Ok(Ok(_))), "{late:?}");
        // The request after the one never answered is served.
        assert!(maps.get_opt("stuck").await.unwrap().is_none());
    });
}
