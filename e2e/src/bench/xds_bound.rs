//! The bound of an xDS push: what the same push costs with nothing but TLS and HTTP/2.
//!
//! A minimal writer serves the simulated Envoys of [`super::xds`] with the product's rustls
//! configuration (`marin3r_xds::server_config`) and the product's HTTP/2 settings, from the
//! same snapshots. Each response is encoded once per snapshot, nonce and gRPC prefix
//! included, and the same bytes go to every stream: every type's response when a stream opens,
//! then, per push, the response of each type that changed. It decodes no request (it reads
//! them only to keep flow control open), keeps nothing per stream but the stream, and wakes
//! no task of its own per stream. So its server CPU per stream per push is the floor the
//! product's is measured against.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::bail;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as DeltaResource,
};
use envoy_types::pb::google::protobuf::Any;
use marin3r_xds::{CONNECTION_WINDOW, STREAM_WINDOW, Snapshot, TlsFiles, server_config};
use prost::Message;
use tokio::io::AsyncBufReadExt;
use tokio_rustls::TlsAcceptor;

use super::xds::{snapshot, subscribed_kinds};

/// What the writer sends: per flavour, the messages of one push.
#[derive(Default)]
struct Messages {
    sotw: Vec<Bytes>,
    delta: Vec<Bytes>,
}

/// A gRPC message: not compressed, its length, then the protobuf bytes.
fn grpc(message: &impl Message) -> Bytes {
    let body = message.encode_to_vec();
    let mut out = BytesMut::with_capacity(5 + body.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.put_slice(&body);
    out.freeze()
}

/// The responses that bring a stream holding `before` (nothing, for a new stream) to `now`:
/// the whole type for state of the world, the resources that changed or went for delta.
fn messages(before: Option<&Snapshot>, now: &Snapshot, nonce: &str) -> Messages {
    let mut out = Messages::default();
    for kind in subscribed_kinds() {
        let of = now.of_type(kind);
        let old = before.map(|b| b.of_type(kind));
        if old.is_some_and(|o| o.version() == of.version()) {
            continue;
        }
        let any = |body: &Bytes| Any {
            type_url: kind.type_url().to_owned(),
            value: body.to_vec(),
        };
        out.sotw.push(grpc(&DiscoveryResponse {
            version_info: of.version().to_owned(),
            resources: of
                .resources()
                .values()
                .map(|r| any(&r.resource.body))
                .collect(),
            type_url: kind.type_url().to_owned(),
            nonce: nonce.to_owned(),
            ..Default::default()
        }));
        let held = |name: &str| {
            old.and_then(|o| o.resources().get(name))
                .map(|r| &r.version)
        };
        out.delta.push(grpc(&DeltaDiscoveryResponse {
            system_version_info: of.version().to_owned(),
            resources: of
                .resources()
                .values()
                .filter(|r| held(&r.name) != Some(&r.version))
                .map(|r| DeltaResource {
                    name: r.name.to_string(),
                    version: r.version.to_string(),
                    resource: Some(any(&r.resource.body)),
                    ..Default::default()
                })
                .collect(),
            type_url: kind.type_url().to_owned(),
            nonce: nonce.to_owned(),
            removed_resources: old
                .map(|o| {
                    o.resources()
                        .keys()
                        .filter(|name| !of.resources().contains_key(*name))
                        .map(ToString::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        }));
    }
    out
}

/// The open streams and what a new one is sent first.
#[derive(Default)]
struct Streams {
    open: Vec<(bool, h2::SendStream<Bytes>)>,
    initial: Messages,
}

fn send_all(stream: &mut h2::SendStream<Bytes>, messages: &[Bytes]) -> bool {
    messages
        .iter()
        .all(|m| stream.send_data(m.clone(), false).is_ok())
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    streams: Arc<Mutex<Streams>>,
) -> anyhow::Result<()> {
    let tls = acceptor.accept(tcp).await?;
    let mut connection = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(17)
        .handshake::<_, Bytes>(tls)
        .await?;
    while let Some(accepted) = connection.accept().await {
        let (request, mut respond) = accepted?;
        let delta = request.uri().path().ends_with("/DeltaAggregatedResources");
        let headers = http::Response::builder()
            .header("content-type", "application/grpc")
            .body(())?;
        let mut send = respond.send_response(headers, false)?;
        {
            let mut streams = streams.lock().unwrap_or_else(PoisonError::into_inner);
            let first = if delta {
                &streams.initial.delta
            } else {
                &streams.initial.sotw
            };
            if send_all(&mut send, first) {
                streams.open.push((delta, send));
            }
        }
        let mut body = request.into_body();
        tokio::spawn(async move {
            while let Some(Ok(chunk)) = body.data().await {
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        });
    }
    Ok(())
}

/// The body of the bound's child process: the same commands as the product's bench server
/// (`ready <addr>`, then `set <generation>` and `quit` on stdin).
pub fn run_server(dir: &Path) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let acceptor = TlsAcceptor::from(server_config(&TlsFiles::in_dir(dir))?);
        let mut current = snapshot(0)?;
        let streams = Arc::new(Mutex::new(Streams {
            open: Vec::new(),
            initial: messages(None, &current, "0"),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("ready {}", listener.local_addr()?);
        let accepting = Arc::clone(&streams);
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve_connection(
                    tcp,
                    acceptor.clone(),
                    Arc::clone(&accepting),
                ));
            }
        });
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["set", g] => {
                    let next = snapshot(g.parse()?)?;
                    let push = messages(Some(&current), &next, g);
                    let mut streams = streams.lock().unwrap_or_else(PoisonError::into_inner);
                    streams.initial = messages(None, &next, g);
                    streams.open.retain_mut(|(delta, send)| {
                        send_all(send, if *delta { &push.delta } else { &push.sotw })
                    });
                    drop(streams);
                    current = next;
                    println!("set {g}");
                }
                ["quit"] => break,
                _ => bail!("unknown command {line:?}"),
            }
        }
        accept.abort();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use marin3r_xds::resource::ResourceType;

    fn decode<M: Message + Default>(frame: &Bytes) -> M {
        let len = u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize;
        assert_eq!((frame[0], len), (0, frame.len() - 5));
        M::decode(&frame[5..]).unwrap()
    }

    #[test]
    fn a_new_stream_gets_every_type_and_a_push_only_what_changed() {
        let (first, second) = (snapshot(0).unwrap(), snapshot(1).unwrap());
        let initial = messages(None, &first, "0");
        let kinds = subscribed_kinds();
        assert_eq!(
            (initial.sotw.len(), initial.delta.len()),
            (kinds.len(), kinds.len())
        );
        for (frame, kind) in initial.sotw.iter().zip(&kinds) {
            let r: DiscoveryResponse = decode(frame);
            assert_eq!(r.type_url, kind.type_url());
            assert_eq!(r.version_info, first.version(*kind));
            assert_eq!(r.resources.len(), first.of_type(*kind).resources().len());
        }
        let push = messages(Some(&first), &second, "1");
        let changed: Vec<ResourceType> = kinds
            .into_iter()
            .filter(|k| first.version(*k) != second.version(*k))
            .collect();
        assert!(!changed.is_empty());
        assert_eq!(push.sotw.len(), changed.len());
        for (frame, kind) in push.delta.iter().zip(&changed) {
            let r: DeltaDiscoveryResponse = decode(frame);
            assert_eq!(
                (r.type_url.as_str(), r.nonce.as_str()),
                (kind.type_url(), "1")
            );
            assert_eq!(r.system_version_info, second.version(*kind));
            assert!(!r.resources.is_empty());
            assert!(r.resources.len() <= second.of_type(*kind).resources().len());
        }
    }
}
