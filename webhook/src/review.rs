//! AdmissionReview v1 in and out: decoding a request body, calling [`mutate`], encoding the
//! response. A body that is not an AdmissionReview is a [`BadRequest`] (HTTP 400); anything
//! wrong with the pod inside one is a denial (HTTP 200, `allowed: false`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};

use crate::config::InjectionConfig;
use crate::mutate::{Denial, mutate};

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
    let mut review: Value = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("the body is not JSON: {e}")))?;
    let Some(obj) = review.as_object_mut() else {
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
    let Some(request) = obj.get_mut("request").and_then(Value::as_object_mut) else {
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

    let outcome = decide(request, config);
    let mut response = Map::new();
    response.insert("uid".into(), Value::String(uid));
    match &outcome {
        Decision::Allow(None, warning) => {
            response.insert("allowed".into(), Value::Bool(true));
            if let Some(w) = warning {
                response.insert("warnings".into(), json!([w]));
            }
        }
        Decision::Allow(Some(patch), _) => {
            response.insert("allowed".into(), Value::Bool(true));
            response.insert("patchType".into(), Value::String("JSONPatch".into()));
            response.insert("patch".into(), Value::String(BASE64.encode(patch)));
        }
        Decision::Deny(message) => {
            response.insert("allowed".into(), Value::Bool(false));
            response.insert(
                "status".into(),
                json!({"status": "Failure", "code": 403, "reason": "Forbidden", "message": message}),
            );
        }
    }
    let outcome = match outcome {
        Decision::Allow(Some(_), _) => Outcome::Patched,
        Decision::Allow(None, _) => Outcome::Unchanged,
        Decision::Deny(m) => Outcome::Denied(m),
    };
    Ok((
        json!({"apiVersion": API_VERSION, "kind": KIND, "response": response}),
        outcome,
    ))
}

enum Decision {
    /// The encoded patch (absent: no change), and a warning for the user.
    Allow(Option<Vec<u8>>, Option<String>),
    Deny(String),
}

fn decide(request: &mut Map<String, Value>, config: &InjectionConfig) -> Decision {
    let kind = request
        .get("kind")
        .and_then(|k| k.get("kind"))
        .and_then(Value::as_str);
    if kind.is_some_and(|k| k != "Pod") {
        // Misconfigured rules must not block unrelated objects.
        return Decision::Allow(
            None,
            Some(format!(
                "marin3r sidecar injection only handles Pods, not {}",
                shown(kind)
            )),
        );
    }
    if request
        .get("operation")
        .and_then(Value::as_str)
        .is_some_and(|op| op != "CREATE")
    {
        return Decision::Allow(None, None);
    }
    let Some(object) = request.remove("object").filter(|o| !o.is_null()) else {
        return Decision::Deny("the AdmissionReview request has no object".into());
    };
    let pod: Pod = match serde_json::from_value(object) {
        Ok(pod) => pod,
        Err(e) => return Decision::Deny(format!("the object is not a valid Pod: {e}")),
    };
    match mutate(&pod, config) {
        Ok(patch) if patch.0.is_empty() => Decision::Allow(None, None),
        Ok(patch) => match serde_json::to_vec(&patch) {
            Ok(bytes) => Decision::Allow(Some(bytes), None),
            Err(e) => Decision::Deny(format!("encoding the patch: {e}")),
        },
        Err(denial @ (Denial::Annotations(_) | Denial::Conflict(_) | Denial::NotAPod(_))) => {
            Decision::Deny(denial.to_string())
        }
    }
}

/// A field value for an error message, without echoing unbounded input back.
fn shown(v: Option<&str>) -> String {
    match v {
        None => "nothing".into(),
        Some(s) if s.len() > 64 => format!("{:?}…", s.chars().take(64).collect::<String>()),
        Some(s) => format!("{s:?}"),
    }
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
