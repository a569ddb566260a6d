//! A spec's resources as the user wrote them, each with its field path, parsed into JSON but
//! not converted: what Envoy judges (`judge`) and the warnings read (`warnings`).

use serde_json::Value;

use super::ConversionError;
use marin3r_api::EnvoyConfigSpec;
use marin3r_xds::resource::ResourceType;

/// One resource as the user wrote it, and where.
#[derive(Debug, Clone)]
pub struct Entry {
    /// `spec.resources[3].value`, `spec.envoyResources.listeners[0].value`.
    pub path: String,
    pub kind: ResourceType,
    pub value: Value,
}

/// The entries of `spec`, as the user wrote them: `envoyResources` first, in the order
/// `EnvoyResources::serialized` lists them, then `resources`; or the first value that does
/// not parse.
pub fn entries(spec: &EnvoyConfigSpec) -> Result<Vec<Entry>, ConversionError> {
    let mut out = Vec::new();
    for (kind, list) in spec.envoy_resources.serialized() {
        for (i, entry) in list.iter().enumerate() {
            let path = format!("spec.envoyResources.{}[{i}].value", kind.spec_field());
            let value = super::value_of(&entry.value, spec.serialization)
                .map_err(|e| ConversionError::new(&path, e))?;
            out.push(Entry { path, kind, value });
        }
    }
    for (i, r) in spec.resources.iter().enumerate() {
        if let Some(value) = &r.value {
            out.push(Entry {
                path: format!("spec.resources[{i}].value"),
                kind: r.kind.resource_type(),
                value: value.clone(),
            });
        }
    }
    Ok(out)
}
