//! `runway:host/process`: local processes for the shell and custom executors.
//!
//! Output of `run` goes straight from the process's pipe into the job's trace sink — stdout
//! and stderr share one pipe so their order is kept — and never crosses into wasm memory.
//! Each process leads its own process group; a stop signal sends SIGTERM to the group, then
//! SIGKILL after a grace period, and stragglers left behind by a finished script are killed
//! too, so nothing a job started outlives its stage.
//!
//! Owns: [`ProcessCtx`] (the `allow_process` policy and buffer limit), [`ProcessView`] and the
//! `process` host trait on it, and the process runners. Must not touch: plugins or stores (the
//! plugin host projects its store data onto a [`ProcessView`]).

use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmtime::component::HasData;

use crate::bindings::executor::runway::host::process::{Command, ExitStatus, Host, Output, ProcessError};
use crate::capability::call::{CallBudget, CallContext};
use crate::stop::{StopReason, StopSignal};
use crate::trace::TraceSink;

/// Time between SIGTERM and SIGKILL when a stage is stopped.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// Most bytes `run-captured` keeps per stream.
pub const MAX_CAPTURE: usize = 1 << 20;
/// Variables passed through from the runner when the command does not set them.
const PASSTHROUGH: &[&str] = &["PATH", "HOME", "USER", "LANG", "SHELL", "TERM"];

/// Kills a process group when dropped (the call was abandoned) unless disarmed.
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn signal(&self, signal: i32) {
        if let Some(pgid) = self.pgid {
            // SAFETY: killpg has no memory-safety preconditions; a stale pgid only yields ESRCH.
            unsafe {
                libc::killpg(pgid, signal);
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitStatus { code, signal: None },
        (None, Some(sig)) => ExitStatus { code: 128 + sig, signal: Some(sig) },
        (None, None) => ExitStatus { code: -1, signal: None },
    }
}

fn build(cmd: &Command) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&cmd.program);
    command.args(&cmd.args).env_clear();
    for key in PASSTHROUGH {
        if !cmd.env.iter().any(|(k, _)| k == key) {
            if let Ok(value) = std::env::var(key) {
                command.env(key, value);
            }
        }
    }
    command.envs(cmd.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if let Some(cwd) = &cmd.cwd {
        command.current_dir(cwd);
    }
    command.process_group(0).kill_on_drop(true);
    command.stdin(if cmd.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command
}

fn spawn_failed(cmd: &Command, e: std::io::Error) -> ProcessError {
    match &cmd.cwd {
        Some(cwd) => ProcessError::SpawnFailed(format!("cannot start {} in {cwd}: {e}", cmd.program)),
        None => ProcessError::SpawnFailed(format!("cannot start {}: {e}", cmd.program)),
    }
}

fn stopped_error(stop: &StopSignal) -> ProcessError {
    match stop.reason() {
        Some(StopReason::TimedOut) => ProcessError::TimedOut,
        _ => ProcessError::Canceled,
    }
}

/// Wait for the child or the stop signal; on stop, TERM then KILL the group.
async fn wait_or_stop(
    child: &mut tokio::process::Child,
    guard: &GroupGuard,
    stop: &StopSignal,
) -> Result<ExitStatus, ProcessError> {
    tokio::select! {
        status = child.wait() => status.map(exit_status).map_err(|e| ProcessError::Other(format!("waiting for process: {e}"))),
        _ = stop.stopped() => {
            guard.signal(libc::SIGTERM);
            if tokio::time::timeout(KILL_GRACE, child.wait()).await.is_err() {
                guard.signal(libc::SIGKILL);
                let _ = child.wait().await;
            }
            Err(stopped_error(stop))
        }
    }
}

async fn write_stdin(child: &mut tokio::process::Child, data: Option<Vec<u8>>) {
    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), data) {
        tokio::spawn(async move {
            // A script that exits early closes its stdin; that is not an error.
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
}

/// Run `cmd`, streaming combined stdout/stderr into `trace`, until it exits or `stop` fires.
pub async fn run_streaming(
    cmd: Command,
    trace: Arc<dyn TraceSink>,
    stop: StopSignal,
) -> Result<ExitStatus, ProcessError> {
    if stop.is_stopped() {
        return Err(stopped_error(&stop));
    }
    let (mut reader, writer) = std::io::pipe().map_err(|e| ProcessError::Other(format!("creating pipe: {e}")))?;
    let writer_err = writer.try_clone().map_err(|e| ProcessError::Other(format!("creating pipe: {e}")))?;
    let mut command = build(&cmd);
    command.stdout(Stdio::from(writer)).stderr(Stdio::from(writer_err));
    let mut child = command.spawn().map_err(|e| spawn_failed(&cmd, e))?;
    // The command holds the pipe's write ends; drop them so EOF arrives when the group exits.
    drop(command);
    let guard = GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) };
    let pump = tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => trace.write(&buf[..n]),
            }
        }
    });
    write_stdin(&mut child, cmd.stdin).await;
    let result = wait_or_stop(&mut child, &guard, &stop).await;
    // Give output already in the pipe a moment to drain, then kill whatever the script left
    // running in the background (it would hold the pipe open forever).
    let mut pump = pump;
    if tokio::time::timeout(Duration::from_millis(500), &mut pump).await.is_err() {
        guard.signal(libc::SIGKILL);
        let _ = pump.await;
    }
    drop(guard);
    result
}

async fn read_capped(stream: Option<impl tokio::io::AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let Some(mut stream) = stream else { return (Vec::new(), false) };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    let mut truncated = false;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(out.len());
                if n > room {
                    truncated = true;
                }
                out.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (out, truncated)
}

/// Run `cmd` and capture its output, each stream cut at `cap` bytes.
pub async fn run_captured(cmd: Command, cap: usize, stop: StopSignal) -> Result<Output, ProcessError> {
    if stop.is_stopped() {
        return Err(stopped_error(&stop));
    }
    let mut command = build(&cmd);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| spawn_failed(&cmd, e))?;
    let guard = GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) };
    let stdout = tokio::spawn(read_capped(child.stdout.take(), cap));
    let stderr = tokio::spawn(read_capped(child.stderr.take(), cap));
    write_stdin(&mut child, cmd.stdin).await;
    let status = wait_or_stop(&mut child, &guard, &stop).await;
    guard.signal(libc::SIGKILL);
    let (stdout, t1) = stdout.await.unwrap_or_default();
    let (stderr, t2) = stderr.await.unwrap_or_default();
    Ok(Output { status: status?, stdout, stderr, truncated: t1 || t2 })
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
