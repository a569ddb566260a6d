//! `marin3r proxy-status`: every proxy connected to a discovery service, with how far each
//! resource type got (synced, stale, NACKed), read from its sync-status endpoint. That
//! endpoint listens on the discovery pod's loopback only, so by default it is reached through
//! the API server: a pod port-forward to the discovery pod (what `kubectl port-forward` does,
//! and what the caller's RBAC must allow: `create` on `pods/portforward`). `--url` reads a
//! URL directly instead (e.g. after a `kubectl port-forward`).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::cluster::ClusterArgs;
use super::output::Output;
use marin3r_api::discovery_service::DEFAULT_ADMIN_PORT;
use marin3r_xds::{ProxyStatus, SYNC_STATUS_PATH, SyncStatus, TypeStatus};

#[derive(Debug, Args)]
pub struct ProxyStatusArgs {
    /// Read this sync-status URL directly (e.g. http://127.0.0.1:8385 after
    /// `kubectl port-forward`) instead of port-forwarding through the API server; the
    /// sync-status path is added when the URL has no path.
    #[arg(long, conflicts_with_all = ["kubeconfig", "context", "discovery_service", "pod"])]
    url: Option<String>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The DiscoveryService whose pod to ask, as NAMESPACE/NAME or NAME (default: the only
    /// discovery pod in the cluster; with several, the one serving --namespace).
    #[arg(long, value_name = "[NAMESPACE/]NAME", conflicts_with = "pod")]
    discovery_service: Option<String>,
    /// The discovery pod to ask, as NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pod: Option<String>,
    /// The discovery pod's admin port (its --admin-address).
    #[arg(long, default_value_t = DEFAULT_ADMIN_PORT)]
    admin_port: u16,
    /// Only proxies of this namespace.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// `table`, `json` or `yaml`: `{"proxies": [...]}` with every field of the sync status
    /// and, per proxy, the discovery pod it is connected to (`replica`, when asked through the
    /// API server).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub async fn run(args: ProxyStatusArgs) -> anyhow::Result<()> {
    let answers = match &args.url {
        Some(url) => {
            let url = status_url(url)?;
            let body = tokio::task::spawn_blocking({
                let url = url.clone();
                move || get_url(&url)
            })
            .await
            .context("the HTTP request task")??;
            vec![Answer::parse(None, &url, &body)]
        }
        None => through_api_server(&args).await?,
    };
    let (mut replicas, mut failures) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            Ok(replica) => replicas.push(replica),
            Err(e) => failures.push(e),
        }
    }
    if let Some(ns) = &args.namespace {
        for replica in &mut replicas {
            replica.status.proxies.retain(|p| &p.namespace == ns);
        }
    }
    if replicas.is_empty() {
        // Nothing to print: say why, for every pod asked.
        let why: Vec<String> = failures.iter().map(super::error_line).collect();
        bail!("no discovery pod answered: {}", why.join("; "));
    }
    print!(
        "{}",
        args.output
            .render(&document(&replicas)?, || render(&replicas))?
    );
    if failures.is_empty() {
        return Ok(());
    }
    for e in &failures {
        eprintln!("error: {}", super::error_line(e));
    }
    bail!(
        "{} of {} discovery pods did not answer; their proxies are missing above",
        failures.len(),
        failures.len() + replicas.len()
    )
}

/// What one discovery pod (or URL) answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// The discovery pod that answered, when asked through the API server.
    pub pod: Option<String>,
    pub status: SyncStatus,
}

impl Answer {
    fn parse(pod: Option<String>, source: &str, body: &str) -> anyhow::Result<Self> {
        let status = serde_json::from_str(body)
            .with_context(|| format!("{source} did not answer a sync-status document"))?;
        Ok(Self { pod, status })
    }
}

fn get_url(url: &str) -> anyhow::Result<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(10)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(url)
        .call()
        .with_context(|| format!("GET {url}"))?;
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the answer of {url}"))?;
    if response.status() != 200 {
        bail!("GET {url}: HTTP {}: {}", response.status(), body.trim());
    }
    Ok(body)
}

/// Asks every discovery pod (each replica has its own proxies) for its sync status through
/// a port-forward, all at once: per pod, its answer or the error naming it.
async fn through_api_server(args: &ProxyStatusArgs) -> anyhow::Result<Vec<anyhow::Result<Answer>>> {
    let client = args.cluster.client().await?;
    let asks = super::discovery_pods::find_pods(
        &client,
        args.discovery_service.as_deref(),
        args.pod.as_deref(),
        args.namespace.as_deref(),
    )
    .await?
    .into_iter()
    .map(|(ns, pod)| {
        let client = client.clone();
        async move {
            let (source, body) = sync_status_of(client, &ns, &pod, args.admin_port).await?;
            Answer::parse(Some(pod), &source, &body)
        }
    });
    Ok(futures::future::join_all(asks).await)
}

/// GETs the sync status of one pod through a port-forward; returns what was asked (for
/// messages) and the body.
pub(super) async fn sync_status_of(
    client: kube::Client,
    ns: &str,
    pod: &str,
    port: u16,
) -> anyhow::Result<(String, String)> {
    super::port_forward::get(client, ns, pod, port, SYNC_STATUS_PATH).await
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

/// Renders the table `marin3r proxy-status` prints, then the NACK messages. With more than
/// one discovery pod (replicas), a `REPLICA` column names the pod each proxy is connected to.
pub fn render(answers: &[Answer]) -> String {
    let proxies: Vec<(Option<&str>, &ProxyStatus)> = answers
        .iter()
        .flat_map(|a| a.status.proxies.iter().map(|p| (a.pod.as_deref(), p)))
        .collect();
    if proxies.is_empty() {
        return "no proxies connected\n".into();
    }
    let replica_column = answers.len() > 1;
    // Only while a canary is served: every other table stays as it was.
    let track_column = proxies.iter().any(|(_, p)| p.track.is_some());
    let used: BTreeSet<&str> = proxies
        .iter()
        .flat_map(|(_, p)| p.types.keys().map(String::as_str))
        .collect();
    let columns: Vec<&str> = COLUMNS.into_iter().filter(|c| used.contains(c)).collect();
    let mut header = vec!["NAMESPACE", "NODE ID", "POD"];
    if replica_column {
        header.push("REPLICA");
    }
    header.extend(["ENVOY", "PROTOCOL"]);
    if track_column {
        header.push("TRACK");
    }
    let mut rows = vec![
        header
            .into_iter()
            .map(String::from)
            .chain(columns.iter().map(|c| c.to_uppercase()))
            .collect::<Vec<_>>(),
    ];
    for (replica, p) in &proxies {
        let mut row = vec![
            p.namespace.clone(),
            p.node_id.clone(),
            p.pod.clone().unwrap_or_else(|| "-".into()),
        ];
        if replica_column {
            row.push(replica.unwrap_or("-").to_owned());
        }
        row.push(p.envoy_version.clone().unwrap_or_else(|| "-".into()));
        row.push(p.protocol.clone());
        if track_column {
            row.push(p.track.clone().unwrap_or_else(|| "stable".into()));
        }
        row.extend(columns.iter().map(|c| cell(p.types.get(*c))));
        rows.push(row);
    }
    let mut out = super::table::aligned(&rows);
    let nacks: Vec<String> = proxies.iter().flat_map(|(_, p)| nack_lines(p)).collect();
    if !nacks.is_empty() {
        out.push_str("\nLast NACKs:\n");
        for n in nacks {
            out.push_str(&n);
            out.push('\n');
        }
    }
    out
}

/// The `-o json|yaml` document: every proxy of every answer, with the pod that answered.
pub fn document(answers: &[Answer]) -> anyhow::Result<serde_json::Value> {
    let mut proxies = Vec::new();
    for answer in answers {
        for p in &answer.status.proxies {
            let mut proxy = serde_json::to_value(p)?;
            if let (Some(pod), Some(fields)) = (&answer.pod, proxy.as_object_mut()) {
                fields.insert("replica".into(), pod.clone().into());
            }
            proxies.push(proxy);
        }
    }
    Ok(serde_json::json!({ "proxies": proxies }))
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
    use marin3r_xds::LastNack;

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
                envoy_version: Some("1.34.1".into()),
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
                track: None,
                stats_port: None,
            }],
        };
        let out = render(&[Answer { pod: None, status }]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "NAMESPACE   NODE ID   POD    ENVOY    PROTOCOL   CLUSTERS          LISTENERS         ROUTES"
        );
        assert_eq!(
            lines[1],
            "team-a      gw        gw-1   1.34.1   delta      SYNCED aaaaaaaa   NACKED bbbbbbbb   STALE"
        );
        assert!(out.contains(
            "  team-a/gw listeners version bbbbbbbbbbbb at 2026-01-01T00:00:00Z: bad listener"
        ));
        assert_eq!(render(&[Answer::default()]), "no proxies connected\n");
    }

    fn proxy(node_id: &str, pod: &str, version: &str) -> ProxyStatus {
        ProxyStatus {
            namespace: "team-a".into(),
            node_id: node_id.into(),
            pod: Some(pod.into()),
            protocol: "sotw".into(),
            envoy_version: None,
            peer: "10.0.0.1:4000".into(),
            connected_at: "now".into(),
            types: BTreeMap::from([("clusters".into(), ts(version, Some(version), None))]),
            track: None,
            stats_port: None,
        }
    }

    #[test]
    fn proxies_of_every_replica_are_listed_with_the_replica_they_are_on() {
        let answers = [
            Answer {
                pod: Some("discovery-a".into()),
                status: SyncStatus {
                    proxies: vec![proxy("gw", "gw-1", "aaaaaaaaaa")],
                },
            },
            Answer {
                pod: Some("discovery-b".into()),
                status: SyncStatus {
                    proxies: vec![
                        proxy("gw", "gw-2", "aaaaaaaaaa"),
                        proxy("db", "db-1", "bbbb"),
                    ],
                },
            },
            // A replica with no proxy adds no line.
            Answer {
                pod: Some("discovery-c".into()),
                status: SyncStatus::default(),
            },
        ];
        let out = render(&answers);
        assert_eq!(
            out,
            "NAMESPACE   NODE ID   POD    REPLICA       ENVOY   PROTOCOL   CLUSTERS\n\
             team-a      gw        gw-1   discovery-a   -       sotw       SYNCED aaaaaaaa\n\
             team-a      gw        gw-2   discovery-b   -       sotw       SYNCED aaaaaaaa\n\
             team-a      db        db-1   discovery-b   -       sotw       SYNCED bbbb\n"
        );
        // One pod asked: no REPLICA column (the single-replica table is unchanged).
        let one = render(&answers[1..2]);
        assert!(
            one.starts_with("NAMESPACE   NODE ID   POD    ENVOY   PROTOCOL"),
            "{one}"
        );
        // Replicas that all have nobody connected.
        assert_eq!(
            render(&[Answer::default(), Answer::default()]),
            "no proxies connected\n"
        );
    }

    /// While a canary is served, a TRACK column says who runs it; the others are stable.
    #[test]
    fn a_track_column_shows_while_a_canary_is_served() {
        let mut canary = proxy("gw", "gw-2", "bbbb");
        canary.track = Some("canary".into());
        let status = SyncStatus {
            proxies: vec![proxy("gw", "gw-1", "aaaaaaaaaa"), canary],
        };
        assert_eq!(
            render(&[Answer { pod: None, status }]),
            "NAMESPACE   NODE ID   POD    ENVOY   PROTOCOL   TRACK    CLUSTERS\n\
             team-a      gw        gw-1   -       sotw       stable   SYNCED aaaaaaaa\n\
             team-a      gw        gw-2   -       sotw       canary   SYNCED bbbb\n"
        );
    }

    #[test]
    fn json_lists_every_proxy_with_its_replica() {
        let answers = [
            Answer {
                pod: Some("discovery-a".into()),
                status: SyncStatus {
                    proxies: vec![proxy("gw", "gw-1", "aaaa")],
                },
            },
            Answer {
                pod: None,
                status: SyncStatus {
                    proxies: vec![proxy("db", "db-1", "bbbb")],
                },
            },
        ];
        let doc = document(&answers).unwrap();
        let proxies = doc["proxies"].as_array().unwrap();
        assert_eq!(proxies.len(), 2);
        assert_eq!(proxies[0]["replica"], "discovery-a");
        assert_eq!(proxies[0]["node_id"], "gw");
        assert_eq!(proxies[0]["types"]["clusters"]["acked_version"], "aaaa");
        // Read from a URL: no replica to name.
        assert!(proxies[1].get("replica").is_none());
        assert_eq!(document(&[]).unwrap(), serde_json::json!({"proxies": []}));
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
