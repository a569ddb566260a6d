//! This build's `marin3r` and the images `hack/image` makes of it, loaded into the real
//! cluster: what the scenarios, the operator's tests and the benchmarks run.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

use crate::cluster::Cluster;
use crate::tools;

/// The built `marin3r`: `MARIN3R_BIN`, else the newest of the one beside the running
/// executable (tests run from `<target>/<profile>/deps`) and the `debug` and `release`
/// builds in `$CARGO_TARGET_DIR` or the workspace's `target/`.
pub fn marin3r_bin() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MARIN3R_BIN") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let beside = beside_this_build("marin3r");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| tools::repo_root().join("target"), PathBuf::from);
    let built = ["debug", "release"].map(|profile| target.join(profile).join("marin3r"));
    beside
        .into_iter()
        .chain(built)
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
}

/// `name` in the build folder of the running executable (`<target>/<profile>`; tests run
/// from its `deps/`), whether or not it exists.
pub fn beside_this_build(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let dir = if dir.ends_with("deps") {
        dir.parent()?
    } else {
        dir
    };
    Some(dir.join(name))
}

/// The images of `hack/image` a scenario asks for (`marin3r`, `envoy`, `python`...), the
/// marin3r one holding this build's `marin3r` ([`marin3r_bin`]), written (or
/// kept when unchanged) and loaded into the cluster; pods running an older marin3r image are
/// started again on this one. An attached cluster must have them already.
pub fn load_images(cluster: &Cluster, images: &[&str]) -> anyhow::Result<()> {
    if !cluster.is_local() {
        return Ok(());
    }
    let marin3r = marin3r_bin()
        .context("no built marin3r for the image (cargo build -p marin3r-discovery)")?;
    let out = Command::new(tools::repo_root().join("hack/image"))
        .args(images)
        .arg("--marin3r")
        .arg(&marin3r)
        .output()
        .context("running hack/image")?;
    if !out.status.success() {
        bail!(
            "hack/image {images:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for archive in String::from_utf8_lossy(&out.stdout).lines() {
        cluster.load(&PathBuf::from(archive))?;
    }
    Ok(())
}
