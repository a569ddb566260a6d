//! A value as the fast path reads it, from JSON or YAML, and what its scalars say.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{MapAccess, SeqAccess, Visitor};

/// A value as written, keys in order and repeated keys kept (a repeated field is
/// declined, where a map would keep only the last).
#[derive(Debug)]
pub(super) enum Node<'a> {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    /// A JSON string, or a quoted YAML scalar.
    Str(Cow<'a, str>),
    /// A plain YAML scalar, whose type the field it fills decides.
    Plain(Cow<'a, str>),
    List(Vec<Node<'a>>),
    Map(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl<'de> Deserialize<'de> for Node<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node<'de>, E> {
        Ok(Node::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node<'de>, E> {
        Ok(Node::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node<'de>, E> {
        Ok(Node::I64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node<'de>, E> {
        Ok(Node::F64(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node<'de>, E> {
        Ok(Node::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Node<'de>, E> {
        Ok(Node::Str(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(key) = map.next_key::<Node<'de>>()? {
            let Node::Str(key) = key else {
                return Err(serde::de::Error::custom("a key that is not a string"));
            };
            entries.push((key, map.next_value()?));
        }
        Ok(Node::Map(entries))
    }
}

pub(super) fn integer(node: &Node<'_>) -> Option<i128> {
    match node {
        Node::U64(v) => Some(i128::from(*v)),
        Node::I64(v) => Some(i128::from(*v)),
        Node::Plain(p) => plain_integer(p),
        _ => None,
    }
}

/// A string: a JSON string, a quoted YAML scalar, or a plain one that is not a null (the full
/// path reads a plain `123` or `true` as text where text belongs, and `~` as nothing).
pub(super) fn string<'n>(node: &'n Node<'_>) -> Option<&'n str> {
    match node {
        Node::Str(s) => Some(s),
        Node::Plain(s) if !nullish(s) => Some(s),
        _ => None,
    }
}

pub(super) fn nullish(plain: &str) -> bool {
    matches!(plain, "" | "~" | "null" | "Null" | "NULL")
}

/// Whether a plain scalar is text whatever reads it: not a null, not a boolean of YAML 1.1 or
/// 1.2 (`yes`, `off`...), nothing that may be a number (or a time, in YAML 1.1).
pub(super) fn plain_is_text(plain: &str) -> bool {
    const WORDS: [&str; 8] = ["y", "yes", "n", "no", "true", "false", "on", "off"];
    let starts_like_a_number = plain
        .bytes()
        .next()
        .is_none_or(|b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.'));
    !nullish(plain) && !starts_like_a_number && !WORDS.iter().any(|w| plain.eq_ignore_ascii_case(w))
}

/// A plain decimal integer as both YAML parsers and JSON write it: `0`, `12`, `-12` (no sign
/// `+`, no leading zero, no `_`, no other base).
pub(super) fn plain_integer(plain: &str) -> Option<i128> {
    let digits = plain.strip_prefix('-').unwrap_or(plain);
    let canonical = !digits.is_empty()
        && digits.len() <= 20
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && plain != "-0";
    canonical.then(|| plain.parse().ok()).flatten()
}

/// A plain decimal number: an integer, or one with a fraction (`25.5`, `-0.25`).
pub(super) fn plain_number(plain: &str) -> Option<f64> {
    if let Some(int) = plain_integer(plain) {
        return Some(int as f64);
    }
    let (whole, fraction) = plain.split_once('.')?;
    let fraction_ok = !fraction.is_empty() && fraction.bytes().all(|b| b.is_ascii_digit());
    let unsigned = whole.strip_prefix('-').unwrap_or(whole);
    (plain_integer(unsigned).is_some() && !unsigned.starts_with('-') && fraction_ok)
        .then(|| plain.parse().ok())
        .flatten()
}
