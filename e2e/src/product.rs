//! What the scenarios take from the product besides the built `marin3r`
//! (`marin3r_testkit::image`): the example manifests, and a DiscoveryService's readiness.

use marin3r_testkit::tools;

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
