//! `marin3r certs inspect`, run as a user runs it: the built binary on files on disk.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use marin3r_certs::{
    CertificateAuthority, CertificateInfo, CertificateRequest, KeyAlgorithm, Usage,
    certificate_hash, issue_self_signed,
};
use time::format_description::well_known::Rfc3339;

fn marin3r(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .output()
        .expect("run marin3r")
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn version_is_printed() {
    let out = marin3r(&["--version"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim(),
        format!("marin3r {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn inspect_prints_every_field_of_issued_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca", day)).unwrap();
    let leaf = CertificateAuthority::from_issued(&ca)
        .unwrap()
        .issue(
            &CertificateRequest::new("envoy", Usage::Client, day * 10)
                .with_hosts(["spiffe://cluster.local/ns/team-a", "10.0.0.7"])
                .with_key_algorithm(KeyAlgorithm::Rsa2048),
        )
        .unwrap();
    let ca_file = write(dir.path(), "ca.crt", &ca.cert_pem);
    let leaf_file = write(dir.path(), "tls.crt", &leaf.cert_pem);

    let out = marin3r(&["certs", "inspect", &ca_file, &leaf_file]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}");

    let info = CertificateInfo::from_pem(&leaf.cert_pem).unwrap();
    let ts = |t: time::OffsetDateTime| t.format(&Rfc3339).unwrap();
    for want in [
        format!("{ca_file}\n  Subject:     CN=marin3r-ca"),
        format!("{leaf_file}\n  Subject:     CN=envoy"),
        "  Issuer:      CN=marin3r-ca".to_owned(),
        "  SANs:        URI:spiffe://cluster.local/ns/team-a, IP:10.0.0.7".to_owned(),
        format!("  Serial:      {}", info.serial),
        "  Key:         RSA 2048".to_owned(),
        "  Key:         ECDSA P-256".to_owned(),
        "  Usage:       client auth".to_owned(),
        "  Usage:       CA".to_owned(),
        format!("  Not before:  {}", ts(info.not_before)),
        format!("  Not after:   {}", ts(info.not_after)),
        format!(
            "  Renewal at:  {} (80% of validity)",
            ts(info.renewal_time())
        ),
        format!(
            "  Hash:        {}",
            certificate_hash(&leaf.cert_pem).unwrap()
        ),
    ] {
        assert!(stdout.contains(&want), "missing {want:?} in:\n{stdout}");
    }
    // Times are RFC 3339 in UTC, and the renewal is 8 of the 10 days in.
    assert!(ts(info.not_after).ends_with('Z'));
    assert_eq!(
        info.renewal_time() - info.not_before,
        time::Duration::days(8)
    );
}

#[test]
fn inspect_numbers_the_certificates_of_a_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let a = issue_self_signed(&CertificateRequest::ca("a", Duration::from_secs(60))).unwrap();
    let b = issue_self_signed(&CertificateRequest::ca("b", Duration::from_secs(60))).unwrap();
    let bundle = write(
        dir.path(),
        "bundle.pem",
        &format!("{}{}", a.cert_pem, b.cert_pem),
    );
    let out = marin3r(&["certs", "inspect", &bundle]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert!(stdout.contains(&format!(
        "{bundle} (certificate 1 of 2)\n  Subject:     CN=a"
    )));
    assert!(stdout.contains(&format!(
        "{bundle} (certificate 2 of 2)\n  Subject:     CN=b"
    )));
}

#[test]
fn inspect_names_each_bad_file_and_why_and_still_prints_the_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    let good = issue_self_signed(&CertificateRequest::ca("good", Duration::from_secs(60))).unwrap();
    let good_file = write(dir.path(), "good.crt", &good.cert_pem);
    let garbage = write(dir.path(), "garbage.crt", "this is not a certificate\n");
    let key_only = write(dir.path(), "tls.key", &good.key_pem);
    let corrupt = write(
        dir.path(),
        "corrupt.crt",
        "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );
    let missing = dir.path().join("missing.crt").to_str().unwrap().to_owned();

    let out = marin3r(&[
        "certs", "inspect", &garbage, &good_file, &key_only, &corrupt, &missing,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stdout.contains("CN=good"), "{stdout}");
    for want in [
        format!("error: {garbage}: no PEM block of type CERTIFICATE found"),
        format!("error: {key_only}: no PEM block of type CERTIFICATE found"),
        format!("error: {corrupt}: invalid certificate"),
        format!("error: {missing}: No such file or directory"),
    ] {
        assert!(stderr.contains(&want), "missing {want:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"));
}

#[test]
fn inspect_without_files_is_a_usage_error() {
    let out = marin3r(&["certs", "inspect"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("<FILE>"));
}

/// Without a cluster to talk to, the error says where it looked, and each cause once (kube's
/// errors repeat their sources in their own text).
#[test]
fn a_missing_kubeconfig_is_reported_once() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["certs", "status", "some-cert"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let config = home.path().join(".kube/config");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(config.to_str().unwrap()),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}

/// `-o json` and `-o yaml` print one document of every certificate for scripts, each with its
/// file; a bad file is still said on stderr and fails the run.
#[test]
fn inspect_prints_one_document_for_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca", day)).unwrap();
    let leaf = CertificateAuthority::from_issued(&ca)
        .unwrap()
        .issue(&CertificateRequest::new("envoy", Usage::Client, day).with_hosts(["10.0.0.7"]))
        .unwrap();
    let bundle = write(
        dir.path(),
        "bundle.pem",
        &format!("{}{}", ca.cert_pem, leaf.cert_pem),
    );
    let out = marin3r(&["certs", "inspect", "-o", "json", &bundle]);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let certs = doc["certificates"].as_array().unwrap();
    assert_eq!(certs.len(), 2, "{doc}");
    let info = CertificateInfo::from_pem(&leaf.cert_pem).unwrap();
    let ts = |t: time::OffsetDateTime| t.format(&Rfc3339).unwrap();
    assert_eq!(
        certs[1],
        serde_json::json!({
            "file": bundle,
            "subject": "CN=envoy",
            "issuer": "CN=marin3r-ca",
            "sans": ["IP:10.0.0.7"],
            "serial": info.serial,
            "key": "ECDSA P-256",
            "usage": ["client auth"],
            "notBefore": ts(info.not_before),
            "notAfter": ts(info.not_after),
            "renewalTime": ts(info.renewal_time()),
            "hash": certificate_hash(&leaf.cert_pem).unwrap(),
        })
    );
    assert_eq!(certs[0]["usage"], serde_json::json!(["CA"]));

    let missing = dir.path().join("missing.crt").to_str().unwrap().to_owned();
    let out = marin3r(&["certs", "inspect", "-o", "yaml", &bundle, &missing]);
    assert_eq!(out.status.code(), Some(1));
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!(yaml, doc, "the YAML is the same document");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains(&format!("error: {missing}: ")), "{stderr}");
}
