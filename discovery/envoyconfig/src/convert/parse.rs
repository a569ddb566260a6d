//! Parsing one serialized value straight into a protobuf message descriptor. The text is
//! deserialized by the message descriptor itself (no intermediate JSON value), wrapped in
//! `serde_path_to_error`, so an error knows both its field path and its line and column.

use base64::Engine as _;
use prost_reflect::{DeserializeOptions, DynamicMessage, Kind, MessageDescriptor};

use super::ValueError;
use marin3r_api::Serialization;

/// The type URL an empty `Any` (`{}`) is parsed as, and written back as an empty `Any` by the
/// canonical encoder: what Envoy's own JSON parser makes of `{}` (a route's
/// `typed_per_filter_config` entry `{"@type": ".../FilterConfig", "config": {}}` enables a
/// filter the listener disabled this way).
pub const EMPTY_ANY_URL: &str = "type.googleapis.com/marin3r.internal.EmptyAny";

/// One step of a path inside a value, as the parser reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    Key(String),
    Index(usize),
}

/// Parses `text` as one `desc` message written in `serialization`.
pub fn parse(
    desc: &MessageDescriptor,
    text: &str,
    serialization: Serialization,
) -> Result<DynamicMessage, ValueError> {
    match parse_streaming(desc, text, serialization) {
        // What Envoy's own parser takes beyond strict proto3 JSON (an `Any` written `{}`, an
        // enum value in another case, a single object for a one-element list): once more
        // through a value written the strict way. When that fails too, the first error is the
        // one to report: it knows its line.
        Err(first) => parse_like_envoy(desc, text, serialization).map_err(|_| first),
        ok => ok,
    }
}

fn parse_streaming(
    desc: &MessageDescriptor,
    text: &str,
    serialization: Serialization,
) -> Result<DynamicMessage, ValueError> {
    if text.trim().is_empty() {
        return Err(ValueError::whole("the value is empty"));
    }
    match serialization {
        Serialization::Json => parse_json(desc, text),
        Serialization::Yaml => parse_yaml(desc, text),
        Serialization::B64json => parse_json(desc, &b64_json(text).map_err(ValueError::whole)?),
    }
}

/// The JSON text a `b64json` value holds.
pub(super) fn b64_json(text: &str) -> Result<String, String> {
    // Manifests often wrap long base64 strings; whitespace is not part of the data.
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| format!("invalid base64: {e}"))?;
    String::from_utf8(bytes)
        .map_err(|_| "the base64 value does not decode to UTF-8 JSON text".to_owned())
}

/// A serialized value as a JSON value, as written (no descriptor, no checks).
pub fn value_of(text: &str, serialization: Serialization) -> Result<serde_json::Value, String> {
    match serialization {
        Serialization::Yaml => serde_saphyr::from_str(text).map_err(|e| e.to_string()),
        Serialization::Json => serde_json::from_str(text).map_err(|e| e.to_string()),
        Serialization::B64json => serde_json::from_str(&b64_json(text)?).map_err(|e| e.to_string()),
    }
}

fn parse_like_envoy(
    desc: &MessageDescriptor,
    text: &str,
    serialization: Serialization,
) -> Result<DynamicMessage, ValueError> {
    let mut value = value_of(text, serialization).map_err(ValueError::whole)?;
    normalize(desc, &mut value);
    let mut track = serde_path_to_error::Track::new();
    DynamicMessage::deserialize_with_options(
        desc.clone(),
        serde_path_to_error::Deserializer::new(value, &mut track),
        &options(),
    )
    .map_err(|err| value_error(text, path_text(&track.path()), &err.to_string(), None))
}

/// Parses `value` (already [`normalize`]d) as a `desc` message; on error, the steps to the
/// field it is about and the error (its path left empty, for the caller to write).
pub(super) fn parse_value(
    desc: &MessageDescriptor,
    value: &serde_json::Value,
) -> Result<DynamicMessage, (Vec<Step>, ValueError)> {
    use serde_path_to_error::Segment;
    let mut track = serde_path_to_error::Track::new();
    DynamicMessage::deserialize_with_options(
        desc.clone(),
        serde_path_to_error::Deserializer::new(value, &mut track),
        &options(),
    )
    .map_err(|err| {
        let steps = track
            .path()
            .iter()
            .filter_map(|segment| match segment {
                Segment::Seq { index } => Some(Step::Index(*index)),
                Segment::Map { key } | Segment::Enum { variant: key } => {
                    Some(Step::Key(key.clone()))
                }
                Segment::Unknown => None,
            })
            .collect();
        (
            steps,
            value_error("", String::new(), &err.to_string(), None),
        )
    })
}

/// Rewrites `value` (a `desc` message) the strict way where Envoy's parser is lenient: every
/// empty object standing for an `Any` gets the placeholder type, every enum value written in
/// another case its declared name, every single object given for a repeated message field a
/// list around it; following the fields (by proto or JSON name), lists, maps and typed `Any`
/// payloads.
pub(super) fn normalize(desc: &MessageDescriptor, value: &mut serde_json::Value) {
    let Some(map) = value.as_object_mut() else {
        return;
    };
    if desc.full_name() == "google.protobuf.Any" {
        if map.is_empty() {
            map.insert("@type".into(), EMPTY_ANY_URL.into());
            return;
        }
        let inner = map
            .get("@type")
            .and_then(serde_json::Value::as_str)
            .and_then(|url| url.rsplit('/').next())
            .and_then(|name| desc.parent_pool().get_message_by_name(name));
        // Well-known types carry their JSON under "value"; they hold no Any to mark.
        if let Some(inner) = inner.filter(|d| !d.full_name().starts_with("google.protobuf.")) {
            normalize_fields(&inner, map);
        }
        return;
    }
    // Well-known types have JSON forms of their own (a Struct is any object).
    if desc.full_name().starts_with("google.protobuf.") {
        return;
    }
    normalize_fields(desc, map);
}

fn normalize_fields(
    desc: &MessageDescriptor,
    map: &mut serde_json::Map<String, serde_json::Value>,
) {
    for (key, child) in map.iter_mut() {
        let Some(field) = desc
            .get_field_by_name(key)
            .or_else(|| desc.get_field_by_json_name(key))
        else {
            continue;
        };
        match field.kind() {
            Kind::Enum(e) => {
                let fix = |v: &mut serde_json::Value| {
                    if let Some(name) = v.as_str()
                        && e.get_value_by_name(name).is_none()
                        && let Some(declared) =
                            e.values().find(|d| d.name().eq_ignore_ascii_case(name))
                    {
                        *v = declared.name().into();
                    }
                };
                match child.as_array_mut() {
                    Some(items) if field.is_list() => items.iter_mut().for_each(fix),
                    _ => fix(child),
                }
            }
            Kind::Message(sub) if field.is_map() => {
                let Kind::Message(entry_value) = sub.map_entry_value_field().kind() else {
                    continue;
                };
                for v in child
                    .as_object_mut()
                    .into_iter()
                    .flat_map(|m| m.values_mut())
                {
                    normalize(&entry_value, v);
                }
            }
            Kind::Message(sub) if field.is_list() => {
                if child.is_object() {
                    *child = serde_json::Value::Array(vec![child.take()]);
                }
                for item in child.as_array_mut().into_iter().flatten() {
                    normalize(&sub, item);
                }
            }
            Kind::Message(sub) => normalize(&sub, child),
            _ => {}
        }
    }
}

/// A field path as users read it: `a.b[0].c`, with a map key that holds a dot (or anything
/// but letters, digits, `_` and `-`) quoted, `typed_per_filter_config["envoy.filters.http.buffer"]`,
/// so the path stays unambiguous.
fn path_text(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push_str(&key_segment(key, out.is_empty()));
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    if out.is_empty() { ".".to_owned() } else { out }
}

/// `.key`, or `["key"]` when the key is not a plain identifier; no dot at the start.
pub fn key_segment(key: &str, first: bool) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (plain, first) {
        (true, true) => key.to_owned(),
        (true, false) => format!(".{key}"),
        (false, _) => format!("[{key:?}]"),
    }
}

fn options() -> DeserializeOptions {
    DeserializeOptions::new().deny_unknown_fields(true)
}

/// Parses `text` without tracking the field path: what almost every value takes. Only when it
/// fails is the value parsed again with tracking, for the error's path (the parse is
/// deterministic, so the error is the one the tracked parse alone would give); the tracking
/// costs an allocation per key, a third of the parse.
fn parse_json(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, ValueError> {
    let mut de = serde_json::Deserializer::from_str(text);
    DynamicMessage::deserialize_with_options(desc.clone(), &mut de, &options())
        .and_then(|msg| de.end().map(|()| msg))
        .or_else(|_| parse_json_tracked(desc, text))
}

fn parse_json_tracked(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, ValueError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let mut track = serde_path_to_error::Track::new();
    let result = DynamicMessage::deserialize_with_options(
        desc.clone(),
        serde_path_to_error::Deserializer::new(&mut de, &mut track),
        &options(),
    )
    .and_then(|msg| de.end().map(|()| msg));
    result.map_err(|err| {
        let location = (err.line() > 0).then(|| (err.line() as u64, err.column() as u64));
        value_error(text, path_text(&track.path()), &err.to_string(), location)
    })
}

/// As [`parse_json`]: untracked first, tracked again only for an error.
fn parse_yaml(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, ValueError> {
    serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |de| {
        DynamicMessage::deserialize_with_options(desc.clone(), de, &options())
    })
    .or_else(|_| parse_yaml_tracked(desc, text))
}

pub(super) fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! { with_snippet: false }
}

fn parse_yaml_tracked(desc: &MessageDescriptor, text: &str) -> Result<DynamicMessage, ValueError> {
    let mut path = None;
    let yaml_options = yaml_options();
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options, |de| {
        let mut track = serde_path_to_error::Track::new();
        let result = DynamicMessage::deserialize_with_options(
            desc.clone(),
            serde_path_to_error::Deserializer::new(de, &mut track),
            &options(),
        );
        if result.is_err() {
            path = Some(path_text(&track.path()));
        }
        result
    });
    result.map_err(|err| {
        let err = err.without_snippet();
        let location = err
            .location()
            .filter(|l| l.line() > 0)
            .map(|l| (l.line(), l.column()));
        let message = match err {
            serde_saphyr::Error::Message { msg, .. } => msg.clone(),
            other => other.to_string(),
        };
        value_error(text, path.unwrap_or_default(), &message, location)
    })
}

/// Builds the error, rewording the deserializer's messages into the ones users read in
/// Kubernetes conditions and `marin3r validate`.
fn value_error(
    text: &str,
    path: String,
    message: &str,
    location: Option<(u64, u64)>,
) -> ValueError {
    // serde_path_to_error renders the root as "." and an unknown position as "?".
    let path = if path == "." || path == "?" {
        String::new()
    } else {
        path
    };
    // Both parsers append the location to their message; it is reported separately.
    let message = match message.rfind(" at line ") {
        Some(at) if location.is_some() => &message[..at],
        _ => message,
    };
    let message = reword(message);
    let location = unknown_field_location(text, &message, location).or(location);
    ValueError {
        path,
        message,
        location,
    }
}

/// The key an `unknown field "key"` error (as [`reword`] words it) is about.
pub(super) fn unknown_field(message: &str) -> Option<&str> {
    message.strip_prefix("unknown field \"")?.strip_suffix('"')
}

/// The parsers place an unknown-field error at the enclosing map (or nowhere, at the root);
/// the offending key is the first occurrence of `key:` from there on, which is what a user
/// wants to be pointed at.
fn unknown_field_location(
    text: &str,
    message: &str,
    near: Option<(u64, u64)>,
) -> Option<(u64, u64)> {
    let key = unknown_field(message)?;
    let first_line = near.map_or(1, |(line, _)| line);
    text.lines()
        .enumerate()
        .skip(usize::try_from(first_line).ok()?.saturating_sub(1))
        .find_map(|(i, line)| {
            [
                format!("{key}:"),
                format!("\"{key}\":"),
                format!("'{key}':"),
            ]
            .iter()
            .find_map(|pattern| line.find(pattern.as_str()))
            .map(|col| (i as u64 + 1, col as u64 + 1))
        })
}

fn reword(message: &str) -> String {
    if let Some(name) = quoted_after(message, "unrecognized field name '") {
        return format!("unknown field \"{name}\"");
    }
    if let Some(value) = quoted_after(message, "unrecognized enum value '") {
        return format!("unknown enum value \"{value}\"");
    }
    if let Some(name) = quoted_after(message, "message '")
        && message.ends_with("' not found")
    {
        return if is_v2_name(name) {
            format!("Envoy's v2 API is not supported; use v3 (\"@type\" names {name})")
        } else {
            format!("unknown \"@type\": no Envoy v3 message is named {name}")
        };
    }
    // The YAML parser's advice is for programmers (a parser option), not for users.
    if let Some(key) = message.strip_prefix("duplicate mapping key: ") {
        let key = key.split(", set DuplicateKeyPolicy").next().unwrap_or(key);
        return format!("duplicate key \"{key}\"");
    }
    // prost-reflect's words for a Duration it cannot read say nothing of the format.
    if message == "failed to parse duration" {
        return "expected a duration in seconds ending in 's', such as \"0.25s\" or \"5s\" \
                (Go-style units such as \"250ms\" are not protobuf JSON; Envoy refuses them too)"
            .to_owned();
    }
    if message == "invalid digit found in string" {
        return "expected an integer".to_owned();
    }
    message.to_owned()
}

/// The text between `prefix` and the next `'`, if `message` starts with `prefix`.
fn quoted_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(prefix)?;
    Some(rest.split('\'').next().unwrap_or(rest))
}

/// Whether a message name belongs to Envoy's removed v2 API (`envoy.api.v2.Listener`,
/// `envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager`, and the
/// `v2alpha` packages).
pub fn is_v2_name(name: &str) -> bool {
    name.starts_with("envoy.") && name.split('.').any(|part| part.starts_with("v2"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_names_are_recognised() {
        assert!(is_v2_name("envoy.api.v2.Listener"));
        assert!(is_v2_name(
            "envoy.config.filter.network.http_connection_manager.v2.HttpConnectionManager"
        ));
        assert!(is_v2_name(
            "envoy.config.filter.http.jwt_authn.v2alpha.JwtAuthentication"
        ));
        assert!(!is_v2_name("envoy.config.listener.v3.Listener"));
        assert!(!is_v2_name("google.protobuf.v2.Thing"));
    }

    #[test]
    fn map_keys_with_dots_are_quoted_in_paths() {
        assert_eq!(key_segment("routes", true), "routes");
        assert_eq!(key_segment("routes", false), ".routes");
        assert_eq!(
            key_segment("envoy.filters.http.buffer", false),
            "[\"envoy.filters.http.buffer\"]"
        );
        assert_eq!(key_segment("a key", true), "[\"a key\"]");
    }

    #[test]
    fn deserializer_messages_are_reworded() {
        assert_eq!(
            reword("unrecognized field name 'stat_prefx'"),
            "unknown field \"stat_prefx\""
        );
        assert_eq!(
            reword("message 'envoy.api.v2.Cluster' not found"),
            "Envoy's v2 API is not supported; use v3 (\"@type\" names envoy.api.v2.Cluster)"
        );
        assert_eq!(reword("something else"), "something else");
    }
}
