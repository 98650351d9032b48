//! Processes on the runner's own machine: spawned with a cleared environment (only
//! [`PASSTHROUGH`] is inherited), each leading its own process group, with stdout and stderr
//! in one pipe (so their order is kept) streamed to a callback or captured with a cap.
//!
//! A stop signal sends SIGTERM to the group, then SIGKILL after [`KILL_GRACE`]; stragglers a
//! finished command left in its group are killed too (they would hold the pipe open), and a
//! dropped call kills the group. A command that must outlive its caller is started in a
//! session of its own by [`super::spawn`] instead.
//!
//! Owns: spawning, streaming, capturing and stopping local processes, in the connector's own
//! types ([`LocalCommand`], [`ProcessFailure`]). Must not touch: WIT types (the `process`
//! capability maps them), plugins, jobs.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::connector::remote::ExitStatus;
use crate::stop::{StopReason, StopSignal};

/// Time between SIGTERM and SIGKILL when a stopped command's group is killed.
pub const KILL_GRACE: Duration = Duration::from_secs(3);
/// Variables passed through from the runner when the command does not set them.
pub const PASSTHROUGH: &[&str] = &["PATH", "HOME", "USER", "LANG", "SHELL", "TERM"];
/// How long output still in the pipe may take to arrive after the command exited, before
/// whatever the command left running in its group is killed.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// A command to run on this machine.
#[derive(Debug, Clone, Default)]
pub struct LocalCommand {
    /// The program (looked up in `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables on top of [`PASSTHROUGH`] (which they override).
    pub env: Vec<(String, String)>,
    /// The working directory; the runner's when `None`.
    pub cwd: Option<String>,
    /// Bytes for standard input, which is then closed; `/dev/null` when `None`.
    pub stdin: Option<Vec<u8>>,
}

impl LocalCommand {
    /// `sh -c script`.
    pub fn shell(script: &str, stdin: Option<&[u8]>) -> Self {
        LocalCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            stdin: stdin.map(<[u8]>::to_vec),
            ..LocalCommand::default()
        }
    }
}

/// Why a local command did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcessFailure {
    /// The program could not be started.
    #[error("{0}")]
    SpawnFailed(String),
    /// The stop signal fired because the job was cancelled; the group was killed.
    #[error("canceled")]
    Canceled,
    /// The stop signal fired because the job timed out; the group was killed.
    #[error("timed out")]
    TimedOut,
    /// Anything else (pipes, waiting).
    #[error("{0}")]
    Other(String),
}

/// A captured command's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// How it ended.
    pub status: ExitStatus,
    /// Standard output, at most the cap.
    pub stdout: Vec<u8>,
    /// Standard error, at most the cap.
    pub stderr: Vec<u8>,
    /// Was either stream cut at the cap?
    pub truncated: bool,
}

/// Kills a process group when dropped (the call was abandoned or is over).
struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    fn of(child: &tokio::process::Child) -> Self {
        GroupGuard { pgid: child.id().and_then(|id| i32::try_from(id).ok()) }
    }

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

/// `program` found in the directories of `path` (a `PATH` value), as `execvp` would find it;
/// `None` for a name with a `/` or one not found there.
fn find_in_path(program: &str, path: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.is_empty() || program.contains('/') {
        return None;
    }
    path.split(':').map(|dir| if dir.is_empty() { "." } else { dir }).find_map(|dir| {
        let candidate = std::path::Path::new(dir).join(program);
        let meta = std::fs::metadata(&candidate).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
    })
}

/// `cmd` with only [`PASSTHROUGH`] of the runner's environment under its own.
///
/// The program is looked up in the child's `PATH` here: the standard library starts a
/// command whose environment sets `PATH` and whose program is a bare name with `fork` +
/// `exec`, and forking the runner (the wasm runtime's mappings included) costs a few
/// milliseconds of page-table copying per process; with a path it uses `posix_spawn`
/// (`vfork`-like), as long as nothing runs between fork and exec.
fn command_of(cmd: &LocalCommand) -> tokio::process::Command {
    let env = environment(cmd);
    let program = resolve_program(cmd, &env);
    let mut command = match &program {
        Some(found) => tokio::process::Command::new(found),
        None => tokio::process::Command::new(&cmd.program),
    };
    if program.is_some() {
        // What the program sees as its name, as with a lookup by `execvp`.
        command.arg0(&cmd.program);
    }
    command.args(&cmd.args).env_clear().envs(env);
    if let Some(cwd) = &cmd.cwd {
        command.current_dir(cwd);
    }
    command
}

/// The whole environment of `cmd`: [`PASSTHROUGH`] of the runner's, under `cmd.env`.
pub fn environment(cmd: &LocalCommand) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        PASSTHROUGH.iter().filter_map(|key| std::env::var(key).ok().map(|value| (key.to_string(), value))).collect();
    // A key of the command's own replaces the runner's (and an earlier one of its own).
    for (key, value) in &cmd.env {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    env
}

/// The program of `cmd` found in the `PATH` of `env` (its whole environment, [`environment`]:
/// the runner's `PATH` unless the command sets its own); the program itself when it is a path
/// (has a `/`); `None` when not found or there is no `PATH`.
pub fn resolve_program(cmd: &LocalCommand, env: &[(String, String)]) -> Option<std::path::PathBuf> {
    if cmd.program.contains('/') {
        return Some(std::path::PathBuf::from(&cmd.program));
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str())?;
    find_in_path(&cmd.program, path)
}

fn build(cmd: &LocalCommand) -> tokio::process::Command {
    let mut command = command_of(cmd);
    command.process_group(0).kill_on_drop(true);
    command.stdin(if cmd.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    command
}

fn spawn_failed(cmd: &LocalCommand, e: std::io::Error) -> ProcessFailure {
    match &cmd.cwd {
        Some(cwd) => ProcessFailure::SpawnFailed(format!("cannot start {} in {cwd}: {e}", cmd.program)),
        None => ProcessFailure::SpawnFailed(format!("cannot start {}: {e}", cmd.program)),
    }
}

fn stopped_error(stop: &StopSignal) -> ProcessFailure {
    match stop.reason() {
        Some(StopReason::TimedOut) => ProcessFailure::TimedOut,
        _ => ProcessFailure::Canceled,
    }
}

fn pipe_error(e: std::io::Error) -> ProcessFailure {
    ProcessFailure::Other(format!("creating pipe: {e}"))
}

fn write_stdin(child: &mut tokio::process::Child, data: Option<Vec<u8>>) {
    if let (Some(mut stdin), Some(data)) = (child.stdin.take(), data) {
        tokio::spawn(async move {
            // A script that exits early closes its stdin; that is not an error.
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
}

/// The read end of a command's output pipe, forwarding what arrives to a callback.
struct Pump<'a> {
    reader: tokio::net::unix::pipe::Receiver,
    buf: Vec<u8>,
    eof: bool,
    output: &'a (dyn Fn(&[u8]) + Send + Sync),
}

impl Pump<'_> {
    /// Forward output while `work` runs; returns what `work` returned.
    async fn during<R>(&mut self, work: impl std::future::Future<Output = R>) -> R {
        tokio::pin!(work);
        loop {
            tokio::select! {
                result = &mut work => return result,
                read = self.reader.read(&mut self.buf), if !self.eof => match read {
                    Ok(0) | Err(_) => self.eof = true,
                    Ok(n) => (self.output)(&self.buf[..n]),
                },
            }
        }
    }

    /// Forward output until every writer closed the pipe.
    async fn drain(&mut self) {
        while !self.eof {
            match self.reader.read(&mut self.buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(n) => (self.output)(&self.buf[..n]),
            }
        }
    }
}

/// How a supervised command may run and is stopped ([`run_supervised`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Supervision {
    /// Stop the command after this long ([`ProcessFailure::TimedOut`]).
    pub timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL to the group.
    pub graceful_kill: Duration,
    /// Time to wait after SIGKILL before giving up on the process.
    pub force_kill: Duration,
    /// Capture at most this many bytes of stdout instead of streaming it.
    pub capture_stdout: Option<usize>,
}

/// A supervised command's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisedExit {
    /// How it ended.
    pub status: ExitStatus,
    /// Standard output, when captured.
    pub stdout: Vec<u8>,
    /// Was it cut at the cap?
    pub truncated: bool,
}

/// Why a supervised command was stopped.
enum Ended {
    Exited(std::io::Result<std::process::ExitStatus>),
    Stopped,
    TimedOut,
}

/// Run `cmd` under `limits` as GitLab Runner runs the custom executor's drivers: stderr (and
/// stdout unless captured) streamed into `output`; stopped by `stop` or the command's own
/// timeout with SIGTERM to its group, SIGKILL `graceful_kill` later, and given up on (an
/// error naming its PID) when it is still there `force_kill` after that.
pub async fn run_supervised(
    cmd: &LocalCommand,
    limits: Supervision,
    output: &(dyn Fn(&[u8]) + Send + Sync),
    stop: &StopSignal,
) -> Result<SupervisedExit, ProcessFailure> {
    if stop.is_stopped() {
        return Err(stopped_error(stop));
    }
    let (writer, reader) = tokio::net::unix::pipe::pipe().map_err(pipe_error)?;
    let writer = writer.into_blocking_fd().map_err(pipe_error)?;
    let mut command = build(cmd);
    match limits.capture_stdout {
        Some(_) => command.stdout(Stdio::piped()),
        None => command.stdout(Stdio::from(writer.try_clone().map_err(pipe_error)?)),
    };
    command.stderr(Stdio::from(writer));
    let mut child = command.spawn().map_err(|e| spawn_failed(cmd, e))?;
    drop(command);
    let pid = child.id().unwrap_or_default();
    let guard = GroupGuard::of(&child);
    let captured = limits.capture_stdout.map(|cap| tokio::spawn(read_capped(child.stdout.take(), cap)));
    write_stdin(&mut child, cmd.stdin.clone());
    let mut pump = Pump { reader, buf: vec![0u8; 32 * 1024], eof: false, output };
    let deadline = async {
        match limits.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let ended = pump
        .during(async {
            tokio::select! {
                status = child.wait() => Ended::Exited(status),
                _ = stop.stopped() => Ended::Stopped,
                _ = deadline => Ended::TimedOut,
            }
        })
        .await;
    let timed_out = matches!(ended, Ended::TimedOut);
    let result = match ended {
        Ended::Exited(status) => {
            status.map(exit_status).map_err(|e| ProcessFailure::Other(format!("waiting for process: {e}")))
        }
        Ended::Stopped | Ended::TimedOut => {
            guard.signal(libc::SIGTERM);
            let mut killed = true;
            if tokio::time::timeout(limits.graceful_kill, pump.during(child.wait())).await.is_err() {
                guard.signal(libc::SIGKILL);
                killed = tokio::time::timeout(limits.force_kill, pump.during(child.wait())).await.is_ok();
            }
            if !killed {
                Err(ProcessFailure::Other(format!("failed to kill process PID={pid}, likely process is dormant")))
            } else if timed_out {
                Err(ProcessFailure::TimedOut)
            } else {
                Err(stopped_error(stop))
            }
        }
    };
    if tokio::time::timeout(DRAIN_GRACE, pump.drain()).await.is_err() {
        guard.signal(libc::SIGKILL);
        let _ = tokio::time::timeout(DRAIN_GRACE, pump.drain()).await;
    }
    drop(guard);
    let (stdout, truncated) = match captured {
        Some(task) => task.await.unwrap_or_default(),
        None => (Vec::new(), false),
    };
    result.map(|status| SupervisedExit { status, stdout, truncated })
}

/// Run `cmd`, streaming combined stdout/stderr into `output`, until it exits or `stop` fires.
pub async fn run_streaming(
    cmd: &LocalCommand,
    output: &(dyn Fn(&[u8]) + Send + Sync),
    stop: &StopSignal,
) -> Result<ExitStatus, ProcessFailure> {
    if stop.is_stopped() {
        return Err(stopped_error(stop));
    }
    let (writer, reader) = tokio::net::unix::pipe::pipe().map_err(pipe_error)?;
    let writer = writer.into_blocking_fd().map_err(pipe_error)?;
    let writer_err = writer.try_clone().map_err(pipe_error)?;
    let mut command = build(cmd);
    command.stdout(Stdio::from(writer)).stderr(Stdio::from(writer_err));
    let mut child = command.spawn().map_err(|e| spawn_failed(cmd, e))?;
    // The command holds the pipe's write ends; drop them so EOF arrives when the group exits.
    drop(command);
    let guard = GroupGuard::of(&child);
    write_stdin(&mut child, cmd.stdin.clone());
    let mut pump = Pump { reader, buf: vec![0u8; 32 * 1024], eof: false, output };
    let ended = pump
        .during(async {
            tokio::select! {
                status = child.wait() => Some(status),
                _ = stop.stopped() => None,
            }
        })
        .await;
    let result = match ended {
        Some(status) => status.map(exit_status).map_err(|e| ProcessFailure::Other(format!("waiting for process: {e}"))),
        None => {
            guard.signal(libc::SIGTERM);
            if tokio::time::timeout(KILL_GRACE, pump.during(child.wait())).await.is_err() {
                guard.signal(libc::SIGKILL);
                let _ = pump.during(child.wait()).await;
            }
            Err(stopped_error(stop))
        }
    };
    // Give output already in the pipe a moment to drain, then kill whatever the command left
    // running in its group (it would hold the pipe open forever). A process that left the
    // group and kept the pipe is not waited for beyond a second grace period.
    if tokio::time::timeout(DRAIN_GRACE, pump.drain()).await.is_err() {
        guard.signal(libc::SIGKILL);
        let _ = tokio::time::timeout(DRAIN_GRACE, pump.drain()).await;
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
pub async fn run_captured(cmd: &LocalCommand, cap: usize, stop: &StopSignal) -> Result<Captured, ProcessFailure> {
    if stop.is_stopped() {
        return Err(stopped_error(stop));
    }
    let mut command = build(cmd);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| spawn_failed(cmd, e))?;
    let guard = GroupGuard::of(&child);
    let stdout = tokio::spawn(read_capped(child.stdout.take(), cap));
    let stderr = tokio::spawn(read_capped(child.stderr.take(), cap));
    write_stdin(&mut child, cmd.stdin.clone());
    let status = tokio::select! {
        status = child.wait() => status.map(exit_status).map_err(|e| ProcessFailure::Other(format!("waiting for process: {e}"))),
        _ = stop.stopped() => {
            guard.signal(libc::SIGTERM);
            if tokio::time::timeout(KILL_GRACE, child.wait()).await.is_err() {
                guard.signal(libc::SIGKILL);
                let _ = child.wait().await;
            }
            Err(stopped_error(stop))
        }
    };
    guard.signal(libc::SIGKILL);
    let (stdout, t1) = stdout.await.unwrap_or_default();
    let (stderr, t2) = stderr.await.unwrap_or_default();
    Ok(Captured { status: status?, stdout, stderr, truncated: t1 || t2 })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::{run_supervised, LocalCommand, ProcessFailure, Supervision};
    use crate::stop::StopSignal;

    fn limits(timeout: Option<Duration>, capture_stdout: Option<usize>) -> Supervision {
        Supervision {
            timeout,
            graceful_kill: Duration::from_secs(1),
            force_kill: Duration::from_secs(5),
            capture_stdout,
        }
    }

    #[tokio::test]
    async fn captured_stdout_is_returned_and_stderr_streamed() {
        let streamed = Mutex::new(Vec::new());
        let output = |bytes: &[u8]| streamed.lock().expect("lock").extend_from_slice(bytes);
        let cmd = LocalCommand::shell("echo '{\"a\":1}'; echo to-log >&2; exit 3", None);
        let exit = run_supervised(&cmd, limits(None, Some(1024)), &output, &StopSignal::new()).await.expect("runs");
        assert_eq!((exit.status.code, exit.stdout.as_slice()), (3, &b"{\"a\":1}\n"[..]));
        assert_eq!(streamed.lock().expect("lock").as_slice(), b"to-log\n");
    }

    #[tokio::test]
    async fn a_command_ignoring_sigterm_is_killed_after_the_graceful_period() {
        let streamed = Mutex::new(Vec::new());
        let output = |bytes: &[u8]| streamed.lock().expect("lock").extend_from_slice(bytes);
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("pid");
        let script = format!(
            "echo $$ > {}; trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.05; done",
            pid_file.display()
        );
        let cmd = LocalCommand::shell(&script, None);
        let result =
            run_supervised(&cmd, limits(Some(Duration::from_millis(200)), None), &output, &StopSignal::new()).await;
        assert_eq!(result, Err(ProcessFailure::TimedOut));
        let text = String::from_utf8_lossy(&streamed.lock().expect("lock")).to_string();
        assert!(text.contains("ready") && text.contains("got TERM"), "{text}");
        let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("number");
        // SAFETY: signal 0 only asks whether the process exists.
        assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "SIGKILL ended what SIGTERM did not");
    }
}
