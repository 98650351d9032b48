//! Blocking HTTP/1.1 requests through `wasi:http/outgoing-handler`. The host checks each
//! request's host against the plugin's `allow_hosts` and refuses the rest
//! ([`HttpError::Denied`]); TLS is the host's.

use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme};
use wasip2::io::streams::StreamError;

/// Largest response body read (cloud API answers are far smaller).
const MAX_BODY: usize = 8 << 20;
/// Time allowed to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time allowed for the first response byte, and between later ones.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// One request.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// Absolute `http://` or `https://` URL.
    pub url: String,
    /// Header names and values.
    pub headers: Vec<(String, String)>,
    /// Body (empty for none).
    pub body: Vec<u8>,
}

impl Request {
    /// A request with no headers or body.
    pub fn new(method: &str, url: impl Into<String>) -> Request {
        Request { method: method.to_string(), url: url.into(), headers: Vec::new(), body: Vec::new() }
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Request {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }
}

/// One response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `Retry-After` in seconds, when the server sent one as a number.
    pub fn retry_after(&self) -> Option<Duration> {
        self.header("retry-after").and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_secs)
    }
}

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The runner's grant does not let this plugin reach the host (`allow_hosts`).
    Denied(String),
    /// The URL is not one this client can send.
    BadUrl(String),
    /// Connecting, sending or reading failed (DNS, refused, reset, timeout, TLS).
    Transport(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Denied(host) => {
                write!(f, "the runner denied the request to {host}: add it to the plugin's allow_hosts")
            }
            HttpError::BadUrl(m) => write!(f, "bad URL: {m}"),
            HttpError::Transport(m) => write!(f, "{m}"),
        }
    }
}

/// The parts of an absolute URL the request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// `http` or `https`.
    pub scheme: String,
    /// `host` or `host:port`.
    pub authority: String,
    /// Path and query, starting with `/`.
    pub path_and_query: String,
}

/// Split an absolute `http(s)://authority/path?query` URL.
pub fn parse_url(url: &str) -> Result<Url, HttpError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| HttpError::BadUrl(format!("{url:?} has no scheme")))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(HttpError::BadUrl(format!("{url:?}: only http and https are supported")));
    }
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
        Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
        None => (rest, "/".to_string()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(HttpError::BadUrl(format!("{url:?} has no host (or has user info)")));
    }
    Ok(Url { scheme, authority: authority.to_string(), path_and_query: path })
}

fn method(name: &str) -> Method {
    match name.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_string()),
    }
}

fn transport(what: &str, code: &ErrorCode) -> HttpError {
    match code {
        ErrorCode::HttpRequestDenied => HttpError::Denied(what.to_string()),
        other => HttpError::Transport(format!("{what}: {other:?}")),
    }
}

/// Send `request` and read the whole response.
pub fn send(request: &Request) -> Result<Response, HttpError> {
    let url = parse_url(&request.url)?;
    let mut entries: Vec<(String, Vec<u8>)> =
        request.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec())).collect();
    // The body's length up front, as the clouds' SDKs send it: without it the body goes
    // chunked, which some endpoints refuse (411) or do not read.
    let has_body = !request.body.is_empty() || matches!(request.method.as_str(), "POST" | "PUT" | "PATCH");
    if has_body && !entries.iter().any(|(k, _)| k == "content-length") {
        entries.push(("content-length".into(), request.body.len().to_string().into_bytes()));
    }
    let fields = Fields::from_list(&entries).map_err(|e| HttpError::BadUrl(format!("bad header: {e:?}")))?;
    let outgoing = OutgoingRequest::new(fields);
    let bad = |what: &str| HttpError::BadUrl(format!("{}: bad {what}", request.url));
    outgoing.set_method(&method(&request.method)).map_err(|_| bad("method"))?;
    let scheme = if url.scheme == "https" { Scheme::Https } else { Scheme::Http };
    outgoing.set_scheme(Some(&scheme)).map_err(|_| bad("scheme"))?;
    outgoing.set_authority(Some(&url.authority)).map_err(|_| bad("host"))?;
    outgoing.set_path_with_query(Some(&url.path_and_query)).map_err(|_| bad("path"))?;
    let options = RequestOptions::new();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    // Hosts that do not support a timeout keep their own.
    let _ = options.set_connect_timeout(Some(nanos(CONNECT_TIMEOUT)));
    let _ = options.set_first_byte_timeout(Some(nanos(READ_TIMEOUT)));
    let _ = options.set_between_bytes_timeout(Some(nanos(READ_TIMEOUT)));
    let body = outgoing.body().map_err(|_| HttpError::Transport("request body unavailable".into()))?;
    let future = outgoing_handler::handle(outgoing, Some(options)).map_err(|e| transport(&url.authority, &e))?;
    // A request the host refuses (or that cannot connect) closes the body stream: the reason
    // is then in the response future, so a failed write only stops writing.
    let mut write_error = None;
    {
        let stream = body.write().map_err(|_| HttpError::Transport("request body stream unavailable".into()))?;
        for chunk in request.body.chunks(4096) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                write_error = Some(format!("{}: writing the request: {e:?}", url.authority));
                break;
            }
        }
    }
    let finished = OutgoingBody::finish(body, None);
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(e))) => return Err(transport(&url.authority, &e)),
        Some(Err(())) | None => return Err(HttpError::Transport(format!("{}: no response", url.authority))),
    };
    if let Some(message) = write_error {
        return Err(HttpError::Transport(message));
    }
    finished.map_err(|e| transport(&url.authority, &e))?;
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let incoming = response.consume().map_err(|_| HttpError::Transport("response body unavailable".into()))?;
    let mut bytes = Vec::new();
    {
        let stream = incoming.stream().map_err(|_| HttpError::Transport("response body stream unavailable".into()))?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => {
                    bytes.extend_from_slice(&chunk);
                    if bytes.len() > MAX_BODY {
                        return Err(HttpError::Transport(format!(
                            "{}: response body larger than {MAX_BODY} bytes",
                            url.authority
                        )));
                    }
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError::Transport(format!(
                        "{}: reading the response: {}",
                        url.authority,
                        e.to_debug_string()
                    )))
                }
            }
        }
    }
    Ok(Response { status, headers, body: bytes })
}
