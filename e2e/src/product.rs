//! What ties the product to the local cluster, which knows no product: the image map that
//! runs this build's `marin3r` image (and no other marin3r image), carrying the installed
//! Envoy as the product's image does, and the installed Envoy, the example manifests, and reading a DiscoveryService's readiness.

use std::path::PathBuf;

use marin3r_discovery::judge::IMAGE_ENVOY;
use marin3r_local_cluster::kubelet::ImageMap;
use marin3r_testkit::tools;

/// The built `marin3r`: `MARIN3R_BIN`, else the workspace's `target/debug` or
/// `target/release` build, whichever is newer.
pub fn marin3r_bin() -> Option<PathBuf> {
    let from_env = std::env::var_os("MARIN3R_BIN").map(PathBuf::from);
    let target = tools::repo_root().join("target");
    let built = ["debug", "release"]
        .iter()
        .map(|profile| target.join(profile).join("marin3r"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok());
    from_env.or(built).filter(|p| p.is_file())
}

/// What this machine has: the installed Envoy for `envoyproxy/envoy*` images, and the given
/// `marin3r` (else [`marin3r_bin`]) for exactly this build's image
/// ([`marin3r_discovery::IMAGE`], the name `manifests/` and the operator use), run as the
/// image's user; any other marin3r image fails to pull. Missing binaries leave their images
/// failing to pull, saying why.
///
/// The marin3r image carries the installed Envoy at [`IMAGE_ENVOY`], as the `Dockerfile`
/// builds it, so the validating webhook and the EnvoyConfig controller judge with Envoy in
/// every scenario; a scenario that needs a config Envoy NACKs applies one only a running
/// Envoy refuses ([`crate::rejected`]).
pub fn images_with(marin3r: Option<PathBuf>) -> ImageMap {
    let mut map = ImageMap::new();
    if let Ok(envoy) = tools::envoy() {
        map = map
            .with_envoy(&envoy)
            .with_file("marin3r", IMAGE_ENVOY, envoy);
    }
    let binary = marin3r.or_else(marin3r_bin).ok_or_else(|| {
        "no marin3r binary configured for the local cluster (build it with \
         `cargo build -p marin3r-discovery`, or set MARIN3R_BIN)"
            .to_owned()
    });
    map.pin(
        marin3r_discovery::IMAGE,
        binary,
        marin3r_discovery::IMAGE_USER,
    )
}

/// [`images_with`] the built `marin3r`.
pub fn images() -> ImageMap {
    images_with(None)
}

/// An example manifest of `manifests/examples/` with its namespace (`demo`) replaced by `ns`.
pub fn example_in(file: &str, ns: &str) -> std::io::Result<String> {
    let path = tools::repo_root().join("manifests/examples").join(file);
    let text = std::fs::read_to_string(path)?;
    Ok(text.replace("namespace: demo", &format!("namespace: {ns}")))
}

/// A DiscoveryService's `Ready` condition: (status, reason, message).
pub fn discovery_service_ready(
    ds: &marin3r_discovery::api::discovery_service::DiscoveryService,
) -> Option<(String, String, String)> {
    ready_condition(&ds.status.as_ref()?.conditions)
}

/// The `Ready` condition among `conditions`: (status, reason, message).
pub fn ready_condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<(String, String, String)> {
    let c = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}
