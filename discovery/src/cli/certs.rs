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
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::cluster::ClusterArgs;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Print subject, issuer, SANs, serial, key, validity, renewal instant and hash of every
    /// certificate in the given PEM files.
    Inspect {
        /// PEM files (a bundle prints every certificate in it).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
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
        } => {
            let (api, ns) = certificates(&cluster, namespace).await?;
            let dsc = api
                .get(&name)
                .await
                .with_context(|| format!("reading discoveryservicecertificate {ns}/{name}"))?;
            let secrets: Api<Secret> =
                Api::namespaced(api_client(&api), &secret_namespace(&dsc, &ns));
            let secret = secrets.get_opt(&dsc.spec.secret_ref.name).await?;
            print!("{}", status_report(&dsc, &ns, secret.as_ref()));
            Ok(ExitCode::SUCCESS)
        }
        CertsCommand::Inspect { files } => {
            let ok = inspect(&files, &mut io::stdout().lock(), &mut io::stderr().lock())?;
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

fn read_certificates(path: &Path) -> Result<Vec<CertificateInfo>, String> {
    let pem = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    CertificateInfo::all_from_pem(&pem).map_err(|e| marin3r_controller::chain(&e))
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_else(|_| t.to_string())
}

fn write_certificate(info: &CertificateInfo, out: &mut impl Write) -> io::Result<()> {
    let sans = if info.sans.is_empty() {
        "(none)".to_owned()
    } else {
        info.sans
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut usage = Vec::new();
    if info.is_ca {
        usage.push("CA");
    }
    if info.server_auth {
        usage.push("server auth");
    }
    if info.client_auth {
        usage.push("client auth");
    }
    let usage = if usage.is_empty() {
        "(none)".to_owned()
    } else {
        usage.join(", ")
    };
    writeln!(out, "  Subject:     {}", info.subject)?;
    writeln!(out, "  Issuer:      {}", info.issuer)?;
    writeln!(out, "  SANs:        {sans}")?;
    writeln!(out, "  Serial:      {}", info.serial)?;
    writeln!(out, "  Key:         {}", info.key_algorithm)?;
    writeln!(out, "  Usage:       {usage}")?;
    writeln!(out, "  Not before:  {}", rfc3339(info.not_before))?;
    writeln!(out, "  Not after:   {}", rfc3339(info.not_after))?;
    writeln!(
        out,
        "  Renewal at:  {} (80% of validity)",
        rfc3339(info.renewal_time())
    )?;
    writeln!(out, "  Hash:        {}", info.hash())?;
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
