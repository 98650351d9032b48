//! The runner's own machine as a [`RemoteSession`]: what a plugin with the `allow_process`
//! grant gets from `runway:host/remote` when its job has no fleet instance.
//!
//! Commands are `sh -c` in the runner's working directory with nothing of the runner's
//! environment but [`super::process::PASSTHROUGH`], leading their own process group, output
//! streamed into the trace, the group killed on stop ([`super::process`]). Detached commands
//! are [`super::detached`]'s: in their own session ([`super::spawn`]: `posix_spawn` with
//! `POSIX_SPAWN_SETSID`), outside the runner's process group, with no parent-death signal, so
//! they outlive the runner. The stage reaper ([`super::reaper`]) starts them and writes their
//! exit codes: no process of ours per command but the command itself (`sh -c`, or for a plain
//! `cd DIR && exec PROGRAM ARGS` the program, in DIR); where there is no reaper, one `sh`
//! leader each that writes the exit code ([`super::detached::DIRECT_EXIT_WRAPPER`]), reaped by
//! the runner while it lives. They are followed by reading their log and its marks directly
//! (the pid and exit code kept on the log: [`super::marks`]; in the runner: it ends with the
//! runner), with no process per poll, waking at once when a command this session started
//! ended. With [`StageOutput::Pipes`] (`runway exec`) a
//! command's log is a pipe this session follows once ([`super::streamed`]), woken when it has
//! data. Files are written atomically (a temporary file in the
//! same directory, renamed over the target) and read with the caller's size cap.
//!
//! Owns: [`LocalSession`]. Must not touch: WIT types, plugins, grants (the capability decides
//! who gets a local session).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use crate::connector::detached::{self, OutputFn, ShellHost};
use crate::connector::direct;
use crate::connector::marks;
use crate::connector::process::{run_streaming, LocalCommand, ProcessFailure};
use crate::connector::reaper;
use crate::connector::remote::{ExitStatus, RemoteError, RemoteSession, SocketStream};
use crate::connector::spawn::{spawn_session_leader_with_input, wait_exit};
use crate::connector::streamed::{self, Stream, Streams};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// The runner's own machine. Holds only the ends of the detached commands it started itself
/// (it is their parent while it lives), so that following one of them wakes at its end
/// instead of at the next poll.
#[derive(Debug)]
pub struct LocalSession {
    /// Exit path → set when that command's leader exited.
    ended: Mutex<HashMap<String, watch::Receiver<bool>>>,
    /// The `runway` executable whose stage reaper starts the detached commands.
    reaper: String,
    /// With [`StageOutput::Pipes`]: the read ends of the logs of commands started here.
    streams: Option<Streams>,
}

/// Where the output of the detached commands of a [`LocalSession`] goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StageOutput {
    /// Into their log files, which any later follower reads again from any byte (a runner
    /// that resumes a job after a crash): `runway run`.
    #[default]
    LogFiles,
    /// Into a pipe at the log's path that this session follows once, to the end
    /// ([`super::streamed`]): for a process that never resumes a stage, `runway exec`.
    Pipes,
}

impl Default for LocalSession {
    fn default() -> Self {
        LocalSession::new()
    }
}

impl LocalSession {
    /// The runner's machine, its detached commands started by the runner's own stage reaper
    /// ([`reaper`]; another `runway` binary's after [`reaper::use_executable`]).
    pub fn new() -> Self {
        LocalSession::with_reaper(reaper::default_executable())
    }

    /// The runner's machine, its detached commands started by the stage reaper of the `runway`
    /// binary `executable` (for a program that embeds the library, such as a test); with
    /// `sh` leaders when that is no reaper.
    pub fn with_reaper(executable: &str) -> Self {
        // Started now, while the job is prepared, so the first stage does not wait for it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let executable = executable.to_string();
            runtime.spawn(async move { reaper::shared(&executable).await });
        }
        LocalSession { ended: Mutex::default(), reaper: executable.to_string(), streams: None }
    }

    /// This session with its detached commands' output going where `output` says.
    pub fn with_output(mut self, output: StageOutput) -> Self {
        self.streams = (output == StageOutput::Pipes).then(Streams::default);
        self
    }

    /// Make the files of a detached command about to start: the log (a pipe with
    /// [`StageOutput::Pipes`]) and the directories; remove an old exit, pid and stdin file.
    async fn prepare(&self, log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
        let (log, exit, input) = (log_path.to_string(), exit_path.to_string(), detached::stdin_path(log_path));
        blocking(move || prepare_detached(&log, &exit, &input)).await?;
        match &self.streams {
            Some(streams) => streams.create(log_path).map_err(|e| io_error("making a pipe at", log_path, e)),
            None => Ok(()),
        }
    }

    /// A detached command of `log_path` could not start: forget its stream.
    fn not_started(&self, log_path: &str) {
        if let Some(streams) = &self.streams {
            streams.take(log_path);
        }
    }

    /// Note the end of `pid`, the leader of the detached command of `exit_path` (this
    /// process's child: reaped here).
    fn watch_end(&self, exit_path: &str, pid: i32) {
        let (ended, receiver) = watch::channel(false);
        tokio::spawn(async move {
            wait_exit(pid).await;
            let _ = ended.send(true);
        });
        self.note_end(exit_path, receiver);
    }

    /// Keep `end` (set once the command of `exit_path` ended and its exit code is written)
    /// for the follower.
    fn note_end(&self, exit_path: &str, end: watch::Receiver<bool>) {
        if let Ok(mut map) = self.ended.lock() {
            map.insert(exit_path.to_string(), end);
        }
    }

    /// [`ShellHost::start`] through the stage reaper: the command (`sh -c`, or the program
    /// itself when it is a plain `cd DIR && exec PROGRAM ARGS`) leads its session and the
    /// reaper writes its exit code. The pid file is written here, as [`ShellHost::start`]
    /// writes it.
    async fn start_reaped(
        &self,
        reaper: &reaper::Reaper,
        command: &str,
        stdin: &[u8],
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        self.prepare(log_path, exit_path).await?;
        let launch = direct::launch(command).unwrap_or_else(|| LocalCommand::shell(command, None));
        let started = reaper.start(&launch, stdin, log_path, exit_path).await;
        let (pid, end) =
            started.inspect_err(|_| self.not_started(log_path)).map_err(|e| RemoteError::Other(e.to_string()))?;
        self.note_end(exit_path, end);
        marks::write_pid(log_path, exit_path, pid).map_err(|e| io_error("noting the pid of", log_path, e))
    }

    /// The end of the detached command of `exit_path`, if this session started it.
    fn take_end(&self, exit_path: &str) -> Option<watch::Receiver<bool>> {
        self.ended.lock().ok()?.remove(exit_path)
    }
}

/// Resolves when `end` says the command ended (and then leaves `None` in it); never without
/// one, nor when its sender went away without saying so.
async fn leader_exit(end: &mut Option<watch::Receiver<bool>>) {
    if let Some(receiver) = end {
        let ended = receiver.wait_for(|done| *done).await.is_ok();
        *end = None;
        if ended {
            return;
        }
    }
    std::future::pending::<()>().await
}

fn remote_error(failure: ProcessFailure) -> RemoteError {
    match failure {
        ProcessFailure::Canceled | ProcessFailure::TimedOut => RemoteError::Canceled,
        ProcessFailure::SpawnFailed(m) | ProcessFailure::Other(m) => RemoteError::Other(m),
    }
}

fn io_error(what: &str, path: &str, e: std::io::Error) -> RemoteError {
    RemoteError::Other(format!("{what} {path}: {e}"))
}

fn write_file(path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
    use std::os::unix::fs::PermissionsExt;
    let target = Path::new(path);
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| io_error("creating the directory of", path, e))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| io_error("creating a file next to", path, e))?;
    tmp.write_all(data).map_err(|e| io_error("writing", path, e))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
        .map_err(|e| io_error("setting the mode of", path, e))?;
    tmp.persist(target).map_err(|e| io_error("writing", path, e.error))?;
    Ok(())
}

fn read_file(path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
    let file = std::fs::File::open(path).map_err(|e| io_error("reading", path, e))?;
    let mut data = Vec::new();
    let cap = u64::try_from(max_bytes).unwrap_or(u64::MAX).saturating_add(1);
    file.take(cap).read_to_end(&mut data).map_err(|e| io_error("reading", path, e))?;
    if data.len() > max_bytes {
        return Err(RemoteError::TooLarge(u32::try_from(max_bytes).unwrap_or(u32::MAX)));
    }
    Ok(data)
}

/// `mkdir -m MODE [-p] -- PATH` without a process: what is created gets exactly `mode`
/// (the umask narrowed it), an existing directory is kept as it is with `parents`.
fn make_dir(path: &str, mode: u32, parents: bool) -> Result<(), RemoteError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let target = Path::new(path);
    let failed = |e| io_error("creating the directory", path, e);
    if parents {
        if target.is_dir() {
            return Ok(());
        }
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(failed)?;
        }
    }
    match std::fs::DirBuilder::new().mode(mode & 0o7777).create(target) {
        Ok(()) => {}
        // Made by someone else in between: `mkdir -p` takes it as it is.
        Err(e) if parents && e.kind() == std::io::ErrorKind::AlreadyExists && target.is_dir() => return Ok(()),
        Err(e) => return Err(failed(e)),
    }
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(failed)
}

/// `rm -rf -- PATH` without a process: symbolic links are removed, never followed.
fn remove_all(path: &str) -> Result<(), RemoteError> {
    let result = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error("removing", path, e)),
        _ => Ok(()),
    }
}

/// The files of a detached command before it starts: directories, no exit, pid or stdin file
/// from an earlier run, and an empty 0600 log without an earlier run's [`marks`].
fn prepare_detached(log: &str, exit: &str, input: &str) -> Result<(), RemoteError> {
    for path in [log, exit] {
        if let Some(dir) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io_error("creating the directory of", path, e))?;
        }
    }
    for path in [exit.to_string(), detached::pid_path(exit), input.to_string()] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error("removing", &path, e)),
            _ => {}
        }
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).mode(0o600).create(true).truncate(true);
    let file = options.open(log).map_err(|e| io_error("creating", log, e))?;
    marks::clear(&file);
    Ok(())
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RemoteError> + Send + 'static,
) -> Result<T, RemoteError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| RemoteError::Other(format!("file operation failed: {e}")))?
}

/// Is process `pid` gone: exited, or a zombie nobody reaps (read from `/proc` where it exists)?
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; it has no effect on it.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'))
}

/// Whether a detached command's exit code is noted ([`marks`], [`detached::exit_code_written`]).
fn exit_written(log_path: &str, exit_path: &str) -> bool {
    marks::read_exit(log_path, exit_path).is_some_and(|text| detached::exit_code_written(&text))
}

/// Most bytes forwarded from a followed log before the follower lets other tasks run.
const FOLLOW_SLICE: usize = 4 << 20;

/// Forward what `file` holds past its position to `output`, at most about [`FOLLOW_SLICE`]
/// bytes; returns whether its end was reached.
fn forward_new(file: &mut std::fs::File, buf: &mut [u8], output: &OutputFn<'_>) -> std::io::Result<bool> {
    let mut total = 0;
    while total < FOLLOW_SLICE {
        match file.read(buf)? {
            0 => return Ok(true),
            n => {
                output(&buf[..n]);
                total += n;
            }
        }
    }
    Ok(false)
}

/// Free a followed log's blocks in steps of at least this many bytes.
const FREE_STEP: u64 = 8 << 20;

/// A trace that frees the followed log's blocks its sink released ([`TraceSink::released`]),
/// while the command still writes on: a stage's output is not on disk twice (log and wherever
/// the sink puts it) and deleting the log at the end is no longer a pause as long as the
/// output. Holes are punched (`FALLOC_FL_PUNCH_HOLE`, the size kept), so the writer and the
/// follower's offsets stay as they are; where the file system cannot, nothing is freed.
struct FreeingSink<'a> {
    inner: &'a dyn TraceSink,
    source: &'a str,
    /// The log opened for writing, when it could be; and how far it is freed.
    log: Mutex<(Option<std::fs::File>, u64)>,
}

impl<'a> FreeingSink<'a> {
    fn new(inner: &'a dyn TraceSink, source: &'a str) -> Self {
        FreeingSink { inner, source, log: Mutex::new((None, 0)) }
    }

    fn free_released(&self) {
        let released = self.inner.released(self.source) & !4095;
        let Ok(mut log) = self.log.lock() else { return };
        let (file, freed) = &mut *log;
        if released < *freed + FREE_STEP {
            return;
        }
        if file.is_none() {
            *file = std::fs::OpenOptions::new().write(true).open(self.source).ok();
        }
        let Some(file) = file else { return };
        // Not supported here: stop trying (freed set past anything released).
        *freed = if punch_hole(file, *freed, released - *freed) { released } else { u64::MAX / 2 };
    }
}

/// Free `length` bytes of `file` from `offset` on, its size kept; whether that was done.
#[cfg(target_os = "linux")]
fn punch_hole(file: &std::fs::File, offset: u64, length: u64) -> bool {
    let (Ok(offset), Ok(length)) = (i64::try_from(offset), i64::try_from(length)) else { return false };
    // SAFETY: fallocate only changes the file behind the descriptor we own.
    let punched = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            length,
        )
    };
    punched == 0
}

/// Free `length` bytes of `file` from `offset` on, where the kernel can: not here.
#[cfg(not(target_os = "linux"))]
fn punch_hole(_file: &std::fs::File, _offset: u64, _length: u64) -> bool {
    false
}

impl TraceSink for FreeingSink<'_> {
    fn write(&self, data: &[u8]) {
        self.inner.write(data)
    }
    fn write_output(&self, data: &[u8]) {
        self.inner.write_output(data)
    }
    fn write_footer(&self, data: &[u8]) {
        self.inner.write_footer(data)
    }
    fn write_followed(&self, source: &str, end: u64, data: &[u8]) {
        self.inner.write_followed(source, end, data);
        if source == self.source {
            self.free_released();
        }
    }
    fn followed(&self, source: &str) -> Option<u64> {
        self.inner.followed(source)
    }
    fn released(&self, source: &str) -> u64 {
        self.inner.released(source)
    }
}

/// How long a follower waits for the exit code of a command whose leader it saw end without
/// one: the stage reaper writes it right after the leader ended.
const EXIT_CODE_GRACE: Duration = Duration::from_secs(2);

/// First poll of a followed log after 1 ms, each next one half as long again, up to this: the
/// end of a short stage is seen within half its run time, a long one costs a `stat` per poll.
const MAX_POLL: Duration = Duration::from_millis(50);

#[async_trait]
impl ShellHost for LocalSession {
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let status = run_streaming(&LocalCommand::shell(script, stdin), output, stop).await.map_err(remote_error)?;
        Ok(status.code)
    }

    /// The files are written here and [`detached::DIRECT_EXIT_WRAPPER`] started in a session of
    /// its own directly ([`spawn_session_leader_with_input`]): one process (`sh`), no launcher
    /// script, no `setsid`. Its standard input is a memory file (the script never touches the
    /// disk; a 0600 stdin file, removed once the leader has it open, where there is no memfd).
    /// The pid file is written here once the leader runs (its pid is its process group),
    /// before this returns, as the other wrapper writes it before its starter returns.
    async fn start(&self, command: &str, stdin: &[u8], log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
        // A standard input too large for one request (tens of MiB) gets an `sh` leader.
        if reaper::Reaper::takes(stdin) {
            if let Some(reaper) = reaper::shared(&self.reaper).await {
                return self.start_reaped(&reaper, command, stdin, log_path, exit_path).await;
            }
        }
        self.prepare(log_path, exit_path).await?;
        let launch = LocalCommand {
            program: "sh".into(),
            args: vec!["-c".into(), detached::DIRECT_EXIT_WRAPPER.into(), command.into(), exit_path.into()],
            ..LocalCommand::default()
        };
        let input = detached::stdin_path(log_path);
        let started = spawn_session_leader_with_input(&launch, stdin, &input, log_path, "/dev/null");
        let pid = started.inspect_err(|_| self.not_started(log_path)).map_err(remote_error)?;
        self.watch_end(exit_path, pid);
        marks::write_pid(log_path, exit_path, pid).map_err(|e| io_error("noting the pid of", log_path, e))
    }

    /// The files are on this machine: read them, no process per poll. Dies with the runner.
    async fn follow(
        &self,
        log_path: &str,
        exit_path: &str,
        from: u64,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        let failed = |e| io_error("following", log_path, e);
        let mut log = match self.streams.as_ref().and_then(|streams| streams.take(log_path)) {
            Some(pipe) => Followed::Pipe(Stream::new(pipe, from).map_err(failed)?),
            None => Followed::File(open_log(log_path, from)?, vec![0u8; 64 * 1024]),
        };
        let leader = marks::read_pid(log_path, exit_path);
        let mut poll = Duration::from_millis(1);
        let mut end = self.take_end(exit_path);
        // The end of a command this session started is what its watcher says (a reaped
        // leader is gone before the reaper has written its exit code); of any other, its
        // leader gone.
        let mut leader_ended = false;
        loop {
            if stop.is_stopped() {
                return Err(RemoteError::Canceled);
            }
            // Whether it ended is decided before the read, so the read gets every last byte.
            let ended =
                exit_written(log_path, exit_path) || leader_ended || (end.is_none() && leader.is_some_and(gone));
            if !log.forward(output).map_err(failed)? {
                tokio::task::yield_now().await;
                continue;
            }
            if ended {
                break;
            }
            tokio::select! {
                more = log.more(poll, output) => more.map_err(failed)?,
                _ = leader_exit(&mut end) => leader_ended = true,
                _ = stop.stopped() => return Err(RemoteError::Canceled),
            }
            poll = (poll * 3 / 2).min(MAX_POLL);
        }
        exit_code(log_path, exit_path, stop).await
    }

    /// The leader is read from its mark ([`marks::read_pid`]), not from a pid file.
    async fn stop(&self, log_path: &str, exit_path: &str) {
        if let Some(pid) = marks::read_pid(log_path, exit_path) {
            detached::kill_group(self, pid).await;
        }
    }
}

/// The log of a detached command as its follower reads it.
enum Followed {
    /// A log file, read from its position (with the read buffer).
    File(std::fs::File, Vec<u8>),
    /// The pipe of a command this session started with [`StageOutput::Pipes`].
    Pipe(Stream),
}

impl Followed {
    /// Forward what the log holds now; `false` when a long file was cut short to let other
    /// tasks run ([`FOLLOW_SLICE`]) and there is more right away.
    fn forward(&mut self, output: &OutputFn<'_>) -> std::io::Result<bool> {
        match self {
            Followed::File(file, buf) => forward_new(file, buf, output),
            Followed::Pipe(stream) => stream.drain(output).map(|()| true),
        }
    }

    /// Let `poll` pass before the follower looks again; a pipe's data is forwarded meanwhile,
    /// as it comes (a writer must not wait for a poll while the pipe is full).
    async fn more(&mut self, poll: Duration, output: &OutputFn<'_>) -> std::io::Result<()> {
        let looked = tokio::time::sleep(poll);
        let Followed::Pipe(stream) = self else {
            looked.await;
            return Ok(());
        };
        tokio::pin!(looked);
        loop {
            tokio::select! {
                read = stream.next(output) => read?,
                _ = &mut looked => return Ok(()),
            }
        }
    }
}

/// The log file at `log_path`, positioned at byte `from`; an error for a pipe a `runway exec`
/// left there (it cannot be followed again), without waiting on it.
fn open_log(log_path: &str, from: u64) -> Result<std::fs::File, RemoteError> {
    let failed = |e| io_error("following", log_path, e);
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(log_path).map_err(failed)?;
    if streamed::is_stream(&file) {
        return Err(RemoteError::Other(format!(
            "{log_path}: the output of a `runway exec` stage, followed once by the process that started it"
        )));
    }
    file.seek(SeekFrom::Start(from)).map_err(failed)?;
    Ok(file)
}

/// The exit code of a command seen ended. A leader seen gone may be a zombie whose reaper is
/// writing its exit code right now: waited for up to [`EXIT_CODE_GRACE`].
async fn exit_code(log_path: &str, exit_path: &str, stop: &StopSignal) -> Result<i32, RemoteError> {
    let waited = std::time::Instant::now();
    loop {
        match marks::read_exit(log_path, exit_path) {
            Some(text) if detached::exit_code_written(&text) => return detached::parse_exit_code(exit_path, &text),
            _ if waited.elapsed() >= EXIT_CODE_GRACE => return Err(detached::no_exit_code(exit_path)),
            _ => tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                _ = stop.stopped() => return Err(RemoteError::Canceled),
            },
        }
    }
}

#[async_trait]
impl RemoteSession for LocalSession {
    async fn run(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        let output = |bytes: &[u8]| trace.write_output(bytes);
        run_streaming(&LocalCommand::shell(command, stdin), &output, stop).await.map_err(remote_error)
    }

    async fn start_detached(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        log_path: &str,
        exit_path: &str,
    ) -> Result<(), RemoteError> {
        detached::start(self, command, stdin, log_path, exit_path).await
    }

    async fn attach(
        &self,
        log_path: &str,
        exit_path: &str,
        offset: u64,
        trace: &dyn TraceSink,
        stop: &StopSignal,
    ) -> Result<ExitStatus, RemoteError> {
        if self.streams.is_some() {
            // A pipe holds nothing once read: there is nothing to free.
            return detached::attach(self, log_path, exit_path, offset, trace, stop).await;
        }
        let freeing = FreeingSink::new(trace, log_path);
        detached::attach(self, log_path, exit_path, offset, &freeing, stop).await
    }

    async fn upload(&self, path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
        let (path, data) = (path.to_string(), data.to_vec());
        blocking(move || write_file(&path, &data, mode)).await
    }

    async fn download(&self, path: &str, max_bytes: usize) -> Result<Vec<u8>, RemoteError> {
        let path = path.to_string();
        blocking(move || read_file(&path, max_bytes)).await
    }

    async fn make_dir(&self, path: &str, mode: u32, parents: bool) -> Result<(), RemoteError> {
        let path = path.to_string();
        blocking(move || make_dir(&path, mode, parents)).await
    }

    async fn remove_all(&self, path: &str) -> Result<(), RemoteError> {
        let path = path.to_string();
        blocking(move || remove_all(&path)).await
    }

    async fn connect_unix(&self, path: &str) -> Result<Box<dyn SocketStream>, RemoteError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| RemoteError::Connection(format!("unix://{path}: {e}")))?;
        Ok(Box::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::trace::MemorySink;

    #[tokio::test]
    async fn commands_stream_output_and_files_round_trip() {
        let session = LocalSession::new();
        let trace = MemorySink::default();
        let stop = StopSignal::new();
        let status = session.run("echo one; echo two >&2; cat; exit 7", Some(b"three\n"), &trace, &stop).await;
        assert_eq!(status.expect("run").code, 7);
        assert_eq!(trace.text(), "one\ntwo\nthree\n");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub dir/it's.bin").display().to_string();
        let data: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
        session.upload(&path, &data, 0o750).await.expect("upload");
        assert_eq!(std::fs::metadata(&path).expect("written").permissions().mode() & 0o777, 0o750);
        assert_eq!(session.download(&path, 1 << 20).await.expect("download"), data);
        assert!(matches!(session.download(&path, 1000).await, Err(RemoteError::TooLarge(1000))));
        assert!(matches!(session.download("/nonexistent/file", 10).await, Err(RemoteError::Other(_))));
        let leftovers = std::fs::read_dir(dir.path().join("sub dir")).expect("dir").count();
        assert_eq!(leftovers, 1, "no temporary file is left behind");
    }

    #[tokio::test]
    async fn directories_are_made_and_removed_as_mkdir_and_rm_would() {
        let session = LocalSession::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let private = dir.path().join("private").display().to_string();
        session.make_dir(&private, 0o700, false).await.expect("a new directory");
        assert_eq!(std::fs::metadata(&private).expect("made").permissions().mode() & 0o7777, 0o700);
        // Without `parents` it must be new, and its parent must exist.
        assert!(
            matches!(session.make_dir(&private, 0o700, false).await, Err(RemoteError::Other(m)) if m.contains("private"))
        );
        let deep = dir.path().join("a/b/c").display().to_string();
        assert!(session.make_dir(&deep, 0o755, false).await.is_err());
        // With `parents`: made with the mode asked, kept as it is when it exists.
        session.make_dir(&deep, 0o2751, true).await.expect("mkdir -p");
        assert_eq!(std::fs::metadata(&deep).expect("made").permissions().mode() & 0o7777, 0o2751);
        session.make_dir(&private, 0o755, true).await.expect("exists: no error");
        assert_eq!(std::fs::metadata(&private).expect("kept").permissions().mode() & 0o7777, 0o700);

        // remove_all: a tree, a file, a missing path; a symbolic link is removed, not followed.
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("kept"), "x").expect("kept");
        std::fs::write(dir.path().join("a/b/file"), "x").expect("file");
        std::os::unix::fs::symlink(&outside, dir.path().join("a/b/c/link")).expect("symlink");
        session.remove_all(&dir.path().join("a").display().to_string()).await.expect("rm -rf");
        assert!(!dir.path().join("a").exists());
        assert!(outside.join("kept").exists(), "the link's target is untouched");
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").expect("plain");
        session.remove_all(&file.display().to_string()).await.expect("a file");
        assert!(!file.exists());
        session.remove_all(&file.display().to_string()).await.expect("missing: no error");
    }

    /// A sink that releases what it was given, as `runway exec`'s terminal does.
    #[derive(Default)]
    struct Releasing(Mutex<u64>);

    impl TraceSink for Releasing {
        fn write(&self, _data: &[u8]) {}
        fn write_followed(&self, _source: &str, end: u64, _data: &[u8]) {
            *self.0.lock().expect("lock") = end;
        }
        fn released(&self, _source: &str) -> u64 {
            *self.0.lock().expect("lock")
        }
    }

    #[test]
    fn what_the_sink_released_of_a_followed_log_is_freed_on_disk() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("00.log");
        let chunk = vec![b'x'; 1 << 20];
        let mut file = std::fs::File::create(&log).expect("log");
        for _ in 0..24 {
            file.write_all(&chunk).expect("write");
        }
        file.sync_all().expect("sync");
        let source = log.display().to_string();
        let allocated = || std::fs::metadata(&log).expect("meta").blocks() * 512;
        let before = allocated();
        // A sink that keeps everything (a trace that can resume) frees nothing.
        let keeping = MemorySink::default();
        FreeingSink::new(&keeping, &source).write_followed(&source, 24 << 20, &chunk);
        assert_eq!(allocated(), before);
        let releasing = Releasing::default();
        let freeing = FreeingSink::new(&releasing, &source);
        freeing.write_followed(&source, 4 << 20, &chunk);
        assert_eq!(allocated(), before, "less than a step released: nothing freed yet");
        freeing.write_followed(&source, 20 << 20, &chunk);
        if allocated() == before {
            eprintln!("this file system cannot punch holes: nothing to check");
            return;
        }
        assert!(allocated() <= before - (20 << 20), "{} of {before} bytes still allocated", allocated());
        assert_eq!(std::fs::metadata(&log).expect("meta").len(), 24 << 20, "the size is kept");
        let mut tail = Vec::new();
        let mut reader = std::fs::File::open(&log).expect("open");
        reader.seek(SeekFrom::Start(20 << 20)).expect("seek");
        reader.read_to_end(&mut tail).expect("read");
        assert!(tail.len() == 4 << 20 && tail.iter().all(|&b| b == b'x'), "what is not released is intact");
    }

    #[tokio::test]
    async fn only_the_passthrough_environment_reaches_commands() {
        std::env::set_var("RUNWAY_LOCAL_SESSION_SECRET", "leak");
        let trace = MemorySink::default();
        LocalSession::new().run("env", None, &trace, &StopSignal::new()).await.expect("run");
        let names: Vec<String> =
            trace.text().lines().filter_map(|l| l.split_once('=')).map(|(k, _)| k.to_string()).collect();
        assert!(!names.iter().any(|k| k == "RUNWAY_LOCAL_SESSION_SECRET"), "{names:?}");
        for name in &names {
            // `sh` itself sets PWD (and some shells OLDPWD, SHLVL, `_`).
            assert!(
                crate::connector::process::PASSTHROUGH.contains(&name.as_str())
                    || ["PWD", "OLDPWD", "SHLVL", "_"].contains(&name.as_str()),
                "{name} leaked into a local command"
            );
        }
    }
}
