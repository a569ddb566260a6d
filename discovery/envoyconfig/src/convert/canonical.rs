//! Deterministic protobuf bytes. prost-reflect keeps map fields in a `HashMap`, so the same
//! resource would encode its map entries (a runtime layer, `typed_per_filter_config`,
//! metadata) in a different order on every conversion, and content-hash versions would
//! change with no change of content. This pass rewrites encoded bytes with every map's
//! entries sorted, descending into nested messages and into `Any` payloads.

use prost::bytes::Buf as _;
use prost::encoding::{decode_varint, encode_varint};
use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};

/// Why bytes could not be walked (they came from our own encoder, so this is a bug, never
/// bad input; the caller then keeps the bytes as they were).
#[derive(Debug)]
pub struct WireError;

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// Returns `bytes` (an encoded `desc` message) with all map entries in a fixed order.
pub fn canonical(
    pool: &DescriptorPool,
    desc: &MessageDescriptor,
    bytes: &[u8],
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(bytes.len());
    write_message(pool, desc, bytes, &mut out)?;
    Ok(out)
}

fn write_message(
    pool: &DescriptorPool,
    desc: &MessageDescriptor,
    mut bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if desc.full_name() == "google.protobuf.Any" {
        return write_any(pool, bytes, out);
    }
    // Entries of the map field being read; prost-reflect writes a field's entries together.
    let mut entries: Vec<Vec<u8>> = Vec::new();
    let mut entries_tag = 0u64;
    while bytes.has_remaining() {
        let tag = decode_varint(&mut bytes).map_err(|_| WireError)?;
        let (number, wire_type) = (tag >> 3, tag & 7);
        if entries_tag != 0 && tag != entries_tag {
            flush_entries(entries_tag, &mut entries, out);
            entries_tag = 0;
        }
        let field = u32::try_from(number).ok().and_then(|n| desc.get_field(n));
        match (wire_type, field) {
            (LEN, Some(field)) => {
                let payload = take_len(&mut bytes)?;
                match field.kind() {
                    Kind::Message(sub) if field.is_map() => {
                        let mut entry = Vec::with_capacity(payload.len());
                        write_message(pool, &sub, payload, &mut entry)?;
                        entries.push(entry);
                        entries_tag = tag;
                    }
                    Kind::Message(sub) => {
                        let mut nested = Vec::with_capacity(payload.len());
                        write_message(pool, &sub, payload, &mut nested)?;
                        write_len(tag, &nested, out);
                    }
                    _ => write_len(tag, payload, out),
                }
            }
            (LEN, None) => {
                let payload = take_len(&mut bytes)?;
                write_len(tag, payload, out);
            }
            (VARINT, _) => {
                let value = decode_varint(&mut bytes).map_err(|_| WireError)?;
                encode_varint(tag, out);
                encode_varint(value, out);
            }
            (FIXED64, _) => copy_fixed(tag, 8, &mut bytes, out)?,
            (FIXED32, _) => copy_fixed(tag, 4, &mut bytes, out)?,
            // Groups do not exist in proto3 (Envoy's API is proto3 only).
            _ => return Err(WireError),
        }
    }
    if entries_tag != 0 {
        flush_entries(entries_tag, &mut entries, out);
    }
    Ok(())
}

/// `Any` is `type_url = 1, value = 2`; its payload is canonicalised as the message it names.
fn write_any(pool: &DescriptorPool, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
    let mut type_url: &[u8] = &[];
    let mut value: &[u8] = &[];
    while bytes.has_remaining() {
        let tag = decode_varint(&mut bytes).map_err(|_| WireError)?;
        match tag {
            0x0a => type_url = take_len(&mut bytes)?,
            0x12 => value = take_len(&mut bytes)?,
            _ => return Err(WireError),
        }
    }
    // `{}` in the manifest: an empty Any, as Envoy's JSON parser makes it.
    if type_url == super::parse::EMPTY_ANY_URL.as_bytes() {
        return Ok(());
    }
    let payload_desc = std::str::from_utf8(type_url)
        .ok()
        .and_then(|url| url.rsplit('/').next())
        .and_then(|name| pool.get_message_by_name(name));
    let value = match payload_desc {
        Some(desc) => canonical(pool, &desc, value)?,
        None => value.to_vec(),
    };
    // Encoders omit empty fields; keep doing so.
    if !type_url.is_empty() {
        write_len(0x0a, type_url, out);
    }
    if !value.is_empty() {
        write_len(0x12, &value, out);
    }
    Ok(())
}

fn flush_entries(tag: u64, entries: &mut Vec<Vec<u8>>, out: &mut Vec<u8>) {
    // Any fixed order will do; keys are unique, so sorting the encoded entries is one.
    entries.sort_unstable();
    for entry in entries.drain(..) {
        write_len(tag, &entry, out);
    }
}

fn take_len<'a>(bytes: &mut &'a [u8]) -> Result<&'a [u8], WireError> {
    let len =
        usize::try_from(decode_varint(bytes).map_err(|_| WireError)?).map_err(|_| WireError)?;
    if len > bytes.len() {
        return Err(WireError);
    }
    let (payload, rest) = bytes.split_at(len);
    *bytes = rest;
    Ok(payload)
}

fn write_len(tag: u64, payload: &[u8], out: &mut Vec<u8>) {
    encode_varint(tag, out);
    encode_varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

fn copy_fixed(tag: u64, n: usize, bytes: &mut &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
    if bytes.len() < n {
        return Err(WireError);
    }
    encode_varint(tag, out);
    out.extend_from_slice(&bytes[..n]);
    *bytes = &bytes[n..];
    Ok(())
}
