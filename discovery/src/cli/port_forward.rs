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

use crate::proxy_config::printable;

/// The most an answer may hold (a large Envoy config dump fits many times over).
const MAX_ANSWER: u64 = 256 * 1024 * 1024;

/// How much of an error answer's body goes into the error message.
const MAX_ERROR_CHARS: usize = 1000;

/// GETs `path` (with its query) from `port` of pod `ns/pod`; returns what was asked (for
/// messages) and the body of a 200 answer.
pub async fn get(
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
        bail!(
            "{source}: the connection closed without an answer {}",
            printable(&reason)
        );
    }
    let body = body_of(&source, &answer)?;
    Ok((source, body))
}

/// The body of `answer`, an HTTP answer from `source`, if it is a 200; else an error saying
/// what the pod answered, escaped and cut.
fn body_of(source: &str, answer: &[u8]) -> anyhow::Result<String> {
    let answer = String::from_utf8_lossy(answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("{source}: not an HTTP answer"))?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("200") {
        // What the pod said, escaped and cut: a tenant's pod may answer anything.
        let said: String = body.trim().chars().take(MAX_ERROR_CHARS).collect();
        bail!("{source}: {}: {}", printable(status_line), printable(&said));
    }
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if chunked {
        dechunk(body).with_context(|| format!("{source}: a broken chunked answer"))
    } else {
        Ok(body.to_owned())
    }
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
    /// An error answer is printed escaped, and only its start.
    #[test]
    fn an_error_answer_is_escaped_and_cut() {
        let mut answer = b"HTTP/1.1 500 \x1b[2JBad\r\nServer: x\r\n\r\n\x1b]0;pwned\x07".to_vec();
        answer.extend(std::iter::repeat_n(b'x', 5000));
        let e = super::body_of("pod a/b port 1/x", &answer)
            .unwrap_err()
            .to_string();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert!(
            e.starts_with("pod a/b port 1/x: HTTP/1.1 500 \\u{1b}[2JBad: \\u{1b}]0;pwned\\u{7}xxx"),
            "{e}"
        );
        assert!(e.len() < 1100, "{} bytes", e.len());
        let ok = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert_eq!(super::body_of("s", ok).unwrap(), "{}");
    }

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
