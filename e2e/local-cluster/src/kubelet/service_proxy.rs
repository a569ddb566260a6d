//! Service virtual IPs, served the way kube-proxy's userspace mode served them: every Service
//! with a selector (and not headless) gets an address of its own on the node's bridge and a
//! listener on each of its TCP ports, which sends every new connection to a pod the Service
//! selects ([`hosts::endpoint`]) on the port's `targetPort`. Its names resolve to that
//! address (`/etc/hosts`), so a client keeps one address while the pods behind it come and
//! go, as with a ClusterIP: without it, a client that caches name lookups (Envoy's c-ares
//! keeps `/etc/hosts` for a minute) would keep dialling a pod that is gone.
//!
//! What crosses the proxy is what would cross kube-proxy's NAT: bytes, a close (FIN) and a
//! reset each way. A pod that vanishes without closing (its network gone) is silent to the
//! client, as it would be in a real cluster; the client finds out from its own keepalives.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::net::Network;
use super::{Node, Objects, hosts};

/// A Service: namespace and name.
type Key = (String, String);

/// The virtual IPs of this node's Services and their listeners. Dropping it stops the
/// listeners and takes the addresses off the bridge.
pub struct ServiceProxy {
    node: Arc<Node>,
    objects: Arc<dyn Objects>,
    served: Mutex<BTreeMap<Key, BTreeMap<u16, JoinHandle<()>>>>,
    /// The proxy's own thread and runtime, as kube-proxy is a process of its own: whatever
    /// blocks a thread of the caller's runtime (tests make blocking calls) never holds up
    /// the connections.
    runtime: Option<tokio::runtime::Runtime>,
}

impl ServiceProxy {
    pub fn new(node: Arc<Node>, objects: Arc<dyn Objects>) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("service-proxy")
            .enable_all()
            .build()?;
        Ok(Self {
            node,
            objects,
            served: Mutex::default(),
            runtime: Some(runtime),
        })
    }

    fn network(&self) -> &Network {
        &self.node.network
    }

    /// Gives every Service with a selector its virtual IP and listeners, and takes them away
    /// from Services that are gone or no longer qualify.
    pub fn sync(&self) {
        let Some(runtime) = &self.runtime else {
            return;
        };
        let wanted: BTreeMap<Key, Vec<u16>> = self
            .objects
            .services()
            .iter()
            .filter_map(|s| Some((key(s), proxied_ports(s)?)))
            .collect();
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<Key> = served
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(listeners) = served.remove(&k) {
                listeners.values().for_each(JoinHandle::abort);
            }
            self.network().remove_service_ip(&k.0, &k.1);
        }
        for (k, ports) in wanted {
            let ip = match self.network().add_service_ip(&k.0, &k.1) {
                Ok(ip) => ip,
                Err(e) => {
                    tracing::warn!(service = %format!("{}/{}", k.0, k.1), "no virtual IP: {e:#}");
                    continue;
                }
            };
            let listeners = served.entry(k.clone()).or_default();
            listeners.retain(|port, task| {
                let keep = ports.contains(port) && !task.is_finished();
                if !keep {
                    task.abort();
                }
                keep
            });
            for port in ports {
                if listeners.contains_key(&port) {
                    continue;
                }
                let listening = {
                    let _in_runtime = runtime.enter();
                    listen(ip, port)
                };
                match listening {
                    Ok(listener) => {
                        let task =
                            runtime.spawn(accept(listener, k.clone(), port, self.objects.clone()));
                        listeners.insert(port, task);
                    }
                    Err(e) => tracing::warn!(
                        service = %format!("{}/{}", k.0, k.1),
                        port,
                        "cannot listen on the virtual IP: {e}"
                    ),
                }
            }
        }
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        let served = std::mem::take(&mut *self.served.lock().unwrap_or_else(|e| e.into_inner()));
        for (k, listeners) in served {
            listeners.values().for_each(JoinHandle::abort);
            self.network().remove_service_ip(&k.0, &k.1);
        }
        // Ends the listeners and every proxied connection, without waiting (this may run
        // inside another runtime).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn key(service: &Service) -> Key {
    (
        service
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into()),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

/// The TCP ports of a Service that gets a virtual IP: one with a selector that is not
/// headless (`clusterIP: None`). `None` for the others.
fn proxied_ports(service: &Service) -> Option<Vec<u16>> {
    let spec = service.spec.as_ref()?;
    if spec.selector.as_ref().is_none_or(BTreeMap::is_empty)
        || spec.cluster_ip.as_deref() == Some("None")
    {
        return None;
    }
    Some(
        spec.ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| u16::try_from(p.port).ok())
            .collect(),
    )
}

fn listen(ip: Ipv4Addr, port: u16) -> std::io::Result<TcpListener> {
    let listener = std::net::TcpListener::bind((ip, port))?;
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

async fn accept(listener: TcpListener, service: Key, port: u16, objects: Arc<dyn Objects>) {
    loop {
        let Ok((client, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let objects = objects.clone();
        let service = service.clone();
        tokio::spawn(async move {
            match upstream(&service, port, peer, &*objects).await {
                Some(pod) => splice(client, pod).await,
                // No pod serves it, or the pod refused: the client is refused too.
                None => reset(&client),
            }
        });
    }
}

/// A connection to the pod that serves `peer`'s connection to `service`:`port`.
async fn upstream(
    service: &Key,
    port: u16,
    peer: SocketAddr,
    objects: &dyn Objects,
) -> Option<TcpStream> {
    let services = objects.services();
    let svc = services.iter().find(|s| key(s) == *service)?;
    let service_port = svc
        .spec
        .as_ref()?
        .ports
        .iter()
        .flatten()
        .find(|p| u16::try_from(p.port).ok() == Some(port))?;
    let pods = objects.pods();
    let peer_ip = peer.ip().to_string();
    let client = pods
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_deref()) == Some(peer_ip.as_str()))
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or(peer_ip);
    let pod = hosts::endpoint(svc, &pods, &client)?;
    let ip: Ipv4Addr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    let target = target_port(service_port, pod)?;
    tokio::time::timeout(Duration::from_secs(5), TcpStream::connect((ip, target)))
        .await
        .ok()?
        .ok()
}

/// The pod port a Service port forwards to: `targetPort` by number or by the name of a
/// container port, or the Service port itself.
fn target_port(port: &ServicePort, pod: &Pod) -> Option<u16> {
    match &port.target_port {
        None => u16::try_from(port.port).ok(),
        Some(IntOrString::Int(n)) => u16::try_from(*n).ok(),
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// How one direction of a proxied connection ended.
enum End {
    /// The sender closed (FIN); passed on.
    Closed,
    /// The sender reset the connection, or its socket failed.
    SenderReset,
    /// The receiver reset the connection.
    ReceiverReset,
    /// The receiver's host went silent (unreachable); what the sender sent after was
    /// discarded until the sender closed.
    ReceiverSilent,
    /// The sender's host went silent: nothing more comes from it.
    SenderSilent,
}

async fn pump(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf) -> End {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) => {
                let _ = to.shutdown().await;
                return End::Closed;
            }
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return End::SenderReset,
            Err(_) => return End::SenderSilent,
        };
        match to.write_all(&buf[..n]).await {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return End::ReceiverReset;
            }
            Err(_) => {
                // As over a network that lost the receiver: the sender hears nothing back.
                while let Ok(1..) = from.read(&mut buf).await {}
                return End::ReceiverSilent;
            }
        }
    }
}

/// Passes bytes both ways until both sides have closed; a reset on one side resets the
/// other; a silent pod stays silent to the client until the client closes.
async fn splice(client: TcpStream, pod: TcpStream) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut pod_read, mut pod_write) = pod.into_split();
    let reset_side = {
        let up = pump(&mut client_read, &mut pod_write);
        let down = pump(&mut pod_read, &mut client_write);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                end = &mut up, if !up_done => match end {
                    End::Closed => up_done = true,
                    End::SenderReset | End::SenderSilent => break Some(Side::Pod),
                    End::ReceiverReset => break Some(Side::Client),
                    End::ReceiverSilent => break None,
                },
                end = &mut down, if !down_done => match end {
                    End::Closed | End::SenderSilent => down_done = true,
                    End::SenderReset => break Some(Side::Client),
                    End::ReceiverReset | End::ReceiverSilent => break Some(Side::Pod),
                },
            }
            if up_done && down_done {
                break None;
            }
        }
    };
    let reset_one = |read: OwnedReadHalf, write: OwnedWriteHalf| {
        if let Ok(stream) = read.reunite(write) {
            reset(&stream);
        }
    };
    match reset_side {
        Some(Side::Client) => reset_one(client_read, client_write),
        Some(Side::Pod) => reset_one(pod_read, pod_write),
        None => {}
    }
}

enum Side {
    Client,
    Pod,
}

/// Closes with a reset (RST) instead of a FIN when the stream is dropped.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}
