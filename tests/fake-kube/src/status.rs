//! Kubernetes `Status` objects and the API's error type: every failed call answers with a
//! `Status` (`kind: Status`, `status: Failure`, `reason`, `code`, `details`) as the real
//! apiserver does. Owns nothing else; routes and the store build their errors from here.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// A failed API call: HTTP code, the Status `reason` and `message`, optional `details`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// `Retry-After` seconds (429 and 503 answers).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason, message: message.into(), details: None, retry_after: None }
    }

    pub(crate) fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// `pods "x" not found`.
    pub(crate) fn not_found(resource: &str, name: &str) -> ApiError {
        ApiError::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
            .with_details(json!({"name": name, "kind": resource}))
    }

    /// `pods "x" already exists`.
    pub(crate) fn already_exists(resource: &str, name: &str) -> ApiError {
        ApiError::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"))
            .with_details(json!({"name": name, "kind": resource}))
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    /// 422 Invalid with one cause per `(field, message)`, as the apiserver's validation:
    /// `Pod "x" is invalid: spec.containers[0].image: Required value`.
    pub(crate) fn invalid(kind: &str, name: &str, causes: &[(String, String)]) -> ApiError {
        let text: Vec<String> = causes.iter().map(|(field, message)| format!("{field}: {message}")).collect();
        let message = if text.len() == 1 {
            format!("{kind} \"{name}\" is invalid: {}", text[0])
        } else {
            format!("{kind} \"{name}\" is invalid: [{}]", text.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(field, message)| {
                let reason =
                    if message.starts_with("Required value") { "FieldValueRequired" } else { "FieldValueInvalid" };
                json!({"reason": reason, "message": message, "field": field})
            })
            .collect();
        ApiError::new(422, "Invalid", message).with_details(json!({"name": name, "kind": kind, "causes": causes}))
    }

    /// The Status object of this error.
    pub(crate) fn status(&self) -> Value {
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
        } else if let Some(retry) = self.retry_after {
            status["details"] = json!({"retryAfterSeconds": retry});
        }
        if self.reason.is_empty() {
            if let Some(map) = status.as_object_mut() {
                map.remove("reason");
            }
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (code, axum::Json(self.status())).into_response();
        if let Some(retry) = self.retry_after {
            if let Ok(value) = retry.to_string().parse() {
                response.headers_mut().insert("Retry-After", value);
            }
        }
        response
    }
}
