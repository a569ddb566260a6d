//! Kubernetes `Status` errors: the exact reasons and codes clients branch on (kube-rs matches
//! `reason`, kubectl prints `message`), and their conversion into HTTP responses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::registry::ResourceInfo;

/// A failed request, answered as a `Status` object with the same HTTP code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, info: &ResourceInfo, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": info.group, "kind": info.plural}));
        self
    }

    pub fn not_found(info: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", info.qualified()),
        )
        .with_details(info, name)
    }

    pub fn namespace_not_found(ns: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"));
        e.details = Some(json!({"name": ns, "kind": "namespaces"}));
        e
    }

    pub fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", info.qualified()),
        )
        .with_details(info, name)
    }

    pub fn conflict(info: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                info.qualified()
            ),
        )
        .with_details(info, name)
    }

    pub fn stale(info: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            info,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(info: &ResourceInfo, name: &str, why: impl std::fmt::Display) -> Self {
        Self::invalid_fields(info, name, &[why.to_string()])
    }

    /// 422 Invalid for field errors (`spec.x: Required value`), with the `causes` kubectl
    /// prints (`The Kind "name" is invalid: field: message`).
    pub fn invalid_fields(info: &ResourceInfo, name: &str, errors: &[String]) -> Self {
        let why = match errors {
            [one] => one.clone(),
            more => format!("[{}]", more.join(", ")),
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| {
                let (field, message) = e.split_once(": ").unwrap_or(("", e.as_str()));
                let reason = [
                    ("Required value", "FieldValueRequired"),
                    ("Unsupported value", "FieldValueNotSupported"),
                    ("Too long", "FieldValueTooLong"),
                    ("Too many", "FieldValueTooMany"),
                    ("Duplicate value", "FieldValueDuplicate"),
                    ("Forbidden", "FieldValueForbidden"),
                ]
                .iter()
                .find(|(prefix, _)| message.starts_with(prefix))
                .map_or("FieldValueInvalid", |(_, r)| r);
                json!({"reason": reason, "message": message, "field": field})
            })
            .collect();
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {why}", info.qualified_kind()),
        );
        err.details =
            Some(json!({"name": name, "group": info.group, "kind": info.kind, "causes": causes}));
        err
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// The error a fault-injection switch answers with, by HTTP code.
    pub fn injected(code: u16) -> Self {
        let reason = match code {
            403 => "Forbidden",
            409 => "Conflict",
            410 => "Expired",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            _ => "InternalError",
        };
        Self::new(code, reason, format!("injected fault: {code}"))
    }

    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.status())).into_response()
    }
}
