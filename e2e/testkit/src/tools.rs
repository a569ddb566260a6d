//! Finding the real Envoy, kubectl, Prometheus, promtool and olm-validate that `hack/install-tools` puts in
//! `.tools/bin`.

use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `e2e/testkit`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Finds a tool: the environment variable `env_var` if set, then `PATH`, then the repo's
/// `.tools/bin`. The error says how to install it.
pub fn find_tool(name: &str, env_var: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_var) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        anyhow::bail!("{env_var}={} does not name a file", path.display());
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(name));
    let in_repo = std::iter::once(repo_root().join(".tools/bin").join(name));
    on_path.chain(in_repo).find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "{name} not found on PATH or in .tools/bin: run hack/install-tools \
             (or set {env_var} to the binary)"
        )
    })
}

/// The real Envoy binary.
pub fn envoy() -> anyhow::Result<PathBuf> {
    find_tool("envoy", "MARIN3R_ENVOY")
}

/// The real kubectl binary.
pub fn kubectl() -> anyhow::Result<PathBuf> {
    find_tool("kubectl", "MARIN3R_KUBECTL")
}

/// The real Prometheus server (3.x, built by `hack/install-cluster-tools`).
pub fn prometheus() -> anyhow::Result<PathBuf> {
    find_tool("prometheus", "MARIN3R_PROMETHEUS")
}

/// The operator-framework's bundle validators (`hack/olm-validate`, built by
/// `hack/install-olm-validate`).
pub fn olm_validate() -> anyhow::Result<PathBuf> {
    find_tool("olm-validate", "MARIN3R_OLM_VALIDATE")
}

/// The real promtool (built beside Prometheus by `hack/install-cluster-tools`).
pub fn promtool() -> anyhow::Result<PathBuf> {
    find_tool("promtool", "MARIN3R_PROMTOOL")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repo_root_holds_the_workspace() {
        assert!(repo_root().join("hack/install-tools").is_file());
    }

    #[test]
    fn a_missing_tool_says_how_to_install_it() {
        let err = find_tool("marin3r-no-such-tool", "MARIN3R_NO_SUCH_TOOL")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hack/install-tools"), "{err}");
        assert!(err.contains("MARIN3R_NO_SUCH_TOOL"), "{err}");
    }
}
