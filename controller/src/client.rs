//! The API client of the controllers: every request but a watch has a read deadline, so a
//! request on a connection that died without a reset (an API server node lost behind the
//! Service address) fails instead of hanging its reconcile, its watch or its Event for good.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;

/// How long a request may wait for the API server's answer (counted from when it was sent,
/// and again between any two reads of the answer).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A client for `config` whose requests have [`READ_TIMEOUT`]; watches keep kube's own
/// deadline, the watcher's idle timeout (the server ends a watch after 290 s, and the
/// watcher re-watches when nothing arrived for 295 s): a read timeout shorter than that
/// would end every quiet watch with an error.
///
/// kube-client 5 has no setting for TCP keepalive; the read timeout is what finds a dead
/// connection, on the first request sent on it.
pub fn with_deadlines(config: kube::Config) -> Result<Client, kube::Error> {
    with_read_timeout(config, READ_TIMEOUT)
}

/// [`with_deadlines`] with another read timeout than [`READ_TIMEOUT`] (tests).
pub fn with_read_timeout(config: kube::Config, timeout: Duration) -> Result<Client, kube::Error> {
    let namespace = config.default_namespace.clone();
    let watches = Client::try_from(config.clone())?;
    let mut bounded = config;
    bounded.read_timeout = Some(timeout);
    // From the request's write, not from when its pooled connection went idle.
    bounded.reset_reader_on_write = true;
    let requests = Client::try_from(bounded)?;
    Ok(Client::new(Split { watches, requests }, namespace))
}

/// [`with_deadlines`] for the cluster the process runs in (or the kubeconfig's).
pub async fn infer() -> Result<Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    with_deadlines(config)
}

/// Sends watches through one client and every other request through the other.
#[derive(Clone)]
struct Split {
    watches: Client,
    requests: Client,
}

fn is_watch<B>(request: &Request<B>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

type Sent = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

impl tower_service::Service<Request<Body>> for Split {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Sent;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each inner client queues its own requests.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = if is_watch(&request) {
            self.watches.clone()
        } else {
            self.requests.clone()
        };
        Box::pin(async move { client.send(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_request(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap_or_default()
    }

    #[test]
    fn only_watches_bypass_the_read_timeout() {
        assert!(is_watch(&mk_request(
            "/api/v1/secrets?labelSelector=a&watch=true&resourceVersion=1"
        )));
        assert!(is_watch(&mk_request("/api/v1/secrets?watch=1")));
        assert!(!is_watch(&mk_request("/api/v1/secrets?limit=500")));
        assert!(!is_watch(&mk_request("/api/v1/namespaces/a/secrets/watch")));
        assert!(!is_watch(&mk_request("/api/v1/secrets?watch=false")));
    }
}
