//! The conventions every `marin3r` process's `/metrics` keeps, checked on real processes
//! against the real cluster's API server: `marin3r_build_info{version,component} 1`, the
//! leader gauge (1 on the replica holding the Lease, 0 on the others, and it moves when the
//! leader leaves), and label values in lowercase.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use marin3r_testkit::envoy::get_body;

use crate::support::plane::runtime;
use crate::support::{Pki, free_port, metric_value};
use marin3r_testkit::namespaces::{Namespaces, cluster};

/// A `marin3r` process, killed on drop unless stopped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// SIGTERM, as the kubelet stops a pod, and waits for the exit.
    fn terminate(&mut self) {
        let pid = self.0.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let _ = self.0.wait();
    }
}

/// Label values that are not lowercase, `le` (`+Inf`) aside: the convention is lowercase
/// snake_case, as Prometheus's own metrics and `resource_type` are.
fn uppercase_label_values(text: &str) -> Vec<String> {
    let labels = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('{')?.1.rsplit_once('}')?.0));
    labels
        .flat_map(|labels| labels.split("\","))
        .filter_map(|pair| pair.split_once("=\""))
        .filter(|(key, _)| *key != "le")
        .map(|(key, value)| format!("{key}={}", value.trim_end_matches('"')))
        .filter(|pair| pair.chars().any(|c| c.is_ascii_uppercase()))
        .collect()
}

/// Waits until `url` serves metrics with a line that `matches`, and returns them; a failure
/// shows the process's log.
fn wait_for_metrics(url: &str, log: &Path, matches: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = get_body(url).unwrap_or_default();
        if text.lines().any(&matches) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never served the sample; last:\n{text}\nlog:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`wait_for_metrics`] for one whole sample line.
fn wait_for_sample(url: &str, line: &str, log: &Path) -> String {
    wait_for_metrics(url, log, |l| l == line)
}

fn build_info(component: &str) -> String {
    format!(
        r#"marin3r_build_info{{version="{}",component="{component}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    )
}

/// An operator replica whose own namespace (its Lease's) is `ns`; it trusts
/// `marin3r-system` as the in-cluster one does, so that what it reconciles while it leads is
/// what that one would.
fn operator(kubeconfig: &Path, ns: &str, name: &str, port: u16, log: &Path) -> Process {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["operator", "--trusted-namespace", "marin3r-system"])
        .args(["--trusted-namespace", ns])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", ns)
        .env("POD_NAME", name)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Process(child)
}

#[test]
fn operator_replicas_report_their_build_and_which_one_leads() {
    let rt = runtime();
    let cluster = cluster();
    // The replicas reconcile every DiscoveryService of the cluster: the in-cluster operator
    // must not reconcile them at the same time.
    let stopped = cluster.operator_stopped().unwrap();
    let client = rt.block_on(cluster.client()).unwrap();
    let space = rt.block_on(Namespaces::holding(&cluster, &client, None));
    let ns = rt.block_on(space.create("metrics-operator", &[]));
    let kubeconfig = cluster.kubeconfig();
    let dir = tempfile::tempdir().unwrap();
    let (port_a, port_b) = (free_port(), free_port());
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let url_a = format!("http://127.0.0.1:{port_a}/metrics");
    let url_b = format!("http://127.0.0.1:{port_b}/metrics");
    let leads = r#"marin3r_leader{lease="marin3r-operator"} 1"#;
    let follows = r#"marin3r_leader{lease="marin3r-operator"} 0"#;

    let mut a = operator(kubeconfig, &ns, "operator-a", port_a, &log_a);
    let text = wait_for_sample(&url_a, leads, &log_a);
    assert!(text.contains(&build_info("operator")), "{text}");
    assert_eq!(
        uppercase_label_values(&text),
        Vec::<String>::new(),
        "{text}"
    );

    // The second replica serves metrics too, as a follower.
    let mut b = operator(kubeconfig, &ns, "operator-b", port_b, &log_b);
    let text = wait_for_sample(&url_b, follows, &log_b);
    assert!(text.contains(&build_info("operator")), "{text}");
    let text = get_body(&url_a).unwrap();
    assert!(text.lines().any(|l| l == leads), "{text}");

    // The leader leaves (it releases the Lease): the follower takes over and says so.
    a.terminate();
    wait_for_sample(&url_b, leads, &log_b);
    b.terminate();
    drop(space);
    drop(stopped);
}

#[test]
fn the_discovery_service_reports_its_build_its_leadership_and_lowercase_labels() {
    let rt = runtime();
    let cluster = cluster();
    let client = rt.block_on(cluster.client()).unwrap();
    let space = rt.block_on(Namespaces::new(&cluster, &client));
    let ns = rt.block_on(space.create("metrics-discovery", &[]));
    let ds = marin3r_testkit::namespaces::unique("ds");
    let kubeconfig = cluster.kubeconfig();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let certs = dir.path().join("server-cert");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("tls.crt"), &pki.server.cert_pem).unwrap();
    std::fs::write(certs.join("tls.key"), &pki.server.key_pem).unwrap();
    std::fs::write(certs.join("ca.crt"), pki.ca_pem()).unwrap();
    let (xds, metrics) = (free_port(), free_port());
    let log = dir.path().join("log");
    let child = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["discovery-service", "--server-cert-dir"])
        .arg(&certs)
        .args(["--xds-port", &xds.to_string()])
        .args(["--metrics-port", &metrics.to_string()])
        .args(["--webhook-port", &free_port().to_string()])
        .args(["--probe-port", &free_port().to_string()])
        .args(["--admin-address", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--discovery-service-name",
            &ds,
            "--bind-address",
            "127.0.0.1",
        ])
        .args(["--shutdown-delay", "0", "--shutdown-grace-period", "1"])
        .env("KUBECONFIG", kubeconfig)
        .env("POD_NAMESPACE", &ns)
        .env("POD_NAME", "discovery-a")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _process = Process(child);
    let url = format!("http://127.0.0.1:{metrics}/metrics");
    let text = wait_for_sample(
        &url,
        &format!(r#"marin3r_leader{{lease="marin3r-discovery-{ds}"}} 1"#),
        &log,
    );
    assert!(text.contains(&build_info("discovery_service")), "{text}");

    // A connection without a client certificate is refused and counted: the reason label,
    // like every other, is lowercase.
    let _ = std::net::TcpStream::connect(("127.0.0.1", xds))
        .and_then(|mut s| std::io::Write::write_all(&mut s, b"not tls\r\n\r\n"));
    let refused = r#"marin3r_xds_refused_connections_total{reason="handshake"}"#;
    let text = wait_for_metrics(&url, &log, |l| metric_value(l, refused) >= 1.0);
    assert_eq!(
        uppercase_label_values(&text),
        Vec::<String>::new(),
        "{text}"
    );
}

#[test]
fn uppercase_label_values_are_found() {
    let text = "# HELP x y\nx{a=\"ok\",b=\"Sotw\"} 1\nh_bucket{le=\"+Inf\"} 2\ny 3\n";
    assert_eq!(uppercase_label_values(text), vec!["b=Sotw".to_owned()]);
}
