//! `runway:host/remote`: commands and files on the instance the autoscaler acquired for the
//! job. The connector does the work through its [`RemoteSession`]; this capability maps the
//! connector's [`connector::ExitStatus`]/[`connector::RemoteError`] to the WIT types, and
//! calls without an acquired instance get `no-instance`.
//!
//! Owns: [`RemoteCtx`] (the transfer limit), [`RemoteView`] and the `remote` host trait on it.
//! Must not touch: plugins or stores (the plugin host projects its store data onto a
//! [`RemoteView`]), connections (the connector owns them).

use wasmtime::component::HasData;

use crate::bindings::executor::runway::host::process::ExitStatus;
use crate::bindings::executor::runway::host::remote::{Host, RemoteCommand, RemoteError};
use crate::capability::call::{CallBudget, CallContext};
use crate::connector::{self, RemoteSession};

/// Most bytes one upload or download may move.
pub const MAX_TRANSFER: usize = 16 << 20;

/// The `remote` capability's own state: how much one transfer may buffer.
pub struct RemoteCtx {
    max_transfer: usize,
}

impl RemoteCtx {
    /// The capability for a plugin that may buffer `max_buffer` bytes per call.
    pub fn new(max_buffer: usize) -> Self {
        RemoteCtx { max_transfer: MAX_TRANSFER.min(max_buffer) }
    }
}

/// The `remote` capability as one call sees it: its limits, the call's instance, log and stop
/// signal, and the budget whose clock stops while the instance works.
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
    fn remote(&self) -> Result<&dyn RemoteSession, RemoteError> {
        self.call.remote.as_deref().ok_or(RemoteError::NoInstance)
    }
}

impl Host for RemoteView<'_> {
    async fn run(&mut self, cmd: RemoteCommand) -> wasmtime::Result<Result<ExitStatus, RemoteError>> {
        let (Some(remote), Some(trace)) = (&self.call.remote, &self.call.trace) else {
            return Ok(Err(RemoteError::NoInstance));
        };
        let result =
            self.budget.in_host(remote.run(&cmd.command, cmd.stdin.as_deref(), &**trace, &self.call.stop)).await;
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
        let (Some(remote), Some(trace)) = (&self.call.remote, &self.call.trace) else {
            return Ok(Err(RemoteError::NoInstance));
        };
        let result = self.budget.in_host(remote.attach(&log_path, &exit_path, offset, &**trace, &self.call.stop)).await;
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
