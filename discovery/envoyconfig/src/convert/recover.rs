//! Every problem of one value, not only the first: the parser stops at its first error, so
//! the field it names is taken out of the value and the rest parsed again, up to
//! [`MAX_PROBLEMS`]; then Envoy's declared rules are checked on what parsed. And every path
//! in one casing: the proto field names (`socket_address`), whichever of the two JSON names
//! the user wrote (`socketAddress`), as Envoy's rules name them.

use prost_reflect::{DynamicMessage, Kind, MessageDescriptor};
use serde_json::Value;

use super::ValueError;
use super::parse::{self, Step, key_segment};
use marin3r_api::Serialization;

/// The most problems reported for one value.
const MAX_PROBLEMS: usize = 20;

/// Every problem of `text` (a `desc` message) once its parse failed with `first`: the
/// parser's errors, each found after taking the previous one's field out, then the declared
/// rules `check` finds on what is left, except under a field already reported. Paths use the
/// proto field names.
pub(super) fn every_problem(
    desc: &MessageDescriptor,
    text: &str,
    serialization: Serialization,
    first: ValueError,
    check: impl Fn(&DynamicMessage) -> Vec<ValueError>,
) -> Vec<ValueError> {
    let Ok(mut value) = parse::value_of(text, serialization) else {
        return vec![first];
    };
    parse::normalize(desc, &mut value);
    let original = value.clone();
    let mut problems: Vec<ValueError> = Vec::new();
    let mut steps_seen: Vec<Vec<Step>> = Vec::new();
    let mut first = Some(first);
    loop {
        let (steps, err) = match parse::parse_value(desc, &value) {
            Ok(message) => {
                let caused = |v: &ValueError| {
                    problems
                        .iter()
                        .any(|p| caused_by(v, &removed(p)) || misspelt(v, p))
                };
                let more: Vec<ValueError> =
                    check(&message).into_iter().filter(|v| !caused(v)).collect();
                problems.extend(more);
                break;
            }
            Err(found) => found,
        };
        // The streaming parse's error knows its line, when it is this one (it may have
        // stopped earlier, at what Envoy's parser takes, such as an enum in lower case).
        let mut err = match first.take() {
            Some(f) if f.message == err.message || f.path == written_path(&steps) => f,
            _ => err,
        };
        err.path = proto_path(desc, &original, &steps);
        problems.push(err.clone());
        if problems.len() >= MAX_PROBLEMS
            || steps_seen.contains(&steps)
            || !take_out(&mut value, &steps, &err.message)
        {
            break;
        }
        steps_seen.push(steps);
    }
    problems
}

/// Whether the rule violation `v` may come from taking the field at `removed` out: it is
/// about that field or one inside it, or about the message holding it and names it (`one of
/// port_value, named_port must be set`).
fn caused_by(v: &ValueError, removed: &str) -> bool {
    let inside = |outer: &str, path: &str| {
        path == outer
            || path.starts_with(&format!("{outer}."))
            || path.starts_with(&format!("{outer}["))
    };
    let field = removed
        .rsplit(['.', '['])
        .next()
        .unwrap_or(removed)
        .trim_end_matches(']');
    inside(removed, &v.path) || (inside(&v.path, removed) && v.message.contains(field))
}

/// Whether the rule violation `v` is what a misspelt key (`p`, an unknown field) left
/// missing: it is about the object holding that key (`one of string_key must be set`), or
/// about a field of that object whose name is the key's but for a letter or two
/// (`stat_prefix` for `stat_prefx`).
fn misspelt(v: &ValueError, p: &ValueError) -> bool {
    let Some(key) = parse::unknown_field(&p.message) else {
        return false;
    };
    if v.path == p.path {
        return true;
    }
    let field = match p.path.is_empty() {
        true => v.path.as_str(),
        false => match v.path.strip_prefix(p.path.as_str()) {
            Some(rest) => rest.strip_prefix('.').unwrap_or(""),
            None => "",
        },
    };
    !field.is_empty() && !field.contains(['.', '[']) && edits(field, key) <= 2
}

/// The Levenshtein distance of two short names.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The path of what was taken out for `p`: its field, or the unknown key of the object it
/// names.
fn removed(p: &ValueError) -> String {
    match parse::unknown_field(&p.message) {
        Some(key) => format!("{}{}", p.path, key_segment(key, p.path.is_empty())),
        None => p.path.clone(),
    }
}

/// `steps` as the parser's own error path is written (keys as the user wrote them).
fn written_path(steps: &[Step]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Key(k) => out.push_str(&key_segment(k, out.is_empty())),
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Takes out of `value` what the error at `steps` is about: the unknown key of the object it
/// names, or the field it names (a list item becomes an empty object, or without one to
/// stand for it, its whole list goes). False when nothing could be taken out.
fn take_out(value: &mut Value, steps: &[Step], message: &str) -> bool {
    if let Some(key) = parse::unknown_field(message) {
        let at = match steps.last() {
            Some(Step::Key(k)) if k == key => &steps[..steps.len() - 1],
            _ => steps,
        };
        return at_mut(value, at)
            .and_then(Value::as_object_mut)
            .is_some_and(|map| map.remove(key).is_some());
    }
    let Some((last, parent)) = steps.split_last() else {
        return false;
    };
    match (last, at_mut(value, parent)) {
        (Step::Key(k), Some(Value::Object(map))) => map.remove(k).is_some(),
        (Step::Index(i), Some(Value::Array(items))) => match items.get_mut(*i) {
            Some(item @ Value::Object(_)) if item.as_object().is_some_and(|m| !m.is_empty()) => {
                *item = Value::Object(serde_json::Map::new());
                true
            }
            _ => take_out(value, parent, ""),
        },
        _ => false,
    }
}

fn at_mut<'a>(value: &'a mut Value, steps: &[Step]) -> Option<&'a mut Value> {
    steps.iter().try_fold(value, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// What a step of a path walks into.
enum Node {
    Message(MessageDescriptor),
    MapOf(Kind),
    ListOf(Kind),
    Leaf,
}

fn node(kind: Kind) -> Node {
    match kind {
        Kind::Message(m) if !m.full_name().starts_with("google.protobuf.") || is_any(&m) => {
            Node::Message(m)
        }
        _ => Node::Leaf,
    }
}

fn is_any(desc: &MessageDescriptor) -> bool {
    desc.full_name() == "google.protobuf.Any"
}

/// `steps` (keys as the user wrote them, in either JSON name) with each field's proto name,
/// following `value` into typed `Any`s; map keys and unknown keys as written.
pub(super) fn proto_path(desc: &MessageDescriptor, value: &Value, steps: &[Step]) -> String {
    let mut out = String::new();
    let mut at = Node::Message(desc.clone());
    let mut v = Some(value);
    for step in steps {
        let (segment, next) = match (at, step) {
            (Node::Message(m), Step::Key(key)) => {
                let m = match is_any(&m) {
                    true => v
                        .and_then(|v| v.get("@type"))
                        .and_then(Value::as_str)
                        .and_then(|url| url.rsplit('/').next())
                        .and_then(|name| m.parent_pool().get_message_by_name(name))
                        .unwrap_or(m),
                    false => m,
                };
                let field = m
                    .get_field_by_name(key)
                    .or_else(|| m.get_field_by_json_name(key));
                let name = field
                    .as_ref()
                    .map_or_else(|| key.clone(), |f| f.name().to_owned());
                let next = match &field {
                    Some(f) if f.is_map() => match f.kind() {
                        Kind::Message(entry) => Node::MapOf(entry.map_entry_value_field().kind()),
                        _ => Node::Leaf,
                    },
                    Some(f) if f.is_list() => Node::ListOf(f.kind()),
                    Some(f) => node(f.kind()),
                    None => Node::Leaf,
                };
                (key_segment(&name, out.is_empty()), next)
            }
            (Node::MapOf(kind), Step::Key(key)) => (key_segment(key, out.is_empty()), node(kind)),
            (Node::ListOf(kind), Step::Index(i)) => (format!("[{i}]"), node(kind)),
            (_, Step::Key(key)) => (key_segment(key, out.is_empty()), Node::Leaf),
            (_, Step::Index(i)) => (format!("[{i}]"), Node::Leaf),
        };
        out.push_str(&segment);
        at = next;
        v = v.and_then(|v| match step {
            Step::Key(k) => v.get(k.as_str()),
            Step::Index(i) => v.get(*i),
        });
    }
    out
}
