//! What a revision becomes when it loads, decided without I/O: its xDS snapshot (the
//! resources, the SDS secrets built from the Secrets it references, the endpoints built from
//! the EndpointSlices it selects), the `ResourcesOutOfSync` condition, and the versions it
//! provides.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use marin3r_controller::{Note, set_condition};
use marin3r_xds::Snapshot;
use marin3r_xds::resource::ResourceType;
use sha2::{Digest, Sha256};

use crate::api::EnvoyConfigRevision;
use crate::api::envoy_config_revision::{
    EnvoyConfigRevisionStatus, RESOURCES_OUT_OF_SYNC, RevisionReason, VersionTracker,
};
use crate::{convert, rules};

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

/// The `ResourcesOutOfSync` condition after a load, and a Warning when the problem is new.
pub(super) fn load_status(
    r: &EnvoyConfigRevision,
    loaded: &Result<(Snapshot, String), String>,
) -> (EnvoyConfigRevisionStatus, Option<Note>) {
    let mut status = r.status.clone().unwrap_or_default();
    if let Ok((snapshot, _)) = loaded {
        status.provides_versions = Some(provided_versions(snapshot));
    }
    let (out_of_sync, reason, message) = match loaded {
        Ok((_, secrets_version)) => (
            false,
            RevisionReason::ResourcesLoaded,
            format!(
                "served to node {} (secrets version {secrets_version})",
                r.spec.node_id
            ),
        ),
        Err(message) => (true, RevisionReason::LoadFailed, message.clone()),
    };
    let changed = set_condition(
        &mut status.conditions,
        RESOURCES_OUT_OF_SYNC,
        out_of_sync,
        reason,
        &message,
        r.metadata.generation,
        &crate::controllers::now(),
    );
    let failure = (changed && out_of_sync).then(|| Note::warning(reason, message));
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
