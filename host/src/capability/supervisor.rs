//! `runway:host/supervisor@0.3.0`: local processes under a deadline, stopped with SIGTERM to
//! the group, SIGKILL after the plugin's graceful period, and given up after its forceful
//! period — how GitLab Runner runs the custom executor's drivers. The same grant and policy as
//! `process` ([`ProcessCtx`]), so it is implemented on the same [`ProcessView`] and linked
//! through [`super::process::HasProcess`]; the processes are
//! [`crate::connector::process::run_supervised`]'s.
//!
//! Owns: the `supervisor` host trait and its WIT mapping. Must not touch: plugins or stores,
//! process handling (the connector owns it).

use std::sync::Arc;
use std::time::Duration;

use crate::bindings::executor::runway::host0_3_0::supervisor::{
    Command, ExitStatus, Host, Limits, Outcome, ProcessError,
};
use crate::capability::process::{ProcessView, MAX_CAPTURE};
use crate::connector::process::{self as local, LocalCommand, ProcessFailure, Supervision};
use crate::trace::TraceSink;

fn wit_error(failure: ProcessFailure) -> ProcessError {
    match failure {
        ProcessFailure::SpawnFailed(m) => ProcessError::SpawnFailed(m),
        ProcessFailure::Canceled => ProcessError::Canceled,
        ProcessFailure::TimedOut => ProcessError::TimedOut,
        ProcessFailure::Other(m) => ProcessError::Other(m),
    }
}

/// Where output goes when a call has no job log (an executor's cleanup outside a job).
struct Discard;

impl TraceSink for Discard {
    fn write(&self, _: &[u8]) {}
}

impl Host for ProcessView<'_> {
    async fn run(&mut self, cmd: Command, limits: Limits) -> wasmtime::Result<Result<Outcome, ProcessError>> {
        if !self.ctx.allows_process() {
            return Ok(Err(ProcessError::NotPermitted(format!(
                "plugin {} has no allow_process grant",
                self.ctx.plugin()
            ))));
        }
        if let Some(stdin) = &cmd.stdin {
            if stdin.len() > self.ctx.max_buffer() {
                return Ok(Err(ProcessError::Other(format!("stdin of {} bytes exceeds max_buffer_mb", stdin.len()))));
            }
        }
        let trace: Arc<dyn TraceSink> = self.call.trace.clone().unwrap_or_else(|| Arc::new(Discard));
        let supervision = Supervision {
            timeout: limits.timeout_seconds.map(|s| Duration::from_secs(u64::from(s))),
            graceful_kill: Duration::from_secs(u64::from(limits.graceful_kill_seconds)),
            force_kill: Duration::from_secs(u64::from(limits.force_kill_seconds)),
            capture_stdout: limits
                .capture_stdout
                .map(|cap| (cap as usize).min(MAX_CAPTURE).min(self.ctx.max_buffer() / 2)),
        };
        let command =
            LocalCommand { program: cmd.program, args: cmd.args, env: cmd.env, cwd: cmd.cwd, stdin: cmd.stdin };
        let output = |bytes: &[u8]| trace.write(bytes);
        let result = self.budget.in_host(local::run_supervised(&command, supervision, &output, &self.call.stop)).await;
        Ok(result
            .map(|exit| Outcome {
                status: ExitStatus { code: exit.status.code, signal: exit.status.signal },
                stdout: exit.stdout,
                truncated: exit.truncated,
            })
            .map_err(wit_error))
    }
}
