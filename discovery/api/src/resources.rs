//! `spec.resources`, the original MARIN3R's API since v0.12: a flat list of typed entries,
//! each an inline Envoy resource (`value`) or one generated from Kubernetes objects (a TLS or
//! Opaque Secret, live EndpointSlices). Plain serde structs; the conversion is in `convert`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use marin3r_xds::resource::ResourceType;

/// One entry of `spec.resources`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// The Envoy resource type of this entry.
    #[serde(rename = "type")]
    pub kind: ResourceKind,
    /// The resource itself, inline, as Envoy's v3 API writes it (proto3 JSON field names,
    /// either `snake_case` or `lowerCamelCase`; `Any` by `@type`). Not for `secret`; for
    /// `endpoint` unless `generateFromEndpointSlices` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub value: Option<serde_json::Value>,
    /// For `secret`: the name of a `kubernetes.io/tls` Secret in the config's namespace; the
    /// SDS secret has the same name and is built as `blueprint` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_tls_secret: Option<String>,
    /// For `secret`: one key of a Secret in the config's namespace, served as an Envoy
    /// generic secret named `alias` (for filters such as OAuth2 or HMAC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_opaque_secret: Option<OpaqueSecretSource>,
    /// For `endpoint`: a `ClusterLoadAssignment` built from the EndpointSlices in the config's
    /// namespace that match `selector`, kept up to date as they change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate_from_endpoint_slices: Option<EndpointSlicesSource>,
    /// For `generateFromTlsSecret`: `tlsCertificate` (the default: `tls.crt` and `tls.key` as a
    /// certificate Envoy presents) or `validationContext` (`tls.crt` as the trusted CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blueprint: Option<Blueprint>,
}

/// `spec.resources[].type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ResourceKind {
    Listener,
    Route,
    ScopedRoute,
    Cluster,
    Endpoint,
    Secret,
    Runtime,
    ExtensionConfig,
}

impl ResourceKind {
    pub fn resource_type(self) -> ResourceType {
        match self {
            Self::Listener => ResourceType::Listener,
            Self::Route => ResourceType::Route,
            Self::ScopedRoute => ResourceType::ScopedRoute,
            Self::Cluster => ResourceType::Cluster,
            Self::Endpoint => ResourceType::Endpoint,
            Self::Secret => ResourceType::Secret,
            Self::Runtime => ResourceType::Runtime,
            Self::ExtensionConfig => ResourceType::ExtensionConfig,
        }
    }

    pub fn of(kind: ResourceType) -> Self {
        match kind {
            ResourceType::Listener => Self::Listener,
            ResourceType::Route => Self::Route,
            ResourceType::ScopedRoute => Self::ScopedRoute,
            ResourceType::Cluster => Self::Cluster,
            ResourceType::Endpoint => Self::Endpoint,
            ResourceType::Secret => Self::Secret,
            ResourceType::Runtime => Self::Runtime,
            ResourceType::ExtensionConfig => Self::ExtensionConfig,
        }
    }

    /// The name as written in a manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Listener => "listener",
            Self::Route => "route",
            Self::ScopedRoute => "scopedRoute",
            Self::Cluster => "cluster",
            Self::Endpoint => "endpoint",
            Self::Secret => "secret",
            Self::Runtime => "runtime",
            Self::ExtensionConfig => "extensionConfig",
        }
    }
}

/// For `generateFromTlsSecret`, what the SDS secret holds: `tlsCertificate` (the default:
/// `tls.crt` and `tls.key` as a certificate Envoy presents) or `validationContext` (`tls.crt`
/// as the CA Envoy validates peers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Blueprint {
    /// `tls.crt` and `tls.key` as a `tls_certificate`.
    #[default]
    TlsCertificate,
    /// `tls.crt` as the `trusted_ca` of a `validation_context`.
    ValidationContext,
}

/// `spec.resources[].generateFromOpaqueSecret`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct OpaqueSecretSource {
    /// The Secret's name, in the config's namespace.
    pub name: String,
    /// The key of the Secret's data to serve.
    pub key: String,
    /// The name of the SDS secret Envoy asks for.
    pub alias: String,
}

/// `spec.resources[].generateFromEndpointSlices`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlicesSource {
    /// Which EndpointSlices of the config's namespace to use, e.g.
    /// `matchLabels: {kubernetes.io/service-name: kuard}`.
    pub selector: LabelSelector,
    /// The `cluster_name` of the generated `ClusterLoadAssignment` (an EDS cluster's name).
    pub cluster_name: String,
    /// The name of the EndpointSlices' port to send traffic to.
    pub target_port: String,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions` are ANDed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels the EndpointSlices must have, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on the EndpointSlices' labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values for `In` and `NotIn`; empty for `Exists` and `DoesNotExist`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// The selector in the syntax of a list or watch `labelSelector` parameter, or why it is
    /// not a valid selector (with the field path inside the selector).
    pub fn to_query(&self) -> Result<String, (String, String)> {
        let mut parts: Vec<String> = self
            .match_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        for (i, e) in self.match_expressions.iter().enumerate() {
            let at = |field: &str| format!("matchExpressions[{i}].{field}");
            if e.key.trim().is_empty() {
                return Err((at("key"), "must not be empty".into()));
            }
            let values = || e.values.join(",");
            let part = match e.operator.as_str() {
                "In" | "NotIn" if e.values.is_empty() => {
                    return Err((
                        at("values"),
                        format!("must not be empty for {}", e.operator),
                    ));
                }
                "In" => format!("{} in ({})", e.key, values()),
                "NotIn" => format!("{} notin ({})", e.key, values()),
                "Exists" | "DoesNotExist" if !e.values.is_empty() => {
                    return Err((at("values"), format!("must be empty for {}", e.operator)));
                }
                "Exists" => e.key.clone(),
                "DoesNotExist" => format!("!{}", e.key),
                other => {
                    return Err((
                        at("operator"),
                        format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
                    ));
                }
            };
            parts.push(part);
        }
        Ok(parts.join(","))
    }

    /// Whether `labels` match, as the API server's selector would decide.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }

    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

/// An object whose fields are kept as written (the API server prunes nothing inside).
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}
