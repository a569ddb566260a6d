//! `marin3r proxy-status`: every proxy connected to a discovery service, with how far each
//! resource type got (synced, stale, NACKed), read from its sync-status endpoint.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use crate::xds::{ProxyStatus, SYNC_STATUS_PATH, SyncStatus, TypeStatus};

#[derive(Debug, Args)]
pub struct ProxyStatusArgs {
    /// The discovery service's metrics address (e.g. http://127.0.0.1:8383); the
    /// sync-status path is added when the URL has no path.
    #[arg(long)]
    url: String,
    /// Only proxies of this namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
}

pub fn run(args: ProxyStatusArgs) -> anyhow::Result<()> {
    let url = status_url(&args.url)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(&url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    if response.status() != 200 {
        bail!("GET {url}: HTTP {}: {}", response.status(), body.trim());
    }
    let mut status: SyncStatus = serde_json::from_str(&body)
        .with_context(|| format!("{url} did not answer a sync-status document"))?;
    if let Some(ns) = &args.namespace {
        status.proxies.retain(|p| &p.namespace == ns);
    }
    print!("{}", render(&status));
    Ok(())
}

fn status_url(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .with_context(|| format!("--url {url:?} must start with http:// or https://"))?;
    Ok(match rest.find('/') {
        None => format!("{url}{SYNC_STATUS_PATH}"),
        Some(i) if rest[i..] == *"/" => format!("{}{SYNC_STATUS_PATH}", url.trim_end_matches('/')),
        Some(_) => url.to_owned(),
    })
}

/// The resource types as columns, in the order Envoy applies them.
const COLUMNS: [&str; 8] = [
    "clusters",
    "endpoints",
    "listeners",
    "routes",
    "scopedRoutes",
    "secrets",
    "runtimes",
    "extensionConfigs",
];

fn short(version: &str) -> &str {
    version.get(..8).unwrap_or(version)
}

fn cell(t: Option<&TypeStatus>) -> String {
    let Some(t) = t else { return "-".into() };
    let rejected = t
        .last_nack
        .as_ref()
        .filter(|n| t.sent_version.as_deref() == Some(n.version.as_str()));
    match (rejected, &t.sent_version, &t.acked_version) {
        (Some(n), _, _) => format!("NACKED {}", short(&n.version)),
        (None, Some(sent), Some(acked)) if sent == acked => format!("SYNCED {}", short(acked)),
        (None, Some(_), _) => "STALE".into(),
        (None, None, _) => "-".into(),
    }
}

/// Renders the table `marin3r proxy-status` prints, then the NACK messages.
pub fn render(status: &SyncStatus) -> String {
    if status.proxies.is_empty() {
        return "no proxies connected\n".into();
    }
    let used: BTreeSet<&str> = status
        .proxies
        .iter()
        .flat_map(|p| p.types.keys().map(String::as_str))
        .collect();
    let columns: Vec<&str> = COLUMNS.into_iter().filter(|c| used.contains(c)).collect();
    let mut rows = vec![
        ["NAMESPACE", "NODE ID", "POD", "PROTOCOL"]
            .into_iter()
            .map(String::from)
            .chain(columns.iter().map(|c| c.to_uppercase()))
            .collect::<Vec<_>>(),
    ];
    for p in &status.proxies {
        let mut row = vec![
            p.namespace.clone(),
            p.node_id.clone(),
            p.pod.clone().unwrap_or_else(|| "-".into()),
            p.protocol.clone(),
        ];
        row.extend(columns.iter().map(|c| cell(p.types.get(*c))));
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    let nacks: Vec<String> = status.proxies.iter().flat_map(nack_lines).collect();
    if !nacks.is_empty() {
        out.push_str("\nLast NACKs:\n");
        for n in nacks {
            out.push_str(&n);
            out.push('\n');
        }
    }
    out
}

fn nack_lines(p: &ProxyStatus) -> Vec<String> {
    p.types
        .iter()
        .filter_map(|(kind, t)| {
            let n = t.last_nack.as_ref()?;
            let message = n.message.split_whitespace().collect::<Vec<_>>().join(" ");
            Some(format!(
                "  {}/{} {kind} version {} at {}: {message}",
                p.namespace, p.node_id, n.version, n.at
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::xds::LastNack;

    fn ts(sent: &str, acked: Option<&str>, nack: Option<&str>) -> TypeStatus {
        TypeStatus {
            sent_version: Some(sent.into()),
            acked_version: acked.map(Into::into),
            last_nack: nack.map(|v| LastNack {
                version: v.into(),
                message: "bad\n  listener".into(),
                at: "2026-01-01T00:00:00Z".into(),
            }),
        }
    }

    #[test]
    fn table_shows_synced_stale_and_nacked_types() {
        let status = SyncStatus {
            proxies: vec![ProxyStatus {
                namespace: "team-a".into(),
                node_id: "gw".into(),
                pod: Some("gw-1".into()),
                protocol: "delta".into(),
                peer: "10.0.0.1:4000".into(),
                connected_at: "now".into(),
                types: BTreeMap::from([
                    (
                        "clusters".into(),
                        ts("aaaaaaaaaaaa", Some("aaaaaaaaaaaa"), None),
                    ),
                    (
                        "listeners".into(),
                        ts("bbbbbbbbbbbb", Some("cccc"), Some("bbbbbbbbbbbb")),
                    ),
                    ("routes".into(), ts("dddd", Some("eeee"), None)),
                ]),
            }],
        };
        let out = render(&status);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   NODE ID   POD    PROTOCOL   CLUSTERS          LISTENERS         ROUTES"
        );
        assert_eq!(
            lines[1],
            "team-a      gw        gw-1   delta      SYNCED aaaaaaaa   NACKED bbbbbbbb   STALE"
        );
        assert!(out.contains(
            "  team-a/gw listeners version bbbbbbbbbbbb at 2026-01-01T00:00:00Z: bad listener"
        ));
        assert_eq!(render(&SyncStatus::default()), "no proxies connected\n");
    }

    #[test]
    fn urls_get_the_status_path_when_they_have_none() {
        assert_eq!(
            status_url("http://127.0.0.1:8383").unwrap(),
            "http://127.0.0.1:8383/sync-status"
        );
        assert_eq!(
            status_url("http://127.0.0.1:8383/").unwrap(),
            "http://127.0.0.1:8383/sync-status"
        );
        assert_eq!(status_url("http://h/custom").unwrap(), "http://h/custom");
        assert!(status_url("127.0.0.1:8383").is_err());
    }
}
