//! A configuration Envoy's validate mode accepts and every running Envoy rejects, for the
//! scenarios that show a NACK and the rollback: its listeners on an address no pod has.
//! Validate mode binds no socket, so the judge (the validating webhook, the EnvoyConfig
//! controller, `marin3r validate`) admits it; a proxy served it fails to bind
//! (`cannot bind '203.0.113.1:8080': Cannot assign requested address`), NACKs, and keeps
//! serving its previous listeners. (A second router filter, say, no longer gets that far:
//! the judge refuses it at `kubectl apply`.)

use anyhow::ensure;

/// RFC 5737's TEST-NET-3, reserved for documentation: no pod, node or test machine has it.
pub const NO_POD_ADDRESS: &str = "203.0.113.1";

/// `manifest` with every listener bound to `0.0.0.0` moved to [`NO_POD_ADDRESS`]; an error
/// when it has none (the result would be served as it is).
pub fn nacked_by_proxies(manifest: &str) -> anyhow::Result<String> {
    const ANY: &str = "address: 0.0.0.0,";
    ensure!(
        manifest.contains(ANY),
        "no listener on `{ANY} ...` to move to {NO_POD_ADDRESS} in:\n{manifest}"
    );
    Ok(manifest.replace(ANY, &format!("address: {NO_POD_ADDRESS},")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_examples_listener_moves_and_a_manifest_without_one_is_an_error() {
        let example = crate::product::example_in("envoyconfig.yaml", "demo").unwrap();
        let moved = nacked_by_proxies(&example).unwrap();
        assert!(
            moved.contains("socket_address: { address: 203.0.113.1, port_value: 8080 }"),
            "{moved}"
        );
        assert_eq!(moved.lines().count(), example.lines().count());
        assert!(nacked_by_proxies(&moved).is_err());
    }

    /// The demo's rejected config (`docs/examples/envoyconfig-rejected.yaml`) is this one.
    #[test]
    fn the_documented_rejected_config_listens_where_no_pod_can() {
        let path = marin3r_testkit::tools::repo_root().join(crate::demo::REJECTED_CONFIG);
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            text.contains(&format!("address: {NO_POD_ADDRESS}, port_value: 8080")),
            "{text}"
        );
    }
}
