//! Compute Engine API calls: JSON with a bearer token, Google's error bodies
//! (`{"error": {"code", "message", "errors": [{"reason"}], "status"}}`), rate limits (429,
//! 403 `rateLimitExceeded`) and 5xx retried with back-off, a refused token refreshed once,
//! `nextPageToken` pagination, and zone operations followed (`status` to `DONE`, its `error`)
//! for as long as a call may wait.
//!
//! The request loop and the error's shape are `cloud_common::call`'s (shared with the Azure
//! plugin); Google's error bodies and codes are this module's.
//!
//! Owns: the REST mechanics. Must not touch: what the group calls mean.

use std::time::Duration;

use cloud_common::call::{self, Bearer};
use cloud_common::http::Response;
use runway_sdk::fleeting::{CapacityError, ProviderError};
use serde_json::Value;

use crate::auth::Auth;

/// Error codes (operation errors and managed instances' last attempts) that mean the zone
/// has no capacity or the project no quota.
const CAPACITY_CODES: [&str; 5] = [
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED",
    "RESOURCE_POOL_EXHAUSTED",
    "STOCKOUT",
];

/// How long `increase` refuses after a capacity error.
pub const CAPACITY_RETRY_SECONDS: u32 = 120;

/// Is `code` a lack of capacity or quota?
pub fn is_capacity(code: &str) -> bool {
    CAPACITY_CODES.contains(&code)
}

/// An API error.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    /// `reason` of the first error, or the operation error's `code`.
    pub code: String,
    pub message: String,
}

impl call::ApiError for ApiError {
    fn from_response(response: &Response) -> ApiError {
        let value: Value = serde_json::from_slice(&response.body).unwrap_or_default();
        let error = value.get("error").cloned().unwrap_or_default();
        let reason = error.pointer("/errors/0/reason").and_then(|r| r.as_str());
        ApiError {
            status: response.status,
            code: reason.or_else(|| error.get("status").and_then(|s| s.as_str())).unwrap_or("").to_string(),
            message: error
                .get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| response.text().chars().take(300).collect()),
        }
    }

    fn retryable(&self) -> bool {
        self.status == 429
            || self.status >= 500
            || matches!(self.code.as_str(), "rateLimitExceeded" | "userRateLimitExceeded" | "RESOURCE_EXHAUSTED")
    }

    fn status(&self) -> u16 {
        self.status
    }

    fn into_provider(self, what: &str) -> ProviderError {
        let message = format!("{what}: {} (HTTP {}): {}", self.code, self.status, self.message);
        if is_capacity(&self.code) {
            return ProviderError::Capacity(CapacityError { message, retry_after_seconds: CAPACITY_RETRY_SECONDS });
        }
        match self.status {
            401 | 403 => ProviderError::InvalidConfig(message),
            404 => ProviderError::NotFound(message),
            429 | 500..=599 => ProviderError::Transient(message),
            _ => ProviderError::Other(message),
        }
    }
}

/// Why a call failed.
pub type CallError = call::CallError<ApiError>;

impl Bearer for Auth {
    fn bearer(&mut self) -> Result<String, String> {
        Auth::bearer(self)
    }

    fn invalidate(&mut self) {
        Auth::invalidate(self)
    }
}

/// Polls of an operation within one call, and the wait between two.
const OPERATION_POLLS: u32 = 15;
const OPERATION_WAIT: Duration = Duration::from_millis(700);

/// A Compute Engine client.
pub struct Compute {
    auth: Auth,
}

impl Compute {
    /// A client taking tokens from `auth`.
    pub fn new(auth: Auth) -> Compute {
        Compute { auth }
    }

    /// A token now (init checks the credentials with it).
    pub fn check_auth(&mut self) -> Result<(), CallError> {
        self.auth.bearer().map(|_| ()).map_err(CallError::Auth)
    }

    /// One request, retried on rate limits and server errors; the 2xx answer as JSON.
    pub fn send(&mut self, method: &str, url: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let response = call::send(&mut self.auth, method, url, body.map(|b| b.to_string()))?;
        Ok(serde_json::from_slice(&response.body).unwrap_or_default())
    }

    /// Every item under `field` of a paged answer (`nextPageToken` → `pageToken`).
    pub fn list(&mut self, method: &str, url: &str, field: &str) -> Result<Vec<Value>, CallError> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..100 {
            let sep = if url.contains('?') { '&' } else { '?' };
            let page_url = match &token {
                Some(t) => format!("{url}{sep}pageToken={}", cloud_common::percent_encode(t)),
                None => url.to_string(),
            };
            let page = self.send(method, &page_url, None)?;
            if let Some(values) = page.get(field).and_then(|v| v.as_array()) {
                items.extend(values.iter().cloned());
            }
            token = page.get("nextPageToken").and_then(|t| t.as_str()).filter(|t| !t.is_empty()).map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        Ok(items)
    }

    /// Follow a zone operation until `DONE` (or the call has waited long enough); its error,
    /// if it ended with one. It is read from `operations` (the zone's operations URL) by name,
    /// not from its `selfLink`, whose host (www.googleapis.com) the grant need not name.
    pub fn follow(&mut self, operations: &str, operation: Value) -> Result<(), CallError> {
        let mut operation = operation;
        for _ in 0..OPERATION_POLLS {
            if operation.get("status").and_then(|s| s.as_str()) == Some("DONE") {
                let Some(error) = operation.pointer("/error/errors/0") else { return Ok(()) };
                return Err(CallError::Api(ApiError {
                    status: 200,
                    code: error.get("code").and_then(|c| c.as_str()).unwrap_or("OPERATION_FAILED").into(),
                    message: error.get("message").and_then(|m| m.as_str()).unwrap_or("").into(),
                }));
            }
            let Some(name) = operation.get("name").and_then(|l| l.as_str()).map(str::to_string) else {
                return Ok(());
            };
            cloud_common::sleep(OPERATION_WAIT);
            operation = self.send("GET", &format!("{operations}/{}", cloud_common::percent_encode(&name)), None)?;
        }
        Ok(())
    }
}
