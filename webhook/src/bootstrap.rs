//! Renders the Envoy bootstrap of an injected sidecar (SPEC §4): ADS over gRPC/HTTP2 with
//! keepalive to the discovery service, mutual TLS with the client certificate and the CA
//! loaded through file-based SDS (so a rotated Secret is reloaded without a restart), and
//! CDS, LDS and a runtime layer from ADS.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use thiserror::Error;

use crate::config as layout;

/// File names in the bootstrap ConfigMap (and in `marin3r bootstrap --out-dir`): the webhook
/// mounts the ConfigMap and starts Envoy with the first.
pub const CONFIG_FILE: &str = layout::BOOTSTRAP_FILE;
pub const TLS_CERTIFICATE_SDS_FILE: &str = layout::TLS_CERTIFICATE_SDS_FILE;
pub const VALIDATION_CONTEXT_SDS_FILE: &str = layout::VALIDATION_CONTEXT_SDS_FILE;

/// Where the sidecar finds its files (the webhook mounts them there).
pub const DEFAULT_BOOTSTRAP_DIR: &str = layout::BOOTSTRAP_MOUNT_PATH;
pub const DEFAULT_CLIENT_CERT_DIR: &str = layout::CLIENT_CERT_MOUNT_PATH;

/// The names of the xDS cluster and of the two SDS secrets inside the bootstrap.
pub const XDS_CLUSTER: &str = "xds_cluster";
const CLIENT_CERT_SECRET: &str = "xds_client_certificate";
const CA_SECRET: &str = "xds_trusted_ca";

/// State-of-the-world or incremental (delta) ADS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AdsMode {
    #[default]
    StateOfTheWorld,
    Delta,
}

/// Envoy's admin interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub bind_address: IpAddr,
    pub port: u16,
    pub access_log_path: String,
}

impl Default for Admin {
    fn default() -> Self {
        Self {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            port: 9901,
            access_log_path: "/dev/null".into(),
        }
    }
}

/// Everything the bootstrap depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapOptions {
    /// Set in the bootstrap when given; a shared per-namespace bootstrap leaves it out and the
    /// sidecar passes `--service-node`.
    pub node_id: Option<String>,
    pub cluster_id: Option<String>,
    /// The discovery service's host name (or IP); also the name its certificate must carry.
    pub xds_host: String,
    pub xds_port: u16,
    pub ads_mode: AdsMode,
    pub admin: Admin,
    /// Where the bootstrap's own files (the SDS files) are, as seen by Envoy.
    pub bootstrap_dir: PathBuf,
    /// Where `tls.crt`, `tls.key` and `ca.crt` of the client certificate are.
    pub client_cert_dir: PathBuf,
}

impl BootstrapOptions {
    pub fn new(xds_host: impl Into<String>, xds_port: u16) -> Self {
        Self {
            node_id: None,
            cluster_id: None,
            xds_host: xds_host.into(),
            xds_port,
            ads_mode: AdsMode::default(),
            admin: Admin::default(),
            bootstrap_dir: DEFAULT_BOOTSTRAP_DIR.into(),
            client_cert_dir: DEFAULT_CLIENT_CERT_DIR.into(),
        }
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BootstrapError {
    #[error("xDS host {0:?} is not a DNS name or IP address")]
    InvalidHost(String),
    #[error("xDS port must be between 1 and 65535")]
    InvalidPort,
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("{field} must be an absolute path, got {path:?}")]
    RelativePath { field: &'static str, path: PathBuf },
}

/// The rendered files, keyed by their file names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub config: String,
    pub tls_certificate_sds: String,
    pub validation_context_sds: String,
}

impl Bootstrap {
    /// `(file name, contents)` of every file, as the ConfigMap's data.
    pub fn files(&self) -> [(&'static str, &str); 3] {
        [
            (CONFIG_FILE, &self.config),
            (TLS_CERTIFICATE_SDS_FILE, &self.tls_certificate_sds),
            (VALIDATION_CONTEXT_SDS_FILE, &self.validation_context_sds),
        ]
    }

    /// Writes every file into `dir`.
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        for (name, contents) in self.files() {
            std::fs::write(dir.join(name), contents)?;
        }
        Ok(())
    }
}

/// Renders the bootstrap and its SDS files.
pub fn render(opts: &BootstrapOptions) -> Result<Bootstrap, BootstrapError> {
    validate(opts)?;
    let mut config = json!({
        "admin": admin(&opts.admin),
        "dynamic_resources": dynamic_resources(opts.ads_mode),
        "layered_runtime": { "layers": [
            // A namespace rarely defines the runtime layer, and Envoy holds its start-up until
            // the layer arrives or the initial fetch times out (15 s by default; 0 would wait
            // forever): wait 1 s, a runtime that comes later is still applied.
            { "name": "runtime", "rtds_layer": { "name": "runtime", "rtds_config": {
                "ads": {}, "resource_api_version": "V3", "initial_fetch_timeout": "1s",
            }}},
        ]},
        "static_resources": { "clusters": [xds_cluster(opts)] },
    });
    let mut node = serde_json::Map::new();
    if let Some(id) = &opts.node_id {
        node.insert("id".into(), Value::from(id.as_str()));
    }
    if let Some(cluster) = &opts.cluster_id {
        node.insert("cluster".into(), Value::from(cluster.as_str()));
    }
    if !node.is_empty() {
        config["node"] = Value::Object(node);
    }
    let (tls_certificate_sds, validation_context_sds) = sds_files(&opts.client_cert_dir);
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    Ok(Bootstrap {
        config: pretty(&config),
        tls_certificate_sds: pretty(&tls_certificate_sds),
        validation_context_sds: pretty(&validation_context_sds),
    })
}

fn path(dir: &Path, file: &str) -> String {
    dir.join(file).to_string_lossy().into_owned()
}

fn admin(admin: &Admin) -> Value {
    json!({
        "access_log": [{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": admin.access_log_path,
            },
        }],
        "address": { "socket_address": {
            "address": admin.bind_address.to_string(),
            "port_value": admin.port,
        }},
    })
}

/// Listeners and clusters, and every resource they name, from ADS on the xDS cluster.
fn dynamic_resources(mode: AdsMode) -> Value {
    let ads = json!({ "ads": {}, "resource_api_version": "V3" });
    json!({
        "ads_config": {
            "api_type": match mode {
                AdsMode::StateOfTheWorld => "GRPC",
                AdsMode::Delta => "DELTA_GRPC",
            },
            "transport_api_version": "V3",
            "set_node_on_first_message_only": true,
            "grpc_services": [{ "envoy_grpc": { "cluster_name": XDS_CLUSTER } }],
        },
        "cds_config": ads,
        "lds_config": ads,
    })
}

/// The discovery service, over HTTP/2 with keepalives and mutual TLS.
fn xds_cluster(opts: &BootstrapOptions) -> Value {
    let host_ip = opts.xds_host.parse::<IpAddr>().ok();
    json!({
        "name": XDS_CLUSTER,
        "type": if host_ip.is_some() { "STATIC" } else { "STRICT_DNS" },
        // A Service name resolves to IPv4 in most clusters: asking for that first avoids an
        // AAAA query that may wait for DNS timeouts before the IPv4 answer is tried.
        "dns_lookup_family": "V4_PREFERRED",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": XDS_CLUSTER,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                "socket_address": { "address": opts.xds_host, "port_value": opts.xds_port },
            }}}]}],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {
                    // Notice a dead discovery pod quickly, even without traffic.
                    "connection_keepalive": { "interval": "30s", "timeout": "5s" },
                }},
            },
        },
        "upstream_connection_options": { "tcp_keepalive": {
            "keepalive_time": 60, "keepalive_interval": 10, "keepalive_probes": 3,
        }},
        "transport_socket": xds_tls(opts, host_ip.is_some()),
    })
}

/// Mutual TLS to the discovery service: the client certificate and the CA from file-based
/// SDS, the server checked against the CA and the host dialled.
fn xds_tls(opts: &BootstrapOptions, host_is_ip: bool) -> Value {
    let bootstrap_dir = opts.bootstrap_dir.to_string_lossy().into_owned();
    let server_san = json!({
        "san_type": if host_is_ip { "IP_ADDRESS" } else { "DNS" },
        "matcher": { "exact": opts.xds_host },
    });
    let sds_file = |file: &str, name: &str| {
        json!({
            "name": name,
            "sds_config": {
                "path_config_source": {
                    "path": path(&opts.bootstrap_dir, file),
                    "watched_directory": { "path": bootstrap_dir },
                },
                "resource_api_version": "V3",
            },
        })
    };
    json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": opts.xds_host,
            "common_tls_context": {
                "tls_params": { "tls_minimum_protocol_version": "TLSv1_2" },
                "alpn_protocols": ["h2"],
                "tls_certificate_sds_secret_configs": [
                    sds_file(TLS_CERTIFICATE_SDS_FILE, CLIENT_CERT_SECRET)
                ],
                "combined_validation_context": {
                    "default_validation_context": {
                        "match_typed_subject_alt_names": [server_san],
                    },
                    "validation_context_sds_secret_config":
                        sds_file(VALIDATION_CONTEXT_SDS_FILE, CA_SECRET),
                },
            },
        },
    })
}

/// The two SDS files: the client certificate and the CA, read from the mounted Secret.
fn sds_files(cert_dir: &Path) -> (Value, Value) {
    let watched = cert_dir.to_string_lossy().into_owned();
    let secret_type = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    let tls_certificate = json!({ "resources": [{
        "@type": secret_type,
        "name": CLIENT_CERT_SECRET,
        "tls_certificate": {
            "certificate_chain": { "filename": path(cert_dir, "tls.crt") },
            "private_key": { "filename": path(cert_dir, "tls.key") },
            // Kubernetes swaps Secret files by renaming a `..data` symlink in this folder.
            "watched_directory": { "path": watched },
        },
    }]});
    let validation_context = json!({ "resources": [{
        "@type": secret_type,
        "name": CA_SECRET,
        "validation_context": {
            "trusted_ca": { "filename": path(cert_dir, "ca.crt") },
            "watched_directory": { "path": watched },
        },
    }]});
    (tls_certificate, validation_context)
}

fn validate(opts: &BootstrapOptions) -> Result<(), BootstrapError> {
    if opts.xds_port == 0 {
        return Err(BootstrapError::InvalidPort);
    }
    let host = opts.xds_host.as_str();
    if host.is_empty() {
        return Err(BootstrapError::Empty { field: "xDS host" });
    }
    let dns_name = !host.contains("://")
        && !host.starts_with('*')
        && marin3r_certs::subject_alt_name(host).is_ok();
    if host.parse::<IpAddr>().is_err() && !dns_name {
        return Err(BootstrapError::InvalidHost(host.to_owned()));
    }
    for (field, value) in [("node id", &opts.node_id), ("cluster id", &opts.cluster_id)] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(BootstrapError::Empty { field });
        }
    }
    for (field, dir) in [
        ("bootstrap directory", &opts.bootstrap_dir),
        ("client certificate directory", &opts.client_cert_dir),
    ] {
        if !dir.is_absolute() {
            return Err(BootstrapError::RelativePath {
                field,
                path: dir.clone(),
            });
        }
    }
    if opts.admin.access_log_path.is_empty() {
        return Err(BootstrapError::Empty {
            field: "admin access log path",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn default_bootstrap_uses_ads_over_mtls_with_file_sds() {
        let b = render(&BootstrapOptions::new(
            "marin3r-instance.default.svc",
            18000,
        ))
        .unwrap();
        let c = parse(&b.config);
        assert_eq!(c["dynamic_resources"]["ads_config"]["api_type"], "GRPC");
        assert_eq!(c["dynamic_resources"]["cds_config"]["ads"], json!({}));
        assert_eq!(c["dynamic_resources"]["lds_config"]["ads"], json!({}));
        assert!(c.get("node").is_none());
        let cluster = &c["static_resources"]["clusters"][0];
        assert_eq!(cluster["type"], "STRICT_DNS");
        let common = &cluster["transport_socket"]["typed_config"]["common_tls_context"];
        assert_eq!(
            common["tls_certificate_sds_secret_configs"][0]["sds_config"]["path_config_source"]["path"],
            "/etc/envoy/bootstrap/tls_certificate_sds_secret.json"
        );
        let san = &common["combined_validation_context"]["default_validation_context"]["match_typed_subject_alt_names"]
            [0];
        assert_eq!(san["san_type"], "DNS");
        assert_eq!(san["matcher"]["exact"], "marin3r-instance.default.svc");
        assert_eq!(c["admin"]["address"]["socket_address"]["port_value"], 9901);

        let sds = parse(&b.tls_certificate_sds);
        let cert = &sds["resources"][0]["tls_certificate"];
        assert_eq!(
            cert["certificate_chain"]["filename"],
            "/etc/envoy/tls/client/tls.crt"
        );
        assert_eq!(
            cert["private_key"]["filename"],
            "/etc/envoy/tls/client/tls.key"
        );
        assert_eq!(cert["watched_directory"]["path"], "/etc/envoy/tls/client");
        let ca = parse(&b.validation_context_sds);
        assert_eq!(
            ca["resources"][0]["validation_context"]["trusted_ca"]["filename"],
            "/etc/envoy/tls/client/ca.crt"
        );
    }

    #[test]
    fn delta_ip_host_and_node_are_rendered() {
        let mut opts = BootstrapOptions::new("127.0.0.1", 18000);
        opts.ads_mode = AdsMode::Delta;
        opts.node_id = Some("proxy-1".into());
        opts.cluster_id = Some("edge".into());
        let c = parse(&render(&opts).unwrap().config);
        assert_eq!(
            c["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        assert_eq!(c["node"], json!({"id": "proxy-1", "cluster": "edge"}));
        let cluster = &c["static_resources"]["clusters"][0];
        assert_eq!(cluster["type"], "STATIC");
        assert_eq!(
            cluster["transport_socket"]["typed_config"]["common_tls_context"]["combined_validation_context"]
                ["default_validation_context"]["match_typed_subject_alt_names"][0]["san_type"],
            "IP_ADDRESS"
        );
    }

    #[test]
    fn bad_options_are_named() {
        let cases: Vec<(BootstrapOptions, BootstrapError)> = vec![
            (
                BootstrapOptions::new("bad host", 1),
                BootstrapError::InvalidHost("bad host".into()),
            ),
            (
                BootstrapOptions::new("https://x", 1),
                BootstrapError::InvalidHost("https://x".into()),
            ),
            (BootstrapOptions::new("x", 0), BootstrapError::InvalidPort),
            (
                BootstrapOptions::new("", 1),
                BootstrapError::Empty { field: "xDS host" },
            ),
            (
                BootstrapOptions {
                    node_id: Some(" ".into()),
                    ..BootstrapOptions::new("x", 1)
                },
                BootstrapError::Empty { field: "node id" },
            ),
            (
                BootstrapOptions {
                    client_cert_dir: "tls".into(),
                    ..BootstrapOptions::new("x", 1)
                },
                BootstrapError::RelativePath {
                    field: "client certificate directory",
                    path: "tls".into(),
                },
            ),
        ];
        for (opts, want) in cases {
            assert_eq!(render(&opts).unwrap_err(), want);
        }
    }
}
