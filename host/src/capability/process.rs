//! `runway:host/process`: local processes for the shell and custom executors.
//!
//! Output of `run` goes straight from the process's pipe into the job's trace sink — stdout
//! and stderr share one pipe so their order is kept — and never crosses into wasm memory.
//! Each process leads its own process group; a stop signal sends SIGTERM to the group, then
//! SIGKILL after a grace period, and stragglers left behind by a finished script are killed
//! too, so nothing a job started outlives its stage. The processes themselves are
//! [`crate::connector::process`]'s (shared with the local session of `remote`); this file maps
//! its types to the WIT ones.
//!
//! Owns: [`ProcessCtx`] (the `allow_process` policy and buffer limit), [`ProcessView`] and the
//! `process` host trait on it. Must not touch: plugins or stores (the plugin host projects its
//! store data onto a [`ProcessView`]), process handling (the connector owns it).

use std::sync::Arc;

use wasmtime::component::HasData;

use crate::bindings::executor::runway::host0_1_0::process::{Command, ExitStatus, Host, Output, ProcessError};
use crate::capability::call::{CallBudget, CallContext};
use crate::connector::process::{self as local, Captured, LocalCommand, ProcessFailure};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

pub use crate::connector::process::KILL_GRACE;

/// Most bytes `run-captured` keeps per stream.
pub const MAX_CAPTURE: usize = 1 << 20;

fn local_command(cmd: Command) -> LocalCommand {
    LocalCommand { program: cmd.program, args: cmd.args, env: cmd.env, cwd: cmd.cwd, stdin: cmd.stdin }
}

fn wit_status(status: crate::connector::ExitStatus) -> ExitStatus {
    ExitStatus { code: status.code, signal: status.signal }
}

fn wit_error(failure: ProcessFailure) -> ProcessError {
    match failure {
        ProcessFailure::SpawnFailed(m) => ProcessError::SpawnFailed(m),
        ProcessFailure::Canceled => ProcessError::Canceled,
        ProcessFailure::TimedOut => ProcessError::TimedOut,
        ProcessFailure::Other(m) => ProcessError::Other(m),
    }
}

/// Run `cmd`, streaming combined stdout/stderr into `trace`, until it exits or `stop` fires.
pub async fn run_streaming(
    cmd: Command,
    trace: Arc<dyn TraceSink>,
    stop: StopSignal,
) -> Result<ExitStatus, ProcessError> {
    let output = |bytes: &[u8]| trace.write_output(bytes);
    local::run_streaming(&local_command(cmd), &output, &stop).await.map(wit_status).map_err(wit_error)
}

/// Run `cmd` and capture its output, each stream cut at `cap` bytes.
pub async fn run_captured(cmd: Command, cap: usize, stop: StopSignal) -> Result<Output, ProcessError> {
    let Captured { status, stdout, stderr, truncated } =
        local::run_captured(&local_command(cmd), cap, &stop).await.map_err(wit_error)?;
    Ok(Output { status: wit_status(status), stdout, stderr, truncated })
}

/// The `process` capability's own state: whose policy, and what it allows.
pub struct ProcessCtx {
    plugin: Arc<str>,
    allow_process: bool,
    max_buffer: usize,
}

impl ProcessCtx {
    /// The capability for `plugin`: processes only with `allow_process`, stdin and captures
    /// bounded by `max_buffer` bytes.
    pub fn new(plugin: Arc<str>, allow_process: bool, max_buffer: usize) -> Self {
        ProcessCtx { plugin, allow_process, max_buffer }
    }
}

/// The `process` capability as one call sees it: its policy, the call's log and stop signal,
/// and the budget whose clock stops while a process runs.
pub struct ProcessView<'a> {
    /// The policy.
    pub ctx: &'a ProcessCtx,
    /// The job the call works for.
    pub call: &'a CallContext,
    /// The call's budget.
    pub budget: &'a CallBudget,
}

/// [`HasData`] marker linking `process` to a [`ProcessView`].
pub struct HasProcess;

impl HasData for HasProcess {
    type Data<'a> = ProcessView<'a>;
}

fn not_permitted(plugin: &str) -> ProcessError {
    ProcessError::NotPermitted(format!("plugin {plugin} has no allow_process grant"))
}

impl Host for ProcessView<'_> {
    async fn run(&mut self, cmd: Command) -> wasmtime::Result<Result<ExitStatus, ProcessError>> {
        if !self.ctx.allow_process {
            return Ok(Err(not_permitted(&self.ctx.plugin)));
        }
        let Some(trace) = self.call.trace.clone() else {
            return Ok(Err(ProcessError::Other("no job log to stream into outside a job; use run-captured".into())));
        };
        if let Some(stdin) = &cmd.stdin {
            if stdin.len() > self.ctx.max_buffer {
                return Ok(Err(ProcessError::Other(format!("stdin of {} bytes exceeds max_buffer_mb", stdin.len()))));
            }
        }
        Ok(self.budget.in_host(run_streaming(cmd, trace, self.call.stop.clone())).await)
    }

    async fn run_captured(&mut self, cmd: Command, max_bytes: u32) -> wasmtime::Result<Result<Output, ProcessError>> {
        if !self.ctx.allow_process {
            return Ok(Err(not_permitted(&self.ctx.plugin)));
        }
        let cap = (max_bytes as usize).min(MAX_CAPTURE).min(self.ctx.max_buffer / 2);
        Ok(self.budget.in_host(run_captured(cmd, cap, self.call.stop.clone())).await)
    }
}
