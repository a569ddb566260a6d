//! What one client address may hold of the webhook: connections and requests in flight. The
//! webhook answers the API server, but anyone who reaches its port may connect without a
//! certificate; a share per address keeps one such client from taking every connection slot
//! (each slow request keeps its connection busy, so never idle, so never given up).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Connections and requests in flight per client address, under the configured maximums.
#[derive(Debug)]
pub(crate) struct Clients {
    counts: Mutex<HashMap<IpAddr, Count>>,
    max_connections: usize,
    max_requests: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    connections: usize,
    requests: usize,
}

/// What a place is counted as; given back when it is dropped.
#[derive(Debug, Clone, Copy)]
enum What {
    Connection,
    Request,
}

/// A connection's, or a request's, place in its address's count.
#[derive(Debug)]
pub(crate) struct Place {
    clients: Arc<Clients>,
    addr: IpAddr,
    what: What,
}

impl Clients {
    pub(crate) fn new(max_connections: usize, max_requests: usize) -> Self {
        Self {
            counts: Mutex::default(),
            max_connections: max_connections.max(1),
            max_requests: max_requests.max(1),
        }
    }

    /// A place for a new connection from `addr`, or None when the address holds its maximum.
    pub(crate) fn connection(self: &Arc<Self>, addr: IpAddr) -> Option<Place> {
        self.take(addr, What::Connection)
    }

    /// A place for a new request from `addr`, or None when the address has its maximum in
    /// flight.
    pub(crate) fn request(self: &Arc<Self>, addr: IpAddr) -> Option<Place> {
        self.take(addr, What::Request)
    }

    fn take(self: &Arc<Self>, addr: IpAddr, what: What) -> Option<Place> {
        // An IPv4 client of a dual-stack listener is one address however it is written.
        let addr = addr.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(addr).or_default();
        let (taken, max) = match what {
            What::Connection => (&mut count.connections, self.max_connections),
            What::Request => (&mut count.requests, self.max_requests),
        };
        if *taken >= max {
            return None;
        }
        *taken += 1;
        Some(Place {
            clients: Arc::clone(self),
            addr,
            what,
        })
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.counts.lock().map(|c| c.len()).unwrap_or(0)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self
            .clients
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.addr) {
            match self.what {
                What::Connection => count.connections = count.connections.saturating_sub(1),
                What::Request => count.requests = count.requests.saturating_sub(1),
            }
            if *count == Count::default() {
                counts.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn each_address_has_its_own_share_given_back_on_drop() {
        let clients = Arc::new(Clients::new(2, 1));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let c1 = clients.connection(a).unwrap();
        let c2 = clients.connection(a).unwrap();
        assert!(clients.connection(a).is_none());
        // The same address written as IPv4-mapped IPv6 shares the count.
        assert!(
            clients
                .connection("::ffff:10.0.0.1".parse().unwrap())
                .is_none()
        );
        let r1 = clients.request(a).unwrap();
        assert!(clients.request(a).is_none());
        let other = (clients.connection(b).unwrap(), clients.request(b).unwrap());
        drop(c1);
        let c3 = clients.connection(a).unwrap();
        drop((c2, c3, r1, other));
        assert_eq!(clients.addresses(), 0, "no entry is left behind");
    }
}
