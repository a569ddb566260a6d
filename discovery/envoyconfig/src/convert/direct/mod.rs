//! JSON or YAML text straight to canonical protobuf bytes, in one walk: the fast path of a
//! value. Each message type's fields are looked up once per type, in a table built
//! on first use, and nothing is decoded into a `DynamicMessage` on the way (an `Any` payload
//! is not parsed, encoded, then decoded again, as the full parser must do).
//!
//! It takes only the strict proto3 JSON that Envoy configs are written in, and the same
//! values in plain YAML (`yaml.rs`; a plain scalar is read as the field it fills asks, as the
//! full parser reads it, and where that could differ, declined). It declines (`None`)
//! everything else: a null, an unknown or repeated field, two members of one oneof, Envoy's
//! lenient forms, a number where a string belongs or the reverse, a number written as a
//! string, and the types it does not handle (bytes, floats, timestamps, field masks, an `Any`
//! holding a well-known type). A declined value goes through the full parser (`parse`), which decides what is
//! accepted and says what is wrong. So the fast path never accepts what the full one would
//! refuse, and what it writes is what the full parser and `canonical` write for the same
//! value (`tests.rs` checks both).

mod node;
mod table;
mod wire;
mod yaml;

use std::borrow::Cow;

use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};

use node::{Node, plain_is_text, plain_number, string};
use table::{Field, Shape, Table, table};
use wire::{Scalar, len_field, scalar};

/// Encodes the JSON `text` as a `desc` message, or declines.
pub(super) fn encode(
    pool: &DescriptorPool,
    desc: &MessageDescriptor,
    text: &str,
) -> Option<Vec<u8>> {
    let node: Node<'_> = serde_json::from_str(text).ok()?;
    encode_node(pool, desc, &node, text.len())
}

/// Encodes the YAML `text` as a `desc` message, or declines.
pub(super) fn encode_yaml(
    pool: &DescriptorPool,
    desc: &MessageDescriptor,
    text: &str,
) -> Option<Vec<u8>> {
    let node = yaml::read(text)?;
    encode_node(pool, desc, &node, text.len())
}

fn encode_node(
    pool: &DescriptorPool,
    desc: &MessageDescriptor,
    node: &Node<'_>,
    text_len: usize,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text_len / 2);
    Encoder { pool }.message(&table(desc), node, &mut out)?;
    Some(out)
}

struct Encoder<'p> {
    pool: &'p DescriptorPool,
}

impl Encoder<'_> {
    fn message(&self, table: &Table, node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
        match table.shape {
            Shape::Plain => {}
            Shape::Any => return self.any(node, out),
            Shape::Duration => return duration(node, out),
            // Each holds one field, `1`, whose JSON is the message's: the bare value of a
            // wrapper, the map of a Struct, the list of a ListValue.
            Shape::Wrapper | Shape::Struct | Shape::ListValue => {
                let field = table.fields.iter().find(|f| f.number == 1)?;
                return self.field(field, node, out);
            }
            Shape::Value => return self.value(table, node, out),
            Shape::Declined => return None,
        }
        let Node::Map(entries) = node else {
            return None;
        };
        self.fields(table, entries.iter(), out)
    }

    /// Writes `entries` as `table`'s fields, in field-number order (as prost-reflect does).
    fn fields<'n, 'a: 'n>(
        &self,
        table: &Table,
        entries: impl Iterator<Item = &'n (Cow<'a, str>, Node<'a>)>,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let mut set: Vec<(&Field, &Node<'_>)> = Vec::new();
        for (name, value) in entries {
            let index = *table.by_name.get(name.as_ref())?;
            set.push((&table.fields[index], value));
        }
        set.sort_unstable_by_key(|(field, _)| field.number);
        for pair in set.windows(2) {
            let (a, b) = (pair[0].0, pair[1].0);
            if a.number == b.number {
                return None;
            }
        }
        let mut oneofs: Vec<u32> = Vec::new();
        for &(field, value) in &set {
            if let Some(oneof) = field.oneof {
                if oneofs.contains(&oneof) {
                    return None;
                }
                oneofs.push(oneof);
            }
            self.field(field, value, out)?;
        }
        Some(())
    }

    fn field(&self, field: &Field, node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
        if field.map {
            return self.map(field, node, out);
        }
        if field.list {
            let Node::List(items) = node else {
                return None;
            };
            if field.packed {
                let mut packed = Vec::new();
                for item in items {
                    scalar(&field.kind, item)?.write_value(&mut packed);
                }
                if !items.is_empty() {
                    len_field(field.number, &packed, out);
                }
                return Some(());
            }
            for item in items {
                self.single(field, item, true, out)?;
            }
            return Some(());
        }
        self.single(field, node, field.presence, out)
    }

    /// One value of `field`; a default scalar is written only when `always`.
    fn single(
        &self,
        field: &Field,
        node: &Node<'_>,
        always: bool,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        if matches!(node, Node::Null) {
            return None;
        }
        self.value_as(field, field.number, node, always, out)
    }

    /// `node` as a value of `field` (a message, or a scalar written when `always` or not
    /// default) under the field number `number`: the field's own, or 2 in a map entry.
    fn value_as(
        &self,
        field: &Field,
        number: u32,
        node: &Node<'_>,
        always: bool,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        if matches!(field.kind, Kind::Message(_)) {
            let mut nested = Vec::new();
            self.message(field.child()?, node, &mut nested)?;
            len_field(number, &nested, out);
            return Some(());
        }
        let value = scalar(&field.kind, node)?;
        if always || !value.is_default() {
            value.write(number, out);
        }
        Some(())
    }

    /// A map with string keys; its entries sorted by their encoding, as `canonical` sorts them.
    /// A key written twice is declined: the full parser says what it makes of it.
    fn map(&self, field: &Field, node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
        let Node::Map(entries) = node else {
            return None;
        };
        if field.other_keys {
            return None;
        }
        let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_ref()).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|pair| pair[0] == pair[1]) {
            return None;
        }
        let mut encoded: Vec<Vec<u8>> = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            // An entry is `key = 1`, `value = 2`, each left out at its default.
            let mut e = Vec::new();
            if !k.is_empty() {
                len_field(1, k.as_bytes(), &mut e);
            }
            self.value_as(field, 2, v, false, &mut e)?;
            encoded.push(e);
        }
        encoded.sort_unstable();
        for e in &encoded {
            len_field(field.number, e, out);
        }
        Some(())
    }

    /// `{"@type": ".../name", ...fields}`: the payload encoded as the named message.
    fn any(&self, node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
        let Node::Map(entries) = node else {
            return None;
        };
        let mut urls = entries.iter().filter(|(k, _)| k == "@type");
        let url = string(&urls.next()?.1)?;
        if urls.next().is_some() {
            return None;
        }
        let (_, name) = url.rsplit_once('/')?;
        if name.starts_with("google.protobuf.") {
            return None;
        }
        let desc = self.pool.get_message_by_name(name)?;
        let mut payload = Vec::new();
        self.fields(
            &table(&desc),
            entries.iter().filter(|(k, _)| k != "@type"),
            &mut payload,
        )?;
        len_field(1, url.as_bytes(), out);
        if !payload.is_empty() {
            len_field(2, &payload, out);
        }
        Some(())
    }

    /// `google.protobuf.Value`: the member of its `kind` oneof the JSON type gives.
    fn value(&self, table: &Table, node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
        let by = |n: u32| table.fields.iter().find(|f| f.number == n);
        match node {
            Node::Null => None,
            Node::Bool(_) => self.single(by(4)?, node, true, out),
            Node::U64(_) | Node::I64(_) | Node::F64(_) => self.single(by(2)?, node, true, out),
            Node::Str(_) => self.single(by(3)?, node, true, out),
            // Read as the full path reads any plain scalar where any value fits.
            Node::Plain(p) if p == "true" || p == "false" => self.single(by(4)?, node, true, out),
            Node::Plain(p) if plain_number(p).is_some() => self.single(by(2)?, node, true, out),
            Node::Plain(p) if plain_is_text(p) => self.single(by(3)?, node, true, out),
            Node::Plain(_) => None,
            Node::Map(_) => self.single(by(5)?, node, true, out),
            Node::List(_) => self.single(by(6)?, node, true, out),
        }
    }
}

/// `"<seconds>[.<fraction>]s"`, at most nine fraction digits, within protobuf's range of
/// ±10,000 years: `seconds = 1`, `nanos = 2`, both negative for a negative duration.
fn duration(node: &Node<'_>, out: &mut Vec<u8>) -> Option<()> {
    const MAX_SECONDS: i64 = 315_576_000_000;
    let text = string(node)?.strip_suffix('s')?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || whole.len() > 12 {
        return None;
    }
    let mut seconds: i64 = whole.parse().ok()?;
    let mut nanos: i64 = 0;
    if let Some(fraction) = fraction {
        if !digits(fraction) || fraction.len() > 9 {
            return None;
        }
        nanos = fraction.parse::<i64>().ok()? * 10i64.pow(9 - fraction.len() as u32);
    }
    if seconds >= MAX_SECONDS {
        return None;
    }
    if negative {
        seconds = -seconds;
        nanos = -nanos;
    }
    if seconds != 0 {
        Scalar::Varint(seconds as u64).write(1, out);
    }
    if nanos != 0 {
        Scalar::Varint(nanos as u64).write(2, out);
    }
    Some(())
}

#[cfg(test)]
mod tests;
