//! `marin3r certs ...`: look at certificates from the command line.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use marin3r_certs::CertificateInfo;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Print subject, issuer, SANs, serial, key, validity, renewal instant and hash of every
    /// certificate in the given PEM files.
    Inspect {
        /// PEM files (a bundle prints every certificate in it).
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

pub fn run(cmd: CertsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
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
    CertificateInfo::all_from_pem(&pem).map_err(|e| e.to_string())
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
