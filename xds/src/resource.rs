//! The Envoy v3 resource types marin3r serves, and a resource as the xDS cache holds it:
//! encoded to protobuf once, then shared by every stream that sends it.

use std::fmt;

use bytes::Bytes;

/// A kind of Envoy resource, as listed in an `EnvoyConfig`'s `spec.envoyResources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Endpoint,
    Cluster,
    Route,
    ScopedRoute,
    Listener,
    Secret,
    Runtime,
    ExtensionConfig,
}

impl ResourceType {
    pub const ALL: [ResourceType; 8] = [
        Self::Endpoint,
        Self::Cluster,
        Self::Route,
        Self::ScopedRoute,
        Self::Listener,
        Self::Secret,
        Self::Runtime,
        Self::ExtensionConfig,
    ];

    /// The v3 type URL Envoy subscribes with.
    pub fn type_url(self) -> &'static str {
        match self {
            Self::Endpoint => "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            Self::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            Self::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            Self::ScopedRoute => {
                "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration"
            }
            Self::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            Self::Secret => "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            Self::Runtime => "type.googleapis.com/envoy.service.runtime.v3.Runtime",
            Self::ExtensionConfig => {
                "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
            }
        }
    }

    /// The fully qualified protobuf message name (the type URL without its prefix).
    pub fn message_name(self) -> &'static str {
        self.type_url()
            .strip_prefix("type.googleapis.com/")
            .unwrap_or(self.type_url())
    }

    pub fn from_type_url(type_url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == type_url)
    }

    /// The type whose [`Self::spec_field`] is `field`.
    pub fn from_spec_field(field: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.spec_field() == field)
    }

    /// The list in `spec.envoyResources` that holds this type (as in error paths).
    pub fn spec_field(self) -> &'static str {
        match self {
            Self::Endpoint => "endpoints",
            Self::Cluster => "clusters",
            Self::Route => "routes",
            Self::ScopedRoute => "scopedRoutes",
            Self::Listener => "listeners",
            Self::Secret => "secrets",
            Self::Runtime => "runtimes",
            Self::ExtensionConfig => "extensionConfigs",
        }
    }
}

impl ResourceType {
    /// Its `resource_type` label value in the metrics: [`Self::spec_field`] in lowercase
    /// snake_case, as Prometheus label values are (`scoped_routes`, `extension_configs`).
    pub fn label(self) -> &'static str {
        match self {
            Self::ScopedRoute => "scoped_routes",
            Self::ExtensionConfig => "extension_configs",
            other => other.spec_field(),
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec_field())
    }
}

/// One named Envoy resource, encoded to protobuf bytes (the message itself, not an `Any`).
/// Cloning is cheap: the bytes are shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub kind: ResourceType,
    pub name: String,
    pub body: Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_urls_round_trip() {
        for t in ResourceType::ALL {
            assert_eq!(ResourceType::from_type_url(t.type_url()), Some(t));
            assert!(t.message_name().starts_with("envoy."));
        }
        assert_eq!(
            ResourceType::from_type_url("type.googleapis.com/envoy.api.v2.Listener"),
            None
        );
    }
}
