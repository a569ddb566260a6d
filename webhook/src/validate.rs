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
    let (uid, request) = request_tree(body)?;
    Ok(respond(uid, decide(&request, validator)))
}

/// What a validation's turn is taken by, read from the body without decoding the rest (a
/// waiting validation holds its body, not a decoded tree ten times its size): the request's
/// uid and namespace, else its object's namespace, as [`decide`] reads them. A body this
/// cannot read (no JSON object, a field twice) gets an empty namespace: the turns are counted
/// per client address too, so only its sender shares that queue, and the body is refused
/// once decoded. The API server sends neither.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) uid: String,
    pub(crate) namespace: String,
}

pub(crate) fn head(body: &[u8]) -> Head {
    #[derive(serde::Deserialize)]
    struct Review {
        #[serde(default)]
        request: Option<Request>,
    }
    #[derive(serde::Deserialize)]
    struct Request {
        #[serde(default)]
        uid: Text,
        #[serde(default)]
        namespace: Text,
        #[serde(default)]
        object: Option<Object>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Option<Metadata>,
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(default)]
        namespace: Text,
    }
    let Ok(Review {
        request: Some(request),
    }) = serde_json::from_slice::<Review>(body)
    else {
        return Head::default();
    };
    let object = request
        .object
        .and_then(|o| o.metadata)
        .and_then(|m| m.namespace.0);
    Head {
        uid: request.uid.0.unwrap_or_default(),
        namespace: request.namespace.0.or(object).unwrap_or_default(),
    }
}

/// A JSON string, or None for any other value (read and dropped), as `Value::as_str` reads one.
#[derive(Default)]
struct Text(Option<String>);

impl<'de> serde::Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Any;
        impl<'de> serde::de::Visitor<'de> for Any {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Text, E> {
                Ok(Text(Some(v.to_owned())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_unit<E>(self) -> Result<Text, E> {
                Ok(Text(None))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Text(None))
            }
        }
        d.deserialize_any(Any)
    }
}

/// The AdmissionReview response that refuses a validation unjudged, `why` being that too many
/// wait: `429 Too Many Requests`, which the API server passes on to the writer, whose client
/// may retry.
pub(crate) fn throttled(uid: &str, why: String) -> Value {
    serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": REVIEW,
        "response": {
            "uid": uid,
            "allowed": false,
            "status": {"status": "Failure", "code": 429, "reason": "TooManyRequests", "message": why},
        },
    })
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
