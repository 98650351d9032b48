//! `exec` in a running container, its connection hijacked (`Upgrade: tcp`, as the Docker CLI
//! does) so the connection itself is the command's input and output. With a tty (GitLab's web
//! terminal on Docker jobs) the bytes are raw and the exec is resized through its resize
//! endpoint; without one ([`DockerClient::exec_run`], the stages of `super::shell`) the output
//! is the multiplexed stream of [`super::frames`], the standard input ends with a half-close,
//! and the exit code is read from the exec's inspection. Works over every transport of
//! [`DockerClient`] (a fleet instance's socket too).
//!
//! Owns: the hijacked exec stream. Must not touch: what runs in the exec (the caller's
//! command), sessions or WebSockets.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::client::{path_escape, Body, DockerClient};
use super::DockerError;
use crate::stop::StopSignal;

/// What an exec runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecSpec {
    /// The command.
    pub cmd: Vec<String>,
    /// `KEY=value` on top of the container's environment.
    pub env: Vec<String>,
    /// User (empty: the container's).
    pub user: String,
    /// Working directory (empty: the container's).
    pub working_dir: String,
}

/// A started interactive exec: the terminal's output and input.
pub struct ExecStream {
    /// The exec's ID (for [`DockerClient::exec_resize`]).
    pub id: String,
    /// What the command writes to its tty.
    pub output: Box<dyn AsyncRead + Send + Unpin>,
    /// What it reads from its tty.
    pub input: Box<dyn AsyncWrite + Send + Unpin>,
}

/// Most bytes of an answer's head before the hijacked stream.
const MAX_HEAD: usize = 64 * 1024;

impl DockerClient {
    /// Create an exec of `spec` with a tty in `container` and start it, `cols` × `rows`.
    pub async fn exec_tty(
        &self,
        container: &str,
        spec: &ExecSpec,
        cols: u16,
        rows: u16,
        stop: &StopSignal,
    ) -> Result<ExecStream, DockerError> {
        let create = serde_json::json!({
            "AttachStdin": true,
            "AttachStdout": true,
            "AttachStderr": true,
            "Tty": true,
            "Cmd": spec.cmd,
            "Env": spec.env,
            "ConsoleSize": [rows, cols],
        });
        let id = self.exec_create(container, spec, create, stop).await?;
        let (output, input) = self.hijack(&id, true, stop).await?;
        // Older engines ignore `ConsoleSize`: the size is set once more now that it runs.
        let _ = self.exec_resize(&id, cols, rows, stop).await;
        Ok(ExecStream { id, output, input })
    }

    /// `POST /containers/{container}/exec` of `create` with `spec`'s user and working directory;
    /// the exec's ID.
    async fn exec_create(
        &self,
        container: &str,
        spec: &ExecSpec,
        mut create: serde_json::Value,
        stop: &StopSignal,
    ) -> Result<String, DockerError> {
        if !spec.user.is_empty() {
            create["User"] = serde_json::json!(spec.user);
        }
        if !spec.working_dir.is_empty() {
            create["WorkingDir"] = serde_json::json!(spec.working_dir);
        }
        let body = Body { data: create.to_string().into(), content_type: None };
        let path = format!("/containers/{}/exec", path_escape(container));
        let (_, answer) = self.request("POST", &path, Some(body), &[], 1 << 20, stop).await?;
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        match answer["Id"].as_str() {
            Some(id) => Ok(id.to_string()),
            None => Err(DockerError::Other("the engine created an exec without an ID".into())),
        }
    }

    /// `POST /exec/{id}/start` with the connection taken over once the engine answers: raw
    /// bytes with `tty`, else the multiplexed stream of [`super::frames`].
    pub(super) async fn hijack(
        &self,
        id: &str,
        tty: bool,
        stop: &StopSignal,
    ) -> Result<(Box<dyn AsyncRead + Send + Unpin>, Box<dyn AsyncWrite + Send + Unpin>), DockerError> {
        let body = if tty { r#"{"Detach":false,"Tty":true}"# } else { r#"{"Detach":false,"Tty":false}"# };
        let request = format!(
            "POST /v{}/exec/{}/start HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n\
             Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: {}\r\n\r\n{body}",
            self.api_version(),
            path_escape(id),
            body.len()
        );
        let started = async {
            let mut io = self.transport().open().await?;
            let lost = |e: std::io::Error| DockerError::Connection(format!("starting the exec: {e}"));
            io.write_all(request.as_bytes()).await.map_err(lost)?;
            io.flush().await.map_err(lost)?;
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            let end = loop {
                if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end;
                }
                if head.len() > MAX_HEAD {
                    return Err(DockerError::TooLarge(u32::try_from(MAX_HEAD).unwrap_or(u32::MAX)));
                }
                let n = io.read(&mut buf).await.map_err(lost)?;
                if n == 0 {
                    return Err(DockerError::Connection("the engine closed the exec's connection".into()));
                }
                head.extend_from_slice(&buf[..n]);
            };
            let rest = head.split_off(end + 4);
            let status = status_of(&head);
            if status != 101 && status != 200 {
                let text = String::from_utf8_lossy(&rest);
                let message = serde_json::from_str::<serde_json::Value>(text.trim())
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| text.trim().to_string());
                return Err(DockerError::Api { status, message });
            }
            let (read, write) = tokio::io::split(io);
            let output: Box<dyn AsyncRead + Send + Unpin> = Box::new(std::io::Cursor::new(rest).chain(read));
            let input: Box<dyn AsyncWrite + Send + Unpin> = Box::new(write);
            Ok((output, input))
        };
        tokio::select! {
            result = started => result,
            _ = stop.stopped() => Err(DockerError::Canceled),
        }
    }

    /// Run `spec` in `container` without a tty: `stdin` on its standard input (closed after
    /// it; none when `None`), stdout and stderr to `output` in arrival order; its exit code
    /// once the engine reports it. When `stop` fires the stream is dropped and the result is
    /// [`DockerError::Canceled`] (the command itself goes on: the caller stops it).
    pub async fn exec_run(
        &self,
        container: &str,
        spec: &ExecSpec,
        stdin: Option<&[u8]>,
        output: &(dyn Fn(&[u8]) + Send + Sync + '_),
        stop: &StopSignal,
    ) -> Result<i32, DockerError> {
        self.exec_run_tagged(container, spec, stdin, &|_, bytes| output(bytes), stop).await
    }

    /// [`DockerClient::exec_run`] with each piece of output's stream (1 stdout, 2 stderr).
    pub async fn exec_run_tagged(
        &self,
        container: &str,
        spec: &ExecSpec,
        stdin: Option<&[u8]>,
        output: &(dyn Fn(u8, &[u8]) + Send + Sync + '_),
        stop: &StopSignal,
    ) -> Result<i32, DockerError> {
        let create = serde_json::json!({
            "AttachStdin": stdin.is_some(),
            "AttachStdout": true,
            "AttachStderr": true,
            "Tty": false,
            "Cmd": spec.cmd,
            "Env": spec.env,
        });
        let run = async {
            let id = self.exec_create(container, spec, create, stop).await?;
            let (mut read, mut write) = self.hijack(&id, false, stop).await?;
            let lost = |e: std::io::Error| DockerError::Connection(format!("the exec stream in {container}: {e}"));
            let feed = async {
                if let Some(data) = stdin {
                    write.write_all(data).await?;
                }
                write.flush().await?;
                // The half-close is what ends the command's standard input.
                write.shutdown().await
            };
            let drain = async {
                let mut demux = super::frames::Demux::new(false);
                let mut buf = vec![0u8; 32 << 10];
                loop {
                    let n = read.read(&mut buf).await?;
                    if n == 0 {
                        return Ok::<(), std::io::Error>(());
                    }
                    demux.push_tagged(&buf[..n], output);
                }
            };
            let (fed, drained) = tokio::join!(feed, drain);
            drained.map_err(lost)?;
            // A command that never read its input may have ended before it was written.
            if let Err(e) = fed {
                tracing::debug!(container, error = %e, "the exec's standard input was not taken whole");
            }
            self.exec_exit_code(&id, stop).await
        };
        tokio::select! {
            result = run => result,
            () = stop.stopped() => Err(DockerError::Canceled),
        }
    }

    /// The exit code of exec `id`, whose stream has ended: the engine may report it a moment
    /// later than the stream's end, so a running exec is asked again (for at most 10 s).
    async fn exec_exit_code(&self, id: &str, stop: &StopSignal) -> Result<i32, DockerError> {
        let path = format!("/exec/{}/json", path_escape(id));
        for attempt in 0u32..1000 {
            let (_, answer) = self.request("GET", &path, None, &[], 1 << 20, stop).await?;
            let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
            if answer["Running"].as_bool() != Some(true) {
                return match answer["ExitCode"].as_i64() {
                    Some(code) => Ok(i32::try_from(code).unwrap_or(255)),
                    None => Err(DockerError::Other(format!("exec {id} ended without an exit code"))),
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(if attempt < 20 { 2 } else { 10 })).await;
        }
        Err(DockerError::Other(format!("exec {id}: its stream ended, but the engine still reports it running")))
    }

    /// Set exec `id`'s tty to `cols` × `rows`.
    pub async fn exec_resize(&self, id: &str, cols: u16, rows: u16, stop: &StopSignal) -> Result<(), DockerError> {
        let path = format!("/exec/{}/resize?h={rows}&w={cols}", path_escape(id));
        self.request("POST", &path, None, &[], 1 << 20, stop).await.map(|_| ())
    }
}

/// The status code of an HTTP/1.1 answer's head (0 when unreadable).
fn status_of(head: &[u8]) -> u16 {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    String::from_utf8_lossy(line).split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_status() {
        assert_eq!(status_of(b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream"), 101);
        assert_eq!(status_of(b"HTTP/1.1 404 Not Found\r\n"), 404);
        assert_eq!(status_of(b"garbage"), 0);
    }
}
