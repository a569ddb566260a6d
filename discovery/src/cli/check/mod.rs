//! `marin3r check`: whether the installation on the current cluster works, part by part, each
//! failure with what to do about it; exit code 0 only when every check passes. Warnings
//! (a config rolled back, which is the user's config and not the installation) are printed
//! and do not fail.

use std::process::ExitCode;

mod certificates;
mod pre;
mod report;
mod served;

use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use marin3r_certs::api::DiscoveryServiceCertificate;
use time::OffsetDateTime;

use super::cluster::ClusterArgs;
use super::output::Output;
use crate::crds;
use marin3r_api::EnvoyConfig;
use marin3r_api::discovery_service::DiscoveryService;
pub use pre::OLDEST_MINOR;
use report::Report;
use served::{check_namespaces, check_webhooks};

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Where the operator runs.
    #[arg(long, default_value = "marin3r-system")]
    operator_namespace: String,
    /// Before installing: whether this cluster can take marin3r (its Kubernetes version, your
    /// permissions to install it, webhooks and CRDs already there that would clash), instead
    /// of whether the installation works.
    #[arg(long)]
    pre: bool,
    /// `table` (the report's lines), `json` or `yaml`: `{"checks": [{check, result, detail,
    /// fix}], "summary": {total, passed, warned, failed}}`, `result` one of pass, warn, fail.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    output: Output,
}

pub async fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let client = args.cluster.client().await?;
    let mut report = Report::default();
    if args.pre {
        pre::check(&client, &args.operator_namespace, &mut report).await;
    } else {
        installed(&client, &args, &mut report).await;
    }
    print!(
        "{}",
        args.output.render(&report.document(), || report.render())?
    );
    Ok(if report.failures() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The checks of an installation.
async fn installed(client: &kube::Client, args: &CheckArgs, report: &mut Report) {
    check_crds(client, report).await;
    check_operator(client, &args.operator_namespace, report).await;
    let dss: Api<DiscoveryService> = Api::all(client.clone());
    match dss.list(&ListParams::default()).await {
        Ok(list) if list.items.is_empty() => report.fail(
            "DiscoveryServices",
            "none exists",
            "create one: kubectl apply -f manifests/examples/discoveryservice.yaml",
        ),
        Ok(list) => {
            for ds in &list.items {
                check_discovery_service(client, ds, &args.operator_namespace, report).await;
            }
        }
        Err(e) => report.fail(
            "DiscoveryServices",
            format!("cannot list them: {}", said(&e)),
            "install the CRDs and check your RBAC",
        ),
    }
    check_certificates(client, report).await;
    check_proxies(client, report).await;
}

const REINSTALL: &str = "apply this release's manifests: kubectl apply --server-side -k manifests/ (or its install.yaml)";

/// What an error from the API server says, for a person (not kube's Debug form).
fn said(e: &kube::Error) -> String {
    marin3r_controller::chain(e)
}

/// Whether two CRDs serve the same versions with the same schemas.
fn same_schema(a: &CustomResourceDefinition, b: &CustomResourceDefinition) -> bool {
    let schema = |crd: &CustomResourceDefinition| {
        let versions = crd.spec.versions.iter();
        versions
            .map(|v| (v.name.clone(), serde_json::to_value(&v.schema).ok()))
            .collect::<Vec<_>>()
    };
    schema(a) == schema(b)
}

async fn check_crds(client: &kube::Client, report: &mut Report) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for want in crds::all() {
        let name = want.name_any();
        let check = format!("CRD {name}");
        match api.get_opt(&name).await {
            Ok(None) => report.fail(check, "not installed", REINSTALL),
            Ok(Some(have)) => {
                if same_schema(&have, &want) {
                    report.pass(check, format!("current ({})", env!("CARGO_PKG_VERSION")));
                } else {
                    let what = format!(
                        "not the schema marin3r {} serves",
                        env!("CARGO_PKG_VERSION")
                    );
                    report.fail(check, what, REINSTALL);
                }
            }
            Err(e) => report.fail(
                check,
                format!("cannot read it: {}", said(&e)),
                "check your RBAC",
            ),
        }
    }
}

async fn check_operator(client: &kube::Client, ns: &str, report: &mut Report) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let params = ListParams::default().labels("app.kubernetes.io/component=operator");
    match deployments.list(&params).await {
        Ok(list) if list.items.is_empty() => report.fail(
            "operator",
            format!("no operator Deployment in namespace {ns}"),
            format!("{REINSTALL}; or pass --operator-namespace"),
        ),
        Ok(list) => {
            for d in &list.items {
                let want = d.spec.replicas.unwrap_or(1);
                let ready = d
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0);
                let check = format!("operator {ns}/{}", d.name_any());
                if ready > 0 {
                    report.pass(check, format!("{ready}/{want} replicas ready"));
                } else {
                    let fix = format!(
                        "kubectl -n {ns} describe deployment {} and its pods' logs",
                        d.name_any()
                    );
                    report.fail(check, format!("0/{want} replicas ready"), fix);
                }
            }
        }
        Err(e) => report.fail(
            "operator",
            format!("cannot list Deployments in {ns}: {}", said(&e)),
            "check your RBAC",
        ),
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let check = "operator leader";
    match leases.get_opt("marin3r-operator").await {
        Ok(Some(lease)) => {
            let spec = lease.spec.unwrap_or_default();
            let holder = spec.holder_identity.unwrap_or_default();
            let renewed = spec.renew_time.map(|t| t.0.as_second());
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            let now = OffsetDateTime::now_utc().unix_timestamp();
            match renewed {
                Some(at) if !holder.is_empty() && at + duration >= now => {
                    report.pass(check, format!("{holder} holds the Lease"));
                }
                _ => report.fail(
                    check,
                    "nobody holds the Lease marin3r-operator (the operator is not leading)",
                    format!("check the operator pods' logs in {ns}"),
                ),
            }
        }
        Ok(None) => report.fail(
            check,
            "no Lease marin3r-operator: no operator has ever led",
            format!("check the operator pods' logs in {ns}"),
        ),
        Err(e) => report.fail(
            check,
            format!("cannot read the Lease: {}", said(&e)),
            "check your RBAC",
        ),
    }
}

async fn check_discovery_service(
    client: &kube::Client,
    ds: &DiscoveryService,
    operator_ns: &str,
    report: &mut Report,
) {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let check = format!("DiscoveryService {ns}/{name}");
    let ready = ds
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => report.pass(&check, "Ready"),
        Some(c) => report.fail(
            &check,
            format!("not Ready ({}): {}", c.reason, c.message),
            format!("kubectl describe discoveryservice {name} -n {ns}"),
        ),
        None => report.fail(
            &check,
            "no Ready condition yet",
            "check that the operator runs (above)",
        ),
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let owned = ds.owned_name();
    let pods_check = format!("discovery pods of {ns}/{name}");
    match deployments.get_opt(&owned).await {
        Ok(Some(d)) => {
            let want = d.spec.replicas.unwrap_or(1);
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            if ready > 0 {
                report.pass(pods_check, format!("{ready}/{want} ready"));
            } else {
                let fix = format!(
                    "kubectl -n {ns} get pods -l app.kubernetes.io/instance={name},app.kubernetes.io/component=discovery-service, then their logs"
                );
                report.fail(
                    pods_check,
                    format!("0/{want} ready: no sidecar gets config and no pod is injected"),
                    fix,
                );
            }
        }
        Ok(None) => report.fail(
            pods_check,
            format!("no Deployment {owned}"),
            "check that the operator runs (above)",
        ),
        Err(e) => report.fail(
            pods_check,
            format!("cannot read Deployment {owned}: {}", said(&e)),
            "check your RBAC",
        ),
    }
    let Ok(spec) = ds.resolve(crate::IMAGE) else {
        return;
    };
    let ca = match marin3r_operator::ca_certificate_pem(client, &ns, &spec.ca_secret).await {
        Ok(Some(ca)) => ca,
        _ => {
            let fix = format!("kubectl get dsc -n {ns}; the operator issues it");
            report.fail(
                format!("CA of {ns}/{name}"),
                format!("Secret {} holds no CA certificate", spec.ca_secret),
                fix,
            );
            return;
        }
    };
    check_webhooks(client, ds, &ca, report).await;
    check_namespaces(client, ds, operator_ns, &ca, report).await;
}

/// Every DiscoveryServiceCertificate issued, ready, renewed on time and not near expiry:
/// one line per certificate with a problem, each with what to do.
async fn check_certificates(client: &kube::Client, report: &mut Report) {
    let api: Api<DiscoveryServiceCertificate> = Api::all(client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            report.fail(
                "certificates",
                format!("cannot list DiscoveryServiceCertificates: {}", said(&e)),
                "check your RBAC",
            );
            return;
        }
    };
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let mut problems = 0;
    for dsc in &list {
        if let Some(p) = certificates::problem(dsc, now) {
            let id = format!("{}/{}", dsc.namespace().unwrap_or_default(), dsc.name_any());
            report.fail(format!("certificate {id}"), p.what, p.fix);
            problems += 1;
        }
    }
    if problems == 0 {
        report.pass(
            "certificates",
            format!(
                "{} issued and ready, none expired, late for renewal or near expiry",
                list.len()
            ),
        );
    }
}

/// Every EnvoyConfig's connected proxies hold its published version.
async fn check_proxies(client: &kube::Client, report: &mut Report) {
    let api: Api<EnvoyConfig> = Api::all(client.clone());
    let list = match api.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            report.fail(
                "proxies",
                format!("cannot list EnvoyConfigs: {}", said(&e)),
                "check your RBAC",
            );
            return;
        }
    };
    let mut behind = Vec::new();
    for ec in &list {
        let id = format!("{}/{}", ec.namespace().unwrap_or_default(), ec.name_any());
        let Some(status) = &ec.status else { continue };
        if let Some(p) = &status.proxies
            && p.acked < p.connected
        {
            behind.push(format!(
                "{id} ({}: {} rejected, {} not answered)",
                p.synced, p.nacked, p.pending
            ));
        }
        if status.published_version.is_some() && status.published_version != status.desired_version
        {
            let state = status
                .cache_state
                .map_or("no cache state yet", |s| s.as_str());
            let what = format!("its desired version is not published ({state})");
            let fix = format!(
                "kubectl describe ec {} -n {}",
                ec.name_any(),
                ec.namespace().unwrap_or_default()
            );
            report.warn(format!("EnvoyConfig {id}"), what, fix);
        }
    }
    if behind.is_empty() {
        report.pass(
            "proxies",
            format!(
                "every connected proxy of {} EnvoyConfigs holds its published version",
                list.len()
            ),
        );
    } else {
        report.fail(
            "proxies",
            format!("out of sync: {}", behind.join(", ")),
            "marin3r proxy-status, then marin3r proxy-config POD for one of them",
        );
    }
}
