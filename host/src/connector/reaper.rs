//! The stage reaper: one small helper process per runner process that starts the detached
//! commands of the runner's own machine ([`super::LocalSession`]) and writes their exit codes,
//! so that a stage needs no `sh` of its own to outlive the runner and still leave its exit
//! code behind.
//!
//! Without it, every detached command on the runner's machine is led by an `sh` that runs the
//! command in a subshell, writes `$?` into the exit file and kills what the command left in its
//! process group ([`super::detached::DIRECT_EXIT_WRAPPER`]): two processes per stage besides
//! the command. With it, the command itself leads its session (started by `posix_spawn` with
//! `POSIX_SPAWN_SETSID`, as [`super::spawn`] starts every leader) and the reaper, whose child
//! it is, does what the `sh` did when it ends: the exit code (`128 + n` for signal `n`) into
//! the exit mark ([`super::marks`]: an attribute of the command's log, else the exit file),
//! then SIGKILL to the command's process group, then the reaping. The exit code is written while the leader is still a zombie (`waitid` with `WNOWAIT`), so a follower that
//! sees the leader gone finds the code at once or within [`super::local`]'s grace.
//!
//! The reaper is the runner's own executable (`/proc/self/exe`) started with [`ARG`], in a
//! session of its own, its standard input one end of a socket pair whose other end only the
//! runner holds: nobody else can ask it to start anything. It survives the runner (it ignores
//! SIGHUP, SIGINT, SIGQUIT and SIGTERM; SIGKILL stops it, and its commands then lose their
//! exit codes, as under a killed `sh`): when the runner is gone (end of file on the socket)
//! it goes on until its last command has ended and its exit code is written, then exits. A
//! runner started again starts a reaper of its own; the old one's commands are followed
//! through their logs and marks as before.
//!
//! Protocol (both ways, in order): frames of a little-endian `u32` length and a JSON
//! `Message`, a request followed by a second length-prefixed frame with the command's
//! standard input (the reaper puts it in a memory file: the stage script never touches the
//! disk). The reaper answers `Message::Ready` once, then `Message::Started` or
//! `Message::Failed` per request in order, and `Message::Ended` when a command ended and
//! its exit code is written (`Message::Started` is always sent before its `Message::Ended`).
//! The reaper queues what it sends and writes it from a thread of its own: a runner that
//! stops reading (stopped with SIGSTOP, its socket buffer full) holds up neither a start nor
//! an exit code.
//!
//! Where the reaper cannot run (the executable is not `runway`, as in the library's unit
//! tests, or it did not answer), [`shared`] says so once and the local session uses its `sh`
//! leaders.
//!
//! Owns: [`serve`] (the reaper process) and [`Reaper`] (the runner's end). Must not touch:
//! what the commands are or where their logs go (the caller decides; the reaper only writes
//! the exit mark of the log and exit file it is given), WIT types.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

use crate::connector::detached;
use crate::connector::marks;
use crate::connector::process::{LocalCommand, ProcessFailure};
use crate::connector::spawn::{
    spawn_session_leader, spawn_session_leader_with_input, wait_exit, LeaderInput, LeaderStreams,
};

/// The argument that makes the runner's executable a reaper ([`serve`]).
pub const ARG: &str = "__stage-reaper";

/// Largest frame either side accepts (a stage script with its variables is far smaller; a
/// larger standard input is not sent: [`Reaper::takes`]).
const MAX_FRAME: usize = 64 << 20;

/// How long a new reaper may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// One frame of the protocol.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    /// Reaper → runner, once: it serves requests.
    Ready,
    /// Runner → reaper: start `program` (an absolute path or a name looked up in `PATH`)
    /// with `args`, `env` on top of the pass-through environment, in `cwd`, in a session of
    /// its own, standard output and error appended to `log` (which exists), standard input
    /// the frame that follows; write its exit code to `exit` when it ends.
    Start {
        id: u64,
        program: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        log: String,
        exit: String,
    },
    /// Reaper → runner: request `id` runs as process (and process group) `pid`.
    Started { id: u64, pid: i32 },
    /// Reaper → runner: request `id` could not be started.
    Failed { id: u64, message: String },
    /// Reaper → runner: the command led by `pid` ended, its exit code is written and its
    /// process group killed.
    Ended { pid: i32 },
}

fn encode(message: &Message, payload: Option<&[u8]>) -> Vec<u8> {
    let json = serde_json::to_vec(message).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + json.len() + payload.map_or(0, <[u8]>::len));
    for part in std::iter::once(json.as_slice()).chain(payload) {
        out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn frame_len(header: [u8; 4]) -> std::io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    Ok(len)
}

fn read_frame(input: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut header = [0u8; 4];
    input.read_exact(&mut header)?;
    let mut data = vec![0u8; frame_len(header)?];
    input.read_exact(&mut data)?;
    Ok(data)
}

fn parse(frame: &[u8]) -> std::io::Result<Message> {
    serde_json::from_slice(frame).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// What the reaper process keeps: the log and exit file of each command still running (by
/// leader pid), and whether the runner is gone.
#[derive(Default)]
struct Children {
    exits: HashMap<i32, (String, String)>,
    runner_gone: bool,
}

/// The reaper process ([`ARG`]): serve the runner on standard input until it is gone and
/// every command started has ended. Returns the process's exit code.
pub fn serve() -> std::process::ExitCode {
    // It ends when its work is done, not on a signal meant for the runner (a terminal's
    // Ctrl-C, a service manager stopping the runner): what it started keeps its exit code.
    // Its commands get these signals' default actions back ([`spawn_session_leader`]).
    for signal in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
        // SAFETY: setting a signal to SIG_IGN installs no handler and has no precondition.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    // Stage scripts (the job's secrets) pass through its memory: sealed as the runner is.
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes this process's dumpable flag.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0)
    };
    // SAFETY: descriptor 0 is the socket the runner passed as standard input; this process
    // owns it from here on and nothing else uses descriptor 0.
    let socket = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(0) };
    let socket = std::os::unix::net::UnixStream::from(socket);
    let Ok(mut writer) = socket.try_clone() else { return std::process::ExitCode::FAILURE };
    // Messages go out from a thread of their own, in order: a runner that does not read (one
    // stopped with SIGSTOP, its socket buffer full) never holds up starts or exit codes.
    let (outbox, queued) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        for frame in queued {
            // The runner may be gone: its commands still get their exit codes.
            let _ = writer.write_all(&frame);
        }
    });
    let send = |outbox: &std::sync::mpsc::Sender<Vec<u8>>, message: &Message| {
        let _ = outbox.send(encode(message, None));
    };
    let children = Arc::new((Mutex::new(Children::default()), Condvar::new()));
    send(&outbox, &Message::Ready);
    let waiter = {
        let (children, outbox) = (Arc::clone(&children), outbox.clone());
        std::thread::spawn(move || reap_children(&children, &|m| send(&outbox, m)))
    };
    let mut reader = std::io::BufReader::new(socket);
    loop {
        let request = read_frame(&mut reader).and_then(|f| parse(&f));
        let Ok(Message::Start { id, program, args, env, cwd, log, exit }) = request else { break };
        let Ok(stdin) = read_frame(&mut reader) else { break };
        let cmd = LocalCommand { program, args, env, cwd, stdin: None };
        let (lock, wake) = &*children;
        let Ok(mut state) = lock.lock() else { break };
        // Started under the lock: the waiter cannot see the leader end before its exit file
        // is known, and `Started` goes out before its `Ended`.
        match start(&cmd, &stdin, &log) {
            Ok(pid) => {
                state.exits.insert(pid, (log, exit));
                send(&outbox, &Message::Started { id, pid });
            }
            Err(e) => send(&outbox, &Message::Failed { id, message: e.to_string() }),
        }
        drop(state);
        wake.notify_all();
    }
    let (lock, wake) = &*children;
    if let Ok(mut state) = lock.lock() {
        state.runner_gone = true;
    }
    wake.notify_all();
    let _ = waiter.join();
    std::process::ExitCode::SUCCESS
}

/// Start `cmd` in a session of its own: `stdin` in a memory file (a 0600 file beside the log,
/// removed at once, where there is none), standard output and error appended to `log`.
fn start(cmd: &LocalCommand, stdin: &[u8], log: &str) -> Result<i32, ProcessFailure> {
    spawn_session_leader_with_input(cmd, stdin, &detached::stdin_path(log), log, log)
}

/// The exit code `sh` would report for a child that ended as `info` says.
fn exit_code(info: &libc::siginfo_t) -> i32 {
    // SAFETY: waitid filled `info` for an exited child, so the SIGCHLD fields are set.
    let status = unsafe { info.si_status() };
    match info.si_code {
        libc::CLD_EXITED => status,
        _ => 128 + status,
    }
}

/// The reaper's second thread: wait for any child to end, write its exit code while it is
/// still a zombie, kill what it left in its process group, reap it, tell the runner. Returns
/// when the runner is gone and no child is left.
fn reap_children(children: &(Mutex<Children>, Condvar), send: &dyn Fn(&Message)) {
    let (lock, wake) = children;
    loop {
        // SAFETY: a zeroed siginfo_t is a valid value for waitid to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid writes only into `info`.
        let got = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if got != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => {
                    // No child: done once the runner is gone, else wait for the next start
                    // (unless one was started since `waitid` looked: starts hold the lock).
                    let Ok(state) = lock.lock() else { return };
                    if !state.exits.is_empty() {
                        continue;
                    }
                    if state.runner_gone {
                        return;
                    }
                    let _ = wake.wait_timeout(state, Duration::from_secs(1));
                    continue;
                }
            }
        }
        // SAFETY: waitid succeeded, so `info` describes a child.
        let pid = unsafe { info.si_pid() };
        let Ok(mut state) = lock.lock() else { return };
        if let Some((log, exit)) = state.exits.remove(&pid) {
            // Nobody to tell when it cannot be written: the follower reports the code missing.
            let _ = marks::write_exit(&log, &exit, exit_code(&info));
            // What the command left running in its group goes with it, as under `sh`.
            // SAFETY: `pid` is our unreaped child, so its process group cannot be reused.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let done = state.runner_gone && state.exits.is_empty();
        drop(state);
        let mut status = 0;
        // SAFETY: `pid` is our child and has ended; waitpid writes only into `status`.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        send(&Message::Ended { pid });
        if done {
            return;
        }
    }
}

/// A command the reaper started: its leader's pid, and a receiver set to true once its exit
/// code is written (closed, never set, when the reaper went away first).
pub type Started = (i32, watch::Receiver<bool>);

/// Why the reaper started no command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReaperError {
    /// The reaper could not start it (its spawn error, as the reaper said it).
    #[error("{0}")]
    Refused(String),
    /// The request could not be sent: the reaper is gone.
    #[error("the stage reaper is gone: {0}")]
    Gone(String),
    /// The reaper ended before it answered the request.
    #[error("the stage reaper ended before it answered")]
    NoAnswer,
}

/// The runner's end of a reaper process.
pub struct Reaper {
    writer: tokio::sync::Mutex<tokio::net::unix::OwnedWriteHalf>,
    /// Requests sent, waiting for `Started`/`Failed`.
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Started, ReaperError>>>>,
    /// Leaders started, by pid: set when `Ended` arrives.
    ended: Mutex<HashMap<i32, watch::Sender<bool>>>,
    next_id: AtomicU64,
    alive: AtomicBool,
}

/// Marks the reaper dead and fails what waits on it when its reading task ends (end of file,
/// a broken frame, or the runtime shutting down).
struct Hangup(Arc<Reaper>);

impl Drop for Hangup {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
        if let Ok(mut pending) = self.0.pending.lock() {
            pending.clear();
        }
        if let Ok(mut ended) = self.0.ended.lock() {
            ended.clear();
        }
    }
}

impl Reaper {
    /// Start a reaper (`executable` with [`ARG`]) and wait until it is ready.
    async fn launch(executable: &str) -> std::io::Result<Arc<Reaper>> {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let cmd = LocalCommand { program: launch_path(executable), args: vec![ARG.into()], ..LocalCommand::default() };
        let streams =
            LeaderStreams { stdin: LeaderInput::Fd(theirs.as_fd()), stdout: "/dev/null", stderr: "/dev/null" };
        let pid = spawn_session_leader(&cmd, streams).map_err(|e| std::io::Error::other(e.to_string()))?;
        drop(theirs);
        tokio::spawn(async move {
            wait_exit(pid).await;
        });
        ours.set_nonblocking(true)?;
        let stream = tokio::net::UnixStream::from_std(ours)?;
        let (mut read, write) = stream.into_split();
        let ready = tokio::time::timeout(READY_TIMEOUT, read_async_frame(&mut read)).await;
        match ready {
            Ok(Ok(frame)) if matches!(parse(&frame), Ok(Message::Ready)) => {}
            _ => return Err(std::io::Error::other("the stage reaper did not start")),
        }
        let reaper = Arc::new(Reaper {
            writer: tokio::sync::Mutex::new(write),
            pending: Mutex::new(HashMap::new()),
            ended: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            alive: AtomicBool::new(true),
        });
        let hangup = Hangup(Arc::clone(&reaper));
        tokio::spawn(async move {
            let hangup = hangup;
            while let Ok(frame) = read_async_frame(&mut read).await {
                match parse(&frame) {
                    Ok(message) => hangup.0.dispatch(message),
                    Err(_) => break,
                }
            }
        });
        Ok(reaper)
    }

    fn dispatch(&self, message: Message) {
        match message {
            Message::Started { id, pid } => {
                let (ended, receiver) = watch::channel(false);
                if let Ok(mut map) = self.ended.lock() {
                    map.insert(pid, ended);
                }
                if let Some(waiter) = self.pending.lock().ok().and_then(|mut p| p.remove(&id)) {
                    let _ = waiter.send(Ok((pid, receiver)));
                }
            }
            Message::Failed { id, message } => {
                if let Some(waiter) = self.pending.lock().ok().and_then(|mut p| p.remove(&id)) {
                    let _ = waiter.send(Err(ReaperError::Refused(message)));
                }
            }
            Message::Ended { pid } => {
                if let Some(ended) = self.ended.lock().ok().and_then(|mut m| m.remove(&pid)) {
                    let _ = ended.send(true);
                }
            }
            Message::Ready | Message::Start { .. } => {}
        }
    }

    /// Whether a command with `stdin` as its standard input fits in one request.
    pub fn takes(stdin: &[u8]) -> bool {
        stdin.len() <= MAX_FRAME
    }

    /// Start `cmd` through the reaper (see `Message::Start`; `cmd.stdin` is not used, `stdin`
    /// is).
    pub async fn start(&self, cmd: &LocalCommand, stdin: &[u8], log: &str, exit: &str) -> Result<Started, ReaperError> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (answer, answered) = oneshot::channel();
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(id, answer);
        }
        let request = Message::Start {
            id,
            program: cmd.program.clone(),
            args: cmd.args.clone(),
            env: cmd.env.clone(),
            cwd: cmd.cwd.clone(),
            log: log.to_string(),
            exit: exit.to_string(),
        };
        let sent = self.writer.lock().await.write_all(&encode(&request, Some(stdin))).await;
        if let Err(e) = sent {
            self.pending.lock().ok().map(|mut p| p.remove(&id));
            return Err(ReaperError::Gone(e.to_string()));
        }
        answered.await.map_err(|_| ReaperError::NoAnswer)?
    }
}

async fn read_async_frame(input: &mut tokio::net::unix::OwnedReadHalf) -> std::io::Result<Vec<u8>> {
    let mut header = [0u8; 4];
    input.read_exact(&mut header).await?;
    let mut data = vec![0u8; frame_len(header)?];
    input.read_exact(&mut data).await?;
    Ok(data)
}

/// This process's own executable: the reaper of a runner ([`super::LocalSession::new`]),
/// started by its path so that `ps` names it `runway` (through `/proc/self/exe` when the
/// file was replaced since the runner started).
pub const OWN_EXECUTABLE: &str = "/proc/self/exe";

/// The reaper [`super::LocalSession::new`] uses: [`OWN_EXECUTABLE`] unless a program that
/// embeds the library named a `runway` binary ([`use_executable`]).
pub fn default_executable() -> &'static str {
    DEFAULT.get().map_or(OWN_EXECUTABLE, String::as_str)
}

/// Make the `runway` binary `executable` the reaper of every local session made from now on
/// with [`super::LocalSession::new`] (for a program that embeds the library, such as a
/// benchmark; a runner needs no call). Only the first call counts.
pub fn use_executable(executable: &str) {
    let _ = DEFAULT.set(executable.to_string());
}

static DEFAULT: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The path to start `executable` by.
fn launch_path(executable: &str) -> String {
    let own = (executable == OWN_EXECUTABLE).then(std::env::current_exe).and_then(Result::ok);
    match own.filter(|path| path.is_file()).and_then(|path| path.to_str().map(str::to_string)) {
        Some(path) => path,
        None => executable.to_string(),
    }
}

/// The reaper of `executable` (a `runway` binary; [`OWN_EXECUTABLE`] for a runner) that this
/// process shares among its local sessions: started at the first call, again after it went
/// away; `None` for good once one could not be started (the sessions then use `sh` leaders).
pub async fn shared(executable: &str) -> Option<Arc<Reaper>> {
    /// By executable: the reaper started last, or `None` when none could be.
    static KNOWN: tokio::sync::Mutex<Vec<(String, Option<Arc<Reaper>>)>> = tokio::sync::Mutex::const_new(Vec::new());
    let mut known = KNOWN.lock().await;
    let entry = known.iter().position(|(exe, _)| exe == executable);
    match entry.map(|i| &known[i].1) {
        Some(None) => return None,
        Some(Some(reaper)) if reaper.alive.load(Ordering::SeqCst) => return Some(Arc::clone(reaper)),
        // Never started, or gone: start one.
        _ => {}
    }
    let launched = Reaper::launch(executable).await;
    if let Err(e) = &launched {
        tracing::debug!("stage reaper {executable} unavailable, stages get an sh leader each: {e}");
    }
    let reaper = launched.ok();
    match entry {
        Some(i) => known[i].1 = reaper.clone(),
        None => known.push((executable.to_string(), reaper.clone())),
    }
    reaper
}
