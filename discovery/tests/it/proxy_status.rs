//! `marin3r proxy-status` against a URL where no xDS server answers.

#[test]
fn proxy_status_names_an_unreachable_url() {
    let port = marin3r_testkit::ports::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["proxy-status", "--url", &url])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("GET {url}/sync-status")),
        "{stderr}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["proxy-status", "--url", "localhost:8383"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("must start with http://"));
}
