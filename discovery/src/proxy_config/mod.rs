//! What `marin3r proxy-config` shows: the configuration one Envoy holds (its admin
//! `/config_dump`, parsed by resource type), the configuration the control plane serves that
//! Envoy's node (the discovery pod's `/served-config`), the same secret fields redacted on
//! both sides, and the difference between the two.

pub mod diff;
pub mod dump;
pub mod redact;
pub mod served;

use serde::{Deserialize, Serialize};

/// The resource types `proxy-config` shows, in the order Envoy applies them; `bootstrap` is
/// Envoy's own and has no served counterpart.
pub const SECTIONS: [&str; 6] = [
    "bootstrap",
    "clusters",
    "endpoints",
    "listeners",
    "routes",
    "secrets",
];

/// One resource as a proxy holds it, or as the control plane serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `clusters`, `listeners`, ... (the `spec.envoyResources` list names).
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    /// `static` (in the bootstrap), `dynamic` (from xDS, in use), `warming` (from xDS, not in
    /// use yet), `error` (rejected), `file` (a secret the bootstrap reads from a file);
    /// `served` for what the control plane serves.
    pub state: String,
    /// The xDS version it came with, when dynamic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When Envoy last updated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<String>,
    /// The resource in proto3 JSON with the proto field names, secret fields redacted.
    pub config: serde_json::Value,
}
