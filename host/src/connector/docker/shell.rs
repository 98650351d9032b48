//! [`ContainerShell`]: one running container of a Docker engine behind
//! `connector::detached`'s [`ShellHost`], so a job's stages start, are followed and are stopped
//! in its long-lived build and helper containers as they are in a pod's containers
//! (`connector::kube::exec::PodShell`) or on an SSH instance: each script is an `exec` without
//! a tty ([`DockerClient::exec_run`]), the stage itself runs detached from it, with its output
//! in a log file and its exit code in a file of the container's filesystem.
//!
//! Owns: the mapping of scripts onto execs. Must not touch: the detached snippets
//! (`connector::detached`), WIT types.

use async_trait::async_trait;

use super::exec::ExecSpec;
use super::{DockerClient, DockerError};
use crate::connector::detached::{self, OutputFn, ShellHost};
use crate::connector::remote::{ExitStatus, RemoteError};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// One running container as a [`ShellHost`]: `sh -c` by `exec`.
pub struct ContainerShell {
    client: DockerClient,
    container: String,
}

impl ContainerShell {
    /// The container `container` (ID or name) of `client`'s engine.
    pub fn new(client: DockerClient, container: String) -> ContainerShell {
        ContainerShell { client, container }
    }

    /// Start `command` detached ([`detached::start`]).
    pub async fn start_detached(
        &self,
        command: &str,
        stdin: &[u8],
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        detached::start(self, command, Some(stdin), log_path, exit_path).await
    }

    /// Follow the detached command of `log_path`/`exit_path` into `trace` from `offset` (or
    /// past what the trace holds of it) until it ends ([`detached::attach`]).
    pub async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        detached::attach(self, log_path, exit_path, offset, trace, stop).await
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
