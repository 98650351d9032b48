//! Commands in a pod's container over the `pods/exec` WebSocket, and [`PodShell`]: one
//! container behind [`ShellHost`], so `super::super::detached` starts, follows and stops stages
//! in it as it does on an SSH instance.
//!
//! The stream protocol is Kubernetes' channel protocol (`v5.channel.k8s.io`, falling back to
//! `v4.channel.k8s.io`): every binary message starts with its channel — 0 stdin, 1 stdout,
//! 2 stderr, 3 the command's `Status` (an exit code other than 0 as reason `NonZeroExitCode`
//! with an `ExitCode` cause), 4 resize — and v5 adds 255, closing a channel, which is how the
//! command's standard input reaches its end. A server that speaks only v4 cannot close
//! standard input, so commands that read it are refused there with a clear error.
//!
//! Owns: the exec stream and its framing. Must not touch: REST calls (`client`), WIT types.

use async_trait::async_trait;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

use super::{KubeClient, KubeError};
use crate::connector::detached::{OutputFn, ShellHost};
use crate::connector::remote::RemoteError;
use crate::stop::StopSignal;

/// The channel protocols offered, best first.
const PROTOCOLS: &str = "v5.channel.k8s.io, v4.channel.k8s.io";
/// Bytes of standard input per message.
const STDIN_CHUNK: usize = 32 << 10;

/// One container of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// Percent-encode a query value.
fn escape(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// The exit code in the error channel's `Status`.
fn exit_code(status: &[u8]) -> Result<i32, KubeError> {
    let parsed: serde_json::Value = serde_json::from_slice(status)
        .map_err(|e| KubeError::Other(format!("unreadable exec status {:?}: {e}", String::from_utf8_lossy(status))))?;
    if parsed["status"].as_str() == Some("Success") {
        return Ok(0);
    }
    if parsed["reason"].as_str() == Some("NonZeroExitCode") {
        let causes = parsed["details"]["causes"].as_array().cloned().unwrap_or_default();
        if let Some(code) = causes
            .iter()
            .find(|c| c["reason"].as_str() == Some("ExitCode"))
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.trim().parse::<i32>().ok())
        {
            return Ok(code);
        }
    }
    Err(KubeError::Other(format!("exec failed: {}", parsed["message"].as_str().unwrap_or("no message"))))
}

/// A byte stream to the API server: TLS, or plain for an `http://` server.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

impl KubeClient {
    /// Open a byte stream to the server for a WebSocket upgrade.
    async fn open(&self) -> Result<Box<dyn Io>, KubeError> {
        let endpoint = self.endpoint();
        let url = url::Url::parse(&endpoint.server).map_err(|e| KubeError::Other(format!("server URL: {e}")))?;
        let host = url.host_str().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
        let port = url.port_or_known_default().unwrap_or(443);
        let fail = |e: &dyn std::fmt::Display| {
            KubeError::Connection(format!("Kubernetes API server {}: {e}", endpoint.server))
        };
        let tcp = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        .map_err(|_| fail(&"connect timed out"))?
        .map_err(|e| fail(&e))?;
        let _ = tcp.set_nodelay(true);
        if url.scheme() == "http" {
            return Ok(Box::new(tcp));
        }
        let name = ServerName::try_from(host.clone()).map_err(|e| fail(&e))?;
        let tls =
            tokio_rustls::TlsConnector::from(endpoint.tls.clone()).connect(name, tcp).await.map_err(|e| fail(&e))?;
        Ok(Box::new(tls))
    }

    /// Run `command` in `target`, `stdin` on its standard input (closed after it), stdout and
    /// stderr to `output` in arrival order; its exit code. When `stop` fires the stream is
    /// closed and the result is [`KubeError::Canceled`].
    pub async fn exec(
        &self,
        target: &ContainerRef,
        command: &[String],
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, KubeError> {
        let server = self.endpoint().server.replacen("http", "ws", 1);
        let mut url = format!(
            "{server}/api/v1/namespaces/{}/pods/{}/exec?container={}&stdout=true&stderr=true",
            escape(&target.namespace),
            escape(&target.pod),
            escape(&target.container)
        );
        if stdin.is_some() {
            url.push_str("&stdin=true");
        }
        for arg in command {
            url.push_str(&format!("&command={}", escape(arg)));
        }
        let mut request = url.into_client_request().map_err(|e| KubeError::Other(format!("exec request: {e}")))?;
        let headers = request.headers_mut();
        headers.insert("Sec-WebSocket-Protocol", http::HeaderValue::from_static(PROTOCOLS));
        if let Some(token) = &self.endpoint().token {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| KubeError::Config("the bearer token is not a valid header value".into()))?;
            headers.insert("Authorization", value);
        }
        let run = async {
            let io = self.open().await?;
            let (mut ws, response) = match tokio_tungstenite::client_async(request, io).await {
                Ok(done) => done,
                Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                    let status = response.status().as_u16();
                    let body = response.body().clone().unwrap_or_default();
                    return Err(KubeError::from_status(status, &body));
                }
                Err(e) => return Err(KubeError::Connection(format!("exec in pod {}: {e}", target.pod))),
            };
            let v5 = response
                .headers()
                .get("Sec-WebSocket-Protocol")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|p| p.trim() == "v5.channel.k8s.io");
            if let Some(data) = stdin {
                if !v5 {
                    return Err(KubeError::Other(
                        "the API server cannot close a command's standard input (it does not speak v5.channel.k8s.io: Kubernetes 1.30 or later is needed)".into(),
                    ));
                }
                for chunk in data.chunks(STDIN_CHUNK) {
                    let mut frame = Vec::with_capacity(chunk.len() + 1);
                    frame.push(0u8);
                    frame.extend_from_slice(chunk);
                    ws.send(Message::binary(frame)).await.map_err(|e| dropped(target, &e))?;
                }
                ws.send(Message::binary(vec![255u8, 0])).await.map_err(|e| dropped(target, &e))?;
            }
            let mut status = None;
            while let Some(message) = ws.next().await {
                let message = message.map_err(|e| dropped(target, &e))?;
                let data = match message {
                    Message::Binary(data) => data,
                    Message::Close(_) => break,
                    _ => continue,
                };
                match data.first() {
                    Some(1 | 2) => output(&data[1..]),
                    Some(3) if data.len() > 1 => status = Some(data[1..].to_vec()),
                    _ => {}
                }
            }
            match status {
                Some(status) => exit_code(&status),
                None => Err(KubeError::Connection(format!(
                    "the exec stream of pod {} container {} closed before the command's exit status",
                    target.pod, target.container
                ))),
            }
        };
        tokio::select! {
            result = run => result,
            () = stop.stopped() => Err(KubeError::Canceled),
        }
    }
}

fn dropped(target: &ContainerRef, error: &dyn std::fmt::Display) -> KubeError {
    KubeError::Connection(format!("the exec stream of pod {} container {}: {error}", target.pod, target.container))
}

/// One container of a pod as a [`ShellHost`]: `sh -c` over `pods/exec`.
pub struct PodShell {
    client: KubeClient,
    target: ContainerRef,
}

impl PodShell {
    /// The container `target` reached through `client`.
    pub fn new(client: KubeClient, target: ContainerRef) -> PodShell {
        PodShell { client, target }
    }
}

/// The remote error of a Kubernetes failure.
fn remote_error(error: KubeError) -> RemoteError {
    match error {
        KubeError::Connection(m) => RemoteError::Connection(m),
        KubeError::Canceled => RemoteError::Canceled,
        KubeError::TooLarge(limit) => RemoteError::TooLarge(limit),
        other => RemoteError::Other(other.to_string()),
    }
}

#[async_trait]
impl ShellHost for PodShell {
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let command = ["sh", "-c", script].map(str::to_string);
        self.client.exec(&self.target, &command, stdin, output, stop).await.map_err(remote_error)
    }
}

/// Back from a [`RemoteError`] of the detached helpers to a Kubernetes error.
pub fn kube_error(error: RemoteError) -> KubeError {
    match error {
        RemoteError::Connection(m) => KubeError::Connection(m),
        RemoteError::Canceled => KubeError::Canceled,
        RemoteError::TooLarge(limit) => KubeError::TooLarge(limit),
        RemoteError::Other(m) => KubeError::Other(m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_status_channel() {
        assert_eq!(exit_code(br#"{"metadata":{},"status":"Success"}"#), Ok(0));
        let failed = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_code(failed), Ok(3));
        let other = br#"{"status":"Failure","message":"container not found (\"build\")","reason":"BadRequest"}"#;
        let err = exit_code(other).expect_err("no exit code").to_string();
        assert!(err.contains("container not found"), "{err}");
    }
}
