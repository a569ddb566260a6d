//! AdmissionReview v1 in and out: decoding a request body, calling [`mutate`], encoding the
//! response. A body that is not an AdmissionReview is a [`BadRequest`] (HTTP 400); anything
//! wrong with the pod inside one is a denial (HTTP 200, `allowed: false`).
//!
//! Why not `kube::core::admission`'s types: their derived `Deserialize` reads an array as a
//! struct (`"kind": ["", "v1", "Deployment"]` as a GroupVersionKind), which our fuzzing found
//! let such a pod through as "not a Pod" while the strict path decided on the pod; they also
//! decode the parts of a request we never read (user info, resources, options). The fast path
//! below reads only `uid`, `kind.kind`, `operation` and `object`, each from a JSON object.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

use crate::config::InjectionConfig;
use crate::mutate::mutation;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// The body is not an AdmissionReview v1 request; the message says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

/// The outcome of one review, for logs and the caller's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Patched,
    Unchanged,
    Denied(String),
}

/// Decodes an AdmissionReview request, decides, and returns the AdmissionReview response.
pub fn review(body: &[u8], config: &InjectionConfig) -> Result<(Value, Outcome), BadRequest> {
    // Fast path: a well-formed review decodes straight into typed structs. Anything else
    // goes the slow way through a JSON tree, which says exactly what is wrong.
    if !skipped_strings_may_be_invalid(body)
        && let Ok(MapOnly(typed)) = serde_json::from_slice::<MapOnly<TypedReview>>(body)
        && typed.api_version == API_VERSION
        && typed.kind == KIND
        && !typed.request.0.uid.is_empty()
    {
        let MapOnly(request) = typed.request;
        let decision = decide(
            request.kind.as_ref().map(|k| k.0.kind.as_str()),
            request.operation.as_deref(),
            || Ok(request.object),
            config,
        );
        return Ok(respond(request.uid, decision));
    }
    review_tree(body, config)
}

/// Whether the typed path could accept a body the JSON tree refuses: serde_json does not check
/// the UTF-8 or the surrogate escapes (`\uD800`) of the strings it skips (fields we do not
/// read), while the tree reads every string. The API server sends neither, so such a body
/// takes the slow path, which names the problem.
fn skipped_strings_may_be_invalid(body: &[u8]) -> bool {
    std::str::from_utf8(body).is_err()
        || body.windows(4).any(|w| {
            matches!(
                w,
                [
                    b'\\',
                    b'u',
                    b'd' | b'D',
                    b'8'..=b'9' | b'a'..=b'f' | b'A'..=b'F',
                ]
            )
        })
}

/// The slow path: the body as a JSON tree, every problem named.
fn review_tree(body: &[u8], config: &InjectionConfig) -> Result<(Value, Outcome), BadRequest> {
    let (uid, mut request) = request_tree(body)?;
    let object = request.remove("object");
    let kind = request
        .get("kind")
        .and_then(|k| k.get("kind"))
        .and_then(Value::as_str);
    let operation = request.get("operation").and_then(Value::as_str);
    let decision = decide(
        kind,
        operation,
        || match object.filter(|o| !o.is_null()) {
            None => Ok(None),
            Some(o) => serde_json::from_value(o)
                .map(Some)
                .map_err(|e| e.to_string()),
        },
        config,
    );
    Ok(respond(uid, decision))
}

/// The uid and the request object of an AdmissionReview v1 body read as a JSON tree, or
/// what is wrong with it.
pub(crate) fn request_tree(body: &[u8]) -> Result<(String, Map<String, Value>), BadRequest> {
    let review: Value = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("the body is not JSON: {e}")))?;
    let Value::Object(mut obj) = review else {
        return Err(BadRequest(
            "the body is not a JSON object (expected an AdmissionReview)".into(),
        ));
    };
    let api_version = obj.get("apiVersion").and_then(Value::as_str);
    let kind = obj.get("kind").and_then(Value::as_str);
    if api_version != Some(API_VERSION) || kind != Some(KIND) {
        return Err(BadRequest(format!(
            "expected apiVersion {API_VERSION:?} and kind {KIND:?}, got {} and {}",
            shown(api_version),
            shown(kind)
        )));
    }
    let Some(Value::Object(request)) = obj.remove("request") else {
        return Err(BadRequest(
            "the AdmissionReview has no request object".into(),
        ));
    };
    let uid = match request.get("uid").and_then(Value::as_str) {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => {
            return Err(BadRequest("the AdmissionReview request has no uid".into()));
        }
    };
    Ok((uid, request))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypedReview {
    api_version: String,
    kind: String,
    request: MapOnly<TypedRequest>,
}

#[derive(serde::Deserialize)]
struct TypedRequest {
    uid: String,
    #[serde(default)]
    kind: Option<MapOnly<TypedKind>>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    object: Option<Pod>,
}

#[derive(serde::Deserialize)]
struct TypedKind {
    kind: String,
}

/// A struct decoded from a JSON object only. Derived `Deserialize` also takes an array of the
/// fields in order (`"kind": ["", "v1", "Pod"]`), which the JSON-tree path rightly does not
/// read as an object: without this the two paths decided such reviews differently.
struct MapOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for MapOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Objects<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Objects<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Objects(std::marker::PhantomData))
            .map(MapOnly)
    }
}

pub(crate) enum Decision {
    /// The encoded patch (absent: no change), and warnings for the user (kubectl prints
    /// each as `Warning: ...`).
    Allow(Option<Vec<u8>>, Vec<String>),
    Deny(String),
}

pub(crate) fn respond(uid: String, decision: Decision) -> (Value, Outcome) {
    let mut response = Map::new();
    response.insert("uid".into(), Value::String(uid));
    let outcome = match decision {
        Decision::Allow(patch, warnings) => {
            response.insert("allowed".into(), Value::Bool(true));
            if !warnings.is_empty() {
                response.insert("warnings".into(), json!(warnings));
            }
            match patch {
                None => Outcome::Unchanged,
                Some(patch) => {
                    response.insert("patchType".into(), Value::String("JSONPatch".into()));
                    response.insert("patch".into(), Value::String(BASE64.encode(patch)));
                    Outcome::Patched
                }
            }
        }
        Decision::Deny(message) => {
            response.insert("allowed".into(), Value::Bool(false));
            response.insert(
                "status".into(),
                json!({"status": "Failure", "code": 403, "reason": "Forbidden", "message": message}),
            );
            Outcome::Denied(message)
        }
    };
    (
        json!({"apiVersion": API_VERSION, "kind": KIND, "response": response}),
        outcome,
    )
}

/// `object` is only decoded for a Pod CREATE; its error is the decoder's message.
fn decide(
    kind: Option<&str>,
    operation: Option<&str>,
    object: impl FnOnce() -> Result<Option<Pod>, String>,
    config: &InjectionConfig,
) -> Decision {
    if kind.is_some_and(|k| k != "Pod") {
        // Misconfigured rules must not block unrelated objects.
        return Decision::Allow(
            None,
            vec![format!(
                "marin3r sidecar injection only handles Pods, not {}",
                shown(kind)
            )],
        );
    }
    if operation.is_some_and(|op| op != "CREATE") {
        return Decision::Allow(None, Vec::new());
    }
    let pod = match object() {
        Ok(Some(pod)) => pod,
        Ok(None) => return Decision::Deny("the AdmissionReview request has no object".into()),
        Err(e) => return Decision::Deny(format!("the object is not a valid Pod: {e}")),
    };
    match mutation(&pod, config) {
        Ok(m) if m.patch.0.is_empty() => Decision::Allow(None, m.warnings),
        Ok(m) => match serde_json::to_vec(&m.patch) {
            Ok(bytes) => Decision::Allow(Some(bytes), m.warnings),
            Err(e) => Decision::Deny(format!("encoding the patch: {e}")),
        },
        Err(denial) => Decision::Deny(denial.to_string()),
    }
}

/// A field value for an error message, without echoing unbounded input back.
pub(crate) fn shown(v: Option<&str>) -> String {
    match v {
        None => "nothing".into(),
        Some(s) if s.len() > 64 => format!("{:?}…", s.chars().take(64).collect::<String>()),
        Some(s) => format!("{s:?}"),
    }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
