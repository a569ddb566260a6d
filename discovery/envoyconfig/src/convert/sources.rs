//! What a spec asks to build from Kubernetes objects when its revision is loaded: SDS
//! secrets from Secrets (`envoyResources.secrets`, `resources[].generateFromTlsSecret`,
//! `resources[].generateFromOpaqueSecret`) and endpoints from EndpointSlices
//! (`resources[].generateFromEndpointSlices`). Both spec forms end up here, so the revision
//! controller has one way to read and build them.

use std::collections::BTreeMap;

use marin3r_api::{Blueprint, EndpointSlicesSource, EnvoyResources, LabelSelector};
use marin3r_xds::resource::Resource;

/// One SDS secret to build from a Kubernetes Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSource {
    /// The spec field that names the Secret, for errors.
    pub path: String,
    /// The name Envoy asks SDS for.
    pub sds_name: String,
    /// The Kubernetes Secret.
    pub secret_name: String,
    /// Its namespace when the spec names one (only `envoyResources.secrets[].ref` can).
    pub namespace: Option<String>,
    pub build: SecretBuild,
}

/// How the SDS secret is made from the Secret's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretBuild {
    /// A `kubernetes.io/tls` Secret, by blueprint.
    Tls(Blueprint),
    /// One key of the Secret's data, as a generic secret.
    Key(String),
}

/// Every Secret a spec's `envoyResources` and `resources` (of an EnvoyConfig or a revision)
/// build an SDS secret from, in spec order.
pub fn secret_sources(
    envoy_resources: &EnvoyResources,
    resources: &[marin3r_api::Resource],
) -> Vec<SecretSource> {
    let legacy = envoy_resources
        .secrets
        .iter()
        .enumerate()
        .map(|(i, s)| SecretSource {
            path: format!(
                "spec.envoyResources.secrets[{i}].{}",
                if s.secret_ref.is_some() {
                    "ref"
                } else {
                    "name"
                }
            ),
            sds_name: s.name.clone(),
            secret_name: s.secret_name().to_owned(),
            namespace: s.secret_namespace().map(str::to_owned),
            build: SecretBuild::Tls(Blueprint::TlsCertificate),
        });
    let typed = resources.iter().enumerate().filter_map(|(i, r)| {
        if let Some(name) = &r.generate_from_tls_secret {
            return Some(SecretSource {
                path: format!("spec.resources[{i}].generateFromTlsSecret"),
                sds_name: name.clone(),
                secret_name: name.clone(),
                namespace: None,
                build: SecretBuild::Tls(r.blueprint.unwrap_or_default()),
            });
        }
        let opaque = r.generate_from_opaque_secret.as_ref()?;
        Some(SecretSource {
            path: format!("spec.resources[{i}].generateFromOpaqueSecret"),
            sds_name: opaque.alias.clone(),
            secret_name: opaque.name.clone(),
            namespace: None,
            build: SecretBuild::Key(opaque.key.clone()),
        })
    });
    legacy.chain(typed).collect()
}

/// Why a Kubernetes Secret's data cannot become the SDS secret a config asks of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretDataError {
    #[error("its type is {0:?}, not kubernetes.io/tls")]
    NotTls(String),
    #[error("it cannot be served")]
    Unusable(#[source] super::SecretError),
    #[error("it has no key {key:?} (it has: {present})")]
    NoKey { key: String, present: String },
}

/// Builds the SDS secret of `source` from the Secret's type and data, or says why it
/// cannot (without the path: the caller knows where the source came from).
pub fn secret_resource(
    source: &SecretSource,
    secret_type: Option<&str>,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Resource, SecretDataError> {
    let field = |k: &str| data.get(k).map(Vec::as_slice).unwrap_or_default();
    match &source.build {
        SecretBuild::Tls(blueprint) => {
            if secret_type != Some("kubernetes.io/tls") {
                return Err(SecretDataError::NotTls(
                    secret_type.unwrap_or("Opaque").to_owned(),
                ));
            }
            match blueprint {
                Blueprint::TlsCertificate => {
                    super::tls_secret(&source.sds_name, field("tls.crt"), field("tls.key"))
                }
                Blueprint::ValidationContext => {
                    super::validation_context_secret(&source.sds_name, field("tls.crt"))
                }
            }
            .map_err(SecretDataError::Unusable)
        }
        SecretBuild::Key(key) => match data.get(key) {
            Some(value) => Ok(super::generic_secret(&source.sds_name, value)),
            None => Err(SecretDataError::NoKey {
                key: key.clone(),
                present: if data.is_empty() {
                    "none".to_owned()
                } else {
                    data.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            }),
        },
    }
}

/// One `ClusterLoadAssignment` to build from EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSource {
    /// `spec.resources[i].generateFromEndpointSlices`, for errors.
    pub path: String,
    pub selector: LabelSelector,
    pub cluster_name: String,
    pub target_port: String,
}

/// Every EndpointSlice-generated endpoint of a spec's `resources`, in spec order.
pub fn endpoint_sources(resources: &[marin3r_api::Resource]) -> Vec<EndpointSource> {
    resources
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let EndpointSlicesSource {
                selector,
                cluster_name,
                target_port,
            } = r.generate_from_endpoint_slices.as_ref()?;
            Some(EndpointSource {
                path: format!("spec.resources[{i}].generateFromEndpointSlices"),
                selector: selector.clone(),
                cluster_name: cluster_name.clone(),
                target_port: target_port.clone(),
            })
        })
        .collect()
}
