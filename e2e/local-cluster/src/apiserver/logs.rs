//! `GET pods/<name>/log` (`kubectl logs`, with `container`, `tailLines`, `follow`): the
//! API server reads the log files the pod runner keeps, found through [`PodLogs`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::registry::ResourceInfo;
use super::store::Store;

/// Where a running container's log file is; the pod runner provides it.
pub trait PodLogs: Send + Sync {
    fn log_path(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf>;
}

impl<F> PodLogs for F
where
    F: Fn(&str, &str, &str) -> Option<PathBuf> + Send + Sync,
{
    fn log_path(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf> {
        self(namespace, pod, container)
    }
}

fn last_lines(text: &[u8], n: usize) -> &[u8] {
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let start = body
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, b)| **b == b'\n')
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i + 1);
    if n == 0 {
        &text[text.len()..]
    } else {
        &text[start..]
    }
}

/// Which container of `pod` a log request means, as kubectl and the real API decide.
fn container_of(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    match asked {
        Some(c) if containers.contains(&c) => Ok(c.to_owned()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].to_owned()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

pub async fn serve(
    store: Arc<Store>,
    logs: Option<Arc<dyn PodLogs>>,
    pods: &ResourceInfo,
    ns: &str,
    name: &str,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let pod = store.get(pods, ns, name)?;
    let container = container_of(&pod, name, query.get("container").map(String::as_str))?;
    let logs =
        logs.ok_or_else(|| ApiError::bad_request("no pod runner serves logs in this cluster"))?;
    let path = logs.log_path(ns, name, &container).ok_or_else(|| {
        ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start"
        ))
    })?;
    let mut content = tokio::fs::read(&path).await.unwrap_or_default();
    let offset = content.len() as u64;
    if let Some(n) = query.get("tailLines").and_then(|n| n.parse::<usize>().ok()) {
        content = last_lines(&content, n).to_vec();
    }
    let follow = query.get("follow").is_some_and(|f| f == "true");
    let body = if follow {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        let (pods, ns, name) = (pods.clone(), ns.to_owned(), name.to_owned());
        let uid = pod.pointer("/metadata/uid").cloned();
        tokio::spawn(async move {
            if tx.send(Bytes::from(content)).await.is_err() {
                return;
            }
            let mut offset = offset;
            // Until the client goes or the pod does.
            while store
                .get(&pods, &ns, &name)
                .ok()
                .and_then(|p| p.pointer("/metadata/uid").cloned())
                == uid
            {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    () = tx.closed() => return,
                }
                let Ok(mut file) = tokio::fs::File::open(&path).await else {
                    continue;
                };
                let mut more = Vec::new();
                if file.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
                    && file.read_to_end(&mut more).await.is_ok()
                    && !more.is_empty()
                {
                    offset += more.len() as u64;
                    if tx.send(Bytes::from(more)).await.is_err() {
                        return;
                    }
                }
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
        });
        Body::from_stream(stream)
    } else {
        Body::from(content)
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tail_lines() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 1), b"c");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\nb\n", 0), b"");
    }

    #[test]
    fn container_choice() {
        let one = json!({"spec": {"containers": [{"name": "main"}]}});
        assert_eq!(container_of(&one, "p", None).unwrap(), "main");
        assert!(
            container_of(&one, "p", Some("other"))
                .unwrap_err()
                .message
                .contains("not valid")
        );
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let err = container_of(&two, "p", None).unwrap_err();
        assert!(
            err.message.contains("choose one of: [a b]"),
            "{}",
            err.message
        );
    }
}
