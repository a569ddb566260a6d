//! Which local binary stands in for a container image: the one `marin3r` image this build
//! ships ([`marin3r_discovery::IMAGE`], tag included) runs the built `marin3r`,
//! `envoyproxy/envoy*` images the installed Envoy, and `--image NAME=PATH` adds more. An
//! image without a mapping cannot be "pulled"; any other `marin3r` image (another tag, the
//! original project's `quay.io/3scale/marin3r`) is refused, so a stale name in the manifests
//! or the operator fails here as it would on a real cluster. Each image also carries the user
//! it runs as, for kubelet's `runAsNonRoot` check.

use std::path::{Path, PathBuf};

/// A local binary standing in for an image, with the image's default arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageBinary {
    pub path: PathBuf,
    /// What the image runs when the container gives neither `command` nor `args`.
    pub default_args: Vec<String>,
    /// The image is Envoy's: its entrypoint treats args not starting with `-` as a command.
    pub envoy_entrypoint: bool,
    /// The uid the image runs as when the pod sets no `runAsUser` (0: root).
    pub user: i64,
}

/// `envoyproxy/envoy` starts as root (its entrypoint drops to the `envoy` user itself);
/// the distroless variants run as distroless' `nonroot`.
const ENVOY_USER: i64 = 0;
const DISTROLESS_NONROOT: i64 = 65532;

#[derive(Clone, Debug, Default)]
pub struct ImageMap {
    marin3r: Option<PathBuf>,
    envoy: Option<PathBuf>,
    extra: Vec<(String, PathBuf)>,
}

/// An image reference in the form a container runtime pulls: registry, `library/` for Docker
/// Hub's official images, and `:latest` when neither tag nor digest is given, so
/// `marin3r:v1` and `docker.io/library/marin3r:v1` compare equal.
fn canonical(image: &str) -> String {
    let (first, rest) = image.split_once('/').unwrap_or(("", image));
    let has_registry = first.contains('.') || first.contains(':') || first == "localhost";
    let mut out = if has_registry {
        image.to_owned()
    } else if first.is_empty() {
        format!("docker.io/library/{image}")
    } else {
        format!("docker.io/{first}/{rest}")
    };
    if repository(&out) == out {
        out.push_str(":latest");
    }
    out
}

/// An image reference split into repository (no tag or digest) and its last path segment.
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

impl ImageMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// What this machine has: Envoy from `tools::envoy()` and `marin3r` from `MARIN3R_BIN`,
    /// or else the workspace's `target/debug` or `target/release` (whichever is newer).
    /// Missing ones stay unmapped (their images fail to pull, saying why).
    pub fn discover() -> Self {
        let mut map = Self::new();
        if let Ok(envoy) = crate::tools::envoy() {
            map = map.with_envoy(envoy);
        }
        let from_env = std::env::var_os("MARIN3R_BIN").map(PathBuf::from);
        let target = crate::tools::repo_root().join("target");
        let built = ["debug", "release"]
            .iter()
            .map(|profile| target.join(profile).join("marin3r"))
            .filter(|p| p.is_file())
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
        if let Some(path) = from_env.or(built).filter(|p| p.is_file()) {
            map = map.with_marin3r(path);
        }
        map
    }

    /// The binary `marin3r` images run.
    pub fn with_marin3r(mut self, path: impl Into<PathBuf>) -> Self {
        self.marin3r = Some(path.into());
        self
    }

    /// The binary `envoyproxy/envoy*` images run.
    pub fn with_envoy(mut self, path: impl Into<PathBuf>) -> Self {
        self.envoy = Some(path.into());
        self
    }

    /// Maps an image (as written, without its tag, or its last path segment) to a binary.
    pub fn with(mut self, name: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        self.extra.push((name.into(), path.into()));
        self
    }

    /// Parses `NAME=PATH` (the `--image` flag).
    pub fn with_flag(self, flag: &str) -> anyhow::Result<Self> {
        let Some((name, path)) = flag.split_once('=') else {
            anyhow::bail!("--image {flag:?}: expected NAME=PATH");
        };
        if name.is_empty() || path.is_empty() {
            anyhow::bail!("--image {flag:?}: expected NAME=PATH with both parts non-empty");
        }
        if !Path::new(path).is_file() {
            anyhow::bail!("--image {flag:?}: {path} is not a file");
        }
        Ok(self.with(name, path))
    }

    /// The binary for an image, or the message a pull error shows.
    pub fn resolve(&self, image: &str) -> Result<ImageBinary, String> {
        let repo = repository(image);
        let last = repo.rsplit('/').next().unwrap_or(repo);
        // An image of unknown origin is taken to run as root, as most do.
        let plain = |path: &PathBuf, user: i64| ImageBinary {
            path: path.clone(),
            default_args: Vec::new(),
            envoy_entrypoint: false,
            user,
        };
        if let Some((_, path)) = self
            .extra
            .iter()
            .find(|(name, _)| name == image || name == repo || name == last)
        {
            return Ok(plain(path, 0));
        }
        if last == "marin3r" {
            let ours = marin3r_discovery::IMAGE;
            if canonical(image) != canonical(ours) {
                return Err(format!(
                    "image {image:?} is not the marin3r image of this build: the local cluster \
                     runs only {ours:?} (marin3r_discovery::IMAGE, the name manifests/ and the \
                     operator use), so a stale or foreign marin3r image would not run this code"
                ));
            }
            return match &self.marin3r {
                Some(path) => Ok(plain(path, marin3r_discovery::IMAGE_USER)),
                None => Err(format!(
                    "image {image:?}: no marin3r binary configured for the local cluster \
                     (build it with `cargo build -p marin3r-discovery`, or pass --marin3r PATH)"
                )),
            };
        }
        let mut segments = repo.rsplit('/');
        let (name, owner) = (segments.next().unwrap_or(""), segments.next().unwrap_or(""));
        if owner == "envoyproxy" && name.starts_with("envoy") {
            return match &self.envoy {
                Some(path) => Ok(ImageBinary {
                    path: path.clone(),
                    default_args: vec!["-c".into(), "/etc/envoy/envoy.yaml".into()],
                    envoy_entrypoint: true,
                    user: if name.contains("distroless") {
                        DISTROLESS_NONROOT
                    } else {
                        ENVOY_USER
                    },
                }),
                None => Err(format!(
                    "image {image:?}: Envoy is not installed (run hack/install-tools)"
                )),
            };
        }
        Err(format!(
            "image {image:?} has no local binary: the local cluster runs marin3r and \
             envoyproxy/envoy images, and others mapped with --image NAME=PATH"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ImageMap {
        ImageMap::new()
            .with_marin3r("/bin/marin3r")
            .with_envoy("/bin/envoy")
            .with("python", "/usr/bin/python3")
    }

    #[test]
    fn only_this_builds_marin3r_image_maps_to_the_built_binary() {
        let ours = marin3r_discovery::IMAGE;
        for image in [ours.to_owned(), format!("docker.io/library/{ours}")] {
            let bin = map().resolve(&image).unwrap();
            assert_eq!(bin.path, PathBuf::from("/bin/marin3r"));
            assert_eq!(bin.user, marin3r_discovery::IMAGE_USER);
        }
    }

    #[test]
    fn stale_or_foreign_marin3r_images_are_refused_naming_them() {
        for image in [
            "marin3r",
            "marin3r:latest",
            "marin3r:v0.0.9",
            "quay.io/3scale/marin3r:v0.1.0",
            "quay.io/3scale/marin3r:v0.13.1",
            "ghcr.io/someone/marin3r:v0.1.0",
            "x/marin3r@sha256:abc",
        ] {
            let err = map().resolve(image).unwrap_err();
            assert!(
                err.contains(image) && err.contains(marin3r_discovery::IMAGE),
                "{err}"
            );
        }
    }

    #[test]
    fn canonical_names_add_registry_library_and_latest() {
        assert_eq!(canonical("marin3r:v1"), "docker.io/library/marin3r:v1");
        assert_eq!(
            canonical("envoyproxy/envoy"),
            "docker.io/envoyproxy/envoy:latest"
        );
        assert_eq!(
            canonical("localhost:5000/marin3r"),
            "localhost:5000/marin3r:latest"
        );
        assert_eq!(canonical("quay.io/a/b@sha256:0"), "quay.io/a/b@sha256:0");
    }

    #[test]
    fn envoy_images_map_to_envoy_with_its_default_config() {
        for image in [
            "envoyproxy/envoy:v1.30.1",
            "docker.io/envoyproxy/envoy-distroless:v1.31",
            "envoyproxy/envoy",
        ] {
            let bin = map().resolve(image).unwrap();
            assert_eq!(bin.path, PathBuf::from("/bin/envoy"));
            assert!(bin.envoy_entrypoint);
            let user = if image.contains("distroless") {
                65532
            } else {
                0
            };
            assert_eq!(bin.user, user, "{image}");
            assert_eq!(bin.default_args, ["-c", "/etc/envoy/envoy.yaml"]);
        }
    }

    #[test]
    fn extra_mappings_match_by_name_repository_or_last_segment() {
        for image in ["python", "python:3.12", "docker.io/library/python:3"] {
            assert_eq!(
                map().resolve(image).unwrap().path,
                PathBuf::from("/usr/bin/python3")
            );
        }
    }

    #[test]
    fn unknown_images_get_a_pull_error_naming_the_image() {
        let err = map().resolve("nginx:1.27").unwrap_err();
        assert!(
            err.contains("nginx:1.27") && err.contains("--image"),
            "{err}"
        );
        let err = ImageMap::new().resolve("envoyproxy/envoy:v1").unwrap_err();
        assert!(err.contains("install-tools"), "{err}");
    }

    #[test]
    fn image_flags_are_checked() {
        assert!(ImageMap::new().with_flag("nopath").is_err());
        assert!(ImageMap::new().with_flag("x=/no/such/file").is_err());
        assert!(ImageMap::new().with_flag("=/bin/sh").is_err());
    }

    #[test]
    fn registry_ports_are_not_tags() {
        assert_eq!(
            repository("localhost:5000/marin3r"),
            "localhost:5000/marin3r"
        );
        assert_eq!(
            repository("localhost:5000/marin3r:v1"),
            "localhost:5000/marin3r"
        );
    }
}
