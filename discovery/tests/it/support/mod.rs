//! Shared fixtures of the discovery tests: real Envoy sidecars started from the product's
//! bootstrap with a Kubernetes-style client certificate folder, pointed at the xDS server
//! fixture (testkit's, re-exported here with its PKI), and the controllers' plane.

pub mod plane;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use marin3r_certs::{CertificateInfo, IssuedCertificate};
use marin3r_testkit::envoy::{Envoy, get_body};
use marin3r_webhook::bootstrap::{self, Admin, AdsMode, BootstrapOptions};

pub use marin3r_testkit::pki::Pki;
pub use marin3r_testkit::ports::free_port;
/// Polls `f` until it returns `Some`, or fails the test naming `what` after `timeout`.
pub use marin3r_testkit::wait::until_sync as wait_for;
pub use marin3r_testkit::xds::server::{XdsServer, metric_value, snapshot};

/// A client certificate folder laid out as a mounted Kubernetes Secret: the files live in a
/// `..<timestamp>` folder, `..data` points at it, and `tls.crt` etc. point through `..data`.
pub struct SecretDir {
    pub path: PathBuf,
}

impl SecretDir {
    pub fn create(path: &Path, cert: &IssuedCertificate) -> Self {
        let mut dir = Self {
            path: path.to_owned(),
        };
        dir.swap(cert);
        dir
    }

    /// Atomically replaces the files, the way the kubelet does.
    pub fn swap(&mut self, cert: &IssuedCertificate) {
        marin3r_testkit::secret_volume::write(
            &self.path,
            &[
                ("tls.crt", cert.cert_pem.as_str()),
                ("tls.key", &cert.key_pem),
                ("ca.crt", &cert.ca_pem),
            ],
        )
        .unwrap();
    }
}

/// A real Envoy started from the product's bootstrap, pointed at the test server.
pub struct Proxy {
    pub envoy: Envoy,
    pub certs: SecretDir,
    _dir: tempfile::TempDir,
}

impl Proxy {
    pub fn start(
        server: &XdsServer,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
    ) -> Self {
        Self::start_with(server, client, node_id, pod, mode, None)
    }

    /// `initial_fetch_timeout` (e.g. `"1s"`) shortens how long Envoy waits for its first
    /// configuration before it starts anyway (15 s by default): for proxies that get none.
    pub fn start_with(
        server: &XdsServer,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
        initial_fetch_timeout: Option<&str>,
    ) -> Self {
        Self::start_on_with(
            server.addr.port(),
            client,
            node_id,
            pod,
            mode,
            initial_fetch_timeout,
        )
    }

    /// Pointed at an xDS server on 127.0.0.1:`xds_port`.
    pub fn start_on(
        xds_port: u16,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
    ) -> Self {
        Self::start_on_with(xds_port, client, node_id, pod, mode, None)
    }

    pub fn start_on_with(
        xds_port: u16,
        client: &IssuedCertificate,
        node_id: &str,
        pod: &str,
        mode: AdsMode,
        initial_fetch_timeout: Option<&str>,
    ) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("marin3r-proxy-")
            .tempdir()
            .unwrap();
        let certs = SecretDir::create(&dir.path().join("tls"), client);
        let bootstrap_dir = dir.path().join("bootstrap");
        let mut opts = BootstrapOptions::new("127.0.0.1", xds_port);
        opts.node_id = Some(node_id.into());
        opts.cluster_id = Some(node_id.into());
        opts.ads_mode = mode;
        opts.admin = Admin {
            bind_address: [127, 0, 0, 1].into(),
            port: 0,
            access_log_path: "/dev/null".into(),
        };
        opts.bootstrap_dir = bootstrap_dir.clone();
        opts.client_cert_dir = certs.path.clone();
        let rendered = bootstrap::render(&opts).unwrap();
        rendered.write_to(&bootstrap_dir).unwrap();
        // The sidecar injector adds the pod's name to the node metadata.
        let config_path = bootstrap_dir.join(bootstrap::CONFIG_FILE);
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        config["node"]["metadata"] = serde_json::json!({ "pod_name": pod, "pod_namespace": "x" });
        // And each pod has its own address: the server tells proxies apart by it.
        if let Some(clusters) = config["static_resources"]["clusters"].as_array_mut() {
            for cluster in clusters {
                cluster["upstream_bind_config"] = serde_json::json!({ "source_address": {
                    "address": pod_address(pod).to_string(), "port_value": 0,
                }});
            }
        }
        if let Some(timeout) = initial_fetch_timeout {
            config["dynamic_resources"]["cds_config"]["initial_fetch_timeout"] = timeout.into();
            config["dynamic_resources"]["lds_config"]["initial_fetch_timeout"] = timeout.into();
            config["layered_runtime"]["layers"][0]["rtds_layer"]["rtds_config"]["initial_fetch_timeout"] =
                timeout.into();
        }
        std::fs::write(&config_path, config.to_string()).unwrap();
        let log_dir = tempfile::Builder::new()
            .prefix("marin3r-envoy-")
            .tempdir()
            .unwrap();
        let envoy = Envoy::start_with_file(log_dir, &config_path, &[]).unwrap();
        Self {
            envoy,
            certs,
            _dir: dir,
        }
    }

    /// Waits until `GET http://127.0.0.1:port/` answers `body`.
    pub fn wait_for_body(&self, port: u16, body: &str) {
        let url = format!("http://127.0.0.1:{port}/");
        let mut last;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match get_body(&url) {
                Ok(b) if b == body => return,
                Ok(b) => last = b,
                Err(e) => last = format!("{e:#}"),
            }
            assert!(
                Instant::now() < deadline,
                "GET {url} never answered {body:?}; last: {last:?}\n{}",
                self.envoy.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of one of Envoy's counters or gauges.
    pub fn stat(&self, name: &str) -> u64 {
        let text = self
            .envoy
            .admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))
            .unwrap();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(": ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

/// The loopback address a test proxy of `pod` connects from (127.0.0.2 to 127.0.0.251, by
/// the name's FNV-1a hash): the xDS server counts the proxies of a node by peer address, as
/// pods have their own IPs in a cluster.
pub fn pod_address(pod: &str) -> std::net::Ipv4Addr {
    let hash = pod.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let last = u8::try_from(hash % 250).unwrap() + 2;
    std::net::Ipv4Addr::new(127, 0, 0, last)
}

/// A certificate's serial as Envoy's admin `/certs` prints it.
pub fn envoy_serial(cert: &IssuedCertificate) -> String {
    CertificateInfo::from_pem(&cert.cert_pem)
        .unwrap()
        .serial
        .replace(':', "")
        .to_lowercase()
}

/// `PATH` with the directory of the Envoy `hack/install-tools` installs first, for a `marin3r`
/// child that looks for `envoy` there.
pub fn path_with_envoy() -> std::ffi::OsString {
    let envoy = marin3r_testkit::tools::envoy().expect("hack/install-tools installs Envoy");
    let dir = envoy.parent().expect("envoy's directory").to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).expect("a PATH")
}

/// An EnvoyConfig file `marin3r validate` finds valid (and a Secret beside it).
pub const GOOD_CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/envoyconfig-good.yaml"
);

/// An EnvoyConfig file with a problem of every kind `marin3r validate` places in the file.
pub const BAD_CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/envoyconfig-bad.yaml"
);

/// Writes into `dir` a kubeconfig naming a cluster on a loopback port nothing listens on, and
/// returns its path: a cluster that refuses every connection.
pub fn refusing_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let port = marin3r_testkit::ports::free_port();
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}
