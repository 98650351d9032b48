//! Azure Resource Manager calls: JSON over HTTPS with a bearer token, ARM's error bodies
//! (`{"error": {"code", "message"}}`), throttling (429, `Retry-After`) and 5xx retried with
//! back-off, a refused token refreshed once, `nextLink` pagination, and long-running
//! operations followed through `Azure-AsyncOperation` or `Location` for as long as a call may
//! wait.
//!
//! The request loop and the error's shape are `cloud_common::call`'s (shared with the Google
//! plugin); ARM's error bodies and codes are this module's.
//!
//! Owns: the REST mechanics. Must not touch: what the scale set calls mean.

use std::time::Duration;

use cloud_common::call::{self, ApiError, Bearer};
use cloud_common::http::Response;
use runway_sdk::fleeting::{CapacityError, ProviderError};

use crate::auth::Auth;

/// An ARM error answer.
#[derive(Debug, Clone)]
pub struct ArmError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

/// Error codes that mean the region has no capacity or the subscription no quota.
const CAPACITY_CODES: [&str; 8] = [
    "AllocationFailed",
    "ZonalAllocationFailed",
    "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest",
    "SkuNotAvailable",
    "QuotaExceeded",
    "OperationNotAllowed",
    "SpotMaxPriceTooLow",
];

/// How long `increase` refuses after a capacity error.
pub const CAPACITY_RETRY_SECONDS: u32 = 120;

impl ApiError for ArmError {
    fn from_response(response: &Response) -> ArmError {
        let value: serde_json::Value = serde_json::from_slice(&response.body).unwrap_or_default();
        let error = value.get("error").cloned().unwrap_or_default();
        ArmError {
            status: response.status,
            code: error.get("code").and_then(|c| c.as_str()).unwrap_or("").to_string(),
            message: error
                .get("message")
                .and_then(|c| c.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| response.text().chars().take(300).collect()),
        }
    }

    fn retryable(&self) -> bool {
        self.status == 429 || self.status >= 500
    }

    fn status(&self) -> u16 {
        self.status
    }

    fn into_provider(self, what: &str) -> ProviderError {
        let message = format!("{what}: {} (HTTP {}): {}", self.code, self.status, self.message);
        if self.is_capacity() {
            return ProviderError::Capacity(CapacityError { message, retry_after_seconds: CAPACITY_RETRY_SECONDS });
        }
        match self.status {
            401 | 403 => ProviderError::InvalidConfig(message),
            404 => ProviderError::NotFound(message),
            409 | 429 | 500..=599 => ProviderError::Transient(message),
            _ => ProviderError::Other(message),
        }
    }
}

impl ArmError {
    /// Is this a lack of capacity or quota?
    pub fn is_capacity(&self) -> bool {
        CAPACITY_CODES.contains(&self.code.as_str())
    }
}

/// Why a call failed.
pub type CallError = call::CallError<ArmError>;

impl Bearer for Auth {
    fn bearer(&mut self) -> Result<String, String> {
        Auth::bearer(self).map_err(|e| e.0)
    }

    fn invalidate(&mut self) {
        Auth::invalidate(self)
    }
}

/// An ARM client.
pub struct Arm {
    auth: Auth,
}

/// How many polls a long-running operation gets within one call, and the longest wait
/// between two (ARM's `Retry-After` is honoured up to it).
const LRO_POLLS: u32 = 15;
const LRO_MAX_WAIT: Duration = Duration::from_secs(2);

/// Where a long-running operation ended, as far as the call watched it.
pub enum Lro {
    /// Finished successfully.
    Succeeded,
    /// Still running when the call stopped watching.
    Running,
}

impl Arm {
    /// A client taking tokens from `auth`.
    pub fn new(auth: Auth) -> Arm {
        Arm { auth }
    }

    /// One request, retried on throttling and server errors; the 2xx response.
    pub fn send(&mut self, method: &str, url: &str, body: Option<&serde_json::Value>) -> Result<Response, CallError> {
        call::send(&mut self.auth, method, url, body.map(|b| b.to_string()))
    }

    /// GET `url` as JSON.
    pub fn get(&mut self, url: &str) -> Result<serde_json::Value, CallError> {
        let response = self.send("GET", url, None)?;
        serde_json::from_slice(&response.body).map_err(|e| {
            CallError::Api(ArmError { status: response.status, code: "BadJson".into(), message: e.to_string() })
        })
    }

    /// Every item of a paged list (`value`, following `nextLink`).
    pub fn list(&mut self, url: &str) -> Result<Vec<serde_json::Value>, CallError> {
        let mut items = Vec::new();
        let mut next = Some(url.to_string());
        let mut pages = 0;
        while let Some(url) = next.take() {
            let page = self.get(&url)?;
            if let Some(values) = page.get("value").and_then(|v| v.as_array()) {
                items.extend(values.iter().cloned());
            }
            pages += 1;
            next = page
                .get("nextLink")
                .and_then(|n| n.as_str())
                .filter(|n| !n.is_empty() && pages < 100)
                .map(str::to_string);
        }
        Ok(items)
    }

    /// Follow the long-running operation `response` started, for a bounded time.
    pub fn follow(&mut self, response: &Response) -> Result<Lro, CallError> {
        if response.status != 201 && response.status != 202 {
            return Ok(Lro::Succeeded);
        }
        let (url, async_op) = match (response.header("azure-asyncoperation"), response.header("location")) {
            (Some(url), _) => (url.to_string(), true),
            (None, Some(url)) => (url.to_string(), false),
            (None, None) => return Ok(Lro::Running),
        };
        let mut wait = response.retry_after();
        for _ in 0..LRO_POLLS {
            cloud_common::sleep(wait.unwrap_or(Duration::from_millis(500)).min(LRO_MAX_WAIT));
            let poll = self.send("GET", &url, None)?;
            wait = poll.retry_after();
            if async_op {
                let status: serde_json::Value = serde_json::from_slice(&poll.body).unwrap_or_default();
                match status.get("status").and_then(|s| s.as_str()).unwrap_or("InProgress") {
                    "Succeeded" => return Ok(Lro::Succeeded),
                    "Failed" | "Canceled" => {
                        let error = status.get("error").cloned().unwrap_or_default();
                        return Err(CallError::Api(ArmError {
                            status: 200,
                            code: error.get("code").and_then(|c| c.as_str()).unwrap_or("OperationFailed").into(),
                            message: error.get("message").and_then(|c| c.as_str()).unwrap_or("").into(),
                        }));
                    }
                    _ => {}
                }
            } else if poll.status != 202 {
                return Ok(Lro::Succeeded);
            }
        }
        Ok(Lro::Running)
    }
}
