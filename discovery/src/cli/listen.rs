//! Where the servers of every subcommand listen: `[::]` means both IP families (IPV6_V6ONLY
//! off), so one default serves IPv4-only, IPv6-only and dual-stack clusters alike, and a
//! kernel without IPv6 gets `0.0.0.0` instead. Any other address is bound as given.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tracing::warn;

/// Every address of both families, the default of every server's bind address.
pub const ANY: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// The queue of connections not yet accepted (tokio's own default).
const BACKLOG: i32 = 1024;

/// Listens on `addr`; `[::]` is dual-stack, or `0.0.0.0` on the same port when IPv6 is
/// unavailable. Must run inside a tokio runtime.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.ip() != ANY {
        return listen(addr, false);
    }
    match listen(addr, true) {
        Ok(listener) => Ok(listener),
        // Taken is taken on both families; anything else means no IPv6 here.
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(e),
        Err(e) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            warn!(%addr, error = %e, fallback = %v4, "no IPv6: listening on IPv4 only");
            listen(v4, false)
        }
    }
}

/// A listening socket on `addr`, accepting IPv4 too when `dual_stack` (an IPv6 `addr`).
fn listen(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    // As tokio and std do: a restarted server rebinds while old connections linger.
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One byte through `addr`, accepted by `listener`.
    async fn reaches(listener: &TcpListener, addr: SocketAddr) {
        let (client, server) =
            tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (mut client, (mut server, _)) = (client.unwrap(), server.unwrap());
        client.write_all(b"x").await.unwrap();
        let mut byte = [0];
        server.read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x");
    }

    #[tokio::test]
    async fn any_is_reached_over_both_families() {
        let listener = bind(SocketAddr::new(ANY, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        if listener.local_addr().unwrap().is_ipv6() {
            reaches(&listener, SocketAddr::from((Ipv6Addr::LOCALHOST, port))).await;
        }
        reaches(&listener, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await;
    }

    #[tokio::test]
    async fn a_given_address_is_bound_as_given_and_a_taken_port_is_an_error() {
        let listener = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(addr.ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        reaches(&listener, addr).await;
        let taken = bind(SocketAddr::new(ANY, addr.port())).unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
    }
}
