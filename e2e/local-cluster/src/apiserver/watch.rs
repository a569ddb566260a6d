//! Watch streams: history replay after the requested version, then live events, one JSON
//! event per line; selector transitions as ADDED/DELETED; bookmarks; timeouts; an expired
//! version answered inside a 200 stream as an ERROR event with code 410.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::error::ApiError;
use super::meta;
use super::registry::ResourceInfo;
use super::selectors::Selectors;
use super::store::{Event, EventType, Store, present};
use super::table::{self, IncludeObject};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for every current object, then live events.
    Current,
    /// Every event after this resourceVersion, then live events.
    After(u64),
}

/// What a new watch starts from: history to replay, the live feed, the version it is at.
pub type Subscription = (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>, u64);

impl Store {
    /// History to replay and a live receiver, taken under one lock.
    pub fn subscribe(
        &self,
        info: &ResourceInfo,
        ns: Option<&str>,
        start: WatchStart,
    ) -> Result<Subscription, ApiError> {
        let inner = self.lock();
        let gr = info.group_resource();
        let same_type = |e: &Event| {
            (&e.group, &e.resource) == (&gr.0, &gr.1) && ns.is_none_or(|n| n == e.namespace)
        };
        let replay = match start {
            WatchStart::Current => inner
                .objects
                .get(&info.group_resource())
                .into_iter()
                .flat_map(|m| m.values())
                .map(|o| {
                    Arc::new(Event {
                        rv: meta::resource_version(o).parse().unwrap_or(0),
                        group: gr.0.clone(),
                        resource: gr.1.clone(),
                        namespace: meta::namespace(o).to_owned(),
                        kind: EventType::Added,
                        object: o.clone(),
                        old: None,
                    })
                })
                .filter(|e| same_type(e))
                .collect(),
            WatchStart::After(rv) => {
                if rv < inner.compacted {
                    return Err(ApiError::expired(rv, inner.compacted));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| e.rv > rv && same_type(e))
                    .cloned()
                    .collect()
            }
        };
        Ok((replay, self.events.subscribe(), inner.rv))
    }
}

/// What a watch request asked for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub info: ResourceInfo,
    pub namespace: Option<String>,
    pub start: WatchStart,
    pub selectors: Selectors,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    /// Table output (kubectl `get -w`) and what its rows include.
    pub table: Option<IncludeObject>,
}

fn line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// A 200 response whose stream holds just one ERROR event (how watches report 410).
pub fn error_stream(err: &ApiError) -> Response {
    stream_response(
        Body::from(line(&json!({"type": "ERROR", "object": err.status()}))),
        false,
    )
}

fn stream_response(body: Body, table: bool) -> Response {
    let content_type = if table {
        "application/json;as=Table;v=v1;g=meta.k8s.io"
    } else {
        "application/json"
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, content_type)
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// How an event looks to a watch with selectors: objects starting to match are ADDED,
/// objects ceasing to match are DELETED.
fn classify<'a>(req: &WatchRequest, e: &'a Event) -> Option<(EventType, &'a Value)> {
    let gr = req.info.group_resource();
    if (&e.group, &e.resource) != (&gr.0, &gr.1) {
        return None;
    }
    if req.namespace.as_deref().is_some_and(|ns| ns != e.namespace) {
        return None;
    }
    let now = req.selectors.matches(&e.object);
    match e.kind {
        EventType::Added | EventType::Deleted => now.then_some((e.kind, &e.object)),
        EventType::Modified => {
            let before = e.old.as_ref().is_some_and(|o| req.selectors.matches(o));
            match (before, now) {
                (true, true) => Some((EventType::Modified, &e.object)),
                (false, true) => Some((EventType::Added, &e.object)),
                (true, false) => Some((EventType::Deleted, &e.object)),
                (false, false) => None,
            }
        }
    }
}

fn render(req: &WatchRequest, kind: EventType, obj: &Value, rv: u64) -> Value {
    let object = match req.table {
        Some(include) => table::table(&req.info, std::slice::from_ref(obj), rv, include),
        None => present(&req.info, obj),
    };
    json!({"type": kind.as_str(), "object": object})
}

fn bookmark(req: &WatchRequest, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": {"kind": req.info.kind, "apiVersion": req.info.api_version(), "metadata": metadata}})
}

/// Starts a watch: the response streams until the client goes, the timeout passes, the
/// watches are dropped by fault injection, or the client falls too far behind.
pub fn start(
    store: &Store,
    req: WatchRequest,
    drop: watch::Receiver<u64>,
    bookmark_every: Duration,
) -> Response {
    let (replay, live, subscribed_at) =
        match store.subscribe(&req.info, req.namespace.as_deref(), req.start) {
            Ok(s) => s,
            Err(err) => return error_stream(&err),
        };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let table = req.table.is_some();
    tokio::spawn(pump(
        req,
        replay,
        live,
        subscribed_at,
        tx,
        drop,
        bookmark_every,
    ));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    stream_response(Body::from_stream(stream), table)
}

async fn pump(
    req: WatchRequest,
    replay: Vec<Arc<Event>>,
    mut live: broadcast::Receiver<Arc<Event>>,
    subscribed_at: u64,
    tx: mpsc::Sender<Bytes>,
    mut drop: watch::Receiver<u64>,
    bookmark_every: Duration,
) {
    // `drop` was subscribed when the request came in, before the client saw the response:
    // a drop since then is for this watch too (marking it seen here lost drops that came
    // before this task first ran, and left such a watch open).
    for e in &replay {
        if let Some((kind, obj)) = classify(&req, e)
            && tx.send(line(&render(&req, kind, obj, e.rv))).await.is_err()
        {
            return;
        }
    }
    let mut last_rv = subscribed_at;
    if req.send_initial_events
        && req.bookmarks
        && tx.send(line(&bookmark(&req, last_rv, true))).await.is_err()
    {
        return;
    }
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ticks = tokio::time::interval(bookmark_every);
    ticks.tick().await;
    loop {
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let out = tokio::select! {
            received = live.recv() => match received {
                Ok(e) => {
                    last_rv = last_rv.max(e.rv);
                    classify(&req, &e).map(|(kind, obj)| render(&req, kind, obj, e.rv))
                }
                // Too far behind, or the store is gone: the client re-watches from its version.
                Err(_) => return,
            },
            _ = ticks.tick(), if req.bookmarks => Some(bookmark(&req, last_rv, false)),
            () = timeout => return,
            _ = drop.changed() => return,
            () = tx.closed() => return,
        };
        if let Some(out) = out
            && tx.send(line(&out)).await.is_err()
        {
            return;
        }
    }
}
