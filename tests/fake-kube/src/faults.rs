//! The state of the fault knobs a test turns through the control API: pods held
//! Unschedulable, calls answered with an error or a TCP reset, open watches and exec/attach
//! streams to cut, open connections to reset, the count of every fault injected by kind, and
//! the record of every create/update body received. Only state and matching; the control
//! routes are in `control.rs`, the kubelet and the API ask here.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Notify;

use crate::resets::Connections;
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
    /// Reset the call's TCP connection instead of answering.
    pub reset: bool,
}

/// What a matching failure rule does to a call.
pub(crate) enum Injected {
    /// Answer with this error.
    Answer(ApiError),
    /// Reset the connection (no answer).
    Reset,
}

/// The namespace a request path is in ("" when none).
fn namespace_of(path: &str) -> &str {
    path.strip_prefix("/api/v1/namespaces/")
        .and_then(|rest| rest.split(['/', '?']).next())
        .filter(|_| path.matches('/').count() > 4)
        .unwrap_or_default()
}

/// A watch's or stream's end when a test cuts it (its namespace's, or every one).
pub(crate) struct Cut(Arc<Notify>);

impl Cut {
    /// Resolves when cut.
    pub(crate) async fn cut(&self) {
        self.0.notified().await
    }
}

/// Open watches or streams, with their namespace (`None`: cluster-wide).
#[derive(Default)]
struct OpenCuts(Mutex<Vec<(Option<String>, Weak<Notify>)>>);

impl OpenCuts {
    fn open(&self, namespace: Option<String>) -> Cut {
        let notify = Arc::new(Notify::new());
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, n)| n.strong_count() > 0);
        open.push((namespace, Arc::downgrade(&notify)));
        Cut(notify)
    }

    /// Cut those of `namespace` (`None`: all): the namespace of each ("" when none).
    fn cut(&self, namespace: Option<&str>) -> Vec<String> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, n)| n.strong_count() > 0);
        open.iter()
            .filter(|(ns, _)| namespace.is_none() || ns.as_deref() == namespace)
            .filter_map(|(ns, n)| n.upgrade().map(|n| (ns, n)))
            .map(|(ns, n)| {
                n.notify_one();
                ns.clone().unwrap_or_default()
            })
            .collect()
    }
}

/// Every knob.
pub(crate) struct Faults {
    holds: Mutex<Vec<Hold>>,
    failures: Mutex<Vec<Failure>>,
    watches: OpenCuts,
    streams: OpenCuts,
    requests: Mutex<Vec<Value>>,
    started: Instant,
    connections: Arc<Connections>,
    /// Faults injected so far, by namespace ("" when none) and kind.
    injected: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
}

impl Faults {
    pub(crate) fn new() -> Faults {
        Faults {
            holds: Mutex::default(),
            failures: Mutex::default(),
            watches: OpenCuts::default(),
            streams: OpenCuts::default(),
            requests: Mutex::default(),
            started: Instant::now(),
            connections: Arc::default(),
            injected: Mutex::default(),
        }
    }

    /// The open connections (the TLS listener tracks them).
    pub(crate) fn connections(&self) -> Arc<Connections> {
        self.connections.clone()
    }

    /// Count one fault of `kind` in `namespace`.
    fn count(&self, namespace: &str, kind: &str) {
        let mut injected = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        *injected.entry(namespace.to_string()).or_default().entry(kind.to_string()).or_default() += 1;
    }

    /// Faults injected so far in `namespace` (`None`: all, by namespace), by kind.
    pub(crate) fn injected(&self, namespace: Option<&str>) -> Value {
        let injected = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        match namespace {
            Some(ns) => serde_json::json!(injected.get(ns).cloned().unwrap_or_default()),
            None => serde_json::json!(*injected),
        }
    }

    /// Reset every open connection but `except`'s (the caller's) — with `namespace`, those
    /// whose latest request was in it: how many.
    pub(crate) fn reset_connections(&self, except: Option<SocketAddr>, namespace: Option<&str>) -> usize {
        let prefix = namespace.map(|ns| format!("/api/v1/namespaces/{ns}/"));
        let reset = self.connections.reset_all(except, prefix.as_deref());
        for path in &reset {
            self.count(namespace_of(path), "connection reset (open connection)");
        }
        reset.len()
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
            .inspect(|_| self.count(meta["namespace"].as_str().unwrap_or_default(), "pod held Unschedulable"))
    }

    pub(crate) fn fail(&self, failure: Failure) {
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).push(failure);
    }

    /// What to do to call `method path` from `peer`, if a failure matches (counting it down):
    /// a reset is done here.
    pub(crate) fn failure_for(&self, method: &str, path_and_query: &str, peer: Option<SocketAddr>) -> Option<Injected> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let failure = failures.iter_mut().find(|f| {
            f.remaining > 0
                && f.method.as_deref().is_none_or(|m| m.eq_ignore_ascii_case(method))
                && f.path.is_match(path_and_query)
        })?;
        failure.remaining -= 1;
        if failure.reset {
            failures.retain(|f| f.remaining > 0);
            drop(failures);
            if peer.is_some_and(|peer| self.connections.reset(peer)) {
                self.count(namespace_of(path_and_query), "connection reset (mid-request)");
            }
            return Some(Injected::Reset);
        }
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
        let kind = format!("{} {}", failure.status, failure.message);
        failures.retain(|f| f.remaining > 0);
        drop(failures);
        self.count(namespace_of(path_and_query), &kind);
        Some(Injected::Answer(error))
    }

    /// Fires when a test cuts the watch (in `namespace`).
    pub(crate) fn watch_cuts(&self, namespace: Option<String>) -> Cut {
        self.watches.open(namespace)
    }

    /// Cut every open watch (of `namespace`): how many there were.
    pub(crate) fn cut_watches(&self, namespace: Option<&str>) -> usize {
        let cut = self.watches.cut(namespace);
        for ns in &cut {
            self.count(ns, "watch cut");
        }
        cut.len()
    }

    /// Fires when a test cuts the exec/attach stream (of a pod in `namespace`).
    pub(crate) fn stream_cuts(&self, namespace: Option<String>) -> Cut {
        self.streams.open(namespace)
    }

    /// Cut every open exec/attach stream (of `namespace`): how many there were.
    pub(crate) fn cut_streams(&self, namespace: Option<&str>) -> usize {
        let cut = self.streams.cut(namespace);
        for ns in &cut {
            self.count(ns, "exec/attach stream cut");
        }
        cut.len()
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
