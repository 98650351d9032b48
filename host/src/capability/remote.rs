//! `runway:host/remote`: commands and files on the instance the autoscaler acquired for the
//! job. The SSH connector implements [`RemoteSession`]; calls without an acquired instance
//! get `no-instance`.

use async_trait::async_trait;

use crate::bindings::executor::runway::host::process::ExitStatus;
use crate::bindings::executor::runway::host::remote::{Host, RemoteCommand, RemoteError};
use crate::plugin::state::PluginState;
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// Most bytes one upload or download may move.
pub const MAX_TRANSFER: usize = 16 << 20;

/// A connection to the job's instance, owned by the host.
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
    /// Start `command` detached, logging to `log_path`, exit code to `exit_path`.
    async fn start_detached(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError>;
    /// Follow a detached command from `offset` until it exits.
    async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError>;
    /// Write a file.
    async fn upload(&self, path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError>;
    /// Read a file (at most `max_bytes`).
    async fn download(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError>;
}

impl Host for PluginState {
    async fn run(&mut self, cmd: RemoteCommand) -> wasmtime::Result<Result<ExitStatus, RemoteError>> {
        let (Some(remote), Some(trace)) = (self.call.remote.clone(), self.call.trace.clone()) else {
            return Ok(Err(RemoteError::NoInstance));
        };
        self.budget.enter_host();
        let result = remote.run(&cmd.command, cmd.stdin.as_deref(), &*trace, &self.call.stop).await;
        self.budget.leave_host();
        Ok(result)
    }

    async fn start_detached(
        &mut self,
        cmd: RemoteCommand,
        log_path: String,
        exit_path: String,
    ) -> wasmtime::Result<Result<(), RemoteError>> {
        let Some(remote) = self.call.remote.clone() else { return Ok(Err(RemoteError::NoInstance)) };
        self.budget.enter_host();
        let result = remote.start_detached(&cmd.command, cmd.stdin.as_deref(), &log_path, &exit_path).await;
        self.budget.leave_host();
        Ok(result)
    }

    async fn attach(
        &mut self,
        log_path: String,
        exit_path: String,
        offset: u64,
    ) -> wasmtime::Result<Result<ExitStatus, RemoteError>> {
        let (Some(remote), Some(trace)) = (self.call.remote.clone(), self.call.trace.clone()) else {
            return Ok(Err(RemoteError::NoInstance));
        };
        self.budget.enter_host();
        let result = remote.attach(&log_path, &exit_path, offset, &*trace, &self.call.stop).await;
        self.budget.leave_host();
        Ok(result)
    }

    async fn upload(&mut self, path: String, data: Vec<u8>, mode: u32) -> wasmtime::Result<Result<(), RemoteError>> {
        if data.len() > MAX_TRANSFER.min(self.max_buffer()) {
            return Ok(Err(RemoteError::TooLarge(MAX_TRANSFER.min(self.max_buffer()) as u32)));
        }
        let Some(remote) = self.call.remote.clone() else { return Ok(Err(RemoteError::NoInstance)) };
        self.budget.enter_host();
        let result = remote.upload(&path, &data, mode).await;
        self.budget.leave_host();
        Ok(result)
    }

    async fn download(&mut self, path: String, max_bytes: u32) -> wasmtime::Result<Result<Vec<u8>, RemoteError>> {
        let Some(remote) = self.call.remote.clone() else { return Ok(Err(RemoteError::NoInstance)) };
        let cap = (max_bytes as usize).min(MAX_TRANSFER).min(self.max_buffer());
        self.budget.enter_host();
        let result = remote.download(&path, cap).await;
        self.budget.leave_host();
        Ok(result)
    }
}
