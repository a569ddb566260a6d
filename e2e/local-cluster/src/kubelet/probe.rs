//! Running one probe (httpGet, tcpSocket, exec) against a container, as the kubelet does:
//! HTTP success is a status in 200..400, HTTPS skips certificate verification; exec runs
//! inside the container's namespaces.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Probe timing with Kubernetes' defaults, the period capped by the node's setting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

pub fn timing(probe: &Probe, max_period: Duration) -> Timing {
    let secs =
        |v: Option<i32>, default: u64| Duration::from_secs(v.map_or(default, |v| v.max(0) as u64));
    Timing {
        initial_delay: secs(probe.initial_delay_seconds, 0),
        period: secs(probe.period_seconds, 10)
            .min(max_period)
            .max(Duration::from_millis(100)),
        timeout: secs(probe.timeout_seconds, 1).max(Duration::from_secs(1)),
        success_threshold: probe.success_threshold.map_or(1, |v| v.max(1) as u32),
        failure_threshold: probe.failure_threshold.map_or(3, |v| v.max(1) as u32),
    }
}

fn port(container: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port {p}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("port {name:?} is not a named port of the container")),
    }
}

/// Runs the probe once. `pod_ip` is the default host; `pid` the container's process (for exec).
pub async fn run(
    probe: &Probe,
    container: &Container,
    pod_ip: &str,
    pid: u32,
    timeout: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, run_inner(probe, container, pod_ip, pid)).await {
        Ok(result) => result,
        Err(_) => Err(format!("probe timed out after {timeout:?}")),
    }
}

async fn run_inner(
    probe: &Probe,
    container: &Container,
    pod_ip: &str,
    pid: u32,
) -> Result<(), String> {
    if let Some(http) = &probe.http_get {
        let scheme = http.scheme.as_deref().unwrap_or("HTTP");
        let tls = match scheme.to_ascii_uppercase().as_str() {
            "HTTP" => false,
            "HTTPS" => true,
            _ => return Err(format!("httpGet scheme {scheme:?} is not HTTP or HTTPS")),
        };
        let host = http
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(pod_ip);
        let port = port(container, &http.port)?;
        let path = http.path.as_deref().unwrap_or("/");
        let url = format!("{}://{host}:{port}{path}", scheme.to_ascii_lowercase());
        let mut request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n"
        );
        for h in http.http_headers.iter().flatten() {
            request.push_str(&format!("{}: {}\r\n", h.name, h.value));
        }
        request.push_str("\r\n");
        let stream = TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        let code = if tls {
            let stream = tls_connect(stream, host)
                .await
                .map_err(|e| format!("Get \"{url}\": {e}"))?;
            status_code(stream, &request).await
        } else {
            status_code(stream, &request).await
        }
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
        return if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or(pod_ip);
        let port = port(container, &tcp.port)?;
        return TcpStream::connect((host, port))
            .await
            .map(|_| ())
            .map_err(|e| format!("dial tcp {host}:{port}: {e}"));
    }
    if let Some(exec) = &probe.exec {
        let command = exec.command.clone().unwrap_or_default();
        if command.is_empty() {
            return Err("exec probe without a command".into());
        }
        let out = tokio::process::Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "-n", "-u", "--"])
            .args(&command)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("exec probe: {e}"))?;
        return if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "exec probe {command:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            ))
        };
    }
    Err("probe has no handler the local cluster supports (httpGet, tcpSocket, exec)".into())
}

/// Sends `request` and reads the status code of the answer.
async fn status_code<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> Result<u16, String> {
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "malformed HTTP response: {:?}",
                line.lines().next().unwrap_or("")
            )
        })
}

/// TLS as the kubelet's HTTPS probes do it: the server's certificate is not verified.
async fn tls_connect(
    stream: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| e.to_string())
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn timing_uses_kubernetes_defaults_and_caps_the_period() {
        let t = timing(&Probe::default(), Duration::from_secs(1));
        assert_eq!(t.period, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        assert_eq!(t.timeout, Duration::from_secs(1));
    }

    #[test]
    fn named_ports_resolve_through_the_container() {
        let c = Container {
            ports: Some(vec![ContainerPort {
                name: Some("admin".into()),
                container_port: 9901,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(port(&c, &IntOrString::String("admin".into())), Ok(9901));
        assert!(
            port(&c, &IntOrString::String("nope".into()))
                .unwrap_err()
                .contains("nope")
        );
        assert!(port(&c, &IntOrString::Int(70000)).is_err());
    }
}
