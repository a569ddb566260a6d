//! Validating admission of `EnvoyConfig` (`marin3r.3scale.net/v1alpha1`): the AdmissionReview
//! is decoded here, the object judged by an [`EnvoyConfigValidator`] the binary injects (this
//! crate does not know the Envoy conversion), and the answer encoded. CREATE and UPDATE are
//! judged; an UPDATE that leaves the spec as it was is admitted, its problems sent as
//! warnings, so that a config stored before the webhook existed can still be relabelled or
//! have its finalizers removed.

use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::review::{
    API_VERSION, BadRequest, Decision, KIND as REVIEW, Outcome, request_tree, respond, shown,
};

pub const GROUP: &str = "marin3r.3scale.net";
pub const KIND: &str = "EnvoyConfig";
/// A denial lists problems up to about this many bytes; the rest are counted. kubectl prints
/// the whole message, and a spec with a thousand bad values should not print a thousand lines.
const MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// Judges one EnvoyConfig object (as the API server would store it) in its namespace:
/// every reason it cannot be served, each naming its field path (`spec.resources[2].value:
/// ...`); empty when it is valid.
#[derive(Clone)]
pub struct EnvoyConfigValidator {
    problems: Arc<ValidateFn>,
    warnings: Option<Arc<ValidateFn>>,
}

type ValidateFn = dyn Fn(&str, &Value) -> Vec<String> + Send + Sync;

impl EnvoyConfigValidator {
    pub fn new(validate: impl Fn(&str, &Value) -> Vec<String> + Send + Sync + 'static) -> Self {
        Self {
            problems: Arc::new(validate),
            warnings: None,
        }
    }

    /// Also returns `warn`'s findings on an object it admits, as admission warnings (what
    /// Envoy accepts but that will not do what the user meant).
    pub fn with_warnings(
        mut self,
        warn: impl Fn(&str, &Value) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.warnings = Some(Arc::new(warn));
        self
    }

    pub fn problems(&self, namespace: &str, object: &Value) -> Vec<String> {
        (self.problems)(namespace, object)
    }

    pub fn warnings(&self, namespace: &str, object: &Value) -> Vec<String> {
        self.warnings
            .as_ref()
            .map(|w| w(namespace, object))
            .unwrap_or_default()
    }
}

impl fmt::Debug for EnvoyConfigValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EnvoyConfigValidator")
    }
}

/// Decodes an AdmissionReview request for an EnvoyConfig, judges it with `validator` and
/// returns the AdmissionReview response. A body that is not an AdmissionReview is a
/// [`BadRequest`] (HTTP 400).
pub fn review_envoy_config(
    body: &[u8],
    validator: &EnvoyConfigValidator,
) -> Result<(Value, Outcome), BadRequest> {
    Ok(read_request(body)?.judge(validator))
}

/// An EnvoyConfig AdmissionReview request, decoded and not yet judged.
pub(crate) struct Request {
    uid: String,
    request: Map<String, Value>,
    namespace: String,
}

/// Decodes an AdmissionReview request; a body that is not one is a [`BadRequest`].
pub(crate) fn read_request(body: &[u8]) -> Result<Request, BadRequest> {
    let (uid, request) = request_tree(body)?;
    let namespace = namespace(&request).to_owned();
    Ok(Request {
        uid,
        request,
        namespace,
    })
}

impl Request {
    /// The namespace the object is judged in.
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Judges the object with `validator`: the AdmissionReview response.
    pub(crate) fn judge(self, validator: &EnvoyConfigValidator) -> (Value, Outcome) {
        respond(self.uid, decide(&self.request, validator))
    }

    /// The AdmissionReview response that refuses the object unjudged, `why` being that too
    /// many validations wait: `429 Too Many Requests`, which the API server passes on to the
    /// writer, whose client may retry.
    pub(crate) fn throttled(&self, why: String) -> Value {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": REVIEW,
            "response": {
                "uid": self.uid,
                "allowed": false,
                "status": {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": why},
            },
        })
    }
}

fn text(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str)
}

/// The request's namespace, else its object's (the API server always sends the first).
fn namespace(request: &Map<String, Value>) -> &str {
    text(request.get("namespace"))
        .or_else(|| {
            text(
                request
                    .get("object")
                    .and_then(|o| o.pointer("/metadata/namespace")),
            )
        })
        .unwrap_or_default()
}

fn decide(request: &Map<String, Value>, validator: &EnvoyConfigValidator) -> Decision {
    let kind = request.get("kind");
    let (group, kind) = (
        text(kind.and_then(|k| k.get("group"))),
        text(kind.and_then(|k| k.get("kind"))),
    );
    if group != Some(GROUP) || kind != Some(KIND) {
        // Misconfigured rules must not block unrelated objects.
        return Decision::Allow(
            None,
            vec![format!(
                "marin3r only validates {KIND}s ({GROUP}), not {} ({})",
                shown(kind),
                shown(group)
            )],
        );
    }
    let operation = text(request.get("operation"));
    if !matches!(operation, Some("CREATE" | "UPDATE")) {
        return Decision::Allow(None, Vec::new());
    }
    let Some(object) = request.get("object").filter(|o| o.is_object()) else {
        return Decision::Deny("the AdmissionReview request has no object".into());
    };
    let namespace = namespace(request);
    let problems = validator.problems(namespace, object);
    if problems.is_empty() {
        return Decision::Allow(None, validator.warnings(namespace, object));
    }
    let unchanged = operation == Some("UPDATE")
        && request
            .get("oldObject")
            .is_some_and(|old| old.get("spec") == object.get("spec"));
    if unchanged {
        let warnings = problems
            .iter()
            .take(5)
            .map(|p| format!("the spec, unchanged by this update, is invalid: {p}"))
            .collect();
        return Decision::Allow(None, warnings);
    }
    Decision::Deny(message(&problems))
}

/// The problems joined with "; ", cut at about [`MAX_MESSAGE_BYTES`].
fn message(problems: &[String]) -> String {
    let mut out = String::new();
    for (i, p) in problems.iter().enumerate() {
        if i > 0 && out.len() + p.len() > MAX_MESSAGE_BYTES {
            out.push_str(&format!("; and {} more problems", problems.len() - i));
            break;
        }
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(p);
    }
    out
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
