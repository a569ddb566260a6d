//! `marin3r bootstrap` writes a bootstrap that the real Envoy accepts, and refuses a
//! certificate folder Envoy could not use, naming the file.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use marin3r_certs::{CertificateAuthority, CertificateRequest, Usage, issue_self_signed};

fn marin3r(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(args)
        .output()
        .unwrap()
}

/// Writes a client certificate folder (tls.crt, tls.key, ca.crt) and returns its CA.
fn client_cert_dir(dir: &Path) -> CertificateAuthority {
    let day = Duration::from_secs(86_400);
    let ca = issue_self_signed(&CertificateRequest::ca("marin3r-ca", day)).unwrap();
    let ca = CertificateAuthority::from_issued(&ca).unwrap();
    let client = ca
        .issue(
            &CertificateRequest::new("envoy", Usage::Client, day)
                .with_hosts(["spiffe://cluster.local/ns/default"]),
        )
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tls.crt"), &client.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), &client.key_pem).unwrap();
    std::fs::write(dir.join("ca.crt"), &client.ca_pem).unwrap();
    ca
}

fn envoy_validate(config: &Path) -> Output {
    Command::new(marin3r_testkit::tools::envoy().unwrap())
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn rendered_bootstrap_is_accepted_by_envoy_in_both_ads_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("tls");
    client_cert_dir(&certs);
    for (mode, extra) in [("sotw", None), ("delta", Some("--delta"))] {
        let out_dir = tmp.path().join(mode);
        let mut args = vec![
            "bootstrap",
            "--node-id",
            "proxy-1",
            "--xds-host",
            "marin3r-instance.default.svc",
            "--xds-port",
            "18000",
            "--cert-dir",
            certs.to_str().unwrap(),
            "--out-dir",
            out_dir.to_str().unwrap(),
            "--admin-port",
            "19901",
        ];
        args.extend(extra);
        let out = marin3r(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        for file in [
            "config.json",
            "tls_certificate_sds_secret.json",
            "validation_context_sds_secret.json",
        ] {
            assert!(out_dir.join(file).is_file(), "{file} missing");
            assert!(stdout.contains(file), "{stdout}");
        }
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(config["node"]["id"], "proxy-1");
        let sds = std::fs::read_to_string(out_dir.join("tls_certificate_sds_secret.json")).unwrap();
        let canonical = std::fs::canonicalize(&certs).unwrap();
        assert!(sds.contains(canonical.join("tls.key").to_str().unwrap()));

        let validated = envoy_validate(&out_dir.join("config.json"));
        assert!(
            validated.status.success(),
            "envoy rejected the {mode} bootstrap:\n{}{}",
            String::from_utf8_lossy(&validated.stdout),
            String::from_utf8_lossy(&validated.stderr)
        );
    }
}

#[test]
fn unusable_certificate_folders_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("tls");
    client_cert_dir(&certs);
    let out_dir = tmp.path().join("out");
    let run = |certs: &Path| {
        let out = marin3r(&[
            "bootstrap",
            "--node-id",
            "p",
            "--xds-host",
            "marin3r",
            "--cert-dir",
            certs.to_str().unwrap(),
            "--out-dir",
            out_dir.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8(out.stderr).unwrap()
    };

    // A CA from elsewhere.
    let other = tmp.path().join("other");
    client_cert_dir(&other);
    std::fs::copy(other.join("ca.crt"), certs.join("ca.crt")).unwrap();
    let err = run(&certs);
    assert!(
        err.contains("tls.crt is not signed by") && err.contains("ca.crt"),
        "{err}"
    );

    // The key of another certificate.
    std::fs::copy(other.join("tls.key"), certs.join("tls.key")).unwrap();
    let err = run(&certs);
    assert!(err.contains("tls.key does not belong to"), "{err}");

    // A missing file.
    std::fs::remove_file(certs.join("tls.key")).unwrap();
    let err = run(&certs);
    assert!(err.contains("reading") && err.contains("tls.key"), "{err}");

    // Garbage instead of a certificate.
    std::fs::write(certs.join("tls.crt"), "garbage").unwrap();
    std::fs::copy(other.join("tls.key"), certs.join("tls.key")).unwrap();
    let err = run(&certs);
    assert!(
        err.contains("tls.crt") && err.contains("CERTIFICATE"),
        "{err}"
    );
    assert!(!out_dir.join("config.json").exists());
}

#[test]
fn bad_options_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("tls");
    client_cert_dir(&certs);
    let out = marin3r(&[
        "bootstrap",
        "--node-id",
        "p",
        "--xds-host",
        "not a host",
        "--cert-dir",
        certs.to_str().unwrap(),
        "--out-dir",
        tmp.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("\"not a host\" is not a DNS name or IP address"),
        "{err}"
    );
}
