//! Serving custom resources: a stored CustomResourceDefinition registers its resources at
//! once, and one being deleted stays until the collector has deleted all its objects.

use serde_json::Value;

use super::hooks;
use super::meta;
use super::registry::{self, ResourceInfo};
use super::store::Inner;

/// (Re)registers the resources of a stored CRD; an invalid one was rejected before storing.
pub(super) fn register(inner: &mut Inner, crd: &Value) {
    if let Ok(infos) = registry::from_crd(crd) {
        inner.registry.set_crd(meta::name(crd), infos);
    }
}

/// Kinds whose deletion waits for the server itself to clean up (namespace content, custom
/// resources of a CRD), like the `kubernetes` and `customresourcecleanup` finalizers.
pub(super) fn server_finalized(info: &ResourceInfo) -> bool {
    hooks::is_namespace(info) || hooks::is_crd(info)
}

/// The group and plural a CRD serves.
pub(super) fn served(crd: &Value) -> (String, String) {
    let text = |p: &str| {
        crd.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    (text("/spec/group"), text("/spec/names/plural"))
}
