//! [`ContainerShell`]: one running container of a Docker engine behind
//! `connector::detached`'s [`ShellHost`], so a job's stages start, are followed and are stopped
//! in its long-lived build and helper containers as they are in a pod's containers
//! (`connector::kube::exec::PodShell`) or on an SSH instance: each script is an `exec` without
//! a tty ([`DockerClient::exec_run`]), the stage itself runs detached from it, with its output
//! in a log file and its exit code in a file of the container's filesystem.
//!
//! A stage costs one `exec`: [`ContainerShell::start_detached`] runs
//! [`detached::start_and_follow_script`], which starts the stage and then streams its log and
//! ends with its exit code; it returns once the script says the stage runs and keeps the rest
//! of the stream in [`StageStreams`] (shared by every call on the same engine handle) for the
//! [`ContainerShell::attach`] that follows. An attach without such a stream (a resumed job, or
//! the stream broke) follows with new execs from the trace's offset, as
//! [`detached::attach`] does everywhere.
//!
//! Owns: the mapping of scripts onto execs, the open streams of started stages. Must not
//! touch: the detached snippets (`connector::detached`), WIT types.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::exec::ExecSpec;
use super::{DockerClient, DockerError};
use crate::connector::detached::{self, OutputFn, ShellHost};
use crate::connector::remote::{ExitStatus, RemoteError};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// Started stages whose `exec` still streams their log, by container, log and exit file: what
/// the next [`ContainerShell::attach`] of the same stage takes over. Dropping one stops its
/// stream (never the stage).
#[derive(Clone, Default)]
pub struct StageStreams(Arc<Mutex<HashMap<String, StageStream>>>);

/// The rest of one stage's start-and-follow `exec`: its standard output still to come, and the
/// task that reads it, which ends with the script's exit code.
struct StageStream {
    output: mpsc::UnboundedReceiver<Vec<u8>>,
    task: tokio::task::JoinHandle<Result<i32, DockerError>>,
}

impl Drop for StageStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StageStreams {
    fn key(container: &str, log_path: &str, exit_path: &str) -> String {
        format!("{container}\n{log_path}\n{exit_path}")
    }

    fn put(&self, key: String, stream: StageStream) {
        if let Ok(mut streams) = self.0.lock() {
            streams.insert(key, stream);
        }
    }

    fn take(&self, key: &str) -> Option<StageStream> {
        self.0.lock().ok().and_then(|mut streams| streams.remove(key))
    }
}

/// One running container as a [`ShellHost`]: `sh -c` by `exec`.
pub struct ContainerShell {
    client: DockerClient,
    container: String,
    streams: StageStreams,
}

impl ContainerShell {
    /// The container `container` (ID or name) of `client`'s engine; `streams` holds the
    /// streams of stages started on it (one per engine handle).
    pub fn new(client: DockerClient, container: String, streams: StageStreams) -> ContainerShell {
        ContainerShell { client, container, streams }
    }

    /// Start `command` detached with [`detached::start_and_follow_script`] in one `exec`;
    /// returns once the command runs, the exec's stream kept for [`ContainerShell::attach`].
    pub async fn start_detached(
        &self,
        command: &str,
        stdin: &[u8],
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        let script = detached::start_and_follow_script(command, stdin.len(), log_path, exit_path);
        let (client, container, stdin) = (self.client.clone(), self.container.clone(), stdin.to_vec());
        let (stdout_tx, stdout_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (stderr_tx, mut stderr_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let task = tokio::spawn(async move {
            let spec = ExecSpec { cmd: ["sh", "-c", &script].map(str::to_string).to_vec(), ..ExecSpec::default() };
            let output = |stream: u8, bytes: &[u8]| {
                let _ = if stream == 2 { stderr_tx.send(bytes.to_vec()) } else { stdout_tx.send(bytes.to_vec()) };
            };
            client.exec_run_tagged(&container, &spec, Some(&stdin), &output, &StopSignal::new()).await
        });
        let mut stream = StageStream { output: stdout_rx, task };
        let marker = format!("{}\n", detached::STARTED_MARKER);
        let mut errors = Vec::new();
        while let Some(bytes) = stderr_rx.recv().await {
            errors.extend_from_slice(&bytes);
            if let Some(at) = errors.windows(marker.len()).position(|w| w == marker.as_bytes()) {
                errors.drain(at..at + marker.len());
                if !errors.is_empty() {
                    tracing::debug!(container = %self.container, output = %String::from_utf8_lossy(&errors), "starting a detached stage");
                }
                self.streams.put(StageStreams::key(&self.container, log_path, exit_path), stream);
                return Ok(());
            }
        }
        // The script ended before the command ran: its exit code and what it said.
        let code = match (&mut stream.task).await {
            Ok(Ok(code)) => code,
            Ok(Err(e)) => return Err(remote_error(e)),
            Err(e) => return Err(RemoteError::Other(format!("starting the detached command: {e}"))),
        };
        Err(RemoteError::Other(format!(
            "starting the detached command failed (exit code {code}): {}",
            String::from_utf8_lossy(&errors).trim()
        )))
    }

    /// Follow the detached command of `log_path`/`exit_path` into `trace` from `offset` (or
    /// past what the trace holds of it) until it ends: from the stream its start left when
    /// there is one, else with new execs ([`detached::attach`]). When `stop` fires the
    /// command's process group is killed and the result is [`RemoteError::Canceled`].
    pub async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        let Some(mut stream) = self.streams.take(&StageStreams::key(&self.container, log_path, exit_path)) else {
            return detached::attach(self, log_path, exit_path, offset, trace, stop).await;
        };
        // The stream holds the log from its first byte: what the trace has already is skipped.
        let skip = offset.max(trace.followed(log_path).unwrap_or(0));
        let followed = tokio::select! {
            code = async {
                let mut received = 0u64;
                while let Some(bytes) = stream.output.recv().await {
                    let end = received + bytes.len() as u64;
                    if end > skip {
                        let from = usize::try_from(skip.saturating_sub(received)).unwrap_or(usize::MAX).min(bytes.len());
                        trace.write_followed(log_path, end, &bytes[from..]);
                    }
                    received = end;
                }
                (&mut stream.task).await
            } => Some(code),
            () = stop.stopped() => None,
        };
        let Some(code) = followed else {
            drop(stream);
            self.stop(log_path, exit_path).await;
            return Err(RemoteError::Canceled);
        };
        match code {
            Ok(Ok(code)) if (0..255).contains(&code) => Ok(ExitStatus::from_code(code)),
            Ok(Ok(_)) => detached::read_exit_code(self, exit_path).await.map(ExitStatus::from_code),
            // The stream broke (the engine's connection): follow on with new execs from what
            // the trace holds.
            Ok(Err(e)) => {
                tracing::debug!(container = %self.container, error = %e, "a stage's stream broke; following it again");
                detached::attach(self, log_path, exit_path, offset, trace, stop).await
            }
            Err(e) => Err(RemoteError::Other(format!("following {log_path}: {e}"))),
        }
    }
}

/// The remote error of an engine failure.
fn remote_error(error: DockerError) -> RemoteError {
    match error {
        DockerError::Connection(m) => RemoteError::Connection(m),
        DockerError::Canceled => RemoteError::Canceled,
        DockerError::TooLarge(limit) => RemoteError::TooLarge(limit),
        other => RemoteError::Other(other.to_string()),
    }
}

/// Back from a [`RemoteError`] of the detached helpers to an engine error.
pub fn docker_error(error: RemoteError) -> DockerError {
    match error {
        RemoteError::Connection(m) => DockerError::Connection(m),
        RemoteError::Canceled => DockerError::Canceled,
        RemoteError::TooLarge(limit) => DockerError::TooLarge(limit),
        RemoteError::Other(m) => DockerError::Other(m),
    }
}

#[async_trait]
impl ShellHost for ContainerShell {
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let spec = ExecSpec { cmd: ["sh", "-c", script].map(str::to_string).to_vec(), ..ExecSpec::default() };
        self.client.exec_run(&self.container, &spec, stdin, output, stop).await.map_err(remote_error)
    }

    /// The launcher checks the standard input arrived whole: the stream may drop (an
    /// instance's engine is reached over SSH).
    async fn start(&self, command: &str, stdin: &[u8], log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
        detached::start_with_shell_checked(self, command, stdin, log_path, exit_path).await
    }
}
