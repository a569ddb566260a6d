//! What the scenarios take from the product: the built `marin3r` (which `hack/image` puts in
//! the image), the example manifests, and a DiscoveryService's readiness.

use std::path::PathBuf;

use marin3r_testkit::tools;

/// The built `marin3r`: `MARIN3R_BIN`, else the newest of the one beside the running
/// executable (tests run from `<target>/<profile>/deps`) and the `debug` and `release`
/// builds in `$CARGO_TARGET_DIR` or the workspace's `target/`.
pub fn marin3r_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MARIN3R_BIN") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        let dir = if dir.ends_with("deps") {
            dir.parent()?
        } else {
            dir
        };
        Some(dir.join("marin3r"))
    });
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| tools::repo_root().join("target"), PathBuf::from);
    let built = ["debug", "release"].map(|profile| target.join(profile).join("marin3r"));
    beside
        .into_iter()
        .chain(built)
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// An example manifest of `manifests/examples/` with its namespace (`demo`) replaced by `ns`.
pub fn example_in(file: &str, ns: &str) -> std::io::Result<String> {
    let path = tools::repo_root().join("manifests/examples").join(file);
    let text = std::fs::read_to_string(path)?;
    Ok(text.replace("namespace: demo", &format!("namespace: {ns}")))
}

/// A DiscoveryService's `Ready` condition: (status, reason, message).
pub fn discovery_service_ready(
    ds: &marin3r_api::discovery_service::DiscoveryService,
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
