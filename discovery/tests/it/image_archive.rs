//! The image archives `hack/image` writes without a Docker daemon: byte for byte the same from
//! the same inputs; the marin3r image is the one the Dockerfile describes (entrypoint, user,
//! files and their paths, Envoy release) and its binaries start as its user on a read-only
//! root; the Envoy image is the one injected sidecars name and run as; the tests' own images
//! (pause, busybox, python) run. Needs root (chroot, a private mount namespace) and Debian's
//! package archive the first time (the packages are cached in `MARIN3R_CACHE`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use marin3r_discovery::{IMAGE, IMAGE_USER};
use marin3r_webhook::config::{DEFAULT_ENVOY_IMAGE, ENVOY_UID};
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `hack/image IMAGES... --out OUT` with this build's `marin3r` and the installed Envoy; the
/// archives' paths it prints.
fn hack_image(out: &Path, images: &[&str]) -> Vec<PathBuf> {
    let envoy = marin3r_testkit::tools::envoy().unwrap();
    let output = Command::new(root().join("hack/image"))
        .args(images)
        .arg("--out")
        .arg(out)
        .arg("--marin3r")
        .arg(env!("CARGO_BIN_EXE_marin3r"))
        .arg("--envoy")
        .arg(envoy)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "hack/image {images:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// An archive taken apart: its index.json, docker's manifest.json, the config, and the root
/// filesystem its layers make, unpacked in order as root (owners and modes kept).
struct Unpacked {
    dir: tempfile::TempDir,
    index: Value,
    manifest: Value,
    config: Value,
}

impl Unpacked {
    fn new(archive: &Path) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("tar");
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(&tar).unwrap();
        std::fs::create_dir_all(&rootfs).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&tar));
        let index = json(&tar.join("index.json"));
        let manifest = json(&tar.join("manifest.json"));
        assert_eq!(
            std::fs::read_to_string(tar.join("oci-layout")).unwrap(),
            r#"{"imageLayoutVersion":"1.0.0"}"#
        );
        // The OCI manifest index.json points at and docker's manifest.json name the same
        // config and layers, each blob under its own sha256.
        let oci_digest = index["manifests"][0]["digest"].as_str().unwrap();
        let oci = json(&blob(&tar, oci_digest));
        let config_path = manifest[0]["Config"].as_str().unwrap();
        assert_eq!(
            format!("blobs/{}", oci["config"]["digest"].as_str().unwrap()).replace(':', "/"),
            config_path
        );
        let layers: Vec<&str> = manifest[0]["Layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect();
        let oci_layers: Vec<String> = oci["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| format!("blobs/{}", l["digest"].as_str().unwrap()).replace(':', "/"))
            .collect();
        assert_eq!(layers, oci_layers);
        for entry in std::fs::read_dir(tar.join("blobs/sha256")).unwrap() {
            let path = entry.unwrap().path();
            let sum = run(Command::new("sha256sum").arg(&path)).stdout;
            let sum = String::from_utf8(sum).unwrap();
            assert_eq!(
                sum.split_whitespace().next().unwrap(),
                path.file_name().unwrap().to_str().unwrap(),
                "blob {} is not its own sha256",
                path.display()
            );
        }
        let config = json(&tar.join(config_path));
        assert_eq!(
            config["rootfs"]["diff_ids"].as_array().unwrap().len(),
            layers.len()
        );
        for layer in &layers {
            run(Command::new("tar")
                .arg("-xf")
                .arg(tar.join(layer))
                .arg("-C")
                .arg(&rootfs)
                .arg("--same-owner")
                .arg("--numeric-owner"));
        }
        Unpacked {
            dir,
            index,
            manifest,
            config,
        }
    }

    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    fn image_config(&self) -> &Value {
        &self.config["config"]
    }

    /// Runs `argv` in the root filesystem, bound read-only in a mount namespace of its own,
    /// as `user` (UID:GID), with the image's environment.
    fn run_as(&self, user: &str, argv: &[&str]) -> Output {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "root=$0 user=$1; shift; mount --bind \"$root\" \"$root\" \
                 && mount -o remount,ro,bind \"$root\" \"$root\" \
                 && exec chroot --userspec=\"$user\" \"$root\" \"$@\"",
            )
            .arg(self.rootfs())
            .arg(user)
            .args(argv)
            .env_clear();
        for env in self.image_config()["Env"].as_array().unwrap() {
            let (k, v) = env.as_str().unwrap().split_once('=').unwrap();
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }
}

fn blob(dir: &Path, digest: &str) -> PathBuf {
    dir.join("blobs")
        .join(digest.replace(':', "/").trim_start_matches('/'))
}

fn stdout_ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every file root's, none writable by others but the sticky /tmp: nothing for the image's
/// user to change on its root filesystem, read-only or not.
fn assert_writable_by_root_only(rootfs: &Path) {
    let mut stack = vec![rootfs.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(rootfs).unwrap().display().to_string();
            assert_eq!((meta.uid(), meta.gid()), (0, 0), "{rel} is not root's");
            if meta.file_type().is_symlink() {
                continue;
            }
            let mode = meta.permissions().mode();
            if rel == "tmp" {
                assert_eq!(mode & 0o7777, 0o1777, "/tmp");
            } else {
                assert_eq!(mode & 0o022, 0, "{rel} is writable by others: {mode:o}");
            }
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
}

/// The Dockerfile's final stage: its `USER`, `ENTRYPOINT`, the destinations of its `COPY`s,
/// and the Envoy image tag its `ENVOY_IMAGE` argument names.
struct Dockerfile {
    user: String,
    entrypoint: Value,
    copies: Vec<String>,
    envoy_tag: String,
}

fn dockerfile() -> Dockerfile {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    let last = &lines[last_from..];
    let value = |key: &str| {
        last.iter()
            .filter_map(|l| l.strip_prefix(key))
            .next_back()
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {key} in the Dockerfile's final stage"))
    };
    let envoy_image = lines
        .iter()
        .find_map(|l| l.strip_prefix("ARG ENVOY_IMAGE="))
        .expect("ARG ENVOY_IMAGE=");
    Dockerfile {
        user: value("USER ").to_owned(),
        entrypoint: serde_json::from_str(value("ENTRYPOINT ")).unwrap(),
        copies: last
            .iter()
            .filter_map(|l| l.strip_prefix("COPY "))
            .map(|l| l.split_whitespace().next_back().unwrap().to_owned())
            .collect(),
        envoy_tag: envoy_image.rsplit_once(':').unwrap().1.to_owned(),
    }
}

/// The Envoy release `envoy --version` prints (`envoy  version: <commit>/1.40.0/Clean/...`).
fn envoy_release(version_output: &str) -> String {
    version_output
        .split_once("version: ")
        .and_then(|(_, v)| v.split('/').nth(1))
        .unwrap_or_else(|| panic!("no release in {version_output:?}"))
        .to_owned()
}

#[test]
fn hack_image_writes_the_dockerfiles_image_the_same_bytes_every_time() {
    let first = tempfile::tempdir().unwrap();
    let second = tempfile::tempdir().unwrap();
    let a = hack_image(first.path(), &["marin3r"]);
    let b = hack_image(second.path(), &["marin3r"]);
    assert_eq!(a.len(), 1);
    let name = format!("{}.tar", IMAGE.replace(':', "-"));
    assert_eq!(a[0], first.path().join(&name));
    assert_eq!(b[0], second.path().join(&name));
    let (bytes_a, bytes_b) = (std::fs::read(&a[0]).unwrap(), std::fs::read(&b[0]).unwrap());
    assert!(bytes_a == bytes_b, "two builds from the same inputs differ");
    drop((bytes_a, bytes_b));

    let image = Unpacked::new(&a[0]);
    // Named as the manifests and the operator name it, for docker and for containerd.
    assert_eq!(image.manifest[0]["RepoTags"][0], IMAGE);
    assert_eq!(
        image.index["manifests"][0]["annotations"]["io.containerd.image.name"],
        format!("docker.io/library/{IMAGE}")
    );

    let docker = dockerfile();
    let config = image.image_config();
    assert_eq!(config["User"], docker.user);
    assert_eq!(docker.user, format!("{IMAGE_USER}:{IMAGE_USER}"));
    assert_eq!(config["Entrypoint"], docker.entrypoint);
    assert_eq!(
        docker.entrypoint,
        serde_json::json!(["/usr/local/bin/marin3r"])
    );
    assert_eq!(config["WorkingDir"], "/");
    assert_eq!(
        docker.copies,
        ["/usr/local/bin/marin3r", "/usr/local/bin/envoy"],
        "the Dockerfile's files"
    );
    let rootfs = image.rootfs();
    for file in &docker.copies {
        let meta = std::fs::metadata(rootfs.join(file.trim_start_matches('/'))).unwrap();
        assert!(
            meta.is_file() && meta.permissions().mode() & 0o111 == 0o111,
            "{file}"
        );
    }
    assert!(rootfs.join("tmp").is_dir());
    assert_writable_by_root_only(&rootfs);

    // Both binaries start as the image's user on the read-only root: every library they need
    // is in the image.
    let user = format!("{IMAGE_USER}:{IMAGE_USER}");
    let version = stdout_ok(
        image.run_as(&user, &["/usr/local/bin/marin3r", "--version"]),
        "marin3r --version",
    );
    assert_eq!(
        version.trim(),
        format!("marin3r {}", env!("CARGO_PKG_VERSION"))
    );
    let envoy = stdout_ok(
        image.run_as(&user, &["/usr/local/bin/envoy", "--version"]),
        "envoy --version",
    );
    assert_eq!(
        envoy_release(&envoy),
        docker.envoy_tag.trim_start_matches('v')
    );
    // The judge's own command line runs there too: Envoy validates a config as the image's
    // user.
    let validated = image.run_as(
        &user,
        &[
            "/usr/local/bin/envoy",
            "--mode",
            "validate",
            "--config-yaml",
            "{admin: {address: {socket_address: {address: 127.0.0.1, port_value: 9901}}}}",
        ],
    );
    stdout_ok(validated, "envoy --mode validate");
}

#[test]
fn the_envoy_image_is_the_one_sidecars_name_and_run_as() {
    let printed = run(Command::new(root().join("hack/image")).args(["--print", "envoy"])).stdout;
    assert_eq!(
        String::from_utf8(printed).unwrap().trim(),
        DEFAULT_ENVOY_IMAGE
    );
    let out = tempfile::tempdir().unwrap();
    let archives = hack_image(out.path(), &["envoy"]);
    let image = Unpacked::new(&archives[0]);
    assert_eq!(image.manifest[0]["RepoTags"][0], DEFAULT_ENVOY_IMAGE);
    assert_eq!(
        image.index["manifests"][0]["annotations"]["io.containerd.image.name"],
        format!("docker.io/{DEFAULT_ENVOY_IMAGE}")
    );
    let config = image.image_config();
    assert_eq!(config["User"], format!("{ENVOY_UID}:{ENVOY_UID}"));
    // A pod's `args:` go to Envoy, as with the official image's entrypoint.
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/envoy"])
    );
    assert_writable_by_root_only(&image.rootfs());
    let passwd = std::fs::read_to_string(image.rootfs().join("etc/passwd")).unwrap();
    assert!(
        passwd.contains(&format!("envoy:x:{ENVOY_UID}:{ENVOY_UID}:")),
        "{passwd}"
    );
    // The sidecar's `command: [envoy]` is found on the image's PATH, as its user.
    let user = format!("{ENVOY_UID}:{ENVOY_UID}");
    let version = stdout_ok(image.run_as(&user, &["envoy", "--version"]), "envoy");
    let wanted = DEFAULT_ENVOY_IMAGE.rsplit_once(":v").unwrap().1;
    assert_eq!(envoy_release(&version), wanted);
}

#[test]
fn the_test_images_run_as_their_users() {
    let out = tempfile::tempdir().unwrap();
    let archives = hack_image(out.path(), &["pause", "busybox", "python"]);
    assert_eq!(archives.len(), 3);
    let names = run(
        Command::new(root().join("hack/image")).args(["--print", "pause", "busybox", "python"])
    )
    .stdout;
    let names: Vec<String> = String::from_utf8(names)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        names,
        [
            "marin3r-test/pause:1",
            "marin3r-test/busybox:1",
            "marin3r-test/python:3"
        ]
    );
    let images: Vec<Unpacked> = archives.iter().map(|a| Unpacked::new(a)).collect();
    for (image, name) in images.iter().zip(&names) {
        assert_eq!(&image.manifest[0]["RepoTags"][0], name);
        assert_writable_by_root_only(&image.rootfs());
    }

    // pause: one static file; it holds until SIGTERM and then exits 0.
    let pause = &images[0];
    assert_eq!(
        pause.image_config()["Entrypoint"],
        serde_json::json!(["/pause"])
    );
    assert_eq!(pause.image_config()["User"], "65535:65535");
    let version = stdout_ok(pause.run_as("65535:65535", &["/pause", "-v"]), "pause -v");
    assert_eq!(version, "marin3r-test pause 1\n");
    let mut child = Command::new("chroot")
        .arg("--userspec=65535:65535")
        .arg(pause.rootfs())
        .arg("/pause")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "pause exited on its own"
    );
    run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
    assert!(child.wait().unwrap().success(), "pause on SIGTERM");

    // busybox: a shell with wget and nc for clients.
    let busybox = &images[1];
    let said = stdout_ok(
        busybox.run_as(
            "65532:65532",
            &[
                "sh",
                "-c",
                "command -v wget && command -v nc && command -v httpd",
            ],
        ),
        "busybox sh",
    );
    // Busybox's shell names its applets bare (it runs them itself); a missing one fails.
    assert_eq!(said, "wget\nnc\nhttpd\n");

    // python: the standard library the scripted backends and clients use, native modules
    // included (their libraries are in the image).
    let python = &images[2];
    let said = stdout_ok(
        python.run_as(
            "65532:65532",
            &[
                "python3",
                "-c",
                "import http.server, urllib.request, ssl, socket, threading, json, sqlite3, \
                 ctypes, lzma, bz2, zlib; print('ready')",
            ],
        ),
        "python3",
    );
    assert_eq!(said, "ready\n");
}

#[test]
fn marin3r_bin_names_the_marin3r_to_image_unless_the_flag_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // A `cargo` that fails: nothing may be built when a marin3r is named.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(
        bin.join("cargo"),
        "#!/bin/sh\necho 'hack/image ran cargo' >&2\nexit 97\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("cargo"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Two small binaries standing for marin3r builds, told apart by their bytes.
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::copy("/bin/true", &one).unwrap();
    std::fs::copy("/bin/false", &two).unwrap();
    let envoy = marin3r_testkit::tools::envoy().unwrap();
    let imaged = |marin3r_bin: &Path, flag: Option<&Path>| {
        let out = dir.path().join("out");
        let mut cmd = Command::new(root().join("hack/image"));
        cmd.args(["marin3r", "--out"])
            .arg(&out)
            .arg("--envoy")
            .arg(&envoy)
            .env("PATH", &path)
            .env("MARIN3R_BIN", marin3r_bin);
        if let Some(flag) = flag {
            cmd.arg("--marin3r").arg(flag);
        }
        let printed = String::from_utf8(run(&mut cmd).stdout).unwrap();
        let image = Unpacked::new(Path::new(printed.trim()));
        std::fs::read(image.rootfs().join("usr/local/bin/marin3r")).unwrap()
    };
    assert_eq!(imaged(&one, None), std::fs::read(&one).unwrap());
    assert_eq!(
        imaged(Path::new("/nonexistent/marin3r"), Some(&two)),
        std::fs::read(&two).unwrap()
    );
}
