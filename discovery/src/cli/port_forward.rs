//! One HTTP GET to a pod's port through the API server's pod port-forward (what `kubectl
//! port-forward` does; the caller's RBAC must allow `create` on `pods/portforward`). The
//! connection is made inside the pod's network namespace, so its loopback-only admin
//! endpoints are reached: the discovery pod's `/sync-status` and `/served-config`, Envoy's
//! `/config_dump`.

use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most an answer may hold (a large Envoy config dump fits many times over).
const MAX_ANSWER: u64 = 256 * 1024 * 1024;

/// GETs `path` (with its query) from `port` of pod `ns/pod`; returns what was asked (for
/// messages) and the body of a 200 answer.
pub(super) async fn get(
    client: kube::Client,
    ns: &str,
    pod: &str,
    port: u16,
    path: &str,
) -> anyhow::Result<(String, String)> {
    let source = format!("pod {ns}/{pod} port {port}{path}");
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let mut forwarder = pods
        .portforward(pod, &[port])
        .await
        .with_context(|| format!("port-forwarding to pod {ns}/{pod} port {port}"))?;
    let mut stream = forwarder
        .take_stream(port)
        .with_context(|| format!("no stream for port {port}"))?;
    let error = forwarder.take_error(port);
    // The server closes the connection after its answer, which ends the stream. HTTP/1.1:
    // Envoy's admin refuses 1.0 (426 Upgrade Required).
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(MAX_ANSWER)
            .read_to_end(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .with_context(|| format!("{source}: no answer within 30 s"))?
        .with_context(|| format!("reading {source}"))?;
    forwarder.abort();
    if answer.is_empty() {
        let reason = match error {
            Some(e) => e.await.unwrap_or_default(),
            None => String::new(),
        };
        bail!("{source}: the connection closed without an answer {reason}");
    }
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("{source}: not an HTTP answer"))?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        bail!("{source}: {status_line}: {}", body.trim());
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).with_context(|| format!("{source}: a broken chunked answer"))?
    } else {
        body.to_owned()
    };
    Ok((source, body))
}

/// The body of a `Transfer-Encoding: chunked` answer.
fn dechunk(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            super::dechunk("5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n").as_deref(),
            Some("hello, world")
        );
        assert_eq!(super::dechunk("5\r\nhel"), None);
        assert_eq!(super::dechunk("zz\r\n"), None);
    }
}
