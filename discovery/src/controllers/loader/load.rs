//! What a revision becomes when it loads, decided without I/O: its xDS snapshot (the
//! resources, the SDS secrets built from the Secrets it references, the endpoints built from
//! the EndpointSlices it selects), the `ResourcesInSync`/`ResourcesOutOfSync` conditions, and the versions it
//! provides.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use marin3r_controller::Note;
use marin3r_xds::Snapshot;
use marin3r_xds::resource::ResourceType;
use sha2::{Digest, Sha256};

use marin3r_api::EnvoyConfigRevision;
use marin3r_api::envoy_config_revision::{
    EnvoyConfigRevisionStatus, RevisionReason, VersionTracker,
};
use marin3r_envoyconfig::{convert, rules};

/// The revision's snapshot and its secrets version (`<version>-<hash of the loaded
/// secrets>`), or why it cannot be served. `secrets` are the referenced Secrets, in order.
pub(super) fn snapshot_for(
    r: &EnvoyConfigRevision,
    secrets: &[Option<Secret>],
    slices: &[Vec<EndpointSlice>],
    allow_cross_namespace_secrets: bool,
) -> Result<(Snapshot, String), String> {
    let mut resources = convert::validate_config(&r.spec.config()).map_err(|errors| {
        let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
        format!("invalid resources: {}", all.join("; "))
    })?;
    let own = r.namespace().unwrap_or_default();
    let mut hasher = Sha256::new();
    let sources = convert::secret_sources(&r.spec.config());
    for (source, secret) in sources.iter().zip(secrets) {
        let path = &source.path;
        let ns = source.namespace.as_deref().unwrap_or(&own);
        let secret_name = &source.secret_name;
        if let Some(problem) = rules::foreign_secret(source, &own, allow_cross_namespace_secrets) {
            return Err(problem);
        }
        let Some(secret) = secret else {
            return Err(format!("{path}: Secret {ns}/{secret_name} not found"));
        };
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        let resource = convert::secret_resource(source, secret.type_.as_deref(), &data)
            .map_err(|e| format!("{path}: Secret {ns}/{secret_name} {e}"))?;
        hasher.update(&resource.body);
        resources.push(resource);
    }
    for (source, slices) in convert::endpoint_sources(&r.spec.config())
        .iter()
        .zip(slices)
    {
        let resource = convert::endpoints_from_slices(source, slices)
            .map_err(|e| format!("{}: {e}", source.path))?;
        resources.push(resource);
    }
    let secrets_hash: String = hasher
        .finalize()
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect();
    let secrets_version = format!("{}-{secrets_hash}", r.spec.version);
    // Envoy sees the SDS version as `<revision>-<hash of the secrets>` (SPEC §2.4): it
    // changes with the revision and whenever a referenced Secret does.
    let snapshot = Snapshot::new(resources).map_err(|e| e.to_string())?;
    Ok((
        snapshot.with_version(ResourceType::Secret, secrets_version.clone()),
        secrets_version,
    ))
}

/// The `ResourcesInSync` and `ResourcesOutOfSync` conditions after a load, and a Warning when the problem is new.
pub(super) fn load_status(
    r: &EnvoyConfigRevision,
    loaded: &Result<(Snapshot, String), String>,
) -> (EnvoyConfigRevisionStatus, Option<Note>) {
    let mut status = r.status.clone().unwrap_or_default();
    if let Ok((snapshot, _)) = loaded {
        status.provides_versions = Some(provided_versions(snapshot));
    }
    let (in_sync, reason, message) = match loaded {
        Ok((_, secrets_version)) => (
            true,
            RevisionReason::ResourcesLoaded,
            format!(
                "served to node {} (secrets version {secrets_version})",
                r.spec.node_id
            ),
        ),
        Err(message) => (false, RevisionReason::LoadFailed, message.clone()),
    };
    let now = crate::controllers::now();
    let changed = status.set_resources_sync(in_sync, reason, &message, r.metadata.generation, &now);
    let failure = (changed && !in_sync).then(|| Note::warning(reason, message));
    (status, failure)
}

/// The version Envoy is sent of each resource type the snapshot holds.
fn provided_versions(snapshot: &Snapshot) -> VersionTracker {
    let version = |kind: ResourceType| {
        let of_type = snapshot.of_type(kind);
        (!of_type.resources().is_empty()).then(|| of_type.version().to_owned())
    };
    VersionTracker {
        endpoints: version(ResourceType::Endpoint),
        clusters: version(ResourceType::Cluster),
        routes: version(ResourceType::Route),
        scoped_routes: version(ResourceType::ScopedRoute),
        listeners: version(ResourceType::Listener),
        secrets: version(ResourceType::Secret),
        runtimes: version(ResourceType::Runtime),
        extension_configs: version(ResourceType::ExtensionConfig),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use marin3r_api::envoy_config_revision::{RESOURCES_IN_SYNC, RESOURCES_OUT_OF_SYNC};

    fn condition<'a>(status: &'a EnvoyConfigRevisionStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    /// HEAD tooling waits on `ResourcesInSync`, v0.6 tooling on `ResourcesOutOfSync`: both
    /// are written on every load, opposite, with one reason and message.
    #[test]
    fn a_load_sets_both_sync_conditions_opposite_to_each_other() {
        let mut r = EnvoyConfigRevision::new("gw-abc", Default::default());
        r.spec.node_id = "gw".into();
        r.spec.version = "abc".into();
        let snapshot = Snapshot::new(Vec::new()).unwrap();
        let (status, note) = load_status(&r, &Ok((snapshot, "abc-00".into())));
        assert!(note.is_none());
        let (in_sync, out) = (
            condition(&status, RESOURCES_IN_SYNC),
            condition(&status, RESOURCES_OUT_OF_SYNC),
        );
        assert_eq!(
            (in_sync.status.as_str(), out.status.as_str()),
            ("True", "False")
        );
        assert_eq!(
            (&in_sync.reason, &in_sync.message),
            (&out.reason, &out.message)
        );
        assert_eq!(in_sync.reason, "ResourcesLoaded");

        r.status = Some(status);
        let (mut status, note) = load_status(&r, &Err("Secret team-a/x not found".into()));
        assert_eq!(note.unwrap().reason, "LoadFailed");
        let (in_sync, out) = (
            condition(&status, RESOURCES_IN_SYNC),
            condition(&status, RESOURCES_OUT_OF_SYNC),
        );
        assert_eq!(
            (in_sync.status.as_str(), out.status.as_str()),
            ("False", "True")
        );
        assert_eq!(in_sync.message, "Secret team-a/x not found");

        // Unpublished: only HEAD's condition goes, as in HEAD.
        assert!(status.clear_resources_in_sync());
        assert!(!status.clear_resources_in_sync());
        assert!(
            status
                .conditions
                .iter()
                .all(|c| c.type_ != RESOURCES_IN_SYNC)
        );
        assert_eq!(condition(&status, RESOURCES_OUT_OF_SYNC).status, "True");
    }
}
