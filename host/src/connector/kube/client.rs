//! REST calls and watch streams to one Kubernetes API server ([`KubeClient`]), over reqwest with
//! the [`Endpoint`]'s TLS configuration and bearer token. A watch ([`WatchStream`]) runs in a
//! task of its own that reconnects from the last `resourceVersion` it saw when the server ends
//! the stream (watches time out by design), and stops after an `ERROR` event such as
//! `410 Gone`, which the caller answers by listing again.
//!
//! Owns: the HTTP side of the connection. Must not touch: exec streams (`exec`), WIT types.

use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::mpsc;

use super::config::{self, ClusterSettings, Endpoint};
use super::KubeError;
use crate::stop::StopSignal;

/// How long a connection to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a REST call may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Reconnections of a watch in a row that may fail before the watch fails.
const WATCH_RETRIES: u32 = 5;

/// A connection to one API server.
#[derive(Clone, Debug)]
pub struct KubeClient {
    endpoint: Endpoint,
    http: reqwest::Client,
}

/// What `User-Agent` says.
fn user_agent() -> String {
    format!("runway/{} (kubernetes executor)", env!("CARGO_PKG_VERSION"))
}

impl KubeClient {
    /// Resolve `settings` in the runner's environment and check the server answers `/version`.
    pub async fn connect(settings: &ClusterSettings, stop: &StopSignal) -> Result<KubeClient, KubeError> {
        let endpoint = config::resolve(settings, &config::Environment::process())?;
        let client = KubeClient::new(endpoint)?;
        let (status, body) = client.request("GET", "/version", None, None, 64 << 10, stop).await?;
        if status >= 400 {
            return Err(KubeError::from_status(status, &body));
        }
        Ok(client)
    }

    /// A client for a resolved endpoint (no call made yet).
    pub fn new(endpoint: Endpoint) -> Result<KubeClient, KubeError> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*endpoint.tls).clone())
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(user_agent())
            .build()
            .map_err(|e| KubeError::Config(format!("HTTP client: {e}")))?;
        Ok(KubeClient { endpoint, http })
    }

    /// The resolved endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    fn builder(&self, method: &str, path: &str) -> Result<reqwest::RequestBuilder, KubeError> {
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| KubeError::Other(format!("{method:?} is not an HTTP method")))?;
        if !path.starts_with('/') {
            return Err(KubeError::Other(format!("{path:?}: an API path starts with /")));
        }
        let mut builder = self.http.request(method, format!("{}{path}", self.endpoint.server));
        if let Some(token) = self.endpoint.bearer() {
            builder = builder.bearer_auth(token);
        }
        Ok(builder.header("Accept", "application/json"))
    }

    /// One REST call; any HTTP status is an answer. The body is cut at `max` bytes with
    /// [`KubeError::TooLarge`]. Transient failures are retried with backoff ([`retry_after`]):
    /// a call the server did not take (429, honouring `Retry-After`; a connection that was
    /// never made) in any case, a failed one (5xx such as `etcdserver: request timed out` or
    /// `etcdserver: leader changed`, a reset connection) only when repeating it is harmless:
    /// GET, HEAD, PUT, DELETE, and a POST that creates an object by name — repeated, it
    /// answers `409 AlreadyExists` when the first attempt was done after all, and then the
    /// object is read back and answered as created ([`KubeClient::created_before`]).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: Option<&str>,
        max: usize,
        stop: &StopSignal,
    ) -> Result<(u16, Vec<u8>), KubeError> {
        let created = if method == "POST" { created_name(body.as_deref()) } else { None };
        let idempotent = matches!(method, "GET" | "HEAD" | "PUT" | "DELETE") || created.is_some();
        let mut attempt = 0;
        loop {
            let result = self.request_once(method, path, body.clone(), content_type, max, stop).await;
            attempt += 1;
            if let (Some(name), Ok((409, answer, _)), true) = (&created, &result, attempt > 1) {
                return self.created_before(path, name, body.as_deref(), answer, max, stop).await;
            }
            let Some(wait) = retry_after(&result, idempotent, attempt) else {
                return result.map(|(s, b, _)| (s, b)).map_err(|failed| failed.error);
            };
            tracing::info!(method, path, attempt, ?wait, fault = %fault_kind(&result), "retrying a Kubernetes API call");
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.stopped() => return Err(KubeError::Canceled),
            }
        }
    }

    /// The answer to a repeated create of `name` at `path` that the server refused with
    /// `answer` (409): when it is `AlreadyExists` and the object there carries the labels that
    /// were sent, the first attempt created it, and the object is the answer (201).
    async fn created_before(
        &self,
        path: &str,
        name: &str,
        sent: Option<&[u8]>,
        answer: &[u8],
        max: usize,
        stop: &StopSignal,
    ) -> Result<(u16, Vec<u8>), KubeError> {
        let refused = Ok((409, answer.to_vec()));
        let status: serde_json::Value = serde_json::from_slice(answer).unwrap_or_default();
        if status["reason"].as_str() != Some("AlreadyExists") {
            return refused;
        }
        let collection = path.split('?').next().unwrap_or(path);
        let Ok((200, object)) =
            Box::pin(self.request("GET", &format!("{collection}/{name}"), None, None, max, stop)).await
        else {
            return refused;
        };
        let labels = |bytes: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(bytes).unwrap_or_default()["metadata"]["labels"].clone()
        };
        if labels(&object) != labels(sent.unwrap_or_default()) {
            return refused;
        }
        tracing::info!(path, name, "a repeated create found the object the first attempt made");
        Ok((201, object))
    }

    /// One attempt: status, body, and the `Retry-After` seconds of the answer.
    async fn request_once(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: Option<&str>,
        max: usize,
        stop: &StopSignal,
    ) -> Result<(u16, Vec<u8>, Option<u64>), Failed> {
        let mut builder = self.builder(method, path).map_err(Failed::sent)?.timeout(REQUEST_TIMEOUT);
        if let Some(body) = body {
            builder = builder.header("Content-Type", content_type.unwrap_or("application/json")).body(body);
        }
        let call = async {
            let response = builder.send().await.map_err(|e| Failed::of(&self.endpoint.server, &e))?;
            let status = response.status().as_u16();
            let retry = response
                .headers()
                .get("Retry-After")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let mut stream = response.bytes_stream();
            let mut out = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Failed::sent(connection_error(&self.endpoint.server, &e)))?;
                if out.len() + chunk.len() > max {
                    return Err(Failed::sent(KubeError::TooLarge(u32::try_from(max).unwrap_or(u32::MAX))));
                }
                out.extend_from_slice(&chunk);
            }
            Ok((status, out, retry))
        };
        tokio::select! {
            result = call => result,
            () = stop.stopped() => Err(Failed::sent(KubeError::Canceled)),
        }
    }

    /// Watch the collection at `path` (its query kept; `watch=1` and `allowWatchBookmarks`
    /// added) from `resource_version`.
    pub fn watch(&self, path: &str, resource_version: &str) -> Result<WatchStream, KubeError> {
        if !path.starts_with('/') {
            return Err(KubeError::Other(format!("{path:?}: an API path starts with /")));
        }
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(run_watch(self.clone(), path.to_string(), resource_version.to_string(), tx));
        Ok(WatchStream { rx, task })
    }
}

/// Attempts of one REST call before its last answer is taken.
const ATTEMPTS: u32 = 6;

/// A failed attempt of a REST call: why, and whether the request surely never reached the
/// server (no connection was made: reqwest's [`reqwest::Error::is_connect`]), so that any
/// call may be sent again.
#[derive(Debug)]
struct Failed {
    error: KubeError,
    unsent: bool,
}

impl Failed {
    /// A failure after the request may have reached the server (or one that is not about
    /// the connection at all).
    fn sent(error: KubeError) -> Failed {
        Failed { error, unsent: false }
    }

    /// The failure of sending a request: unsent when reqwest could not connect.
    fn of(server: &str, error: &reqwest::Error) -> Failed {
        Failed { error: connection_error(server, error), unsent: error.is_connect() }
    }
}

/// The name a POST body creates its object under (`metadata.name`; not `generateName`, whose
/// repetition would create a second object).
fn created_name(body: Option<&[u8]>) -> Option<String> {
    let object: serde_json::Value = serde_json::from_slice(body?).ok()?;
    object["metadata"]["name"].as_str().filter(|n| !n.is_empty()).map(str::to_string)
}

/// What kind of fault a retried attempt met, for the runner's log: the HTTP status with the
/// etcd message when there is one, or the connection failure.
fn fault_kind(result: &Result<(u16, Vec<u8>, Option<u64>), Failed>) -> String {
    match result {
        Ok((status, body, _)) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).to_string();
            match ["etcdserver: request timed out", "etcdserver: leader changed"].iter().find(|m| text.contains(**m)) {
                Some(message) => format!("{status} {message}"),
                None => status.to_string(),
            }
        }
        Err(Failed { unsent: true, .. }) => "connection not made".into(),
        Err(Failed { .. }) => "connection lost".into(),
    }
}

/// How long to wait before attempt `attempt + 1` of a call that got `result`, or `None` when
/// the result stands: 429 (the server did not take the call; its `Retry-After`, at most 10 s)
/// and a connection that was never made always; 5xx and other connection failures only for
/// `idempotent` calls. Backoff 0.2 s doubling to 3.2 s.
fn retry_after(
    result: &Result<(u16, Vec<u8>, Option<u64>), Failed>,
    idempotent: bool,
    attempt: u32,
) -> Option<Duration> {
    if attempt >= ATTEMPTS {
        return None;
    }
    let backoff = Duration::from_millis(200 << (attempt - 1).min(4));
    match result {
        Ok((429, _, after)) => Some(after.map(|s| Duration::from_secs(s.min(10))).unwrap_or(backoff)),
        Ok((500..=599, _, after)) if idempotent => {
            Some(after.map(|s| Duration::from_secs(s.min(10))).unwrap_or(backoff))
        }
        Err(Failed { error: KubeError::Connection(_), unsent }) if idempotent || *unsent => Some(backoff),
        _ => None,
    }
}

/// A connection failure, named by the server it was for.
fn connection_error(server: &str, error: &reqwest::Error) -> KubeError {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    KubeError::Connection(format!("Kubernetes API server {server}: {text}"))
}

/// An open watch: events as the server sent them, one JSON object each.
pub struct WatchStream {
    rx: mpsc::Receiver<Result<String, KubeError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WatchStream {
    /// The next event, `None` when `timeout` passed without one. After an `ERROR` event or an
    /// error the stream has ended and returns [`KubeError::Other`].
    pub async fn next(&mut self, timeout: Duration, stop: &StopSignal) -> Result<Option<String>, KubeError> {
        tokio::select! {
            event = self.rx.recv() => match event {
                Some(result) => result.map(Some),
                None => Err(KubeError::Other("the watch has ended: watch again".into())),
            },
            () = tokio::time::sleep(timeout) => Ok(None),
            () = stop.stopped() => Err(KubeError::Canceled),
        }
    }
}

/// The resource version of a watch event's object, if it has one.
fn event_version(event: &serde_json::Value) -> Option<String> {
    event["object"]["metadata"]["resourceVersion"].as_str().filter(|v| !v.is_empty()).map(str::to_string)
}

/// The watch task: connect, forward every line, reconnect from the last version seen.
async fn run_watch(client: KubeClient, path: String, mut version: String, tx: mpsc::Sender<Result<String, KubeError>>) {
    let mut failures = 0;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut url = format!("{path}{sep}watch=1&allowWatchBookmarks=true");
        if !version.is_empty() {
            url.push_str(&format!("&resourceVersion={}", version));
        }
        let outcome = async {
            let response =
                client.builder("GET", &url)?.send().await.map_err(|e| connection_error(&client.endpoint.server, &e))?;
            let status = response.status().as_u16();
            if status >= 400 {
                let body = response.bytes().await.unwrap_or_default();
                return Err(KubeError::from_status(status, &body));
            }
            Ok(response)
        }
        .await;
        let response = match outcome {
            // The server answers: what counts from here is how this watch ends.
            Ok(response) => {
                failures = 0;
                response
            }
            Err(KubeError::Api { status: 410, reason, message }) => {
                // Too old a version at the start: as the ERROR event a running watch gets,
                // so the caller lists again.
                let status = serde_json::json!({"kind": "Status", "status": "Failure", "code": 410, "reason": reason, "message": message});
                let _ = tx.send(Ok(serde_json::json!({"type": "ERROR", "object": status}).to_string())).await;
                return;
            }
            Err(e @ KubeError::Api { status: 400..=428 | 430..=499, .. }) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
            Err(e) => {
                failures += 1;
                if failures > WATCH_RETRIES {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
                tracing::info!(path, failures, error = %e, "re-establishing a Kubernetes watch");
                tokio::time::sleep(Duration::from_millis(200 << failures.min(5))).await;
                continue;
            }
        };
        let mut stream = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut clean = true;
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                clean = false;
                break;
            };
            failures = 0;
            buffer.extend_from_slice(&chunk);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let text = String::from_utf8_lossy(&line).trim().to_string();
                if text.is_empty() {
                    continue;
                }
                let event: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let is_error = event["type"].as_str() == Some("ERROR");
                if !is_error {
                    if let Some(v) = event_version(&event) {
                        version = v;
                    }
                }
                if tx.send(Ok(text)).await.is_err() || is_error {
                    return;
                }
            }
        }
        tracing::info!(path, version, clean, "the Kubernetes watch ended: watching again from its last version");
        if !clean {
            // A cut stream is watched again from its last version, as client-go's reflector
            // does, however often it happens (a quiet watch of a pod held Pending sees no event
            // between cuts), after a pause so a flapping server is not hammered; only failing
            // to re-establish it, WATCH_RETRIES times in a row, ends the watch.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_safe_to_repeat_is_retried() {
        let answer = |status: u16, after: Option<u64>| Ok((status, Vec::new(), after));
        let failed = |m: &str, unsent: bool| Err(Failed { error: KubeError::Connection(m.into()), unsent });
        assert_eq!(retry_after(&answer(429, Some(2)), false, 1), Some(Duration::from_secs(2)), "429: never taken");
        assert_eq!(retry_after(&answer(500, None), true, 1), Some(Duration::from_millis(200)));
        assert_eq!(retry_after(&answer(500, None), true, 3), Some(Duration::from_millis(800)));
        assert_eq!(retry_after(&answer(500, None), false, 1), None, "a POST that failed may have been done");
        assert_eq!(retry_after(&answer(404, None), true, 1), None);
        assert_eq!(retry_after(&answer(503, None), true, ATTEMPTS), None, "the last attempt stands");
        let refused = failed("x: error sending request", true);
        assert!(retry_after(&refused, false, 1).is_some(), "a connection never made sent nothing");
        let dropped = failed("x: Connection refused (os error 111) in a proxy's words", false);
        assert!(retry_after(&dropped, false, 1).is_none(), "the message does not decide: the error's kind does");
        assert!(retry_after(&dropped, true, 1).is_some());
        let large = Err(Failed::sent(KubeError::TooLarge(10)));
        assert!(retry_after(&large, true, 1).is_none());
    }

    #[test]
    fn a_create_by_name_may_be_repeated_and_generate_name_may_not() {
        assert_eq!(created_name(Some(br#"{"metadata":{"name":"p-1"}}"#)), Some("p-1".into()));
        assert_eq!(created_name(Some(br#"{"metadata":{"generateName":"p-"}}"#)), None);
        assert_eq!(created_name(Some(b"not json")), None);
        assert_eq!(created_name(None), None);
    }

    #[test]
    fn faults_are_named_by_kind() {
        let etcd = Ok((500, br#"{"message":"etcdserver: leader changed"}"#.to_vec(), None));
        assert_eq!(fault_kind(&etcd), "500 etcdserver: leader changed");
        assert_eq!(fault_kind(&Ok((429, Vec::new(), Some(1)))), "429");
        assert_eq!(
            fault_kind(&Err(Failed { error: KubeError::Connection("x".into()), unsent: true })),
            "connection not made"
        );
    }

    /// reqwest's own classification: a port nobody listens on is a connection never made.
    #[tokio::test]
    async fn a_refused_connection_is_classified_by_reqwest_as_unsent() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let error = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/")).send().await.expect_err("refused");
        let failed = Failed::of("http://127.0.0.1", &error);
        assert!(failed.unsent, "{failed:?}");
        assert!(retry_after(&Err(failed), false, 1).is_some());
    }
}
