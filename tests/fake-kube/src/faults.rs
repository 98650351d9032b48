//! The state of the fault knobs a test turns through the control API: pods held
//! Unschedulable, calls answered with an error, open watches and exec/attach streams to cut,
//! and the record of every create/update body received. Only state and matching; the
//! control routes are in `control.rs`, the kubelet and the API ask here.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::broadcast;

use crate::selectors::LabelSelector;
use crate::status::ApiError;

/// Pods to keep Unschedulable.
#[derive(Debug)]
pub(crate) struct Hold {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub selector: Option<LabelSelector>,
    pub seconds: f64,
}

/// Calls to answer with an error.
#[derive(Debug)]
pub(crate) struct Failure {
    pub method: Option<String>,
    pub path: regex::Regex,
    pub remaining: u64,
    pub status: u16,
    pub message: String,
    pub retry_after: Option<u64>,
}

/// Every knob.
pub(crate) struct Faults {
    holds: Mutex<Vec<Hold>>,
    failures: Mutex<Vec<Failure>>,
    watches: broadcast::Sender<()>,
    streams: broadcast::Sender<()>,
    requests: Mutex<Vec<Value>>,
    started: Instant,
}

impl Faults {
    pub(crate) fn new() -> Faults {
        Faults {
            holds: Mutex::default(),
            failures: Mutex::default(),
            watches: broadcast::channel(16).0,
            streams: broadcast::channel(16).0,
            requests: Mutex::default(),
            started: Instant::now(),
        }
    }

    pub(crate) fn hold(&self, hold: Hold) {
        self.holds.lock().unwrap_or_else(|e| e.into_inner()).push(hold);
    }

    pub(crate) fn clear_holds(&self) {
        self.holds.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// How long to keep `pod` Unschedulable, if a hold matches it.
    pub(crate) fn unschedulable(&self, pod: &Value) -> Option<Duration> {
        let holds = self.holds.lock().unwrap_or_else(|e| e.into_inner());
        let meta = &pod["metadata"];
        holds
            .iter()
            .find(|h| {
                h.namespace.as_deref().is_none_or(|n| meta["namespace"].as_str() == Some(n))
                    && h.name.as_deref().is_none_or(|n| meta["name"].as_str() == Some(n))
                    && h.selector.as_ref().is_none_or(|s| s.matches(pod))
            })
            .map(|h| Duration::from_secs_f64(h.seconds.max(0.0)))
    }

    pub(crate) fn fail(&self, failure: Failure) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(failure);
    }

    /// The error to answer `method path` with, if a failure matches (counting it down).
    pub(crate) fn failure_for(&self, method: &str, path_and_query: &str) -> Option<ApiError> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let failure = failures.iter_mut().find(|f| {
            f.remaining > 0
                && f.method.as_deref().is_none_or(|m| m.eq_ignore_ascii_case(method))
                && f.path.is_match(path_and_query)
        })?;
        failure.remaining -= 1;
        let reason = match failure.status {
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            409 => "Conflict",
            _ => "InternalError",
        };
        let mut error = ApiError::new(failure.status, reason, failure.message.clone());
        if failure.status == 500 {
            error = error.with_details(serde_json::json!({"causes": [{"message": failure.message}]}));
        }
        error.retry_after = failure.retry_after;
        failures.retain(|f| f.remaining > 0);
        Some(error)
    }

    /// Fires when a test cuts the open watches.
    pub(crate) fn watch_cuts(&self) -> broadcast::Receiver<()> {
        self.watches.subscribe()
    }

    /// Cut every open watch: how many there were.
    pub(crate) fn cut_watches(&self) -> usize {
        self.watches.send(()).unwrap_or(0)
    }

    /// Fires when a test cuts the open exec/attach streams.
    pub(crate) fn stream_cuts(&self) -> broadcast::Receiver<()> {
        self.streams.subscribe()
    }

    pub(crate) fn cut_streams(&self) -> usize {
        self.streams.send(()).unwrap_or(0)
    }

    /// Keep a create/update/patch body.
    pub(crate) fn record(&self, method: &str, path: &str, query: &str, body: Value) {
        let entry = serde_json::json!({
            "method": method,
            "path": path,
            "query": query,
            "body": body,
            "seconds": self.started.elapsed().as_secs_f64(),
        });
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn clear_requests(&self) {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
