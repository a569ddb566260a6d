//! The `EnvoyConfig` spec (`marin3r.3scale.net/v1alpha1`): the Envoy resources a user declares
//! for one node id, with the field names of the original MARIN3R manifests. Plain serde
//! structs with the CRD derive on top; the status follows SPEC §2.3.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec` of an `EnvoyConfig` (and, with a version, of an `EnvoyConfigRevision`).
#[derive(
    CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "marin3r.3scale.net",
    version = "v1alpha1",
    kind = "EnvoyConfig",
    namespaced,
    shortname = "ec",
    category = "marin3r",
    doc = "Envoy configuration for the proxies of one node id in this namespace: listeners, clusters, routes and the other xDS resources, validated, versioned into EnvoyConfigRevisions and served by the discovery service, with automatic rollback when Envoy rejects a version.",
    status = "EnvoyConfigStatus",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Node ID","type":"string","jsonPath":".spec.nodeID"}"#,
    printcolumn = r#"{"name":"Envoy API","type":"string","jsonPath":".spec.envoyAPI"}"#,
    printcolumn = r#"{"name":"Desired Version","type":"string","jsonPath":".status.desiredVersion"}"#,
    printcolumn = r#"{"name":"Published Version","type":"string","jsonPath":".status.publishedVersion"}"#,
    printcolumn = r#"{"name":"Cache State","type":"string","jsonPath":".status.cacheState"}"#,
    printcolumn = r#"{"name":"Synced","type":"string","jsonPath":".status.proxies.synced"}"#,
    // Only `-o wide` shows it: the default columns stay what they were.
    printcolumn = r#"{"name":"Rollout","type":"string","priority":1,"jsonPath":".status.rollout.phase"}"#,
    // kube-apiserver adds Age only to a CRD that declares no printer columns.
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigSpec {
    /// The Envoy `node.id` this configuration is served to.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// How every `value` in `envoyResources` is written (`resources` values are inline
    /// objects and need no serialization).
    #[serde(default)]
    pub serialization: Serialization,
    /// The xDS API version. Only `v3` is served; `v2` parses so that validation can say why it
    /// is refused instead of a bare "unknown variant".
    #[serde(default, rename = "envoyAPI")]
    pub envoy_api: EnvoyApi,
    /// The resources, by type, each `value` a string in `serialization`. Deprecated by the
    /// original MARIN3R since v0.12 in favour of `resources`, and still served; only one of
    /// the two may hold entries.
    #[serde(default, skip_serializing_if = "EnvoyResources::is_empty")]
    pub envoy_resources: EnvoyResources,
    /// The resources as a list of typed entries, each an inline `value` or generated from a
    /// Secret or from EndpointSlices (the original MARIN3R's API since v0.12).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<super::resources::Resource>,
    /// How many times one proxy must reject (NACK) a version before it counts as rejecting
    /// it, from 1 to 10 (default 1: the first rejection counts). Below it, the discovery
    /// service sends the version to that proxy again at once, so one failed load (a race
    /// with a certificate or a file still arriving) does not taint the revision. A revision
    /// is tainted, and rolled back, once enough of the node's proxies count as rejecting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10))]
    pub nack_threshold: Option<u8>,
    /// How a new version reaches the proxies. Unset, it is published at once. Set (even
    /// empty), a version that removes much of what the node serves or empties a listener is
    /// held until approved. Not part of the version: changing it makes no revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<super::rollout::RolloutStrategy>,
}

/// The highest `spec.nackThreshold`: each rejection below it costs every proxy a resend.
pub const MAX_NACK_THRESHOLD: u8 = 10;

impl EnvoyConfigSpec {
    /// `spec.nackThreshold`, 1 when unset.
    pub fn nack_threshold(&self) -> u8 {
        self.nack_threshold.unwrap_or(1)
    }

    /// The version of the declared resources: a hash of `envoyResources`, or of `resources`
    /// when that is used, so the same resources always get the same version (and a
    /// re-applied spec finds its old revision). `envoyResources` versions are unchanged from
    /// before `resources` existed.
    pub fn version(&self) -> String {
        let resources = if self.resources.is_empty() {
            self.envoy_resources.version()
        } else {
            // Serializing plain structs and JSON values cannot fail; the fallback keeps this
            // total. The prefix keeps the two kinds of versions apart.
            let json = serde_json::to_vec(&self.resources).unwrap_or_default();
            short_hash(&[b"resources:".as_slice(), &json].concat())
        };
        // A NACK threshold other than the default is part of what a revision serves, so a
        // change of it alone is a new version (a new revision carries it to the proxies);
        // without one, versions are what they always were.
        match self.nack_threshold {
            Some(n) if n != 1 => short_hash(format!("{resources}:nackThreshold={n}").as_bytes()),
            _ => resources,
        }
    }

    /// How many entries the spec declares, in either field.
    pub fn entries(&self) -> usize {
        self.envoy_resources.len() + self.resources.len()
    }
}

/// The first 5 bytes of the SHA-256 of `bytes`, in hex.
fn short_hash(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .take(5)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The original MARIN3R's name for `runtimes` is `runtime`: both are in the schema, so the
/// API server keeps whichever a manifest uses.
fn runtime_alias(schema: &mut schemars::Schema) {
    let runtimes = schema
        .get("properties")
        .and_then(|p| p.get("runtimes"))
        .cloned();
    if let (Some(runtimes), Some(properties)) = (
        runtimes,
        schema
            .get_mut("properties")
            .and_then(serde_json::Value::as_object_mut),
    ) {
        properties.insert("runtime".into(), runtimes);
    }
}

/// The encoding of each resource `value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Serialization {
    /// Canonical proto3 JSON.
    #[default]
    Json,
    /// The same mapping written as YAML.
    Yaml,
    /// Proto3 JSON, base64-encoded (accepted for compatibility with the original MARIN3R).
    B64json,
}

impl Serialization {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Yaml => "yaml",
            Self::B64json => "b64json",
        }
    }
}

/// Envoy's xDS API version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EnvoyApi {
    /// Removed from Envoy; always rejected by validation.
    V2,
    #[default]
    V3,
}

impl EnvoyApi {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V2 => "v2",
            Self::V3 => "v3",
        }
    }
}

/// `spec.envoyResources`: one list per Envoy resource type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = runtime_alias)]
pub struct EnvoyResources {
    /// `ClusterLoadAssignment`s, named by their `cluster_name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EnvoyResource>,
    /// `Cluster`s (CDS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<EnvoyResource>,
    /// `RouteConfiguration`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<EnvoyResource>,
    /// `ScopedRouteConfiguration`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped_routes: Vec<EnvoyResource>,
    /// `Listener`s (LDS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<EnvoyResource>,
    /// Runtime layers (`envoy.service.runtime.v3.Runtime`); `runtime` is accepted as well.
    #[serde(default, alias = "runtime", skip_serializing_if = "Vec::is_empty")]
    pub runtimes: Vec<EnvoyResource>,
    /// TLS certificates taken from Kubernetes Secrets, served by SDS under `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<EnvoySecretResource>,
    /// `TypedExtensionConfig`s (ECDS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_configs: Vec<EnvoyResource>,
}

impl EnvoyResources {
    /// The version of these resources: a hash of their canonical JSON, so the same resources
    /// always get the same version (and a re-applied spec finds its old revision).
    pub fn version(&self) -> String {
        // Serializing plain structs of strings cannot fail; the fallback keeps this total.
        short_hash(&serde_json::to_vec(self).unwrap_or_default())
    }

    /// Every list of serialized resources with the type it must hold (secrets are references,
    /// not serialized values, and are not among them).
    pub fn serialized(&self) -> [(marin3r_xds::resource::ResourceType, &[EnvoyResource]); 7] {
        use marin3r_xds::resource::ResourceType as T;
        [
            (T::Endpoint, &self.endpoints),
            (T::Cluster, &self.clusters),
            (T::Route, &self.routes),
            (T::ScopedRoute, &self.scoped_routes),
            (T::Listener, &self.listeners),
            (T::Runtime, &self.runtimes),
            (T::ExtensionConfig, &self.extension_configs),
        ]
    }

    /// How many entries all lists hold together.
    pub fn len(&self) -> usize {
        self.serialized()
            .iter()
            .map(|(_, l)| l.len())
            .sum::<usize>()
            + self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One serialized Envoy resource.
///
/// `name` is optional: the name Envoy sees is always the resource's own (`name`, or
/// `cluster_name` for endpoints), so a second copy adds nothing. Original MARIN3R manifests
/// carry it, so it is accepted, and when present it must equal the resource's own name:
/// a mismatch is an error rather than a silent choice between two names.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct EnvoyResource {
    /// Optional; when given it must equal the resource's own name (`cluster_name` for
    /// endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One resource, written in the config's `serialization`.
    pub value: String,
}

/// An SDS secret served under `name`, read from a `kubernetes.io/tls` Secret.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct EnvoySecretResource {
    /// The name Envoy asks for (`tls_certificate_sds_secret_configs[].name`).
    pub name: String,
    /// The Kubernetes Secret holding `tls.crt` and `tls.key`. Without it, as in the original
    /// MARIN3R, the Secret named `name` in the config's namespace.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
}

impl EnvoySecretResource {
    /// The name of the Kubernetes Secret to read.
    pub fn secret_name(&self) -> &str {
        self.secret_ref.as_ref().map_or(&self.name, |r| &r.name)
    }

    /// The namespace of the Kubernetes Secret, when the reference names one.
    pub fn secret_namespace(&self) -> Option<&str> {
        self.secret_ref.as_ref()?.namespace.as_deref()
    }
}

/// A Kubernetes Secret by name; the namespace defaults to the config's own.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct SecretReference {
    /// The Secret's name.
    pub name: String,
    /// The Secret's namespace; only the config's own is allowed unless the discovery service
    /// permits other namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `status` of an `EnvoyConfig`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvoyConfigStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_state: Option<CacheState>,
    /// The version served to the proxies of `nodeID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_version: Option<String>,
    /// The version of the spec's resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// `CacheOutOfSync`, `Ready` (its opposite), `RollbackFailed` and `Synced` (every
    /// connected proxy acknowledged the desired version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The revisions in publication order; the last published one is last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<ConfigRevisionRef>,
    /// Why Envoy refused the desired version, when it did (its NACK's error text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_nack_message: Option<String>,
    /// How many of the node's connected proxies acknowledged the published version, rejected
    /// it, or have not answered yet, summed over every discovery replica by the leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxies: Option<super::proxy_sync::ProxySync>,
    /// Each discovery replica's count of the node's proxies connected to it, one entry per
    /// replica (keyed by `replica`); what `proxies` sums.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["replica"]))]
    pub sync_reports: Vec<super::proxy_sync::SyncReport>,
    /// Where the desired version's rollout stands, while `spec.rollout` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<super::rollout::RolloutStatus>,
}

/// One entry of `status.revisions`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ConfigRevisionRef {
    /// The revision's version (`spec.version`).
    pub version: String,
    #[serde(rename = "ref")]
    pub revision_ref: ObjectReference,
}

/// Whether proxies get the desired version: `InSync` (they do), `Rollback` (Envoy rejected it
/// and an older revision is served) or `RollbackFailed` (every revision was rejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum CacheState {
    /// The desired version is published.
    InSync,
    /// The desired version was rejected; an older untainted revision is published.
    Rollback,
    /// Every revision was rejected; the newest stays published until the spec is fixed.
    RollbackFailed,
}

impl CacheState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InSync => "InSync",
            Self::Rollback => "Rollback",
            Self::RollbackFailed => "RollbackFailed",
        }
    }

    /// Its `state` label value in `marin3r_envoyconfig_cache_state_changes_total`: lowercase
    /// snake_case, as Prometheus label values are.
    pub fn label(self) -> &'static str {
        match self {
            Self::InSync => "in_sync",
            Self::Rollback => "rollback",
            Self::RollbackFailed => "rollback_failed",
        }
    }
}

#[cfg(test)]
mod nack_threshold_tests {
    use super::*;

    #[test]
    fn only_a_threshold_other_than_the_default_changes_the_version() {
        let mut spec = EnvoyConfigSpec {
            node_id: "gw".into(),
            ..Default::default()
        };
        let plain = spec.version();
        assert_eq!(spec.nack_threshold(), 1);
        spec.nack_threshold = Some(1);
        assert_eq!(spec.version(), plain);
        spec.nack_threshold = Some(3);
        let three = spec.version();
        assert_ne!(three, plain);
        assert_eq!(three.len(), plain.len());
        spec.nack_threshold = Some(4);
        assert_ne!(spec.version(), three);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["nackThreshold"], 4);
    }

    /// The revision the controller makes of a config carries the threshold to the loader.
    #[test]
    fn a_revision_carries_the_threshold_and_gives_it_back() {
        let spec = EnvoyConfigSpec {
            node_id: "gw".into(),
            nack_threshold: Some(5),
            ..Default::default()
        };
        let revision =
            crate::envoy_config_revision::EnvoyConfigRevisionSpec::of(&spec, &spec.version());
        assert_eq!(revision.nack_threshold, Some(5));
        assert_eq!(revision.config(), spec);
        let json = serde_json::to_value(&revision).unwrap();
        assert_eq!(json["nackThreshold"], 5);
    }
}
