//! `pods/portforward` over WebSocket, as the API server and kubelet serve it to kube-rs
//! (`Api::<Pod>::portforward`): subprotocol `v4.channel.k8s.io`, two channels per requested
//! port (data `2i`, error `2i+1`), each opened by a frame of the port number (little endian),
//! then every binary message is one channel byte and the payload. The connection to the port
//! is made inside the pod's network namespace, so the pod's loopback is reachable (found
//! through [`PodPorts`], the pod runner's).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::ServerState;
use super::error::ApiError;

/// The one subprotocol served (kube-rs offers `v5.channel.k8s.io, v4.channel.k8s.io`; the
/// kubelet serves v4 for port-forward).
const PROTOCOL: &str = "v4.channel.k8s.io";

/// Connects to a port of a running pod from inside its network namespace.
pub trait PodPorts: Send + Sync {
    /// A connection to `127.0.0.1:port` in the pod's network namespace (blocking).
    fn connect(
        &self,
        namespace: &str,
        pod: &str,
        port: u16,
    ) -> std::io::Result<std::net::TcpStream>;
}

pub(crate) async fn handle(
    State(state): State<Arc<ServerState>>,
    plain_http: Option<axum::Extension<super::handlers::PlainHttp>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    if plain_http.is_none()
        && let Err(e) = authorize(&state, &headers, &namespace, &name)
    {
        return e.into_response();
    }
    match prepare(&state, &namespace, &name, &query, &headers) {
        Ok((ports, accept)) => upgrade(state, namespace, name, ports, accept, request),
        Err(e) => e.into_response(),
    }
}

/// `create` on `pods/portforward`, as a real API server asks of a WebSocket port-forward.
fn authorize(
    state: &ServerState,
    headers: &HeaderMap,
    namespace: &str,
    name: &str,
) -> Result<(), ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = state.tokens.authenticate(&state.store, authorization)?;
    let attrs = super::rbac::Attributes::Resource {
        verb: "create".into(),
        group: String::new(),
        resource: "pods".into(),
        subresource: Some("portforward".into()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
    };
    if super::rbac::allowed(&state.store, &user, &attrs) {
        Ok(())
    } else {
        Err(super::rbac::forbidden(&user, &attrs))
    }
}

/// Checks the request and the pod; the ports and the `Sec-WebSocket-Accept` value.
fn prepare(
    state: &ServerState,
    namespace: &str,
    name: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> Result<(Vec<u16>, String), ApiError> {
    let registry = state.store.registry();
    let pods = registry
        .find("", "v1", "pods")
        .ok_or_else(|| ApiError::bad_request("pods are not served"))?;
    let pod = state.store.get(pods, namespace, name)?;
    if pod.pointer("/status/phase").and_then(|p| p.as_str()) != Some("Running") {
        return Err(ApiError::bad_request(format!(
            "pod {name} is not running and cannot be port-forwarded"
        )));
    }
    let mut ports = Vec::new();
    for (_, value) in query.iter().filter(|(k, _)| k == "ports") {
        for p in value.split(',').filter(|p| !p.is_empty()) {
            match p.trim().parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid port {p:?}: must be between 1 and 65535"
                    )));
                }
            }
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request(
            "at least one port must be given (query parameter ports)",
        ));
    }
    let header = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());
    if !header(header::UPGRADE).is_some_and(|u| u.eq_ignore_ascii_case("websocket")) {
        return Err(ApiError::bad_request(
            "port-forward needs a WebSocket upgrade (Upgrade: websocket); SPDY is not served by the local cluster",
        ));
    }
    let offered = header(header::SEC_WEBSOCKET_PROTOCOL).unwrap_or_default();
    if !offered.split(',').any(|p| p.trim() == PROTOCOL) {
        return Err(ApiError::bad_request(format!(
            "no supported WebSocket subprotocol in {offered:?}; this server speaks {PROTOCOL}"
        )));
    }
    let key = header(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| ApiError::bad_request("missing Sec-WebSocket-Key"))?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Ok((ports, accept))
}

fn upgrade(
    state: Arc<ServerState>,
    namespace: String,
    name: String,
    ports: Vec<u16>,
    accept: String,
    mut request: Request,
) -> Response {
    let Some(on_upgrade) = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
    else {
        return ApiError::bad_request("this connection cannot be upgraded").into_response();
    };
    let dialer = state
        .pod_ports
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "port-forward upgrade failed");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        forward(ws, dialer, &namespace, &name, &ports).await;
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(PROTOCOL),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    response
}

/// What the pod side of each port sends back to the client.
enum FromPod {
    Data(u8, Vec<u8>),
    Closed,
}

async fn forward<S>(
    ws: WebSocketStream<S>,
    dialer: Option<Arc<dyn PodPorts>>,
    namespace: &str,
    name: &str,
    ports: &[u16],
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    // Every channel opens with its port number.
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i, 2 * i + 1] {
            let mut frame = vec![ch as u8];
            frame.extend_from_slice(&port.to_le_bytes());
            if sink.send(Message::binary(frame)).await.is_err() {
                return;
            }
        }
    }
    let (tx, mut rx) = mpsc::channel::<FromPod>(16);
    let mut writers = HashMap::new();
    let mut open = 0;
    for (i, &port) in ports.iter().enumerate() {
        let (data, error) = (2 * i as u8, 2 * i as u8 + 1);
        let connected = match &dialer {
            None => Err(std::io::Error::other(
                "no pod runner serves port-forward in this cluster",
            )),
            Some(d) => {
                let (d, ns, pod) = (d.clone(), namespace.to_owned(), name.to_owned());
                tokio::task::spawn_blocking(move || d.connect(&ns, &pod, port))
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            }
        };
        let tcp = connected.and_then(|s| {
            s.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(s)
        });
        let tcp = match tcp {
            Ok(tcp) => tcp,
            Err(e) => {
                // The message the kubelet sends on the error channel.
                let text = format!(
                    "error forwarding port {port} to pod {name}, uid : failed to connect to localhost:{port} inside namespace {namespace}: {e}"
                );
                let mut frame = vec![error];
                frame.extend_from_slice(text.as_bytes());
                let _ = sink.send(Message::binary(frame)).await;
                continue;
            }
        };
        let (mut read, write) = tcp.into_split();
        writers.insert(data, write);
        open += 1;
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send(FromPod::Data(data, buf[..n].to_vec()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send(FromPod::Closed).await;
        });
    }
    drop(tx);
    if open == 0 {
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    loop {
        tokio::select! {
            from_pod = rx.recv() => match from_pod {
                Some(FromPod::Data(ch, bytes)) => {
                    let mut frame = Vec::with_capacity(bytes.len() + 1);
                    frame.push(ch);
                    frame.extend_from_slice(&bytes);
                    if sink.send(Message::binary(frame)).await.is_err() {
                        return;
                    }
                }
                Some(FromPod::Closed) => {
                    open -= 1;
                    if open == 0 {
                        // v4 has no per-channel close: the stream ends with the last port.
                        let _ = sink.send(Message::Close(None)).await;
                        return;
                    }
                }
                None => return,
            },
            from_client = stream.next() => match from_client {
                Some(Ok(Message::Binary(bytes))) => {
                    let Some((&ch, payload)) = bytes.split_first() else { continue };
                    if let Some(w) = writers.get_mut(&ch)
                        && w.write_all(payload).await.is_err()
                    {
                        writers.remove(&ch);
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
