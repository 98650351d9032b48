//! A small client of the Docker Engine API over its unix socket (hyper): JSON calls, pulls
//! with `X-Registry-Auth`, streamed logs, and hijacked (`Upgrade: tcp`) exec/attach streams.
//! Owns no Kubernetes semantics; the kubelet and the exec bridge build on it.

use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// The Engine API version fake-kube speaks (Debian's docker.io supports it).
const API: &str = "/v1.41";

/// An Engine call that failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DockerError {
    #[error("docker engine at {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("docker engine: {0}")]
    Http(#[from] hyper::Error),
    #[error("docker engine: {0}")]
    Request(#[from] hyper::http::Error),
    /// The engine answered with an error status and message.
    #[error("{message}")]
    Status { status: u16, message: String },
    #[error("docker engine: bad JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl DockerError {
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            DockerError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The Engine at a unix socket.
#[derive(Debug, Clone)]
pub(crate) struct Docker {
    socket: PathBuf,
}

/// The bytes of a hijacked connection.
pub(crate) type Hijacked = TokioIo<hyper::upgrade::Upgraded>;

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Docker {
    /// `unix:///path/docker.sock` (or a bare path).
    pub(crate) fn new(host: &str) -> anyhow::Result<Docker> {
        let path = host.strip_prefix("unix://").unwrap_or(host);
        anyhow::ensure!(path.starts_with('/'), "--docker-host must be unix:///absolute/path (got {host})");
        Ok(Docker { socket: PathBuf::from(path) })
    }

    async fn send(&self, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, DockerError> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|e| DockerError::Connect(self.socket.display().to_string(), e))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.with_upgrades().await;
        });
        Ok(sender.send_request(request).await?)
    }

    fn build(
        method: &str,
        path: &str,
        body: Option<&Value>,
        auth: Option<&str>,
    ) -> Result<Request<Full<Bytes>>, DockerError> {
        let mut builder =
            Request::builder().method(method).uri(format!("http://docker{API}{path}")).header("Host", "docker");
        if let Some(auth) = auth {
            builder = builder.header("X-Registry-Auth", auth);
        }
        let body = match body {
            Some(v) => {
                builder = builder.header("Content-Type", "application/json");
                Bytes::from(serde_json::to_vec(v)?)
            }
            None => Bytes::new(),
        };
        Ok(builder.body(Full::new(body))?)
    }

    async fn error_of(response: Response<Incoming>) -> DockerError {
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_string());
        DockerError::Status { status, message }
    }

    /// A call answering JSON (or nothing): the parsed body, `Null` when empty.
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, DockerError> {
        let response = self.send(Self::build(method, path, body, None)?).await?;
        if !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        let bytes = response.into_body().collect().await?.to_bytes();
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// A call whose body streams (logs): the response body.
    pub(crate) async fn stream(&self, path: &str) -> Result<Incoming, DockerError> {
        let response = self.send(Self::build("GET", path, None, None)?).await?;
        if !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        Ok(response.into_body())
    }

    /// A hijacked call (`POST /exec/ID/start`, `POST /containers/ID/attach`).
    pub(crate) async fn hijack(&self, path: &str, body: Option<&Value>) -> Result<Hijacked, DockerError> {
        let mut request = Self::build("POST", path, body, None)?;
        request.headers_mut().insert("Connection", hyper::header::HeaderValue::from_static("Upgrade"));
        request.headers_mut().insert("Upgrade", hyper::header::HeaderValue::from_static("tcp"));
        let response = self.send(request).await?;
        if response.status() != hyper::StatusCode::SWITCHING_PROTOCOLS && !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        let upgraded = hyper::upgrade::on(response).await?;
        Ok(TokioIo::new(upgraded))
    }

    pub(crate) async fn image_exists(&self, reference: &str) -> Result<bool, DockerError> {
        match self.call("GET", &format!("/images/{}/json", percent(reference)), None).await {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Pull `reference` (with base64url `X-Registry-Auth`); the engine's error message when
    /// the pull failed (it answers 200 and reports the error in the progress stream).
    pub(crate) async fn pull(&self, reference: &str, auth: Option<&str>) -> Result<(), DockerError> {
        let (image, tag) = split_reference(reference);
        let path = format!("/images/create?fromImage={}&tag={}", percent(&image), percent(&tag));
        let response = self.send(Self::build("POST", &path, None, auth)?).await?;
        if !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        let bytes = response.into_body().collect().await?.to_bytes();
        for line in bytes.split(|b| *b == b'\n') {
            if let Ok(message) = serde_json::from_slice::<Value>(line) {
                if let Some(error) = message["error"].as_str() {
                    return Err(DockerError::Status { status: 500, message: error.to_string() });
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn create_container(&self, name: &str, config: &Value) -> Result<String, DockerError> {
        let created = self.call("POST", &format!("/containers/create?name={}", percent(name)), Some(config)).await?;
        Ok(created["Id"].as_str().unwrap_or_default().to_string())
    }

    pub(crate) async fn start(&self, id: &str) -> Result<(), DockerError> {
        match self.call("POST", &format!("/containers/{id}/start"), None).await {
            Err(e) if e.status() == Some(304) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// SIGTERM (the image's stop signal), SIGKILL after `grace` seconds.
    pub(crate) async fn stop(&self, id: &str, grace: u64) -> Result<(), DockerError> {
        match self.call("POST", &format!("/containers/{id}/stop?t={grace}"), None).await {
            Err(e) if matches!(e.status(), Some(304) | Some(404)) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    pub(crate) async fn kill(&self, id: &str) -> Result<(), DockerError> {
        match self.call("POST", &format!("/containers/{id}/kill"), None).await {
            Err(e) if matches!(e.status(), Some(404) | Some(409)) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    pub(crate) async fn remove(&self, id: &str) -> Result<(), DockerError> {
        match self.call("DELETE", &format!("/containers/{id}?force=1&v=1"), None).await {
            Err(e) if e.status() == Some(404) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Block until the container stops: its exit code.
    pub(crate) async fn wait(&self, id: &str) -> Result<i64, DockerError> {
        let answer = self.call("POST", &format!("/containers/{id}/wait"), None).await?;
        Ok(answer["StatusCode"].as_i64().unwrap_or(-1))
    }

    pub(crate) async fn inspect(&self, id: &str) -> Result<Value, DockerError> {
        self.call("GET", &format!("/containers/{id}/json"), None).await
    }

    pub(crate) async fn create_volume(&self, name: &str, labels: &Value) -> Result<(), DockerError> {
        self.call("POST", "/volumes/create", Some(&serde_json::json!({"Name": name, "Labels": labels})))
            .await
            .map(|_| ())
    }

    pub(crate) async fn remove_volume(&self, name: &str) -> Result<(), DockerError> {
        match self.call("DELETE", &format!("/volumes/{}?force=1", percent(name)), None).await {
            Err(e) if e.status() == Some(404) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Ids of containers (any state) with `label` (`key` or `key=value`).
    pub(crate) async fn containers_labelled(&self, label: &str) -> Result<Vec<String>, DockerError> {
        let filter = percent(&serde_json::json!({"label": [label]}).to_string());
        let list = self.call("GET", &format!("/containers/json?all=1&filters={filter}"), None).await?;
        Ok(list.as_array().into_iter().flatten().filter_map(|c| c["Id"].as_str().map(String::from)).collect())
    }

    /// Names of volumes with `label`.
    pub(crate) async fn volumes_labelled(&self, label: &str) -> Result<Vec<String>, DockerError> {
        let filter = percent(&serde_json::json!({"label": [label]}).to_string());
        let list = self.call("GET", &format!("/volumes?filters={filter}"), None).await?;
        Ok(list["Volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["Name"].as_str().map(String::from))
            .collect())
    }

    /// Create an exec: its id.
    pub(crate) async fn exec_create(&self, container: &str, config: &Value) -> Result<String, DockerError> {
        let created = self.call("POST", &format!("/containers/{container}/exec"), Some(config)).await?;
        Ok(created["Id"].as_str().unwrap_or_default().to_string())
    }

    /// An exec's state (`Running`, `ExitCode`).
    pub(crate) async fn exec_inspect(&self, exec: &str) -> Result<Value, DockerError> {
        self.call("GET", &format!("/exec/{exec}/json"), None).await
    }

    /// Resize an exec's (or, with `container`, a container's) terminal.
    pub(crate) async fn resize(&self, target: &str, exec: bool, width: u64, height: u64) -> Result<(), DockerError> {
        let kind = if exec { "exec" } else { "containers" };
        self.call("POST", &format!("/{kind}/{target}/resize?h={height}&w={width}"), None).await.map(|_| ())
    }
}

/// `registry/repo:tag` → (`registry/repo`, `tag`); a digest stays in the image part.
pub(crate) fn split_reference(reference: &str) -> (String, String) {
    if reference.contains('@') {
        return (reference.to_string(), String::new());
    }
    let last_slash = reference.rfind('/').map(|i| i + 1).unwrap_or(0);
    match reference[last_slash..].rfind(':') {
        Some(i) => (reference[..last_slash + i].to_string(), reference[last_slash + i + 1..].to_string()),
        None => (reference.to_string(), "latest".to_string()),
    }
}

/// Read one frame of Docker's multiplexed stream (8-byte header: stream, 0, 0, 0, size BE).
pub(crate) fn demux(buffer: &mut Vec<u8>) -> Option<(u8, Vec<u8>)> {
    if buffer.len() < 8 {
        return None;
    }
    let size = u32::from_be_bytes([buffer[4], buffer[5], buffer[6], buffer[7]]) as usize;
    if buffer.len() < 8 + size {
        return None;
    }
    let stream = buffer[0];
    let payload = buffer[8..8 + size].to_vec();
    buffer.drain(..8 + size);
    Some((stream, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert_eq!(split_reference("busybox"), ("busybox".into(), "latest".into()));
        assert_eq!(split_reference("127.0.0.1:5000/a/b:1"), ("127.0.0.1:5000/a/b".into(), "1".into()));
        assert_eq!(split_reference("127.0.0.1:5000/a"), ("127.0.0.1:5000/a".into(), "latest".into()));
    }

    #[test]
    fn demultiplexes() {
        let mut buffer = vec![1, 0, 0, 0, 0, 0, 0, 2, b'h', b'i', 2, 0, 0];
        assert_eq!(demux(&mut buffer), Some((1, b"hi".to_vec())));
        assert_eq!(demux(&mut buffer), None);
        assert_eq!(buffer.len(), 3);
    }
}
