//! One serialized value made a resource: parsed into its message type, named, checked
//! against Envoy's validation rules and encoded canonically; or every problem it has, with a
//! hint when it holds another type's resource.

use std::sync::LazyLock;

use prost::Message as _;
use prost_reflect::{DynamicMessage, Value};

use super::pool::descriptor_pool;
use super::{ValueError, canonical, direct, parse, pgv, recover};
use marin3r_api::Serialization;
use marin3r_xds::resource::{Resource, ResourceType};

/// Where a value sits, for the hint when it holds another type's resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listing {
    /// In the list of `spec.envoyResources` for its type.
    ByType,
    /// In `spec.resources`, with a `type`.
    Typed,
}

/// Envoy's protoc-gen-validate rules, compiled lazily per message type.
static VALIDATOR: LazyLock<Option<pgv::Validator>> =
    LazyLock::new(|| descriptor_pool().ok().map(pgv::Validator::new));

pub(super) fn resource(
    pool: &prost_reflect::DescriptorPool,
    kind: ResourceType,
    value: &str,
    serialization: Serialization,
    listing: Listing,
) -> Result<Resource, Vec<ValueError>> {
    let desc = pool
        .get_message_by_name(kind.message_name())
        .ok_or_else(|| {
            vec![ValueError::whole(format!(
                "the descriptor set has no {}",
                kind.message_name()
            ))]
        })?;
    if let Some(resource) = direct(pool, kind, &desc, value, serialization) {
        return Ok(resource);
    }
    let message = match parse::parse(&desc, value, serialization) {
        Ok(message) => message,
        Err(err) => {
            let hinted = hint_other_type(pool, kind, value, serialization, listing, err.clone());
            // A value of another type (or in another serialization) is one problem: that.
            if hinted != err {
                return Err(vec![hinted]);
            }
            let check =
                |m: &DynamicMessage| VALIDATOR.as_ref().map_or_else(Vec::new, |v| v.check(m));
            return Err(recover::every_problem(
                &desc,
                value,
                serialization,
                err,
                check,
            ));
        }
    };
    let name = resource_name(kind, &message);
    if name.is_empty() {
        return Err(vec![ValueError::whole(format!(
            "the resource has no name: set `{}`",
            name_field(kind)
        ))]);
    }
    if let Some(validator) = VALIDATOR.as_ref() {
        let violations = validator.check(&message);
        if !violations.is_empty() {
            return Err(violations);
        }
    }
    let encoded = message.encode_to_vec();
    // Our own bytes always walk; should they not, they are still a correct encoding.
    let body = canonical::canonical(pool, &desc, &encoded).unwrap_or(encoded);
    Ok(Resource {
        kind,
        name,
        body: body.into(),
    })
}

/// The fast path of a JSON value (`direct`): the resource, when the fast path takes the value
/// and the message it makes is named and breaks no rule. Anything else goes the full way,
/// which finds every problem and words it.
fn direct(
    pool: &prost_reflect::DescriptorPool,
    kind: ResourceType,
    desc: &prost_reflect::MessageDescriptor,
    value: &str,
    serialization: Serialization,
) -> Option<Resource> {
    let body = match serialization {
        Serialization::Json => direct::encode(pool, desc, value)?,
        Serialization::B64json => direct::encode(pool, desc, &parse::b64_json(value).ok()?)?,
        Serialization::Yaml => direct::encode_yaml(pool, desc, value)?,
    };
    // Decoded only to name it and check it; `Any` payloads stay bytes until checked.
    let message = DynamicMessage::decode(desc.clone(), body.as_slice()).ok()?;
    let name = resource_name(kind, &message);
    let valid = VALIDATOR
        .as_ref()
        .is_none_or(|validator| validator.check(&message).is_empty());
    (!name.is_empty() && valid).then(|| Resource {
        kind,
        name,
        body: body.into(),
    })
}

/// The field that names a resource of `kind`.
fn name_field(kind: ResourceType) -> &'static str {
    match kind {
        ResourceType::Endpoint => "cluster_name",
        _ => "name",
    }
}

fn resource_name(kind: ResourceType, message: &DynamicMessage) -> String {
    match message.get_field_by_name(name_field(kind)).as_deref() {
        Some(Value::String(name)) => name.clone(),
        _ => String::new(),
    }
}

/// When a value does not parse as its list's type but parses as another resource type, the
/// user most likely put it in the wrong list: say so instead of listing an unknown field.
/// Likewise a YAML value in a `json` config. Only runs on the error path, so valid configs
/// pay nothing for it.
fn hint_other_type(
    pool: &prost_reflect::DescriptorPool,
    kind: ResourceType,
    value: &str,
    serialization: Serialization,
    listing: Listing,
    err: ValueError,
) -> ValueError {
    if serialization == Serialization::Json
        && err.path.is_empty()
        && let Some(desc) = pool.get_message_by_name(kind.message_name())
        && parse::parse(&desc, value, Serialization::Yaml).is_ok()
    {
        return ValueError::whole(format!(
            "the value is YAML, not JSON: set `spec.serialization: yaml` ({err})"
        ));
    }
    if !err.path.is_empty() || !err.message.starts_with("unknown field") {
        return err;
    }
    let fits = ResourceType::ALL
        .into_iter()
        .filter(|&other| other != kind)
        .find(|other| {
            pool.get_message_by_name(other.message_name())
                .is_some_and(|desc| parse::parse(&desc, value, serialization).is_ok())
        });
    match fits {
        Some(other) if listing == Listing::Typed => ValueError::whole(format!(
            "this is an {} resource, not {} as `type` says; set `type: {}` ({})",
            other.message_name(),
            kind.message_name(),
            marin3r_api::ResourceKind::of(other).as_str(),
            err.message
        )),
        Some(other) => ValueError::whole(format!(
            "this is an {} resource, which belongs in `{}`; `{}` holds {} resources ({})",
            other.message_name(),
            other.spec_field(),
            kind.spec_field(),
            kind.message_name(),
            err.message
        )),
        None => err,
    }
}
