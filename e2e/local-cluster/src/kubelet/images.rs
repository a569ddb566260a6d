//! Which local binary stands in for a container image: `envoyproxy/envoy*` images run the
//! installed Envoy, images pinned by the caller run their binary (tag included: the caller's
//! own build, such as the product under test), and `with`/`--image NAME=PATH` adds more. An
//! image without a mapping cannot be "pulled"; another tag or registry of a pinned image's
//! name is refused, so a stale name in manifests fails here as it would on a real cluster.
//! Each image also carries the user it runs as, for kubelet's `runAsNonRoot` check.

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
    /// Other files the image holds, as (path in the image, local file): bind-mounted read-only
    /// into each of its containers, as a multi-binary image carries them.
    pub files: Vec<(PathBuf, PathBuf)>,
}

/// `envoyproxy/envoy` starts as root (its entrypoint drops to the `envoy` user itself);
/// the distroless variants run as distroless' `nonroot`.
const ENVOY_USER: i64 = 0;
const DISTROLESS_NONROOT: i64 = 65532;

#[derive(Clone, Debug, Default)]
pub struct ImageMap {
    pinned: Vec<Pinned>,
    envoy: Option<PathBuf>,
    extra: Vec<(String, PathBuf)>,
    /// (image name, path in the image, local file): see [`ImageMap::with_file`].
    files: Vec<(String, PathBuf, PathBuf)>,
}

/// The one image of its name the cluster runs (see [`ImageMap::pin`]).
#[derive(Clone, Debug)]
struct Pinned {
    image: String,
    binary: Result<PathBuf, String>,
    user: i64,
}

/// The last path segment of an image's repository (`quay.io/a/marin3r:v1` → `marin3r`).
fn name_of(image: &str) -> &str {
    let repo = repository(image);
    repo.rsplit('/').next().unwrap_or(repo)
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

    /// Pins `image` (tag included) to a binary run as `user`: the only image of its name
    /// (last path segment) the cluster runs, so another tag or registry of that name fails to
    /// pull naming the pinned one. `Err(why)` pins the image without a binary: pulling it
    /// fails with `why` (say, how to build it).
    pub fn pin(
        mut self,
        image: impl Into<String>,
        binary: Result<PathBuf, String>,
        user: i64,
    ) -> Self {
        self.pinned.push(Pinned {
            image: image.into(),
            binary,
            user,
        });
        self
    }

    /// The binary `envoyproxy/envoy*` images run.
    pub fn with_envoy(mut self, path: impl Into<PathBuf>) -> Self {
        self.envoy = Some(path.into());
        self
    }

    /// Puts the local file `source` at `path` in every container of image `name` (as written,
    /// without its tag, or its last path segment), as an image holding more than its
    /// entrypoint does (the marin3r image carries Envoy).
    pub fn with_file(
        mut self,
        name: impl Into<String>,
        path: impl Into<PathBuf>,
        source: impl Into<PathBuf>,
    ) -> Self {
        self.files.push((name.into(), path.into(), source.into()));
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
        let mut binary = self.resolve_binary(image)?;
        let repo = repository(image);
        let last = repo.rsplit('/').next().unwrap_or(repo);
        binary.files = self
            .files
            .iter()
            .filter(|(name, _, _)| name == image || name == repo || name == last)
            .map(|(_, path, source)| (path.clone(), source.clone()))
            .collect();
        Ok(binary)
    }

    fn resolve_binary(&self, image: &str) -> Result<ImageBinary, String> {
        let repo = repository(image);
        let last = repo.rsplit('/').next().unwrap_or(repo);
        // An image of unknown origin is taken to run as root, as most do.
        let plain = |path: &PathBuf, user: i64| ImageBinary {
            path: path.clone(),
            default_args: Vec::new(),
            envoy_entrypoint: false,
            user,
            files: Vec::new(),
        };
        if let Some((_, path)) = self
            .extra
            .iter()
            .find(|(name, _)| name == image || name == repo || name == last)
        {
            return Ok(plain(path, 0));
        }
        if let Some(pin) = self.pinned.iter().find(|p| name_of(&p.image) == last) {
            let ours = &pin.image;
            if canonical(image) != canonical(ours) {
                return Err(format!(
                    "image {image:?} is not the {last} image of this build: the local cluster \
                     runs only {ours:?}, so a stale or foreign {last} image would not run this \
                     code"
                ));
            }
            return match &pin.binary {
                Ok(path) => Ok(plain(path, pin.user)),
                Err(why) => Err(format!("image {image:?}: {why}")),
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
                    files: Vec::new(),
                }),
                None => Err(format!(
                    "image {image:?}: Envoy is not installed (run hack/install-tools)"
                )),
            };
        }
        Err(format!(
            "image {image:?} has no local binary: the local cluster runs envoyproxy/envoy \
             images, the images its caller pins, and others mapped with --image NAME=PATH"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "marin3r:v0.1.0";

    fn map() -> ImageMap {
        ImageMap::new()
            .pin(OURS, Ok("/bin/marin3r".into()), 65532)
            .with_envoy("/bin/envoy")
            .with("python", "/usr/bin/python3")
    }

    #[test]
    fn only_the_pinned_image_maps_to_its_binary() {
        for image in [OURS.to_owned(), format!("docker.io/library/{OURS}")] {
            let bin = map().resolve(&image).unwrap();
            assert_eq!(bin.path, PathBuf::from("/bin/marin3r"));
            assert_eq!(bin.user, 65532);
        }
        let unbuilt = ImageMap::new().pin(OURS, Err("build it first".into()), 0);
        let err = unbuilt.resolve(OURS).unwrap_err();
        assert!(
            err.contains(OURS) && err.contains("build it first"),
            "{err}"
        );
    }

    #[test]
    fn other_tags_or_registries_of_a_pinned_image_are_refused_naming_both() {
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
            assert!(err.contains(image) && err.contains(OURS), "{err}");
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
