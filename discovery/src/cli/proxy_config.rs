//! `marin3r proxy-config POD [SECTION]`: the configuration a pod's Envoy holds, read from its
//! admin `/config_dump` through the API server's pod port-forward (the admin listens on the
//! pod's loopback), secret fields redacted; then, compared with what the control plane serves
//! the pod's node (the `/served-config` of the discovery pod the proxy is connected to), the
//! difference when there is one. Exit code 0 when they agree, 1 when they differ.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use marin3r_webhook::annotations::{ADMIN_PORT, NODE_ID};
use marin3r_xds::{SYNC_STATUS_PATH, SyncStatus};

use super::cluster::ClusterArgs;
use super::output::Output;
use crate::proxy_config::served::{SERVED_CONFIG_PATH, Served};
use crate::proxy_config::{Entry, defuse, diff, dump, printable};
use marin3r_api::discovery_service::DEFAULT_ADMIN_PORT;

/// Envoy's admin port when the pod does not say.
const ENVOY_ADMIN_PORT: u16 = 9901;

#[derive(Debug, Args)]
pub struct ProxyConfigArgs {
    /// The pod, as NAME or pod/NAME, or deployment/NAME (deploy/NAME) for a running pod of
    /// that Deployment; in --namespace.
    pod: String,
    /// What to show.
    #[arg(value_enum, default_value_t = Section::All)]
    section: Section,
    /// The pod's namespace (default: the kubeconfig context's).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The pod's Envoy admin port (default: its `marin3r.3scale.net/admin.port`
    /// annotation, else 9901).
    #[arg(long)]
    admin_port: Option<u16>,
    /// `table` (type, name, state, version), `json` or `yaml` (every resource in full).
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Only what the proxy holds: no comparison with what the control plane serves.
    #[arg(long)]
    no_compare: bool,
    /// The DiscoveryService whose pods serve the proxy, as NAMESPACE/NAME or NAME (default:
    /// the one whose pod the proxy is connected to, else the only one in the cluster, else the
    /// one serving the pod's namespace).
    #[arg(long, value_name = "[NAMESPACE/]NAME")]
    discovery_service: Option<String>,
    /// The discovery pods' admin port (their --admin-address).
    #[arg(long, default_value_t = DEFAULT_ADMIN_PORT)]
    discovery_admin_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    Bootstrap,
    Clusters,
    Endpoints,
    Listeners,
    Routes,
    Secrets,
    All,
}

impl Section {
    fn admits(self, kind: &str) -> bool {
        match self {
            Self::All => true,
            Self::Bootstrap => kind == "bootstrap",
            Self::Clusters => kind == "clusters",
            Self::Endpoints => kind == "endpoints",
            Self::Listeners => kind == "listeners",
            Self::Routes => kind == "routes",
            Self::Secrets => kind == "secrets",
        }
    }
}

pub async fn run(args: ProxyConfigArgs) -> anyhow::Result<ExitCode> {
    let client = args.cluster.client().await?;
    let ns = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let pod = find_pod(&client, &ns, &args.pod).await?;
    let name = pod.name_any();
    let admin_port = admin_port(&pod, args.admin_port)?;
    let dump = admin_get(&client, &ns, &name, admin_port, "/config_dump?include_eds").await?;
    let all = dump::entries(&dump)?;
    let node = match pod.annotations().get(NODE_ID).filter(|id| !id.is_empty()) {
        Some(id) => id.clone(),
        // Pods of an EnvoyDeployment gateway have no annotation: the node Envoy runs as
        // (its --service-node, or its bootstrap's) is in its /server_info.
        None => {
            let info = admin_get(&client, &ns, &name, admin_port, "/server_info").await?;
            server_node_id(&info).with_context(|| {
                format!("pod {ns}/{name}: no {NODE_ID} annotation, and its Envoy's /server_info names no node id")
            })?
        }
    };
    let held: Vec<Entry> = all
        .into_iter()
        .filter(|e| args.section.admits(&e.kind))
        .collect();
    print!("{}", render(&held, args.output)?);
    if args.no_compare || args.section == Section::Bootstrap {
        return Ok(ExitCode::SUCCESS);
    }
    let (replica, served) = served(&client, &args, &ns, &name, &node).await?;
    let served: Vec<Entry> = served
        .resources
        .into_iter()
        .filter(|e| args.section.admits(&e.kind))
        .map(|mut e| {
            defuse(&mut e);
            e
        })
        .collect();
    let comparison = diff::compare(&held, &served);
    // The comparison goes to stderr with `-o json|yaml`, so stdout stays one document.
    let report = format!(
        "\nCompared with what discovery pod {replica} serves node {}:\n{}",
        printable(&node),
        comparison.render()
    );
    match args.output.is_document() {
        false => print!("{report}"),
        true => eprint!("{report}"),
    }
    // Nothing served at all is a node without config (a wrong node id?); nothing of one
    // chosen type is just that.
    let agreed =
        comparison.in_sync() || (comparison.nothing_served() && args.section != Section::All);
    Ok(if agreed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The node id in Envoy's admin `/server_info` answer: the node it runs as, from its
/// command line (`--service-node`) or its bootstrap.
fn server_node_id(info: &serde_json::Value) -> Option<String> {
    let id = info.get("node")?.get("id")?.as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// The pod's Envoy admin port: `flag`, else the pod's annotation, else 9901.
fn admin_port(pod: &Pod, flag: Option<u16>) -> anyhow::Result<u16> {
    Ok(match (flag, pod.annotations().get(ADMIN_PORT)) {
        (Some(port), _) => port,
        (None, Some(port)) => port
            .parse()
            .with_context(|| format!("the pod's {ADMIN_PORT} annotation {port:?} is not a port"))?,
        (None, None) => ENVOY_ADMIN_PORT,
    })
}

/// The JSON answer of the pod's Envoy admin to `GET path`, through a port-forward.
async fn admin_get(
    client: &kube::Client,
    ns: &str,
    name: &str,
    port: u16,
    path: &str,
) -> anyhow::Result<serde_json::Value> {
    let (_, body) = super::port_forward::get(client.clone(), ns, name, port, path)
        .await
        .with_context(|| {
            format!("reading {path} of pod {ns}/{name}'s Envoy (admin port {port})")
        })?;
    serde_json::from_str(&body)
        .with_context(|| format!("pod {ns}/{name} answered {path} with something else than JSON"))
}

/// The pod `target` names in `ns`: `NAME`, `pod/NAME`, or a running pod of
/// `deployment/NAME` (the first by name, for a stable answer).
async fn find_pod(client: &kube::Client, ns: &str, target: &str) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (kind, name) = target.split_once('/').unwrap_or(("pod", target));
    match kind {
        "pod" | "pods" | "po" => pods
            .get_opt(name)
            .await
            .with_context(|| format!("reading pod {ns}/{name}"))?
            .with_context(|| format!("pod {ns}/{name} not found")),
        "deployment" | "deployments" | "deploy" => {
            let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
            let deployment = deployments
                .get_opt(name)
                .await
                .with_context(|| format!("reading deployment {ns}/{name}"))?
                .with_context(|| format!("deployment {ns}/{name} not found"))?;
            let labels = deployment.spec.selector.match_labels.unwrap_or_default();
            let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let mut running: Vec<Pod> = pods
                .list(&ListParams::default().labels(&selector.join(",")))
                .await
                .with_context(|| format!("listing the pods of deployment {ns}/{name}"))?
                .items
                .into_iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .collect();
            running.sort_by_key(ResourceExt::name_any);
            running
                .into_iter()
                .next()
                .with_context(|| format!("deployment {ns}/{name} has no running pod"))
        }
        other => bail!("{target:?}: a pod is NAME, pod/NAME or deployment/NAME, not a {other}"),
    }
}

/// What the control plane serves the pod's node: asked of the discovery pod the proxy is
/// connected to (every replica serves the same revision, but one may lag), else of the first
/// one; returns the pod asked and its answer.
async fn served(
    client: &kube::Client,
    args: &ProxyConfigArgs,
    ns: &str,
    pod: &str,
    node: &str,
) -> anyhow::Result<(String, Served)> {
    let (selector, running) =
        super::discovery_pods::running_pods(client, args.discovery_service.as_deref()).await?;
    let port = args.discovery_admin_port;
    let mut connected_to = None;
    for (dns, dpod) in &ask_order(&running, ns) {
        let Ok((_, body)) =
            super::port_forward::get(client.clone(), dns, dpod, port, SYNC_STATUS_PATH).await
        else {
            continue;
        };
        let status: SyncStatus = serde_json::from_str(&body).unwrap_or_default();
        if status
            .proxies
            .iter()
            .any(|p| p.namespace == ns && p.pod.as_deref() == Some(pod))
        {
            connected_to = Some((dns.clone(), dpod.clone()));
            break;
        }
    }
    // None has the proxy connected (it may be reconnecting): the first pod of the only
    // discovery service, or of the one serving the pod's namespace.
    let (dns, dpod) = match connected_to {
        Some(pod) => pod,
        None => super::discovery_pods::one_instance(client, &selector, running, Some(ns))
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("no discovery pod to ask what node {node} is served"))?,
    };
    let path = format!(
        "{SERVED_CONFIG_PATH}?namespace={}&node={}",
        query_escape(ns),
        query_escape(node)
    );
    let (_, body) = super::port_forward::get(client.clone(), &dns, &dpod, port, &path)
        .await
        .with_context(|| format!("asking discovery pod {dns}/{dpod} what node {node} is served"))?;
    let served = serde_json::from_str(&body)
        .with_context(|| format!("discovery pod {dns}/{dpod} answered no served config"))?;
    Ok((format!("{dns}/{dpod}"), served))
}

/// The running discovery pods, in the order they are asked whether the proxy of namespace
/// `ns` is connected to them: those of `ns` first (a DiscoveryService serves its own
/// namespace), then the others, each group by name.
fn ask_order(running: &[super::discovery_pods::RunningPod], ns: &str) -> Vec<(String, String)> {
    let mut pods: Vec<(String, String)> = running
        .iter()
        .map(|(dns, _, pod)| (dns.clone(), pod.clone()))
        .collect();
    pods.sort_by(|a, b| (a.0 != ns, &a.0, &a.1).cmp(&(b.0 != ns, &b.0, &b.1)));
    pods.dedup();
    pods
}

/// Percent-encodes everything but unreserved characters.
fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn render(entries: &[Entry], output: Output) -> anyhow::Result<String> {
    output.render(&serde_json::json!({ "resources": entries }), || {
        table(entries)
    })
}

fn table(entries: &[Entry]) -> String {
    let mut rows = vec![["TYPE", "NAME", "STATE", "VERSION", "LAST UPDATED"].map(String::from)];
    let cell =
        |text: Option<&String>| text.map_or_else(|| "-".into(), |t| printable(t).into_owned());
    for e in entries {
        rows.push([
            cell(Some(&e.kind)),
            cell(Some(&e.name)),
            cell(Some(&e.state)),
            cell(e.version.as_ref()),
            cell(e.last_updated.as_ref()),
        ]);
    }
    super::table::aligned(&rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_proxys_namespace_is_asked_first_among_several_discovery_services() {
        let running: Vec<super::super::discovery_pods::RunningPod> = [
            ("marin3r-system", "instance", "marin3r-instance-b"),
            ("shop", "instance", "marin3r-instance-z"),
            ("gateway", "instance", "marin3r-instance-y"),
            ("marin3r-system", "instance", "marin3r-instance-a"),
        ]
        .iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect();
        let order: Vec<String> = super::ask_order(&running, "shop")
            .into_iter()
            .map(|(ns, pod)| format!("{ns}/{pod}"))
            .collect();
        assert_eq!(
            order,
            [
                "shop/marin3r-instance-z",
                "gateway/marin3r-instance-y",
                "marin3r-system/marin3r-instance-a",
                "marin3r-system/marin3r-instance-b",
            ]
        );
    }

    use super::*;

    #[test]
    fn the_table_lists_each_resource_and_queries_are_escaped() {
        let e = Entry {
            kind: "clusters".into(),
            name: "app".into(),
            state: "dynamic".into(),
            version: Some("c1".into()),
            last_updated: None,
            config: serde_json::json!({"private_key": "[redacted]"}),
        };
        assert_eq!(
            table(&[e]),
            "TYPE       NAME   STATE     VERSION   LAST UPDATED\n\
             clusters   app    dynamic   c1        -\n"
        );
        assert_eq!(query_escape("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        // Names from a pod's answer cannot drive the terminal.
        let sly = Entry {
            kind: "clusters".into(),
            name: "app\u{1b}[2J\n".into(),
            state: "dynamic".into(),
            version: None,
            last_updated: None,
            config: serde_json::json!({}),
        };
        assert_eq!(
            table(&[sly]),
            "TYPE       NAME                STATE     VERSION   LAST UPDATED\n\
             clusters   app\\u{1b}[2J\\u{a}   dynamic   -         -\n"
        );
    }

    #[test]
    fn the_node_id_is_read_from_envoys_server_info() {
        // The shape Envoy 1.40 answers, trimmed: `node` is what it runs as.
        let info = serde_json::json!({
            "version": "9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL",
            "state": "LIVE",
            "command_line_options": {"service_node": "gateway"},
            "node": {"id": "gateway", "cluster": "marin3r", "user_agent_name": "envoy"},
        });
        assert_eq!(server_node_id(&info).as_deref(), Some("gateway"));
        assert_eq!(
            server_node_id(&serde_json::json!({"node": {"id": ""}})),
            None
        );
        assert_eq!(server_node_id(&serde_json::json!({"state": "LIVE"})), None);
    }
}
