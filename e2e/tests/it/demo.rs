//! `hack/demo --exit`: the quick start runs its whole story on the local cluster and exits 0
//! only when every step succeeded. Needs root, like every local-cluster test.

use std::path::Path;
use std::process::Command;

#[test]
fn the_demo_story_succeeds_step_by_step() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tools = repo.join(".tools/bin");
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(env!("CARGO_BIN_EXE_demo"))
        .arg("--exit")
        .current_dir(&repo)
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "hack/demo --exit failed:\n{stdout}\n{stderr}"
    );
    for step in [
        "installing manifests/",
        "creating the DiscoveryService",
        "enabling namespace demo",
        "applying the EnvoyConfig",
        "waiting for the injected pod",
        "Envoy connected and synced",
        "a request through the sidecar returns the configured body",
        "updating the EnvoyConfig",
        "waiting for the rollback",
        "renewing it with the annotation",
    ] {
        assert!(
            stdout.contains(step),
            "the demo never said {step:?}:\n{stdout}"
        );
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert!(stdout.contains("every step succeeded"), "{stdout}");
    assert!(stdout.contains("GET http://"), "{stdout}");
    assert!(stdout.contains("Rollback"), "{stdout}");
}
