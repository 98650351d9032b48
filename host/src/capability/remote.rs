//! `runway:host/remote`: commands and files on the machine the job runs on — the instance the
//! autoscaler acquired for the job, or, for a plugin with the `allow_process` grant whose job
//! has no fleet instance, the runner's own machine ([`connector::LocalSession`]). The
//! connector does the work through its [`RemoteSession`]; this capability picks the session,
//! maps the connector's [`connector::ExitStatus`]/[`connector::RemoteError`] to the WIT types,
//! and calls with neither get `no-instance`.
//!
//! Owns: [`RemoteCtx`] (the transfer limit, the local session of the grant), [`RemoteView`]
//! and the `remote` host trait on it.
//! Must not touch: plugins or stores (the plugin host projects its store data onto a
//! [`RemoteView`]), connections (the connector owns them).

use std::sync::Arc;

use wasmtime::component::HasData;

use crate::bindings::executor::runway::host0_1_0::process::ExitStatus;
use crate::bindings::executor::runway::host0_1_0::remote::{Host, RemoteCommand, RemoteError};
use crate::capability::call::{CallBudget, CallContext};
pub use crate::connector::StageOutput;
use crate::connector::{self, LocalSession, RemoteSession};
use crate::trace::TraceSink;

/// Most bytes one upload or download may move.
pub const MAX_TRANSFER: usize = 16 << 20;

/// The `remote` capability's own state: how much one transfer may buffer, and the runner's
/// machine when the plugin's grant allows local processes.
pub struct RemoteCtx {
    max_transfer: usize,
    local: Option<Arc<dyn RemoteSession>>,
}

impl RemoteCtx {
    /// The capability for a plugin that may buffer `max_buffer` bytes per call; with
    /// `allow_process` (its `allow_process` grant) a job without a fleet instance runs on the
    /// runner's own machine, its stages' output going where `stage_output` says.
    pub fn new(max_buffer: usize, allow_process: bool, stage_output: StageOutput) -> Self {
        let local =
            allow_process.then(|| Arc::new(LocalSession::new().with_output(stage_output)) as Arc<dyn RemoteSession>);
        RemoteCtx { max_transfer: MAX_TRANSFER.min(max_buffer), local }
    }
}

/// The `remote` capability as one call sees it: its limits, the call's instance (else the
/// local session of the grant), log and stop signal, and the budget whose clock stops while
/// the machine works.
pub struct RemoteView<'a> {
    /// The limits.
    pub ctx: &'a RemoteCtx,
    /// The job the call works for (its `remote` is the instance).
    pub call: &'a CallContext,
    /// The call's budget.
    pub budget: &'a CallBudget,
}

/// [`HasData`] marker linking `remote` to a [`RemoteView`].
pub struct HasRemote;

impl HasData for HasRemote {
    type Data<'a> = RemoteView<'a>;
}

/// The WIT exit status of a remote command.
pub fn wit_status(status: connector::ExitStatus) -> ExitStatus {
    ExitStatus { code: status.code, signal: status.signal }
}

/// The WIT error of a failed remote operation.
pub fn wit_error(error: connector::RemoteError) -> RemoteError {
    match error {
        connector::RemoteError::Connection(m) => RemoteError::Connection(m),
        connector::RemoteError::Canceled => RemoteError::Canceled,
        connector::RemoteError::TooLarge(limit) => RemoteError::TooLarge(limit),
        connector::RemoteError::Other(m) => RemoteError::Other(m),
    }
}

impl RemoteView<'_> {
    /// The job's fleet instance, else the runner's machine when the grant allows it.
    pub(super) fn remote(&self) -> Result<&dyn RemoteSession, RemoteError> {
        self.call.remote.as_deref().or(self.ctx.local.as_deref()).ok_or(RemoteError::NoInstance)
    }

    /// The job log; outside a job (no log), output is dropped.
    fn trace(&self) -> Arc<dyn TraceSink> {
        self.call.trace_or_discard()
    }
}

impl Host for RemoteView<'_> {
    async fn run(&mut self, cmd: RemoteCommand) -> wasmtime::Result<Result<ExitStatus, RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        let trace = self.trace();
        let result =
            self.budget.in_host(remote.run(&cmd.command, cmd.stdin.as_deref(), &*trace, &self.call.stop)).await;
        Ok(result.map(wit_status).map_err(wit_error))
    }

    async fn start_detached(
        &mut self,
        cmd: RemoteCommand,
        log_path: String,
        exit_path: String,
    ) -> wasmtime::Result<Result<(), RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        let result =
            self.budget.in_host(remote.start_detached(&cmd.command, cmd.stdin.as_deref(), &log_path, &exit_path)).await;
        Ok(result.map_err(wit_error))
    }

    async fn attach(
        &mut self,
        log_path: String,
        exit_path: String,
        offset: u64,
    ) -> wasmtime::Result<Result<ExitStatus, RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        let trace = self.trace();
        let result = self.budget.in_host(remote.attach(&log_path, &exit_path, offset, &*trace, &self.call.stop)).await;
        Ok(result.map(wit_status).map_err(wit_error))
    }

    async fn upload(&mut self, path: String, data: Vec<u8>, mode: u32) -> wasmtime::Result<Result<(), RemoteError>> {
        if data.len() > self.ctx.max_transfer {
            return Ok(Err(RemoteError::TooLarge(u32::try_from(self.ctx.max_transfer).unwrap_or(u32::MAX))));
        }
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self.budget.in_host(remote.upload(&path, &data, mode)).await.map_err(wit_error))
    }

    async fn download(&mut self, path: String, max_bytes: u32) -> wasmtime::Result<Result<Vec<u8>, RemoteError>> {
        let remote = match self.remote() {
            Ok(remote) => remote,
            Err(e) => return Ok(Err(e)),
        };
        let cap = (max_bytes as usize).min(self.ctx.max_transfer);
        Ok(self.budget.in_host(remote.download(&path, cap)).await.map_err(wit_error))
    }
}
