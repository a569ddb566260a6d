//! `marin3r version`: this client's version and, when a cluster is reachable, what runs
//! there: the operator's image, each DiscoveryService's discovery image, and the Envoy
//! releases of the proxies connected to its discovery pods (their sync status, reached by a
//! pod port-forward as `proxy-status` reaches it). No cluster is not an error: the client
//! version is printed and the server part says why it is missing.

use std::collections::BTreeMap;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::cluster::ClusterArgs;
use super::discovery_pods::DISCOVERY_POD_SELECTOR;
use super::output::Output;
use super::proxy_status::sync_status_of;
use marin3r_api::discovery_service::{DEFAULT_ADMIN_PORT, DiscoveryService};

const OPERATOR_SELECTOR: &str =
    "app.kubernetes.io/name=marin3r,app.kubernetes.io/component=operator";

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print the client version only; do not contact a cluster.
    #[arg(long)]
    client: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The namespace the operator's Deployment runs in.
    #[arg(long, value_name = "NAMESPACE", default_value = "marin3r-system")]
    operator_namespace: String,
    /// The discovery pods' admin port (their --admin-address), for their proxies' versions.
    #[arg(long, default_value_t = DEFAULT_ADMIN_PORT)]
    admin_port: u16,
    /// `table` (or `text`), `json` or `yaml`: `{"client": {...}, "server": {...}}`, or
    /// `"serverError"` in place of `server` when the cluster could not be asked.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    client: Client,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<Server>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Client {
    version: &'static str,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Server {
    /// The operator Deployments found (one, unless installed twice).
    operators: Vec<Workload>,
    discovery_services: Vec<Discovery>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Workload {
    namespace: String,
    name: String,
    image: String,
    ready_replicas: i32,
    replicas: i32,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Discovery {
    namespace: String,
    name: String,
    /// The image of each running discovery pod (two during a rollout).
    images: Vec<String>,
    pods: usize,
    /// Connected proxies by Envoy release (`unknown` when a proxy sent none).
    envoy_versions: BTreeMap<String, usize>,
    /// Discovery pods whose sync status could not be read, with why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    errors: Vec<String>,
}

pub async fn run(args: VersionArgs) -> anyhow::Result<()> {
    let client = Client {
        version: env!("CARGO_PKG_VERSION"),
    };
    let (server, server_error) = match args.client {
        true => (None, None),
        false => match server(&args).await {
            Ok(server) => (Some(server), None),
            Err(e) => (None, Some(super::error_line(&e))),
        },
    };
    let report = Report {
        client,
        server,
        server_error,
    };
    print!("{}", args.output.render(&report, || render(&report))?);
    Ok(())
}

/// What runs in the cluster; an error only when the cluster could not be asked at all.
async fn server(args: &VersionArgs) -> anyhow::Result<Server> {
    let client = args.cluster.client().await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &args.operator_namespace);
    let operators = deployments
        .list(&ListParams::default().labels(OPERATOR_SELECTOR))
        .await
        .with_context(|| {
            format!(
                "listing the operator's Deployment in {}",
                args.operator_namespace
            )
        })?
        .items
        .iter()
        .map(workload)
        .collect();
    let services = Api::<DiscoveryService>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing the DiscoveryServices")?;
    let mut discovery_services = Vec::new();
    for ds in &services.items {
        discovery_services.push(discovery(&client, ds, args.admin_port).await?);
    }
    Ok(Server {
        operators,
        discovery_services,
    })
}

fn workload(d: &Deployment) -> Workload {
    let containers = d
        .spec
        .template
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let status = d.status.as_ref();
    Workload {
        namespace: d.namespace().unwrap_or_default(),
        name: d.name_any(),
        image: image_of(containers),
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        replicas: status.and_then(|s| s.replicas).unwrap_or(0),
    }
}

/// The marin3r container's image: the first container's (the operator builds one).
fn image_of(containers: &[k8s_openapi::api::core::v1::Container]) -> String {
    containers
        .first()
        .and_then(|c| c.image.clone())
        .unwrap_or_else(|| "-".into())
}

/// One DiscoveryService: its running pods' images, and their proxies' Envoy releases.
async fn discovery(
    client: &kube::Client,
    ds: &DiscoveryService,
    admin_port: u16,
) -> anyhow::Result<Discovery> {
    let (namespace, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let selector = format!("{DISCOVERY_POD_SELECTOR},app.kubernetes.io/instance={name}");
    let listed = Api::<Pod>::namespaced(client.clone(), &namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .with_context(|| format!("listing the pods of DiscoveryService {namespace}/{name}"));
    let mut out = Discovery {
        namespace: namespace.clone(),
        name,
        ..Default::default()
    };
    for pod in running(&mut out, listed) {
        let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
        let image = image_of(containers.unwrap_or_default());
        if !out.images.contains(&image) {
            out.images.push(image);
        }
        let asked = sync_status_of(client.clone(), &namespace, &pod.name_any(), admin_port).await;
        let status = asked.and_then(|(source, body)| {
            serde_json::from_str::<marin3r_xds::SyncStatus>(&body)
                .with_context(|| format!("{source} did not answer a sync-status document"))
        });
        match status {
            Ok(status) => {
                for p in status.proxies {
                    let version = p.envoy_version.unwrap_or_else(|| "unknown".into());
                    *out.envoy_versions.entry(version).or_default() += 1;
                }
            }
            Err(e) => out.errors.push(super::error_line(&e)),
        }
    }
    Ok(out)
}

/// The running pods among those `listed` for `out`'s DiscoveryService, counted in `out`; when
/// they could not be listed, none, and why in `out.errors`: one DiscoveryService the API server
/// cannot select pods of (a name longer than a label value, which the operator refuses too)
/// leaves the others reported.
fn running(out: &mut Discovery, listed: anyhow::Result<Vec<Pod>>) -> Vec<Pod> {
    let pods = match listed {
        Ok(pods) => pods,
        Err(e) => {
            out.errors.push(super::error_line(&e));
            Vec::new()
        }
    };
    let running: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    out.pods = running.len();
    running
}

/// The text `marin3r version` prints.
fn render(report: &Report) -> String {
    let mut out = format!("Client: marin3r {}\n", report.client.version);
    if let Some(error) = &report.server_error {
        out.push_str(&format!("Server: could not be reached: {error}\n"));
    }
    let Some(server) = &report.server else {
        return out;
    };
    if server.operators.is_empty() {
        out.push_str("Operator: no Deployment found\n");
    }
    for o in &server.operators {
        out.push_str(&format!(
            "Operator {}/{}: {} ({}/{} ready)\n",
            o.namespace, o.name, o.image, o.ready_replicas, o.replicas
        ));
    }
    if server.discovery_services.is_empty() {
        out.push_str("DiscoveryServices: none\n");
    }
    for d in &server.discovery_services {
        let images = match d.images.is_empty() {
            true => "no running pod".to_owned(),
            false => d.images.join(", "),
        };
        let envoys: Vec<String> = d
            .envoy_versions
            .iter()
            .map(|(v, n)| format!("Envoy {v} ({n})"))
            .collect();
        let envoys = match envoys.is_empty() {
            true => "no proxy connected".to_owned(),
            false => envoys.join(", "),
        };
        out.push_str(&format!(
            "DiscoveryService {}/{}: {images} ({} pods); proxies: {envoys}\n",
            d.namespace, d.name, d.pods
        ));
        for e in &d.errors {
            out.push_str(&format!("  error: {e}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_discovery_service_whose_pods_cannot_be_listed_is_reported_with_why() {
        let mut out = Discovery::default();
        let listed = Err(anyhow::anyhow!(
            "values[0][app.kubernetes.io/instance]: must be no more than 63 bytes"
        ))
        .context("listing the pods of DiscoveryService a/xxx");
        assert!(running(&mut out, listed).is_empty());
        assert_eq!(out.pods, 0);
        assert_eq!(
            out.errors,
            [
                "listing the pods of DiscoveryService a/xxx: values[0][app.kubernetes.io/instance]: must be no more than 63 bytes"
            ]
        );
        let mut out = Discovery::default();
        let listed = Ok(vec![pod("a", "Running"), pod("b", "Pending")]);
        let names: Vec<String> = running(&mut out, listed)
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!((names, out.pods), (vec!["a".to_owned()], 1));
        assert!(out.errors.is_empty());
    }

    #[test]
    fn the_text_names_every_part_and_what_is_missing() {
        let mut report = Report {
            client: Client { version: "0.1.0" },
            server: None,
            server_error: Some("connecting to the cluster: refused".into()),
        };
        assert_eq!(
            render(&report),
            "Client: marin3r 0.1.0\nServer: could not be reached: connecting to the cluster: refused\n"
        );
        report.server_error = None;
        report.server = Some(Server {
            operators: vec![Workload {
                namespace: "marin3r-system".into(),
                name: "marin3r-operator".into(),
                image: "marin3r:v0.1.0".into(),
                ready_replicas: 1,
                replicas: 1,
            }],
            discovery_services: vec![Discovery {
                namespace: "marin3r-system".into(),
                name: "instance".into(),
                images: vec!["marin3r:v0.1.0".into()],
                pods: 2,
                envoy_versions: BTreeMap::from([("1.34.1".into(), 3), ("unknown".into(), 1)]),
                errors: vec!["pod marin3r-system/b port 8385/sync-status: no answer".into()],
            }],
        });
        assert_eq!(
            render(&report),
            "Client: marin3r 0.1.0\n\
             Operator marin3r-system/marin3r-operator: marin3r:v0.1.0 (1/1 ready)\n\
             DiscoveryService marin3r-system/instance: marin3r:v0.1.0 (2 pods); proxies: Envoy 1.34.1 (3), Envoy unknown (1)\n  \
             error: pod marin3r-system/b port 8385/sync-status: no answer\n"
        );
    }
}
