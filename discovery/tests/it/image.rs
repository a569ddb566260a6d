//! The container image: one name (`marin3r_discovery::IMAGE`) that the operator defaults to,
//! `manifests/` deploy (through kustomize, as `kubectl apply -k` renders them), `hack/image`
//! builds and the docs name; the Dockerfile's user is the non-root one
//! (`marin3r_discovery::IMAGE_USER`); and `hack/image --docker` says so and exits 2 where no
//! container tool can build (`image_archive.rs`: the archives `hack/image` writes without
//! one).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use marin3r_discovery::{IMAGE, IMAGE_USER};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl kustomize DIR`: the objects `kubectl apply -k DIR` would send.
fn kustomize(dir: &Path) -> Vec<Value> {
    let kubectl = marin3r_testkit::tools::kubectl().unwrap();
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

/// The operator container's image and its `MARIN3R_IMAGE` (the discovery pods' image).
fn operator_images(objects: &[Value]) -> (String, String) {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "marin3r-operator")
        .expect("the operator Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "MARIN3R_IMAGE")
        .expect("MARIN3R_IMAGE");
    (
        container["image"].as_str().unwrap().to_owned(),
        env["value"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn the_manifests_deploy_the_image_the_operator_defaults_to() {
    assert!(IMAGE.starts_with("marin3r:v") && IMAGE.ends_with(env!("CARGO_PKG_VERSION")));
    let (operator, discovery) = operator_images(&kustomize(&root().join("manifests")));
    assert_eq!(operator, IMAGE);
    assert_eq!(discovery, IMAGE);
}

#[test]
fn a_kustomize_images_override_reaches_the_operator_and_its_discovery_pods() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("manifests");
    let status = Command::new("cp")
        .arg("-r")
        .arg(root().join("manifests"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let kustomization = copy.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).unwrap();
    let edited = text.replace(
        "newName: marin3r\n",
        "newName: registry.example/team/marin3r\n",
    );
    assert_ne!(text, edited, "kustomization.yaml has no `newName: marin3r`");
    std::fs::write(&kustomization, edited).unwrap();
    let want = IMAGE.replace("marin3r:", "registry.example/team/marin3r:");
    assert_eq!(operator_images(&kustomize(&copy)), (want.clone(), want));
}

#[test]
fn hack_image_dockerfile_and_docs_name_the_same_image() {
    let out = Command::new(root().join("hack/image"))
        .arg("--print")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), IMAGE);

    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let user = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    assert_eq!(user.trim(), format!("{IMAGE_USER}:{IMAGE_USER}"));

    let install = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    assert!(install.contains(IMAGE), "docs/install.md must name {IMAGE}");
    // Nothing deploys the original Go project's image.
    for file in [
        "manifests/operator/deployment.yaml",
        "manifests/kustomization.yaml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        assert!(!text.contains("quay.io/3scale"), "{file}");
    }
}

/// Runs `hack/image --docker` with PATH set to `bin` only (and any extra environment).
fn hack_image(bin: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("/bin/bash");
    cmd.arg(root().join("hack/image"))
        .arg("--docker")
        .env_clear()
        .env("PATH", bin);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn hack_image_docker_without_docker_or_podman_says_so_and_exits_2() {
    let bin = tempfile::tempdir().unwrap();
    let out = hack_image(bin.path(), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no usable container tool (docker or podman) to build {IMAGE}"
        )) && stderr.contains("docker: not installed")
            && stderr.contains("podman: not installed"),
        "{stderr}"
    );
}

#[test]
fn hack_image_docker_with_a_docker_whose_daemon_is_down_says_so_and_exits_2() {
    let bin = tempfile::tempdir().unwrap();
    // The real docker client when this machine has one, pointed at a socket nobody serves.
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("docker"))
        .find(|p| p.is_file());
    let docker = bin.path().join("docker");
    match &real {
        Some(path) => symlink(path, &docker).unwrap(),
        None => {
            // Without a client, a stand-in that answers `info` as a client without a daemon.
            std::fs::write(
                &docker,
                "#!/bin/bash\necho 'Cannot connect to the Docker daemon at unix:///nonexistent.sock. Is the docker daemon running?' >&2\nexit 1\n",
            )
            .unwrap();
            Command::new("chmod")
                .arg("+x")
                .arg(&docker)
                .status()
                .unwrap();
        }
    }
    let socket = bin.path().join("no-daemon.sock");
    let host = format!("unix://{}", socket.display());
    let home = bin.path().display().to_string();
    let out = hack_image(bin.path(), &[("DOCKER_HOST", &host), ("HOME", &home)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("docker: installed, but `docker info` fails")
            && stderr.contains("podman: not installed"),
        "{stderr}"
    );
}

#[test]
fn the_operator_defaults_discovery_pods_to_its_own_image() {
    let out = Command::new(env!("CARGO_BIN_EXE_marin3r"))
        .args(["operator", "--help"])
        .env_remove("MARIN3R_IMAGE")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains(&format!("[default: {IMAGE}]")), "{help}");
}
