//! What the host can do on the machine a job runs on, in the connector's own terms: the
//! [`RemoteSession`] trait (implemented by [`super::SshSession`] for a fleet instance and by
//! [`super::LocalSession`] for the runner's own machine), the [`ExitStatus`] of a command and
//! the [`RemoteError`] of an operation.
//!
//! Owns: the remote-operation contract and its domain types. Must not touch: WIT bindings or
//! capabilities (`capability::remote` maps these types to the WIT ones), plugins.

use async_trait::async_trait;

use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// How a remote command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// The exit code; `128 + signal` when the command was killed by a signal.
    pub code: i32,
    /// The signal that killed the command, if any.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// An exit status from a shell-style code (`128 + n` means signal `n`).
    pub fn from_code(code: i32) -> Self {
        ExitStatus { code, signal: (129..=128 + 64).contains(&code).then_some(code - 128) }
    }
}

/// Why a remote operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The connection to the instance failed or dropped.
    #[error("connection to the instance failed: {0}")]
    Connection(String),
    /// The job was cancelled or timed out; the remote command was stopped.
    #[error("canceled")]
    Canceled,
    /// A transfer was larger than allowed (the payload is the limit in bytes).
    #[error("larger than the {0}-byte limit")]
    TooLarge(u32),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// A byte stream to a socket (a unix socket on the machine, forwarded through the session).
pub trait SocketStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> SocketStream for T {}

/// The machine a job runs on (a fleet instance, or the runner's own), owned by the host.
#[async_trait]
pub trait RemoteSession: Send + Sync {
    /// Run `command`, streaming output into `trace`, until it exits or `stop` fires.
    async fn run(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError>;
    /// Start `command` detached, logging to `log_path`, exit code to `exit_path`, process
    /// group in `<exit_path>.pid`: it keeps running when the session or the runner is gone.
    /// Returns once it runs, not when it ends.
    async fn start_detached(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError>;
    /// Follow a detached command into `trace` until it exits, from byte `offset` of its log
    /// or past what `trace` already holds of it ([`TraceSink::followed`]), whichever is
    /// further; every chunk goes to [`TraceSink::write_followed`]. When `stop` fires the
    /// command's process group is killed and the result is [`RemoteError::Canceled`].
    async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError>;
    /// Write a file atomically with Unix `mode`, creating its directory.
    async fn upload(&self, path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError>;
    /// Read a file; [`RemoteError::TooLarge`] when it has more than `max_bytes`.
    async fn download(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError>;
    /// Create directory `path` with exactly the permission bits `mode`. Without `parents` it
    /// must not exist yet (and its parent must); with `parents`, missing parents are created
    /// and an existing directory is kept as it is (`mkdir -p`).
    async fn make_dir(&self, path: &str, mode: u32, parents: bool) -> Result<(), RemoteError>;
    /// Remove `path` and everything under it without following symbolic links; a missing
    /// path is no error.
    async fn remove_all(&self, path: &str) -> Result<(), RemoteError>;
    /// Connect to the unix socket at `path` on the machine (over SSH: stream-local forwarding,
    /// which OpenSSH allows by default).
    async fn connect_unix(&self, path: &str) -> Result<Box<dyn SocketStream>, RemoteError>;
}
