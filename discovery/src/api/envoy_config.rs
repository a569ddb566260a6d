//! The `EnvoyConfig` spec (`marin3r.3scale.net/v1alpha1`): the Envoy resources a user declares
//! for one node id, with the field names of the original MARIN3R manifests. Plain serde
//! structs, so the CRD derive can be added on top without reshaping them.

use serde::{Deserialize, Serialize};

/// `spec` of an `EnvoyConfig` (and, with a version, of an `EnvoyConfigRevision`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvoyConfigSpec {
    /// The Envoy `node.id` this configuration is served to.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// How every `value` in `envoyResources` is written.
    #[serde(default)]
    pub serialization: Serialization,
    /// The xDS API version. Only `v3` is served; `v2` parses so that validation can say why it
    /// is refused instead of a bare "unknown variant".
    #[serde(default, rename = "envoyAPI")]
    pub envoy_api: EnvoyApi,
    /// The resources, by type.
    #[serde(default)]
    pub envoy_resources: EnvoyResources,
}

/// The encoding of each resource `value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvoyApi {
    /// Removed from Envoy; always rejected by validation.
    V2,
    #[default]
    V3,
}

/// `spec.envoyResources`: one list per Envoy resource type.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnvoyResources {
    /// `ClusterLoadAssignment`s, named by their `cluster_name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<EnvoyResource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<EnvoyResource>,
    /// `RouteConfiguration`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<EnvoyResource>,
    /// `ScopedRouteConfiguration`s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped_routes: Vec<EnvoyResource>,
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
    /// Every list of serialized resources with the type it must hold (secrets are references,
    /// not serialized values, and are not among them).
    pub fn serialized(&self) -> [(crate::resource::ResourceType, &[EnvoyResource]); 7] {
        use crate::resource::ResourceType as T;
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
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoyResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One resource, written in the config's `serialization`.
    pub value: String,
}

/// An SDS secret served under `name`, read from a `kubernetes.io/tls` Secret.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvoySecretResource {
    /// The name Envoy asks for (`tls_certificate_sds_secret_configs[].name`).
    pub name: String,
    /// The Kubernetes Secret holding `tls.crt` and `tls.key`.
    #[serde(rename = "ref")]
    pub secret_ref: SecretReference,
}

/// A Kubernetes Secret by name; the namespace defaults to the config's own.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretReference {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}
