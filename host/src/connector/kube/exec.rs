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
//! A handshake the server did not take (no connection, 429, 5xx) is tried again: nothing ran.
//! A stage's streams survive a drop ([`PodShell::start_detached`], [`PodShell::attach`]): the
//! stage runs detached in the pod, so a dropped follow reattaches from the output offset the
//! trace holds, and a start whose stream dropped checks the pod for the stage before starting
//! it again (its standard input is checked whole before anything starts).
//!
//! Owns: the exec stream and its framing. Must not touch: REST calls (`client`), WIT types.

use async_trait::async_trait;
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;

use super::{KubeClient, KubeError};
use crate::connector::detached::{self, quote, OutputFn, ShellHost};
use crate::connector::remote::{ExitStatus, RemoteError};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// The channel protocols offered, best first.
const PROTOCOLS: &str = "v5.channel.k8s.io, v4.channel.k8s.io";
/// Bytes of standard input per message.
const STDIN_CHUNK: usize = 32 << 10;
/// Exec handshakes tried before the last failure stands.
const HANDSHAKE_ATTEMPTS: u32 = 6;
/// Drops of a stage's stream in a row, with no output between them, that are reattached.
const REATTACH_ATTEMPTS: u32 = 8;

/// The wait before attempt `attempt + 1`: 0.2 s doubling to 3.2 s.
fn backoff(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_millis(200 << attempt.saturating_sub(1).min(4))
}

/// An exec WebSocket and the server's handshake answer.
pub(super) type Socket =
    (tokio_tungstenite::WebSocketStream<Box<dyn Io>>, tokio_tungstenite::tungstenite::handshake::client::Response);

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
pub(super) fn escape(value: &str) -> String {
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
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
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
        let run = async {
            let (mut ws, response) = self.handshake(&url, target, stdin.is_none()).await?;
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

impl KubeClient {
    /// The exec request for `url` with the protocols and the bearer token.
    fn exec_request(&self, url: &str) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, KubeError> {
        let mut request = url.into_client_request().map_err(|e| KubeError::Other(format!("exec request: {e}")))?;
        let headers = request.headers_mut();
        headers.insert("Sec-WebSocket-Protocol", http::HeaderValue::from_static(PROTOCOLS));
        if let Some(token) = self.endpoint().bearer() {
            let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| KubeError::Config("the bearer token is not a valid header value".into()))?;
            headers.insert("Authorization", value);
        }
        Ok(request)
    }

    /// Open the exec WebSocket of `url`, again with backoff when the server did not take it:
    /// no connection, 429 or 5xx (the command did not start); a handshake that failed on the
    /// way only when `may_repeat` (the command reads no standard input, so a start of it
    /// that the server made is harmless).
    pub(super) async fn handshake(
        &self,
        url: &str,
        target: &ContainerRef,
        may_repeat: bool,
    ) -> Result<Socket, KubeError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let request = self.exec_request(url)?;
            let (error, again) = match self.open().await {
                Err(e @ KubeError::Connection(_)) => (e, true),
                Err(e) => return Err(e),
                Ok(io) => match tokio_tungstenite::client_async(request, io).await {
                    Ok(done) => return Ok(done),
                    Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                        let status = response.status().as_u16();
                        let body = response.body().clone().unwrap_or_default();
                        (KubeError::from_status(status, &body), status == 429 || status >= 500)
                    }
                    Err(e) => (KubeError::Connection(format!("exec in pod {}: {e}", target.pod)), may_repeat),
                },
            };
            if !again || attempt >= HANDSHAKE_ATTEMPTS {
                return Err(error);
            }
            tracing::info!(pod = %target.pod, attempt, %error, "retrying a pods/exec handshake");
            tokio::time::sleep(backoff(attempt)).await;
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

impl PodShell {
    /// Start `command` detached ([`detached::start`]); when the stream drops on the way, look
    /// in the pod whether it started (its pid or exit file) before starting it again.
    pub async fn start_detached(
        &self,
        command: &str,
        stdin: &[u8],
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        let mut attempt = 0;
        loop {
            let message = match detached::start(self, command, Some(stdin), log_path, exit_path).await {
                Err(RemoteError::Connection(m)) if attempt < REATTACH_ATTEMPTS => m,
                other => return other,
            };
            attempt += 1;
            tracing::info!(pod = %self.target.pod, attempt, %message, "the exec stream dropped while starting a stage");
            tokio::time::sleep(backoff(attempt)).await;
            let started = format!("[ -s {} ] || [ -e {} ]", quote(&detached::pid_path(exit_path)), quote(exit_path));
            match self.capture(&started, None, 64).await {
                Ok((0, _)) => return Ok(()),
                Ok(_) | Err(RemoteError::Connection(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Follow the detached command of `log_path`/`exit_path` into `trace`
    /// ([`detached::attach`]); a dropped stream is reattached from the output offset the
    /// trace holds, up to [`REATTACH_ATTEMPTS`] drops in a row with no output between them.
    pub async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        let mut failures = 0;
        loop {
            let before = trace.followed(log_path);
            let message = match detached::attach(self, log_path, exit_path, offset, trace, stop).await {
                Err(RemoteError::Connection(m)) => m,
                other => return other,
            };
            failures = if trace.followed(log_path) == before { failures + 1 } else { 1 };
            if failures > REATTACH_ATTEMPTS {
                return Err(RemoteError::Connection(message));
            }
            tracing::info!(pod = %self.target.pod, failures, %message, "the exec stream of a stage dropped: reattaching");
            tokio::select! {
                () = tokio::time::sleep(backoff(failures)) => {}
                () = stop.stopped() => {
                    detached::kill(self, exit_path).await;
                    return Err(RemoteError::Canceled);
                }
            }
        }
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

    /// The launcher checks the standard input arrived whole: the stream may drop.
    async fn start(&self, command: &str, stdin: &[u8], log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
        detached::start_with_shell_checked(self, command, stdin, log_path, exit_path).await
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
