//! `marin3r certs ...`: look at certificates from the command line.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use marin3r_certs::CertificateInfo;
use marin3r_certs::api::{DiscoveryServiceCertificate, RENEW_ANNOTATION};
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::cluster::ClusterArgs;
use super::output::Output;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Print subject, issuer, SANs, serial, key, validity, renewal instant and hash of every
    /// certificate in the given PEM files.
    Inspect {
        /// PEM files (a bundle prints every certificate in it).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// `table` (a block per certificate), `json` or `yaml`: `{"certificates": [...]}`,
        /// each with its `file`; a file that cannot be read is said on stderr.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Request a renewal of a DiscoveryServiceCertificate (sets the
    /// `marin3r.3scale.net/renew` annotation to the current time).
    Renew {
        /// The DiscoveryServiceCertificate's name.
        name: String,
        /// Its namespace (default: the current context's).
        #[arg(short, long)]
        namespace: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Show a DiscoveryServiceCertificate: readiness, conditions, its Secret and the
    /// certificate inside it.
    Status {
        /// The DiscoveryServiceCertificate's name.
        name: String,
        /// Its namespace (default: the current context's).
        #[arg(short, long)]
        namespace: Option<String>,
        #[command(flatten)]
        cluster: ClusterArgs,
        /// `table` (a report), `json` or `yaml`: its `name`, `namespace`, `spec` and `status`,
        /// and its `secret` with the certificate inside.
        #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

pub async fn run(cmd: CertsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CertsCommand::Renew {
            name,
            namespace,
            cluster,
        } => {
            let (api, ns) = certificates(&cluster, namespace).await?;
            let now = rfc3339(OffsetDateTime::now_utc());
            let patch = serde_json::json!({"metadata": {"annotations": {RENEW_ANNOTATION: now}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .with_context(|| format!("requesting a renewal of {ns}/{name}"))?;
            println!("renewal requested for discoveryservicecertificate {ns}/{name}");
            Ok(ExitCode::SUCCESS)
        }
        CertsCommand::Status {
            name,
            namespace,
            cluster,
            output,
        } => {
            let (api, ns) = certificates(&cluster, namespace).await?;
            let dsc = api
                .get(&name)
                .await
                .with_context(|| format!("reading discoveryservicecertificate {ns}/{name}"))?;
            let secrets: Api<Secret> =
                Api::namespaced(api_client(&api), &secret_namespace(&dsc, &ns));
            let secret = secrets.get_opt(&dsc.spec.secret_ref.name).await?;
            let document = status_document(&dsc, &ns, secret.as_ref());
            let report = || status_report(&dsc, &ns, secret.as_ref());
            print!("{}", output.render(&document, report)?);
            Ok(ExitCode::SUCCESS)
        }
        CertsCommand::Inspect { files, output } => {
            let (out, err) = (&mut io::stdout().lock(), &mut io::stderr().lock());
            let ok = match output {
                Output::Table => inspect(&files, out, err)?,
                _ => inspect_document(&files, output, out, err)?,
            };
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Prints every certificate of every file to `out`; a file that cannot be read or holds no
/// valid certificate is reported on `err` by name, and the others are still printed.
/// Returns whether every file was fine.
pub fn inspect(files: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> io::Result<bool> {
    let mut all_ok = true;
    for (index, path) in files.iter().enumerate() {
        match read_certificates(path) {
            Ok(certs) => {
                if index > 0 {
                    writeln!(out)?;
                }
                let total = certs.len();
                for (n, cert) in certs.iter().enumerate() {
                    if total > 1 {
                        writeln!(out, "{} (certificate {} of {total})", path.display(), n + 1)?;
                    } else {
                        writeln!(out, "{}", path.display())?;
                    }
                    write_certificate(cert, out)?;
                }
            }
            Err(reason) => {
                all_ok = false;
                writeln!(err, "error: {}: {reason}", path.display())?;
            }
        }
    }
    Ok(all_ok)
}

/// `marin3r certs inspect -o json|yaml`: one document of every certificate of every file;
/// a file that cannot be read is reported on `err`. Returns whether every file was fine.
fn inspect_document(
    files: &[PathBuf],
    output: Output,
    out: &mut impl Write,
    err: &mut impl Write,
) -> anyhow::Result<bool> {
    let mut all_ok = true;
    let mut certificates = Vec::new();
    for path in files {
        match read_certificates(path) {
            Ok(certs) => certificates.extend(
                certs
                    .iter()
                    .map(|c| CertificateView::new(c, Some(path.display().to_string()))),
            ),
            Err(reason) => {
                all_ok = false;
                writeln!(err, "error: {}: {reason}", path.display())?;
            }
        }
    }
    let document = serde_json::json!({ "certificates": certificates });
    write!(out, "{}", output.render(&document, String::new)?)?;
    Ok(all_ok)
}

/// What `certs inspect` and `certs status` say of one certificate.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CertificateView {
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    subject: String,
    issuer: String,
    sans: Vec<String>,
    serial: String,
    key: String,
    usage: Vec<&'static str>,
    not_before: String,
    not_after: String,
    /// 80% of its validity, when marin3r renews it.
    renewal_time: String,
    hash: String,
}

impl CertificateView {
    fn new(info: &CertificateInfo, file: Option<String>) -> Self {
        let usages = [
            (info.is_ca, "CA"),
            (info.server_auth, "server auth"),
            (info.client_auth, "client auth"),
        ];
        Self {
            file,
            subject: info.subject.clone(),
            issuer: info.issuer.clone(),
            sans: info.sans.iter().map(ToString::to_string).collect(),
            serial: info.serial.clone(),
            key: info.key_algorithm.clone(),
            usage: usages
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, u)| *u)
                .collect(),
            not_before: rfc3339(info.not_before),
            not_after: rfc3339(info.not_after),
            renewal_time: rfc3339(info.renewal_time()),
            hash: info.hash(),
        }
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateInfo>, String> {
    let pem = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    CertificateInfo::all_from_pem(&pem).map_err(|e| marin3r_controller::chain(&e))
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

fn write_certificate(info: &CertificateInfo, out: &mut impl Write) -> io::Result<()> {
    let view = CertificateView::new(info, None);
    let listed = |items: &[String]| match items.is_empty() {
        true => "(none)".to_owned(),
        false => items.join(", "),
    };
    let usage: Vec<String> = view.usage.iter().map(|u| (*u).to_owned()).collect();
    writeln!(out, "  Subject:     {}", view.subject)?;
    writeln!(out, "  Issuer:      {}", view.issuer)?;
    writeln!(out, "  SANs:        {}", listed(&view.sans))?;
    writeln!(out, "  Serial:      {}", view.serial)?;
    writeln!(out, "  Key:         {}", view.key)?;
    writeln!(out, "  Usage:       {}", listed(&usage))?;
    writeln!(out, "  Not before:  {}", view.not_before)?;
    writeln!(out, "  Not after:   {}", view.not_after)?;
    writeln!(
        out,
        "  Renewal at:  {} (80% of validity)",
        view.renewal_time
    )?;
    writeln!(out, "  Hash:        {}", view.hash)?;
    Ok(())
}

async fn certificates(
    cluster: &ClusterArgs,
    namespace: Option<String>,
) -> anyhow::Result<(Api<DiscoveryServiceCertificate>, String)> {
    let client = cluster.client().await?;
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    Ok((Api::namespaced(client, &ns), ns))
}

fn api_client(api: &Api<DiscoveryServiceCertificate>) -> kube::Client {
    api.clone().into_client()
}

fn secret_namespace(dsc: &DiscoveryServiceCertificate, ns: &str) -> String {
    dsc.spec
        .secret_ref
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| ns.to_owned())
}

/// The `marin3r certs status -o json|yaml` document.
fn status_document(
    dsc: &DiscoveryServiceCertificate,
    ns: &str,
    secret: Option<&Secret>,
) -> serde_json::Value {
    let secret_ref = format!("{}/{}", secret_namespace(dsc, ns), dsc.spec.secret_ref.name);
    let secret = match secret {
        None => serde_json::json!({ "name": secret_ref, "found": false }),
        Some(secret) => {
            let keys: Vec<&String> = secret.data.iter().flat_map(|d| d.keys()).collect();
            let pem = secret.data.as_ref().and_then(|d| d.get("tls.crt"));
            let certificate =
                pem.map(|b| CertificateInfo::from_pem(&String::from_utf8_lossy(&b.0)));
            let (certificate, error) = match certificate {
                Some(Ok(info)) => (Some(CertificateView::new(&info, None)), None),
                Some(Err(e)) => (None, Some(format!("tls.crt is unreadable: {e}"))),
                None => (None, Some("tls.crt is missing".to_owned())),
            };
            serde_json::json!({
                "name": secret_ref,
                "found": true,
                "type": secret.type_,
                "keys": keys,
                "certificate": certificate,
                "error": error,
            })
        }
    };
    serde_json::json!({
        "name": dsc.metadata.name,
        "namespace": ns,
        "spec": dsc.spec,
        "status": dsc.status,
        "secret": secret,
    })
}

/// The `marin3r certs status` report.
pub fn status_report(
    dsc: &DiscoveryServiceCertificate,
    ns: &str,
    secret: Option<&Secret>,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let name = dsc.metadata.name.as_deref().unwrap_or_default();
    let status = dsc.status.clone().unwrap_or_default();
    let time = |t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.as_ref()
            .map_or_else(|| "-".to_owned(), |t| t.0.to_string())
    };
    let _ = writeln!(out, "Name:          {name}");
    let _ = writeln!(out, "Namespace:     {ns}");
    let _ = writeln!(out, "Common name:   {}", dsc.spec.common_name);
    let _ = writeln!(
        out,
        "Ready:         {}",
        status
            .ready
            .map_or("Unknown", |r| if r { "True" } else { "False" })
    );
    let _ = writeln!(out, "Not before:    {}", time(&status.not_before));
    let _ = writeln!(out, "Not after:     {}", time(&status.not_after));
    let _ = writeln!(out, "Renewal time:  {}", time(&status.renewal_time));
    let _ = writeln!(
        out,
        "Hash:          {}",
        status.certificate_hash.as_deref().unwrap_or("-")
    );
    let _ = writeln!(out, "Conditions:");
    if status.conditions.is_empty() {
        let _ = writeln!(out, "  (none yet: is the operator running?)");
    }
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "  {}={} {}: {} (since {})",
            c.type_, c.status, c.reason, c.message, c.last_transition_time.0
        );
    }
    let secret_ref = format!("{}/{}", secret_namespace(dsc, ns), dsc.spec.secret_ref.name);
    match secret {
        None => {
            let _ = writeln!(out, "Secret:        {secret_ref} (not found)");
        }
        Some(secret) => secret_report(&mut out, &secret_ref, secret),
    }
    out
}

/// The certificate Secret's part of the status report: its type, keys and certificate.
fn secret_report(out: &mut String, secret_ref: &str, secret: &Secret) {
    use std::fmt::Write as _;
    let keys: Vec<&str> = secret
        .data
        .iter()
        .flat_map(|d| d.keys())
        .map(String::as_str)
        .collect();
    let _ = writeln!(
        out,
        "Secret:        {secret_ref} (type {}, keys: {})",
        secret.type_.as_deref().unwrap_or("-"),
        keys.join(", ")
    );
    let cert = secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned());
    match cert.as_deref().map(CertificateInfo::from_pem) {
        Some(Ok(info)) => {
            let _ = writeln!(out, "Certificate (tls.crt):");
            let mut buf = Vec::new();
            if write_certificate(&info, &mut buf).is_ok() {
                out.push_str(&String::from_utf8_lossy(&buf));
            }
        }
        Some(Err(e)) => {
            let _ = writeln!(out, "Certificate (tls.crt): unreadable: {e}");
        }
        None => {
            let _ = writeln!(out, "Certificate (tls.crt): missing");
        }
    }
}
