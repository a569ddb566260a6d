//! `marin3r wait-for-proxy`: waits until Envoy answers its readiness URL. The webhook's hold
//! container (`hold-application-until-proxy-starts`, classic layout) runs it twice: as its
//! postStart hook, which kubelet waits for before it starts the next containers (the
//! applications), and with `--then-idle` as the container's own process.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Debug, Args)]
pub struct WaitForProxyArgs {
    /// Envoy's readiness URL: the sidecar's readiness listener (`http://127.0.0.1:9902/ready`).
    #[arg(long, value_name = "URL", value_parser = http_url)]
    url: String,
    /// Give up after this many seconds (exit 1); 0 waits for ever.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    timeout: u64,
    /// Milliseconds between two tries.
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    interval_ms: u64,
    /// Once ready (or given up), stay until SIGTERM instead of exiting: the hold container's
    /// process, which must not end while the pod runs.
    #[arg(long)]
    then_idle: bool,
}

fn http_url(value: &str) -> Result<String, String> {
    match value.strip_prefix("http://") {
        Some(rest) if !rest.is_empty() => Ok(value.to_owned()),
        _ => Err(format!("{value}: an http:// URL is expected")),
    }
}

pub async fn run(args: WaitForProxyArgs) -> anyhow::Result<ExitCode> {
    let deadline = (args.timeout > 0).then(|| Instant::now() + Duration::from_secs(args.timeout));
    let interval = Duration::from_millis(args.interval_ms);
    let ready = wait(&args.url, deadline, interval).await;
    match &ready {
        Ok(()) => eprintln!("{} is ready", args.url),
        Err(last) => eprintln!("{} not ready after {} s: {last}", args.url, args.timeout),
    }
    if args.then_idle {
        super::shutdown_signal().await;
        return Ok(ExitCode::SUCCESS);
    }
    Ok(if ready.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Tries `url` until it answers 200, or the deadline passes (the last failure).
async fn wait(url: &str, deadline: Option<Instant>, interval: Duration) -> Result<(), String> {
    loop {
        let url_owned = url.to_owned();
        let last = tokio::task::spawn_blocking(move || get(&url_owned))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match last {
            Ok(()) => return Ok(()),
            Err(e) if deadline.is_some_and(|d| Instant::now() + interval >= d) => return Err(e),
            Err(_) => tokio::time::sleep(interval).await,
        }
    }
}

fn get(url: &str) -> Result<(), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1)))
        .build()
        .into();
    let response = agent.get(url).call().map_err(|e| e.to_string())?;
    match response.status().as_u16() {
        200 => Ok(()),
        status => Err(format!("HTTP {status}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A readiness endpoint that answers 503 until `ready` is set.
    async fn endpoint(ready: Arc<AtomicBool>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/ready",
            axum::routing::get(move || {
                let ready = ready.load(Ordering::SeqCst);
                async move {
                    if ready {
                        (axum::http::StatusCode::OK, "LIVE")
                    } else {
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            "PRE_INITIALIZING",
                        )
                    }
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/ready")
    }

    #[tokio::test]
    async fn returns_once_the_proxy_turns_ready() {
        let ready = Arc::new(AtomicBool::new(false));
        let url = endpoint(ready.clone()).await;
        let waiter = tokio::spawn({
            let url = url.clone();
            async move { wait(&url, None, Duration::from_millis(20)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "returned before the proxy was ready");
        ready.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("still waiting after the proxy turned ready")
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline_with_the_last_answer() {
        let url = endpoint(Arc::new(AtomicBool::new(false))).await;
        let deadline = Some(Instant::now() + Duration::from_millis(300));
        let err = wait(&url, deadline, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert_eq!(err, "HTTP 503");
    }

    #[test]
    fn only_http_urls() {
        assert!(http_url("http://127.0.0.1:9902/ready").is_ok());
        assert!(http_url("https://127.0.0.1:9902/ready").is_err());
        assert!(http_url("127.0.0.1:9902").is_err());
    }
}
