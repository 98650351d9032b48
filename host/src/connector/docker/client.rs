//! [`DockerClient`]: HTTP/1.1 to a Docker engine's API over any byte stream — a unix socket, TCP
//! (with TLS), or a unix socket on a fleet instance reached through its SSH session
//! ([`RemoteSession::connect_unix`]). One connection per request (the engine's API is cheap to
//! connect to, and a request that waits — `wait`, `logs?follow` — holds its own). Requests are
//! passed through as the plugin wrote them; the client adds the version prefix, the `Host`
//! header, and turns error answers into [`DockerError::Api`] with the engine's message.
//!
//! Owns: transports, the version prefix, bodies and their limits, the pull/import progress
//! streams, following container output into a [`TraceSink`]. Must not touch: what the requests
//! mean (the executor plugin decides), grants.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio_rustls::rustls::pki_types::ServerName;

use super::endpoint::{tls_config, Address, EngineAddress};
use super::frames::Demux;
use super::DockerError;
use crate::connector::remote::{RemoteSession, SocketStream};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// The newest API version the host speaks; an engine's own version is used when older.
pub const MAX_API_VERSION: (u32, u32) = (1, 45);
/// The oldest API version the host speaks (Docker 18.09, Podman 3).
pub const MIN_API_VERSION: (u32, u32) = (1, 24);

/// Where the bytes go.
#[derive(Clone)]
pub enum Transport {
    /// A unix socket on the runner's machine.
    Unix(std::path::PathBuf),
    /// TCP, with TLS when configured.
    Tcp {
        /// Host name or IP.
        host: String,
        /// Port.
        port: u16,
        /// TLS configuration and the name to verify.
        tls: Option<(Arc<tokio_rustls::rustls::ClientConfig>, ServerName<'static>)>,
    },
    /// A unix socket on the machine of a session (a fleet instance over SSH).
    Remote {
        /// The session.
        session: Arc<dyn RemoteSession>,
        /// The socket's path there.
        path: String,
    },
}

impl Transport {
    /// The transport for `address` on the runner's machine (TLS files are read now).
    pub fn local(address: &EngineAddress) -> Result<Transport, DockerError> {
        Ok(match &address.address {
            Address::Unix(path) => Transport::Unix(path.clone()),
            Address::Tcp { host, port } => {
                let tls = match &address.tls_dir {
                    Some(dir) => {
                        let name = ServerName::try_from(host.clone())
                            .map_err(|e| DockerError::Other(format!("TLS server name {host:?}: {e}")))?;
                        Some((tls_config(dir)?, name))
                    }
                    None => None,
                };
                Transport::Tcp { host: host.clone(), port: *port, tls }
            }
        })
    }

    /// A new connection to the engine.
    pub(crate) async fn open(&self) -> Result<Box<dyn SocketStream>, DockerError> {
        let refused = |what: &str, e: &dyn std::fmt::Display| DockerError::Connection(format!("{what}: {e}"));
        match self {
            Transport::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| refused(&format!("unix://{}", path.display()), &e))?;
                Ok(Box::new(stream))
            }
            Transport::Tcp { host, port, tls } => {
                let where_ = format!("tcp://{host}:{port}");
                let stream =
                    tokio::net::TcpStream::connect((host.as_str(), *port)).await.map_err(|e| refused(&where_, &e))?;
                let _ = stream.set_nodelay(true);
                match tls {
                    None => Ok(Box::new(stream)),
                    Some((config, name)) => {
                        let connector = tokio_rustls::TlsConnector::from(config.clone());
                        let stream = connector.connect(name.clone(), stream).await.map_err(|e| refused(&where_, &e))?;
                        Ok(Box::new(stream))
                    }
                }
            }
            Transport::Remote { session, path } => session
                .connect_unix(path)
                .await
                .map_err(|e| DockerError::Connection(format!("unix://{path} on the instance: {e}"))),
        }
    }
}

/// A connected engine: its transport and the API version settled with it.
#[derive(Clone)]
pub struct DockerClient {
    transport: Transport,
    version: String,
}

/// A request's body and its content type.
pub struct Body {
    /// The bytes.
    pub data: Bytes,
    /// `application/json` when `None`.
    pub content_type: Option<String>,
}

impl DockerClient {
    /// Ping the engine and settle the API version: the engine's, at most [`MAX_API_VERSION`].
    pub async fn connect(transport: Transport, stop: &StopSignal) -> Result<DockerClient, DockerError> {
        let probe = DockerClient { transport, version: String::new() };
        let response = probe.send(probe.build("GET", "/_ping", None, &[])?, stop).await?;
        let header = response.headers().get("api-version").and_then(|v| v.to_str().ok()).map(str::to_string);
        let status = response.status().as_u16();
        drop(response);
        if status != 200 {
            return Err(DockerError::Connection(format!("the engine answered /_ping with HTTP {status}")));
        }
        let engine = match header {
            Some(v) => v,
            None => {
                let (_, body) = probe.request("GET", "/version", None, &[], 1 << 20, stop).await?;
                let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                json["ApiVersion"].as_str().unwrap_or("1.24").to_string()
            }
        };
        let parsed = parse_version(&engine)
            .ok_or_else(|| DockerError::Connection(format!("the engine reports API version {engine:?}")))?;
        if parsed < MIN_API_VERSION {
            return Err(DockerError::Connection(format!(
                "the engine speaks API {engine}; Runway needs at least {}.{}",
                MIN_API_VERSION.0, MIN_API_VERSION.1
            )));
        }
        let (major, minor) = parsed.min(MAX_API_VERSION);
        Ok(DockerClient { transport: probe.transport, version: format!("{major}.{minor}") })
    }

    /// The API version in use, e.g. `1.41`.
    pub fn api_version(&self) -> &str {
        &self.version
    }

    /// Where the bytes go.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    fn build(
        &self,
        method: &str,
        path: &str,
        body: Option<Body>,
        headers: &[(&str, String)],
    ) -> Result<Request<Full<Bytes>>, DockerError> {
        if !path.starts_with('/') {
            return Err(DockerError::Other(format!("request path {path:?} must start with /")));
        }
        let uri = if self.version.is_empty() { path.to_string() } else { format!("/v{}{path}", self.version) };
        let mut builder = Request::builder().method(method).uri(uri).header("host", "docker");
        for (name, value) in headers {
            builder = builder.header(*name, value.as_str());
        }
        let data = match body {
            Some(body) => {
                let kind = body.content_type.unwrap_or_else(|| "application/json".into());
                builder = builder.header("content-type", kind);
                body.data
            }
            None => Bytes::new(),
        };
        builder.body(Full::new(data)).map_err(|e| DockerError::Other(format!("request {method} {path}: {e}")))
    }

    async fn send(&self, request: Request<Full<Bytes>>, stop: &StopSignal) -> Result<Response<Incoming>, DockerError> {
        let exchange = async {
            let io = self.transport.open().await?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| DockerError::Connection(format!("HTTP handshake: {e}")))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            sender.send_request(request).await.map_err(|e| DockerError::Connection(e.to_string()))
        };
        tokio::select! {
            result = exchange => result,
            _ = stop.stopped() => Err(DockerError::Canceled),
        }
    }

    /// One request; the answer's body (at most `max` bytes) when its status is 2xx or 304, else
    /// [`DockerError::Api`] with the engine's message.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<Body>,
        headers: &[(&str, String)],
        max: usize,
        stop: &StopSignal,
    ) -> Result<(u16, Vec<u8>), DockerError> {
        let response = self.send(self.build(method, path, body, headers)?, stop).await?;
        let status = response.status().as_u16();
        let body = read_capped(response.into_body(), max, stop).await?;
        if (200..300).contains(&status) || status == 304 {
            Ok((status, body))
        } else {
            Err(api_error(status, &body))
        }
    }

    /// `POST /images/create?fromImage=…&tag=…` read to the end of its progress stream.
    pub async fn pull(&self, image: &str, auth: Option<String>, stop: &StopSignal) -> Result<(), DockerError> {
        let (name, tag) = split_reference(image);
        let mut path = format!("/images/create?fromImage={}", query_escape(name));
        if let Some(tag) = tag {
            path.push_str(&format!("&tag={}", query_escape(tag)));
        }
        let headers: Vec<(&str, String)> = auth.into_iter().map(|a| ("x-registry-auth", a)).collect();
        self.progress(self.build("POST", &path, None, &headers)?, stop).await
    }

    /// `POST /images/create?fromSrc=-` with a root filesystem tar: the image `reference`.
    pub async fn import(&self, reference: &str, tar: Bytes, stop: &StopSignal) -> Result<(), DockerError> {
        let (name, tag) = split_reference(reference);
        let path = format!(
            "/images/create?fromSrc=-&repo={}&tag={}",
            query_escape(name),
            query_escape(tag.unwrap_or("latest"))
        );
        let body = Body { data: tar, content_type: Some("application/x-tar".into()) };
        self.progress(self.build("POST", &path, Some(body), &[])?, stop).await
    }

    /// A JSON-lines progress stream to its end; a line with `error` fails it.
    async fn progress(&self, request: Request<Full<Bytes>>, stop: &StopSignal) -> Result<(), DockerError> {
        let response = self.send(request, stop).await?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        if !(200..300).contains(&status) {
            return Err(api_error(status, &read_capped(body, 1 << 20, stop).await?));
        }
        let mut pending = BytesMut::new();
        loop {
            let frame = tokio::select! {
                frame = body.frame() => frame,
                _ = stop.stopped() => return Err(DockerError::Canceled),
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| DockerError::Connection(e.to_string()))?;
            let Some(data) = frame.data_ref() else { continue };
            pending.extend_from_slice(data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line = pending.split_to(end + 1);
                stream_error(&line)?;
            }
            // Progress lines are short; a runaway line is not kept.
            if pending.len() > 1 << 20 {
                pending.clear();
            }
        }
        stream_error(&pending)
    }

    /// Stream container `id`'s output into `trace` until the container stops, starting past
    /// `offset` bytes of it or past what `trace` already holds of it, whichever is further.
    pub async fn follow(
        &self,
        id: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<(), DockerError> {
        let (_, inspect) =
            self.request("GET", &format!("/containers/{}/json", path_escape(id)), None, &[], 4 << 20, stop).await?;
        let inspect: serde_json::Value = serde_json::from_slice(&inspect).unwrap_or_default();
        let tty = inspect["Config"]["Tty"].as_bool().unwrap_or(false);
        let source = format!("docker:{}", inspect["Id"].as_str().unwrap_or(id));
        let start = offset.max(trace.followed(&source).unwrap_or(0));
        let path = format!("/containers/{}/logs?follow=1&stdout=1&stderr=1", path_escape(id));
        let response = self.send(self.build("GET", &path, None, &[])?, stop).await?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        if !(200..300).contains(&status) {
            return Err(api_error(status, &read_capped(body, 1 << 20, stop).await?));
        }
        let mut demux = Demux::new(tty);
        let mut seen = 0u64;
        loop {
            let frame = tokio::select! {
                frame = body.frame() => frame,
                _ = stop.stopped() => return Err(DockerError::Canceled),
            };
            let Some(frame) = frame else { return Ok(()) };
            let frame = frame.map_err(|e| DockerError::Connection(e.to_string()))?;
            let Some(data) = frame.data_ref() else { continue };
            demux.push(data, |payload| {
                let end = seen + payload.len() as u64;
                if end > start {
                    let skip = usize::try_from(start.saturating_sub(seen)).unwrap_or(usize::MAX).min(payload.len());
                    trace.write_followed(&source, end, &payload[skip..]);
                }
                seen = end;
            });
        }
    }
}

/// `1.41` as `(1, 41)`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `name[:tag]` or `name@digest` as `(name, tag)` (a digest stays in the name).
pub fn split_reference(image: &str) -> (&str, Option<&str>) {
    if image.contains('@') {
        return (image, None);
    }
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, Some(tag)),
        _ => (image, None),
    }
}

/// Percent-encoding of a query value.
pub fn query_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(char::from(byte)),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// A container ID or name as one path segment.
pub(crate) fn path_escape(value: &str) -> String {
    query_escape(value)
}

async fn read_capped(mut body: Incoming, max: usize, stop: &StopSignal) -> Result<Vec<u8>, DockerError> {
    let mut out = Vec::new();
    loop {
        let frame = tokio::select! {
            frame = body.frame() => frame,
            _ = stop.stopped() => return Err(DockerError::Canceled),
        };
        let Some(frame) = frame else { return Ok(out) };
        let frame = frame.map_err(|e| DockerError::Connection(e.to_string()))?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > max {
                return Err(DockerError::TooLarge(u32::try_from(max).unwrap_or(u32::MAX)));
            }
            out.extend_from_slice(data);
        }
    }
}

/// The engine's error answer: its JSON `message`, else the body's text.
fn api_error(status: u16, body: &[u8]) -> DockerError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    DockerError::Api { status, message }
}

/// A progress line that reports an error.
fn stream_error(line: &[u8]) -> Result<(), DockerError> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) else { return Ok(()) };
    match value.get("errorDetail").and_then(|d| d["message"].as_str()).or_else(|| value["error"].as_str()) {
        Some(message) => Err(DockerError::Api { status: 500, message: message.to_string() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert_eq!(split_reference("alpine"), ("alpine", None));
        assert_eq!(split_reference("alpine:3.20"), ("alpine", Some("3.20")));
        assert_eq!(split_reference("127.0.0.1:5000/a/b"), ("127.0.0.1:5000/a/b", None));
        assert_eq!(split_reference("127.0.0.1:5000/a/b:1"), ("127.0.0.1:5000/a/b", Some("1")));
        assert_eq!(split_reference("a@sha256:00"), ("a@sha256:00", None));
    }

    #[test]
    fn progress_errors_are_found() {
        assert!(stream_error(br#"{"status":"Downloading"}"#).is_ok());
        let err = stream_error(br#"{"errorDetail":{"message":"manifest unknown"},"error":"x"}"#).expect_err("error");
        assert_eq!(err, DockerError::Api { status: 500, message: "manifest unknown".into() });
        assert_eq!(
            api_error(404, br#"{"message":"No such image: x"}"#),
            DockerError::Api { status: 404, message: "No such image: x".into() }
        );
        assert_eq!(parse_version("1.41"), Some((1, 41)));
    }
}
