//! Scalars as they go on the wire.

use prost::encoding::{WireType, encode_key, encode_varint};
use prost_reflect::{EnumDescriptor, Kind};

use super::node::{Node, integer, plain_is_text, plain_number, string};

pub(super) fn len_field(number: u32, payload: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// A scalar read from JSON, as it goes on the wire.
#[derive(Clone, Copy)]
pub(super) enum Scalar<'n> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'n [u8]),
}

impl Scalar<'_> {
    pub(super) fn is_default(&self) -> bool {
        match self {
            Scalar::Varint(v) | Scalar::Fixed64(v) => *v == 0,
            Scalar::Fixed32(v) => *v == 0,
            Scalar::Bytes(b) => b.is_empty(),
        }
    }

    pub(super) fn write_value(&self, out: &mut Vec<u8>) {
        match *self {
            Scalar::Varint(v) => encode_varint(v, out),
            Scalar::Fixed64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Scalar::Fixed32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Scalar::Bytes(b) => {
                encode_varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
        }
    }

    pub(super) fn write(&self, number: u32, out: &mut Vec<u8>) {
        let wire_type = match self {
            Scalar::Varint(_) => WireType::Varint,
            Scalar::Fixed64(_) => WireType::SixtyFourBit,
            Scalar::Fixed32(_) => WireType::ThirtyTwoBit,
            Scalar::Bytes(_) => WireType::LengthDelimited,
        };
        encode_key(number, wire_type, out);
        self.write_value(out);
    }
}

/// A scalar of `kind` from `node`, or `None` when the fast path leaves it to the full parser.
pub(super) fn scalar<'n>(kind: &Kind, node: &'n Node<'_>) -> Option<Scalar<'n>> {
    let int = |min: i128, max: i128| integer(node).filter(|v| (min..=max).contains(v));
    Some(match kind {
        Kind::Bool => match node {
            Node::Bool(b) => Scalar::Varint(u64::from(*b)),
            Node::Plain(p) if p == "true" => Scalar::Varint(1),
            Node::Plain(p) if p == "false" => Scalar::Varint(0),
            _ => return None,
        },
        Kind::String => Scalar::Bytes(string(node)?.as_bytes()),
        // Negative int32 values are sign-extended to ten bytes, as protobuf writes them.
        Kind::Int32 => Scalar::Varint(int(i32::MIN.into(), i32::MAX.into())? as i64 as u64),
        Kind::Int64 => Scalar::Varint(int(i64::MIN.into(), i64::MAX.into())? as i64 as u64),
        Kind::Uint32 => Scalar::Varint(int(0, u32::MAX.into())? as u64),
        Kind::Uint64 => Scalar::Varint(int(0, u64::MAX.into())? as u64),
        Kind::Sint32 => {
            let v = int(i32::MIN.into(), i32::MAX.into())? as i32;
            Scalar::Varint(u64::from(((v << 1) ^ (v >> 31)) as u32))
        }
        Kind::Sint64 => {
            let v = int(i64::MIN.into(), i64::MAX.into())? as i64;
            Scalar::Varint(((v << 1) ^ (v >> 63)) as u64)
        }
        Kind::Fixed32 => Scalar::Fixed32(int(0, u32::MAX.into())? as u32),
        Kind::Sfixed32 => Scalar::Fixed32(int(i32::MIN.into(), i32::MAX.into())? as i32 as u32),
        Kind::Fixed64 => Scalar::Fixed64(int(0, u64::MAX.into())? as u64),
        Kind::Sfixed64 => Scalar::Fixed64(int(i64::MIN.into(), i64::MAX.into())? as i64 as u64),
        Kind::Double => Scalar::Fixed64(number(node)?.to_bits()),
        Kind::Enum(e) => Scalar::Varint(enum_number(e, node)? as i64 as u64),
        Kind::Float | Kind::Bytes | Kind::Message(_) => return None,
    })
}

fn number(node: &Node<'_>) -> Option<f64> {
    match node {
        Node::U64(v) => Some(*v as f64),
        Node::I64(v) => Some(*v as f64),
        Node::F64(v) => Some(*v),
        Node::Plain(p) => plain_number(p),
        _ => None,
    }
}

fn enum_number(e: &EnumDescriptor, node: &Node<'_>) -> Option<i32> {
    let name = match node {
        Node::Str(name) => name,
        Node::Plain(name) if plain_is_text(name) => name,
        _ => return None,
    };
    e.get_value_by_name(name).map(|v| v.number())
}
