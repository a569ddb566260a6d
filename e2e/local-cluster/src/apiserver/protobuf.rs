//! Kubernetes protobuf request bodies for the kinds kubectl's imperative generators create
//! (`kubectl create namespace|configmap|secret|serviceaccount|deployment`), which send
//! protobuf whatever the server prefers. Decoding follows a schema of the fields those
//! commands set; any other field with a non-empty value is refused, never dropped.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The prefix of every Kubernetes protobuf body.
const MAGIC: &[u8] = b"k8s\0";

#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed(u64),
}

/// How one field maps to JSON.
#[derive(Clone, Copy)]
enum F {
    Str(&'static str),
    Int(&'static str),
    Bool(&'static str),
    RepStr(&'static str),
    MapStr(&'static str),
    /// `map<string, bytes>`, base64 in JSON.
    MapBytes(&'static str),
    Msg(&'static str, Schema),
    RepMsg(&'static str, Schema),
    /// Set by the server; whatever a client sends is not used.
    Ignore,
}

type Schema = &'static [(u64, F)];

const OBJECT_META: Schema = &[
    (1, F::Str("name")),
    (2, F::Str("generateName")),
    (3, F::Str("namespace")),
    (4, F::Ignore),
    (5, F::Ignore),
    (6, F::Ignore),
    (7, F::Ignore),
    (8, F::Ignore),
    (9, F::Ignore),
    (10, F::Ignore),
    (11, F::MapStr("labels")),
    (12, F::MapStr("annotations")),
    (14, F::RepStr("finalizers")),
    (17, F::Ignore),
];
const NAMESPACE: Schema = &[(1, F::Msg("metadata", OBJECT_META))];
const CONFIG_MAP: Schema = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapStr("data")),
    (3, F::MapBytes("binaryData")),
    (4, F::Bool("immutable")),
];
const SECRET: Schema = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::MapBytes("data")),
    (3, F::Str("type")),
    (4, F::MapStr("stringData")),
    (5, F::Bool("immutable")),
];
const SERVICE_ACCOUNT: Schema = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (4, F::Bool("automountServiceAccountToken")),
];
const CONTAINER_PORT: Schema = &[
    (1, F::Str("name")),
    (3, F::Int("containerPort")),
    (4, F::Str("protocol")),
];
const CONTAINER: Schema = &[
    (1, F::Str("name")),
    (2, F::Str("image")),
    (3, F::RepStr("command")),
    (4, F::RepStr("args")),
    (6, F::RepMsg("ports", CONTAINER_PORT)),
];
const POD_SPEC: Schema = &[(2, F::RepMsg("containers", CONTAINER))];
const POD_TEMPLATE: Schema = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", POD_SPEC)),
];
const LABEL_SELECTOR: Schema = &[(1, F::MapStr("matchLabels"))];
const DEPLOYMENT_SPEC: Schema = &[
    (1, F::Int("replicas")),
    (2, F::Msg("selector", LABEL_SELECTOR)),
    (3, F::Msg("template", POD_TEMPLATE)),
];
const DEPLOYMENT: Schema = &[
    (1, F::Msg("metadata", OBJECT_META)),
    (2, F::Msg("spec", DEPLOYMENT_SPEC)),
];

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}

fn take<'a>(buf: &'a [u8], pos: &mut usize, len: usize) -> Result<&'a [u8], String> {
    let end = pos
        .checked_add(len)
        .filter(|e| *e <= buf.len())
        .ok_or("truncated field")?;
    let out = &buf[*pos..end];
    *pos = end;
    Ok(out)
}

/// The fields of one message, in order.
fn fields(buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let wire = match key & 7 {
            0 => Wire::Varint(varint(buf, &mut pos)?),
            1 => Wire::Fixed(u64::from_le_bytes(
                take(buf, &mut pos, 8)?
                    .try_into()
                    .map_err(|_| "bad fixed64")?,
            )),
            2 => {
                let len =
                    usize::try_from(varint(buf, &mut pos)?).map_err(|_| "length too large")?;
                Wire::Bytes(take(buf, &mut pos, len)?)
            }
            5 => Wire::Fixed(u64::from(u32::from_le_bytes(
                take(buf, &mut pos, 4)?
                    .try_into()
                    .map_err(|_| "bad fixed32")?,
            ))),
            other => return Err(format!("unsupported wire type {other}")),
        };
        out.push((key >> 3, wire));
    }
    Ok(out)
}

/// Whether a field carries nothing: zero, empty, or a message of such fields.
fn is_empty(wire: Wire<'_>) -> bool {
    match wire {
        Wire::Varint(v) | Wire::Fixed(v) => v == 0,
        Wire::Bytes(b) => {
            b.is_empty() || fields(b).is_ok_and(|fs| fs.into_iter().all(|(_, w)| is_empty(w)))
        }
    }
}

fn text(wire: Wire<'_>) -> Result<String, String> {
    match wire {
        Wire::Bytes(b) => {
            String::from_utf8(b.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
        }
        _ => Err("expected a string".into()),
    }
}

fn bytes(wire: Wire<'_>) -> Result<&[u8], String> {
    match wire {
        Wire::Bytes(b) => Ok(b),
        _ => Err("expected a length-delimited field".into()),
    }
}

fn number(wire: Wire<'_>) -> Result<u64, String> {
    match wire {
        Wire::Varint(v) => Ok(v),
        _ => Err("expected a varint".into()),
    }
}

fn map_entry(wire: Wire<'_>) -> Result<(String, Wire<'_>), String> {
    let mut key = String::new();
    let mut value = Wire::Bytes(&[]);
    for (n, w) in fields(bytes(wire)?)? {
        match n {
            1 => key = text(w)?,
            2 => value = w,
            _ => {}
        }
    }
    Ok((key, value))
}

fn message(buf: &[u8], schema: Schema, path: &str) -> Result<Value, String> {
    let mut out = Map::new();
    for (n, wire) in fields(buf)? {
        let Some((_, f)) = schema.iter().find(|(num, _)| *num == n) else {
            if is_empty(wire) {
                continue;
            }
            return Err(format!(
                "field {n} of {path} is not understood in protobuf: send this object as JSON (kubectl apply -f)"
            ));
        };
        let entry = |out: &mut Map<String, Value>, name: &str| {
            out.entry(name.to_owned())
                .or_insert_with(|| json!({}))
                .clone()
        };
        match *f {
            F::Ignore => {}
            F::Str(name) => {
                let s = text(wire)?;
                if !s.is_empty() {
                    out.insert(name.into(), json!(s));
                }
            }
            // int32 values travel as 64-bit two's complement varints.
            F::Int(name) => {
                out.insert(name.into(), json!(number(wire)?.cast_signed()));
            }
            F::Bool(name) => {
                out.insert(name.into(), json!(number(wire)? != 0));
            }
            F::RepStr(name) => {
                let s = text(wire)?;
                let list = out.entry(name.to_owned()).or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(json!(s));
                }
            }
            F::MapStr(name) | F::MapBytes(name) => {
                let (k, v) = map_entry(wire)?;
                let value = match *f {
                    F::MapBytes(_) => {
                        json!(base64::engine::general_purpose::STANDARD.encode(bytes(v)?))
                    }
                    _ => json!(text(v)?),
                };
                let mut map = entry(&mut out, name);
                map[k] = value;
                out.insert(name.into(), map);
            }
            F::Msg(name, inner) => {
                out.insert(
                    name.into(),
                    message(bytes(wire)?, inner, &format!("{path}.{name}"))?,
                );
            }
            F::RepMsg(name, inner) => {
                let item = message(bytes(wire)?, inner, &format!("{path}.{name}[]"))?;
                let list = out.entry(name.to_owned()).or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(item);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf request body into the JSON object it stands for.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or("a protobuf body must start with the Kubernetes magic prefix")?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (n, wire) in fields(rest)? {
        match n {
            1 => {
                for (m, w) in fields(bytes(wire)?)? {
                    match m {
                        1 => api_version = text(w)?,
                        2 => kind = text(w)?,
                        _ => {}
                    }
                }
            }
            2 => raw = bytes(wire)?,
            _ => {}
        }
    }
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIG_MAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("apps/v1", "Deployment") => DEPLOYMENT,
        _ => {
            return Err(format!(
                "protobuf bodies are understood for Namespace, ConfigMap, Secret, ServiceAccount and Deployment only, not {api_version} {kind}: send JSON (kubectl apply -f)"
            ));
        }
    };
    let mut obj = message(raw, schema, &kind)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes a length-delimited field (test vectors are built by hand).
    fn ld(n: u64, body: &[u8]) -> Vec<u8> {
        let mut out = vec![
            u8::try_from((n << 3) | 2).unwrap(),
            u8::try_from(body.len()).unwrap(),
        ];
        out.extend_from_slice(body);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [ld(1, api_version.as_bytes()), ld(2, kind.as_bytes())].concat();
        [MAGIC.to_vec(), ld(1, &type_meta), ld(2, raw)].concat()
    }

    #[test]
    fn a_secret_decodes() {
        let meta = [
            ld(1, b"s1"),
            ld(3, b"default"),
            ld(11, &[ld(1, b"a"), ld(2, b"b")].concat()),
        ]
        .concat();
        let raw = [
            ld(1, &meta),
            ld(2, &[ld(1, b"user"), ld(2, b"admin")].concat()),
            ld(3, b"Opaque"),
        ]
        .concat();
        let obj = decode(&envelope("v1", "Secret", &raw)).unwrap();
        assert_eq!(
            obj,
            json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "s1", "namespace": "default", "labels": {"a": "b"}},
                "data": {"user": "YWRtaW4="},
            })
        );
    }

    #[test]
    fn unknown_fields_and_kinds_and_garbage_are_refused() {
        let meta = ld(1, b"n");
        let with_unknown = [ld(1, &meta), ld(9, b"something")].concat();
        let err = decode(&envelope("v1", "Namespace", &with_unknown)).unwrap_err();
        assert!(err.contains("field 9 of Namespace"), "{err}");
        let empty_unknown = [ld(1, &meta), ld(9, b"")].concat();
        assert!(decode(&envelope("v1", "Namespace", &empty_unknown)).is_ok());
        let err = decode(&envelope("v1", "Pod", &meta)).unwrap_err();
        assert!(err.contains("not v1 Pod"), "{err}");
        assert!(decode(b"{}").unwrap_err().contains("magic"));
        let truncated = &envelope("v1", "Namespace", &[ld(1, &meta)].concat())[..10];
        assert!(decode(truncated).is_err());
    }
}
