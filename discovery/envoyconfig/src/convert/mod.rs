//! From an `EnvoyConfig` spec to Envoy v3 protobuf resources: every serialized value is
//! parsed into its message type (canonical proto3 JSON, YAML or base64 JSON, `Any` by
//! `@type`), checked, named and encoded once. All errors are collected, each naming its
//! field path from `spec`.

mod canonical;
mod direct;
mod endpoints;
mod entries;
mod error;
mod parse;
mod pgv;
pub(crate) mod pool;
mod recover;
mod resource;
mod secret;
mod sources;
mod typed;

use std::collections::HashMap;

use marin3r_api::{EnvoyApi, EnvoyConfigSpec, EnvoyResources, Serialization};
use marin3r_xds::resource::{Resource, ResourceType};

pub use endpoints::{EndpointsError, endpoints_from_slices};
pub use entries::{Entry, entries};
pub use error::{ConversionError, ValueError};
pub use parse::{is_v2_name, key_segment, value_of};
pub use pool::{PoolError, descriptor_pool};
pub use secret::{SecretError, generic_secret, tls_secret, validation_context_secret};
pub use sources::{
    EndpointSource, SecretBuild, SecretDataError, SecretSource, endpoint_sources, secret_resource,
    secret_sources,
};
pub use typed::typed_resources;

/// Validates a whole spec and converts its resources: the `envoyAPI` and `nodeID`, then
/// every resource of `envoyResources` as [`envoy_resources`] does and of `resources` as
/// [`typed_resources`] does (only one of the two may hold entries). Secrets and EndpointSlice
/// endpoints are built from Kubernetes objects: they are checked here (names, fields,
/// duplicates) and built by the revision controller ([`secret_sources`],
/// [`endpoint_sources`]).
pub fn validate_config(spec: &EnvoyConfigSpec) -> Result<Vec<Resource>, Vec<ConversionError>> {
    let mut errors = Vec::new();
    if spec.envoy_api == EnvoyApi::V2 {
        errors.push(ConversionError::new(
            "spec.envoyAPI",
            "Envoy's v2 API is not supported; use v3",
        ));
    }
    if spec.node_id.trim().is_empty() {
        errors.push(ConversionError::new("spec.nodeID", "must not be empty"));
    } else if let Some(why) = node_id_problem(&spec.node_id) {
        errors.push(ConversionError::new("spec.nodeID", why));
    }
    if !spec.envoy_resources.is_empty() && !spec.resources.is_empty() {
        errors.push(ConversionError::new(
            "spec",
            "spec.envoyResources and spec.resources are both set; use only one \
             (spec.resources replaces the deprecated spec.envoyResources)",
        ));
    }
    let mut out = Vec::new();
    for converted in [
        envoy_resources(&spec.envoy_resources, spec.serialization),
        typed_resources(&spec.resources),
    ] {
        match converted {
            Ok(resources) => out.extend(resources),
            Err(more) => errors.extend(more),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Why `node_id` cannot be a node id, if it cannot. It becomes the label value
/// `marin3r.3scale.net/node-id` (at most 63 characters) and the start of revision names
/// `<nodeID>-<version>` (a DNS-1123 subdomain: lowercase), so it must be both.
pub fn node_id_problem(node_id: &str) -> Option<String> {
    let ok = node_id.len() <= 63 && marin3r_certs::names::is_dns_subdomain(node_id);
    (!ok).then(|| {
        format!(
            "{node_id:?} is not a valid node id: use at most 63 lowercase letters, digits, '-' \
             and '.', starting and ending with a letter or digit (it becomes the label \
             marin3r.3scale.net/node-id and the revision name <nodeID>-<version>)"
        )
    })
}

/// Converts every serialized resource of `spec.envoyResources` (secrets excepted, see
/// [`validate_config`]) into encoded protobuf resources, in list order, or returns every
/// error found.
pub fn envoy_resources(
    resources: &EnvoyResources,
    serialization: Serialization,
) -> Result<Vec<Resource>, Vec<ConversionError>> {
    let mut errors = Vec::new();
    let mut out = Vec::with_capacity(resources.len());
    let pool = match descriptor_pool() {
        Ok(pool) => pool,
        Err(err) => return Err(vec![ConversionError::new("spec.envoyResources", err)]),
    };
    for (kind, list) in resources.serialized() {
        // Names seen so far in this list, with the index of their first entry.
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, entry) in list.iter().enumerate() {
            let at = format!("spec.envoyResources.{}[{i}]", kind.spec_field());
            let resource = match resource::resource(
                pool,
                kind,
                &entry.value,
                serialization,
                resource::Listing::ByType,
            ) {
                Ok(resource) => resource,
                Err(errs) => {
                    let path = format!("{at}.value");
                    errors.extend(
                        errs.into_iter()
                            .map(|e| ConversionError::in_value(path.clone(), e)),
                    );
                    continue;
                }
            };
            // A `name` that differs from the resource's own has no effect, as in the original
            // (its HEAD documents it so): a warning (`crate::warnings`), not a refusal.
            if let Some(&first) = seen.get(&resource.name) {
                errors.push(ConversionError::new(
                    at,
                    format!(
                        "duplicate name \"{}\" (also in {}[{first}])",
                        resource.name,
                        kind.spec_field()
                    ),
                ));
                continue;
            }
            seen.insert(resource.name.clone(), i);
            out.push(resource);
        }
    }
    check_secrets(resources, &mut errors);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn check_secrets(resources: &EnvoyResources, errors: &mut Vec<ConversionError>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, secret) in resources.secrets.iter().enumerate() {
        let at = format!("spec.envoyResources.secrets[{i}]");
        if secret.name.trim().is_empty() {
            errors.push(ConversionError::new(
                format!("{at}.name"),
                "must not be empty",
            ));
        } else if let Some(first) = seen.get(secret.name.as_str()) {
            errors.push(ConversionError::new(
                at.clone(),
                format!(
                    "duplicate name \"{}\" (also in secrets[{first}])",
                    secret.name
                ),
            ));
        } else {
            seen.insert(&secret.name, i);
        }
        // The Secret's name and namespace go into API paths: they must be object names.
        let name_at = if secret.secret_ref.is_some() {
            format!("{at}.ref.name")
        } else {
            format!("{at}.name")
        };
        if secret.secret_ref.is_some() && secret.secret_name().trim().is_empty() {
            errors.push(ConversionError::new(
                name_at,
                "must name a kubernetes.io/tls Secret",
            ));
        } else if let Some(why) = (!secret.secret_name().trim().is_empty())
            .then(|| marin3r_certs::names::object_name_problem(secret.secret_name()))
            .flatten()
        {
            errors.push(ConversionError::new(name_at, why));
        }
        if let Some(why) = secret
            .secret_namespace()
            .filter(|ns| !ns.is_empty())
            .and_then(marin3r_certs::names::namespace_name_problem)
        {
            errors.push(ConversionError::new(format!("{at}.ref.namespace"), why));
        }
    }
}

/// Parses one serialized value as a `kind` resource, checks it and encodes it. Errors are
/// relative to the value (field paths inside it): the first parse error, or every
/// validation rule the parsed resource breaks.
pub fn convert_value(
    kind: ResourceType,
    value: &str,
    serialization: Serialization,
) -> Result<Resource, Vec<ValueError>> {
    let pool = descriptor_pool().map_err(|e| vec![ValueError::whole(e.to_string())])?;
    resource::resource(pool, kind, value, serialization, resource::Listing::ByType)
}

#[cfg(test)]
mod envoy_agreement_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod typed_tests;

#[cfg(test)]
#[path = "recover_tests.rs"]
mod recover_tests;
