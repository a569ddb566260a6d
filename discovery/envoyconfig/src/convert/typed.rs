//! `spec.resources`: checks every entry against the rules of its `type` (which fields it may
//! and must set) and converts inline `value`s through the same parser, validator and encoder
//! as `envoyResources`. Entries generated from Kubernetes objects are checked here and built
//! when a revision is loaded ([`super::sources`]).

use std::collections::HashMap;

use marin3r_api::{Resource as Entry, ResourceKind};
use marin3r_xds::resource::{Resource, ResourceType};

use super::{ConversionError, ValueError, descriptor_pool};

/// Converts the inline values of `spec.resources` in list order, or returns every error
/// found, each at `spec.resources[i]...`.
pub fn typed_resources(entries: &[Entry]) -> Result<Vec<Resource>, Vec<ConversionError>> {
    let mut errors = Vec::new();
    let mut out = Vec::new();
    let pool = match descriptor_pool() {
        Ok(pool) => pool,
        Err(err) => return Err(vec![ConversionError::new("spec.resources", err)]),
    };
    // (type, name) of every resource the list declares, with the index of its first entry.
    let mut seen: HashMap<(ResourceType, String), usize> = HashMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("spec.resources[{i}]");
        let before = errors.len();
        check_fields(entry, &at, &mut errors);
        if errors.len() > before {
            continue;
        }
        let kind = entry.kind.resource_type();
        let name = match (&entry.value, generated_name(entry)) {
            (Some(value), _) => match convert(pool, entry.kind, value) {
                Ok(resource) => {
                    let name = resource.name.clone();
                    out.push(resource);
                    name
                }
                Err(errs) => {
                    let path = format!("{at}.value");
                    errors.extend(
                        errs.into_iter()
                            .map(|e| ConversionError::in_value(path.clone(), e)),
                    );
                    continue;
                }
            },
            (None, Some(name)) => name,
            (None, None) => continue,
        };
        match seen.get(&(kind, name.clone())) {
            Some(first) => errors.push(ConversionError::new(
                at,
                format!(
                    "duplicate {} name \"{name}\" (also in spec.resources[{first}])",
                    entry.kind.as_str()
                ),
            )),
            None => {
                seen.insert((kind, name), i);
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The name Envoy will know a generated resource by.
fn generated_name(entry: &Entry) -> Option<String> {
    if let Some(tls) = &entry.generate_from_tls_secret {
        return Some(tls.clone());
    }
    if let Some(opaque) = &entry.generate_from_opaque_secret {
        return Some(opaque.alias.clone());
    }
    entry
        .generate_from_endpoint_slices
        .as_ref()
        .map(|e| e.cluster_name.clone())
}

/// The fields an entry of its type may and must set, as the original MARIN3R's webhook
/// checks them, plus the names and selectors that go into API requests.
fn check_fields(entry: &Entry, at: &str, errors: &mut Vec<ConversionError>) {
    check_misplaced(entry, at, errors);
    match entry.kind {
        ResourceKind::Secret => check_secret(entry, at, errors),
        ResourceKind::Endpoint => check_endpoint(entry, at, errors),
        _ => {
            if entry.value.is_none() {
                let why = format!("must be set for type {}", entry.kind.as_str());
                refuse(errors, at, "value", why);
            }
        }
    }
}

fn refuse(errors: &mut Vec<ConversionError>, at: &str, field: &str, why: String) {
    errors.push(ConversionError::new(format!("{at}.{field}"), why));
}

/// Fields set on an entry of a type they do not belong to.
fn check_misplaced(entry: &Entry, at: &str, errors: &mut Vec<ConversionError>) {
    let kind = entry.kind.as_str();
    let only_for = |other: &str| format!("only allowed for type {other}, not {kind}");
    let is_secret = entry.kind == ResourceKind::Secret;
    if !is_secret {
        if entry.generate_from_tls_secret.is_some() {
            refuse(errors, at, "generateFromTlsSecret", only_for("secret"));
        }
        if entry.generate_from_opaque_secret.is_some() {
            refuse(errors, at, "generateFromOpaqueSecret", only_for("secret"));
        }
    }
    if entry.blueprint.is_some() && entry.generate_from_tls_secret.is_none() && is_secret {
        let why = "only allowed with generateFromTlsSecret".to_owned();
        refuse(errors, at, "blueprint", why);
    } else if entry.blueprint.is_some() && !is_secret {
        refuse(errors, at, "blueprint", only_for("secret"));
    }
    if entry.kind != ResourceKind::Endpoint && entry.generate_from_endpoint_slices.is_some() {
        refuse(
            errors,
            at,
            "generateFromEndpointSlices",
            only_for("endpoint"),
        );
    }
}

/// A secret is generated from one Kubernetes Secret, TLS or opaque, never given inline.
fn check_secret(entry: &Entry, at: &str, errors: &mut Vec<ConversionError>) {
    if entry.value.is_some() {
        let why = "not allowed for type secret: a secret is generated from a Kubernetes \
                   Secret with generateFromTlsSecret or generateFromOpaqueSecret";
        refuse(errors, at, "value", why.to_owned());
    }
    match (
        &entry.generate_from_tls_secret,
        &entry.generate_from_opaque_secret,
    ) {
        (None, None) => errors.push(ConversionError::new(
            at,
            "type secret needs generateFromTlsSecret or generateFromOpaqueSecret",
        )),
        (Some(_), Some(_)) => errors.push(ConversionError::new(
            at,
            "generateFromTlsSecret and generateFromOpaqueSecret are both set; use one",
        )),
        (Some(name), None) => {
            if let Some(why) = secret_name_problem(name) {
                refuse(errors, at, "generateFromTlsSecret", why);
            }
        }
        (None, Some(opaque)) => {
            if let Some(why) = secret_name_problem(&opaque.name) {
                refuse(errors, at, "generateFromOpaqueSecret.name", why);
            }
            if let Some(why) = secret_key_problem(&opaque.key) {
                refuse(errors, at, "generateFromOpaqueSecret.key", why);
            }
            if opaque.alias.trim().is_empty() {
                let why = "must not be empty: it is the name Envoy asks SDS for";
                refuse(errors, at, "generateFromOpaqueSecret.alias", why.to_owned());
            }
        }
    }
}

/// Endpoints are given inline or generated from the EndpointSlices a selector picks.
fn check_endpoint(entry: &Entry, at: &str, errors: &mut Vec<ConversionError>) {
    match (&entry.value, &entry.generate_from_endpoint_slices) {
        (None, None) => errors.push(ConversionError::new(
            at,
            "type endpoint needs value or generateFromEndpointSlices",
        )),
        (Some(_), Some(_)) => errors.push(ConversionError::new(
            at,
            "value and generateFromEndpointSlices are both set; use one",
        )),
        (None, Some(slices)) => {
            let field = "generateFromEndpointSlices";
            if slices.selector.is_empty() {
                let why = "must not be empty: it would select every EndpointSlice of the \
                           namespace";
                refuse(errors, at, &format!("{field}.selector"), why.to_owned());
            } else if let Err((path, why)) = slices.selector.to_query() {
                refuse(errors, at, &format!("{field}.selector.{path}"), why);
            }
            if slices.cluster_name.trim().is_empty() {
                let why = "must not be empty: it names the EDS cluster".to_owned();
                refuse(errors, at, &format!("{field}.clusterName"), why);
            }
            if slices.target_port.trim().is_empty() {
                let why = "must not be empty: it names the EndpointSlices' port".to_owned();
                refuse(errors, at, &format!("{field}.targetPort"), why);
            }
        }
        (Some(_), None) => {}
    }
}

fn secret_name_problem(name: &str) -> Option<String> {
    if name.trim().is_empty() {
        return Some("must name a Secret in the config's namespace".to_owned());
    }
    marin3r_certs::names::object_name_problem(name)
}

/// A Secret data key is made of alphanumerics, `-`, `_` and `.` (Kubernetes' rule).
fn secret_key_problem(key: &str) -> Option<String> {
    let ok = !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    (!ok).then(|| format!("{key:?} is not a Secret key: use letters, digits, '-', '_' and '.'"))
}

fn convert(
    pool: &prost_reflect::DescriptorPool,
    kind: ResourceKind,
    value: &serde_json::Value,
) -> Result<Resource, Vec<ValueError>> {
    if !value.is_object() {
        return Err(vec![ValueError::whole(format!(
            "must be an object (the {} resource itself), not {}",
            kind.resource_type().message_name(),
            json_kind(value)
        ))]);
    }
    let json = serde_json::to_string(value)
        .map_err(|e| vec![ValueError::whole(format!("cannot be read as JSON: {e}"))])?;
    super::resource::resource(
        pool,
        kind.resource_type(),
        &json,
        marin3r_api::Serialization::Json,
        super::resource::Listing::Typed,
    )
    // Positions are in our own re-serialized text, not the user's: they would mislead.
    .map_err(|errs| {
        errs.into_iter()
            .map(|mut e| {
                e.location = None;
                e
            })
            .collect()
    })
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}
