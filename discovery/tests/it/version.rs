//! `marin3r version` with no cluster to ask: the client version, a line saying why the
//! server part is missing, and exit 0. (With a cluster: `e2e/tests/it/replicas_e2e.rs`.)

use std::process::Command;

#[test]
fn without_a_cluster_the_client_version_is_printed_and_the_server_part_explained() {
    let dir = tempfile::tempdir().unwrap();
    // A cluster whose API server is not listening.
    let kubeconfig = crate::support::refusing_kubeconfig(dir.path());
    let version = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
            .arg("version")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = version(&[]);
    let mut lines = text.lines();
    let client = format!("Client: marin3r {}", env!("CARGO_PKG_VERSION"));
    assert_eq!(lines.next(), Some(client.as_str()), "{text}");
    let server = lines.next().unwrap_or_default();
    assert!(
        server.starts_with("Server: could not be reached: "),
        "{text}"
    );
    assert!(server.contains("Connection refused"), "{text}");

    let json: serde_json::Value = serde_json::from_str(&version(&["-o", "json"])).unwrap();
    assert_eq!(
        json["client"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{json}"
    );
    assert!(json["serverError"].is_string(), "{json}");
    assert!(json.get("server").is_none(), "{json}");

    // --client never asks.
    assert_eq!(version(&["--client"]), format!("{client}\n"));
}
