//! The API calls the executor makes, over the host's `kube` capability: create an object, read
//! one, delete one; and how a Kubernetes failure becomes the job's failure (the API server's
//! own message kept, the object named). Owns no decision about what the objects hold.

use runway_sdk::executor::ExecutorError;
use runway_sdk::kube::{Cluster, KubeError};
use serde_json::Value;

/// The cluster of one job.
pub struct Api {
    /// The host's connection.
    pub cluster: Cluster,
}

/// A person's reading of a Kubernetes failure.
pub fn message(error: &KubeError) -> String {
    match error {
        KubeError::NotPermitted(m) | KubeError::Config(m) | KubeError::Connection(m) | KubeError::Other(m) => m.clone(),
        KubeError::Api(api) => format!("{} ({} {})", api.message, api.status, api.reason),
        KubeError::Canceled => "canceled".into(),
        KubeError::TooLarge(limit) => format!("an answer was larger than the {limit}-byte limit"),
    }
}

/// The executor error of a Kubernetes failure while doing `what`.
pub fn executor_error(error: KubeError, what: &str) -> ExecutorError {
    match error {
        KubeError::Canceled => ExecutorError::Canceled,
        KubeError::Config(m) | KubeError::NotPermitted(m) => ExecutorError::InvalidConfig(format!("{what}: {m}")),
        KubeError::Connection(m) => ExecutorError::Unavailable(format!("{what}: {m}")),
        other => ExecutorError::Other(format!("{what}: {}", message(&other))),
    }
}

impl Api {
    /// The API of `cluster`.
    pub fn new(cluster: Cluster) -> Api {
        Api { cluster }
    }

    /// `POST` `object` to the collection at `path`; the created object.
    pub fn create(&self, path: &str, object: &Value, what: &str) -> Result<Value, ExecutorError> {
        let body = serde_json::to_vec(object).map_err(|e| ExecutorError::Other(format!("{what}: {e}")))?;
        let response = self
            .cluster
            .request("POST", path, Some(&body))
            .map_err(|e| executor_error(e, &format!("creating {what}")))?;
        if response.status >= 300 {
            return Err(status_error(response.status, &response.body, &format!("creating {what}")));
        }
        Ok(serde_json::from_slice(&response.body).unwrap_or_default())
    }

    /// `GET` the object at `path`; `None` when it does not exist.
    pub fn get(&self, path: &str, what: &str) -> Result<Option<Value>, ExecutorError> {
        let response =
            self.cluster.request("GET", path, None).map_err(|e| executor_error(e, &format!("reading {what}")))?;
        match response.status {
            404 => Ok(None),
            s if s >= 300 => Err(status_error(s, &response.body, &format!("reading {what}"))),
            _ => serde_json::from_slice(&response.body)
                .map(Some)
                .map_err(|e| ExecutorError::Other(format!("reading {what}: {e}"))),
        }
    }

    /// `DELETE` the object at `path`, best effort: a failure is logged, a missing object is
    /// fine.
    pub fn delete(&self, path: &str, what: &str) {
        match self.cluster.request("DELETE", path, None) {
            Ok(response) if response.status < 300 || response.status == 404 => {}
            Ok(response) => runway_sdk::log::warn(&format!(
                "deleting {what}: {}",
                message(&status_kube_error(response.status, &response.body))
            )),
            Err(e) => runway_sdk::log::warn(&format!("deleting {what}: {}", message(&e))),
        }
    }
}

/// The Kubernetes error of a failure status and its `Status` body.
fn status_kube_error(status: u16, body: &[u8]) -> KubeError {
    let parsed: Value = serde_json::from_slice(body).unwrap_or_default();
    let text = |key: &str| parsed[key].as_str().unwrap_or_default().to_string();
    let message = match text("message") {
        m if m.is_empty() => String::from_utf8_lossy(&body[..body.len().min(512)]).trim().to_string(),
        m => m,
    };
    KubeError::Api(runway_sdk::kube::ApiError { status, reason: text("reason"), message })
}

/// The executor error of a failure status while doing `what`.
pub fn status_error(status: u16, body: &[u8], what: &str) -> ExecutorError {
    executor_error(status_kube_error(status, body), what)
}
