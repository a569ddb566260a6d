//! `hack/demo --exit`: the quick start tells its whole story on the real cluster
//! (`hack/cluster`, or the one `MARIN3R_E2E_KUBECONFIG` names) with this build's images, and
//! exits 0 only when every step succeeded; installed from the versioned install.yaml that
//! `hack/render-install` renders from `manifests/` (the other scenarios install with
//! `kubectl apply -k manifests/`). Needs root, like every cluster test.

use std::path::Path;
use std::process::Command;

use marin3r_testkit::cluster::Cluster;

#[test]
fn the_demo_story_succeeds_step_by_step() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tools = repo.join(".tools/bin");
    let path = format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let install = dir.path().join("install.yaml");
    let rendered = Command::new(repo.join("hack/render-install"))
        .args(["-o", &install.to_string_lossy()])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(
        rendered.status.success(),
        "hack/render-install failed: {}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let text = std::fs::read_to_string(&install).unwrap();
    let tag = format!("image: marin3r:v{}", env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&tag), "{tag} not in install.yaml");

    let cluster = Cluster::start_or_attach().unwrap();
    let _held = cluster.exclusive().unwrap();
    let marin3r = marin3r_testkit::image::marin3r_bin().expect("a built marin3r");
    let out = if cluster.is_local() {
        // The script itself, as a newcomer runs it, with the binaries this test was built with.
        Command::new(repo.join("hack/demo"))
            .arg("--exit")
            .arg("--install-yaml")
            .arg(&install)
            .env("MARIN3R_BIN", &marin3r)
            .env("MARIN3R_DEMO_BIN", env!("CARGO_BIN_EXE_demo"))
            .env("PATH", &path)
            .output()
            .unwrap()
    } else {
        Command::new(env!("CARGO_BIN_EXE_demo"))
            .arg("--exit")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .arg("--marin3r")
            .arg(&marin3r)
            .arg("--install-yaml")
            .arg(&install)
            .current_dir(&repo)
            .env("PATH", &path)
            .output()
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "hack/demo --exit failed:\n{stdout}\n{stderr}"
    );
    if cluster.is_local() {
        assert!(
            stdout.contains("== a cluster runs here: telling the story on it"),
            "{stdout}"
        );
    }
    for step in [
        "install.yaml (kubectl apply --server-side -f)",
        "creating the DiscoveryService",
        "enabling namespace demo",
        "applying the EnvoyConfig",
        "waiting for the injected pod",
        "Envoy connected and synced",
        "a request through the sidecar returns the configured body",
        "updating the EnvoyConfig",
        "waiting for the rollback",
        "renewing it with the annotation",
        "what the sidecar holds (marin3r proxy-config) and the SYNCED column",
        "$ marin3r proxy-config -n demo deployment/demo listeners",
        "In sync: the proxy holds the 1 resource(s) the control plane serves its node.",
        "$ kubectl get envoyconfig demo-proxy -n demo",
        "the proxy holds what is served; SYNCED 1/1",
        "$ marin3r check",
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

    let kubectl = |args: &[&str]| {
        Command::new(tools.join("kubectl"))
            .args(args)
            .env("KUBECONFIG", cluster.kubeconfig())
            .output()
            .unwrap()
    };
    // The operator and discovery pods ran our image, the sidecar a real Envoy container.
    let images = kubectl(&[
        "get",
        "pods",
        "-n",
        "marin3r-system",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].image}{\"\\n\"}{end}",
    ]);
    let images = String::from_utf8_lossy(&images.stdout);
    let ours = format!("marin3r:v{}", env!("CARGO_PKG_VERSION"));
    for pod in ["marin3r-operator-", "marin3r-instance-"] {
        assert!(
            images
                .lines()
                .any(|l| l.starts_with(pod) && l.ends_with(&ours)),
            "no {pod} pod runs {ours}:\n{images}"
        );
    }
    let sidecar = kubectl(&[
        "get",
        "pods",
        "-n",
        "demo",
        "-l",
        "app=demo",
        "-o",
        "jsonpath={range .items[*].status.initContainerStatuses[*]}{.name} {.image} {.started}{\"\\n\"}{end}{range .items[*].status.containerStatuses[*]}{.name} {.image} {.started}{\"\\n\"}{end}",
    ]);
    let sidecar = String::from_utf8_lossy(&sidecar.stdout);
    assert!(
        sidecar.lines().any(|l| l.starts_with("envoy-sidecar ")
            && l.contains("envoyproxy/envoy:v")
            && l.ends_with(" true")),
        "no started envoy-sidecar container:\n{sidecar}"
    );
    // The demo's look-around names the native sidecar's log: the API server serves it.
    let logs = kubectl(&[
        "logs",
        "-n",
        "demo",
        "deployment/demo",
        "-c",
        "envoy-sidecar",
    ]);
    let log = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.status.success() && log.contains("lds: add/update listener"),
        "kubectl logs -c envoy-sidecar: {log}{}",
        String::from_utf8_lossy(&logs.stderr)
    );
}

#[test]
fn render_install_versions_every_image_and_refuses_bad_input() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let render = |args: &[&str]| {
        Command::new(repo.join("hack/render-install"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = render(&[
        "--image",
        "registry.example:5000/team/marin3r",
        "--version",
        "v2.3.4",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let image = "registry.example:5000/team/marin3r:v2.3.4";
    // The operator's container and the image it gives the discovery pods it starts.
    assert_eq!(
        text.matches(&format!("image: {image}")).count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.matches(&format!("value: {image}")).count(),
        1,
        "{text}"
    );
    assert!(
        !text.contains("marin3r:v0."),
        "an unversioned image is left:\n{text}"
    );
    for kind in [
        "name: discoveryservices.operator.marin3r.3scale.net",
        "name: envoyconfigs.marin3r.3scale.net",
        "name: envoydeployments.operator.marin3r.3scale.net",
        "kind: Namespace",
        "kind: ClusterRole",
    ] {
        assert!(text.contains(kind), "{kind} missing");
    }
    assert!(text.contains("app.kubernetes.io/version: 2.3.4"));
    for bad in [
        &["--version", "latest"][..],
        &["--image", "marin3r:v1"][..],
        &["--image", "Not An Image"][..],
        &["--unknown"][..],
    ] {
        let out = render(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("render-install:"),
            "{bad:?}"
        );
    }
}
