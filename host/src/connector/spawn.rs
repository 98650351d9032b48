//! Session leaders on the runner's own machine: a process started with `posix_spawn` and
//! `POSIX_SPAWN_SETSID` (its own session and process group, no controlling terminal, no
//! parent-death signal), its standard streams set up by the spawn itself (the standard input
//! from a memory file: [`memory_file`]), and its end awaited (and the process reaped) through a
//! pidfd.
//!
//! Why not the standard library: `std::process::Command` can give a child its own process
//! group (`process_group`, which `posix_spawn` supports) but a session only through a
//! `pre_exec` hook, which makes it `fork` the runner's whole address space (the wasm runtime's
//! mappings included: milliseconds of page-table copying per process); the alternative,
//! `setsid(1)` in front of the command, is one more `exec` per detached command. A process
//! group alone is not enough for a detached stage: it would stay in the runner's session, so a
//! hangup of the runner's terminal and job control reach it, and a program of the stage that
//! opens `/dev/tty` gets the runner's terminal.
//!
//! Owns: [`spawn_session_leader`], [`spawn_session_leader_with_input`], [`memory_file`],
//! [`wait_exit`]. Must not touch: what the leader runs (the detached protocol is
//! [`super::detached`]'s), WIT types.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use crate::connector::process::{environment, resolve_program, LocalCommand, ProcessFailure};

/// A session leader's standard input.
#[derive(Debug, Clone, Copy)]
pub enum LeaderInput<'a> {
    /// A path, opened read-only by the spawn.
    Path(&'a str),
    /// An open descriptor of this process (e.g. [`memory_file`]), duplicated onto the child's
    /// standard input; it shares the descriptor's offset.
    Fd(BorrowedFd<'a>),
}

/// Where a session leader's standard streams come from, set up by the spawn in the child
/// before its program runs.
#[derive(Debug, Clone, Copy)]
pub struct LeaderStreams<'a> {
    /// Standard input.
    pub stdin: LeaderInput<'a>,
    /// Opened write-only (not truncated, not created) as standard output.
    pub stdout: &'a str,
    /// Opened write-only as standard error; the same path as `stdout` makes it a copy of
    /// standard output instead (`2>&1`: one file offset, the two streams never overwrite
    /// each other).
    pub stderr: &'a str,
}

/// `data` in an anonymous memory file (`memfd_create`), its offset at the start: a standard
/// input for a detached command that outlives the runner (the command holds it open) and is
/// never on disk (a stage script holds the job's secrets). An error where the kernel has no
/// memfd; callers fall back to a 0600 file.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn memory_file(data: &[u8]) -> std::io::Result<OwnedFd> {
    use std::io::{Seek, Write};
    // SAFETY: the name is a NUL-terminated literal; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"runway-stdin".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(data)?;
    file.rewind()?;
    Ok(file.into())
}

/// [`memory_file`] where there is no `memfd_create`: always an error (callers use a file).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn memory_file(_data: &[u8]) -> std::io::Result<OwnedFd> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// [`spawn_session_leader`] with `stdin` as the leader's standard input: in a [`memory_file`],
/// or where the kernel has none in a new 0600 file at `stdin_file` (it must not exist), removed
/// again once the leader has it open (the spawn opens it before the program runs), so a stage
/// script with its secrets stays on disk only for the moment of the spawn.
pub fn spawn_session_leader_with_input(
    cmd: &LocalCommand,
    stdin: &[u8],
    stdin_file: &str,
    stdout: &str,
    stderr: &str,
) -> Result<i32, ProcessFailure> {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(memory) = memory_file(stdin) {
        return spawn_session_leader(cmd, LeaderStreams { stdin: LeaderInput::Fd(memory.as_fd()), stdout, stderr });
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(stdin_file)
        .map_err(|e| io_failure(cmd, &format!("creating {stdin_file}"), e))?;
    let spawned = match file.write_all(stdin) {
        Ok(()) => spawn_session_leader(cmd, LeaderStreams { stdin: LeaderInput::Path(stdin_file), stdout, stderr }),
        Err(e) => Err(io_failure(cmd, &format!("writing {stdin_file}"), e)),
    };
    let _ = std::fs::remove_file(stdin_file);
    spawned
}

/// Frees a `posix_spawn` object when dropped.
struct Spawn {
    actions: libc::posix_spawn_file_actions_t,
    attr: libc::posix_spawnattr_t,
}

impl Drop for Spawn {
    fn drop(&mut self) {
        // SAFETY: both were initialised by `posix_spawn_*_init` in `spawn_session_leader`
        // before this value was built (neither holds a pointer to itself, so the move is
        // sound), and are destroyed only here.
        unsafe {
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
            libc::posix_spawnattr_destroy(&mut self.attr);
        }
    }
}

fn c_string(cmd: &LocalCommand, text: &[u8]) -> Result<CString, ProcessFailure> {
    CString::new(text)
        .map_err(|_| ProcessFailure::SpawnFailed(format!("cannot start {}: a NUL byte in its command", cmd.program)))
}

fn spawn_error(cmd: &LocalCommand, what: &str, code: i32) -> ProcessFailure {
    io_failure(cmd, what, std::io::Error::from_raw_os_error(code))
}

fn io_failure(cmd: &LocalCommand, what: &str, e: std::io::Error) -> ProcessFailure {
    ProcessFailure::SpawnFailed(format!("cannot start {} ({what}): {e}", cmd.program))
}

/// Start `cmd` (program looked up in its `PATH`, environment as every local command's:
/// [`super::process::PASSTHROUGH`] under its own) in a new session, with `streams` as its
/// standard input, output and error. Returns its process ID, which is also its process group
/// and session ID. The caller must reap it ([`wait_exit`]).
pub fn spawn_session_leader(cmd: &LocalCommand, streams: LeaderStreams<'_>) -> Result<i32, ProcessFailure> {
    let env = environment(cmd);
    let program = resolve_program(cmd, &env)
        .ok_or_else(|| ProcessFailure::SpawnFailed(format!("cannot start {}: not found in PATH", cmd.program)))?;
    let path = c_string(cmd, program.as_os_str().as_bytes())?;
    let argv: Vec<CString> = std::iter::once(cmd.program.as_bytes())
        .chain(cmd.args.iter().map(|a| a.as_bytes()))
        .map(|a| c_string(cmd, a))
        .collect::<Result<_, _>>()?;
    let envp: Vec<CString> =
        env.iter().map(|(k, v)| c_string(cmd, format!("{k}={v}").as_bytes())).collect::<Result<_, _>>()?;
    let mut opens = vec![(1, c_string(cmd, streams.stdout.as_bytes())?, libc::O_WRONLY)];
    let stderr_is_stdout = streams.stderr == streams.stdout;
    if !stderr_is_stdout {
        opens.push((2, c_string(cmd, streams.stderr.as_bytes())?, libc::O_WRONLY));
    }
    // A descriptor below 3 (the runner's own standard streams were closed) would be replaced
    // by the spawn's other actions: use a copy above them.
    let (input, _copy) = match streams.stdin {
        LeaderInput::Path(path) => {
            opens.insert(0, (0, c_string(cmd, path.as_bytes())?, libc::O_RDONLY));
            (None, None)
        }
        LeaderInput::Fd(fd) if fd.as_raw_fd() > 2 => (Some(fd.as_raw_fd()), None),
        LeaderInput::Fd(fd) => {
            let copy = fd.try_clone_to_owned().map_err(|e| io_failure(cmd, "standard input", e))?;
            // try_clone_to_owned takes the lowest free descriptor, which may still be below 3.
            // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (≥ 3) or -1.
            let high = unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
            if high < 0 {
                return Err(io_failure(cmd, "standard input", std::io::Error::last_os_error()));
            }
            // SAFETY: `high` was just created and is owned by nobody else.
            let high = unsafe { OwnedFd::from_raw_fd(high) };
            (Some(high.as_raw_fd()), Some(high))
        }
    };
    let cwd = cmd.cwd.as_deref().map(|d| c_string(cmd, d.as_bytes())).transpose()?;
    let mut argv_ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let mut envp_ptrs: Vec<*mut libc::c_char> = envp.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp_ptrs.push(std::ptr::null_mut());

    // SAFETY: every pointer handed to libc points into a CString or Vec above that outlives
    // the calls; the spawn objects are initialised before use and destroyed by `Spawn`'s Drop;
    // the signal sets are initialised by sigemptyset before they are read.
    unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let code = libc::posix_spawn_file_actions_init(&mut actions);
        if code != 0 {
            return Err(spawn_error(cmd, "file actions", code));
        }
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        let code = libc::posix_spawnattr_init(&mut attr);
        if code != 0 {
            libc::posix_spawn_file_actions_destroy(&mut actions);
            return Err(spawn_error(cmd, "attributes", code));
        }
        // Both initialised: destroyed once, by Drop, from here on.
        let mut spawn = Spawn { actions, attr };
        if let Some(fd) = input {
            let code = libc::posix_spawn_file_actions_adddup2(&mut spawn.actions, fd, 0);
            if code != 0 {
                return Err(spawn_error(cmd, "standard input", code));
            }
        }
        for (fd, path, flags) in &opens {
            let code = libc::posix_spawn_file_actions_addopen(&mut spawn.actions, *fd, path.as_ptr(), *flags, 0);
            if code != 0 {
                return Err(spawn_error(cmd, "standard streams", code));
            }
        }
        if stderr_is_stdout {
            let code = libc::posix_spawn_file_actions_adddup2(&mut spawn.actions, 1, 2);
            if code != 0 {
                return Err(spawn_error(cmd, "standard error", code));
            }
        }
        if let Some(dir) = &cwd {
            let code = libc::posix_spawn_file_actions_addchdir_np(&mut spawn.actions, dir.as_ptr());
            if code != 0 {
                return Err(spawn_error(cmd, "working directory", code));
            }
        }
        // As the standard library does for its children: no blocked signals, and SIGPIPE
        // (which Rust programs ignore) back to its default; so are the signals the stage
        // reaper ignores (`super::reaper`).
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        let mut defaults: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut defaults);
        for signal in [libc::SIGPIPE, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
            libc::sigaddset(&mut defaults, signal);
        }
        // The flags are small bit values; libc types the two older ones as c_int.
        let flags =
            libc::POSIX_SPAWN_SETSID | (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;
        for code in [
            libc::posix_spawnattr_setflags(&mut spawn.attr, flags),
            libc::posix_spawnattr_setsigmask(&mut spawn.attr, &empty),
            libc::posix_spawnattr_setsigdefault(&mut spawn.attr, &defaults),
        ] {
            if code != 0 {
                return Err(spawn_error(cmd, "attributes", code));
            }
        }
        let mut pid: libc::pid_t = 0;
        let code = libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            &spawn.actions,
            &spawn.attr,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        );
        if code != 0 {
            return Err(spawn_error(cmd, "posix_spawn", code));
        }
        Ok(pid)
    }
}

/// Reap child `pid`, blocking until it ended; its exit status, or `None` when it was not
/// this process's child (or was reaped already).
fn reap(pid: i32) -> Option<i32> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes only into `status`.
        let got = unsafe { libc::waitpid(pid, &mut status, 0) };
        if got == pid {
            return Some(status);
        }
        if got < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// Wait for the end of `pid`, a child [`spawn_session_leader`] started, and reap it: through a
/// pidfd (no thread held while it runs); where the kernel has none, on the blocking pool.
pub async fn wait_exit(pid: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if let Ok(fd) = i32::try_from(fd) {
            if fd >= 0 {
                // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                // SAFETY: the AsyncFd owns `owned`, which stays open and the same descriptor
                // until the AsyncFd is dropped.
                let registered =
                    unsafe { tokio::io::unix::AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) };
                if let Ok(ready) = registered {
                    // A pidfd becomes readable when its process has ended; waitpid then
                    // returns at once.
                    let _ = ready.readable().await;
                    reap(pid);
                    return;
                }
            }
        }
    }
    let _ = tokio::task::spawn_blocking(move || reap(pid)).await;
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[tokio::test]
    async fn a_leader_runs_in_its_own_session_with_the_given_streams() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("in");
        let output = dir.path().join("out");
        std::fs::write(&input, "from stdin\n").expect("write");
        std::fs::write(&output, "").expect("write");
        let script = "cat; echo \"$0\"; cut -d' ' -f5,6 /proc/$$/stat; echo gone >&2";
        let cmd = LocalCommand {
            program: "sh".into(),
            args: vec!["-c".into(), script.into(), "arg".into()],
            ..LocalCommand::default()
        };
        let streams = LeaderStreams {
            stdin: LeaderInput::Path(&input.display().to_string()),
            stdout: &output.display().to_string(),
            stderr: "/dev/null",
        };
        let pid = spawn_session_leader(&cmd, streams).expect("spawn");
        wait_exit(pid).await;
        let text = std::fs::read_to_string(&output).expect("read");
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("from stdin"));
        assert_eq!(lines.next(), Some("arg"), "`sh -c script arg`: $0 is arg");
        let ids: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
        assert_eq!(ids, [pid.to_string(), pid.to_string()], "session and group are the leader's own");
        assert_eq!(lines.next(), None, "stderr went elsewhere: {text:?}");
        // Reaped: no zombie left.
        // SAFETY: signal 0 only checks existence.
        assert_ne!(unsafe { libc::kill(pid, 0) }, 0);
    }

    #[test]
    fn a_missing_program_or_stream_is_a_spawn_failure() {
        let cmd = LocalCommand { program: "runway-no-such-program".into(), ..LocalCommand::default() };
        let streams = LeaderStreams { stdin: LeaderInput::Path("/dev/null"), stdout: "/dev/null", stderr: "/dev/null" };
        assert!(matches!(spawn_session_leader(&cmd, streams), Err(ProcessFailure::SpawnFailed(_))));
        let sh =
            LocalCommand { program: "sh".into(), args: vec!["-c".into(), "true".into()], ..LocalCommand::default() };
        let streams =
            LeaderStreams { stdin: LeaderInput::Path("/nonexistent/in"), stdout: "/dev/null", stderr: "/dev/null" };
        match spawn_session_leader(&sh, streams) {
            Err(ProcessFailure::SpawnFailed(m)) => assert!(m.contains("No such file"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_memory_file_is_the_leaders_standard_input_and_outlives_the_runners_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let output = dir.path().join("out");
        std::fs::write(&output, "").expect("write");
        let memory = memory_file(b"line one\nline two\n").expect("memfd");
        let cmd = LocalCommand {
            program: "sh".into(),
            args: vec!["-c".into(), "sleep 0.2; cat".into()],
            ..LocalCommand::default()
        };
        let out = output.display().to_string();
        let streams = LeaderStreams { stdin: LeaderInput::Fd(memory.as_fd()), stdout: &out, stderr: "/dev/null" };
        let pid = spawn_session_leader(&cmd, streams).expect("spawn");
        // The runner's descriptor goes away at once; the leader still reads everything.
        drop(memory);
        wait_exit(pid).await;
        assert_eq!(std::fs::read_to_string(&output).expect("read"), "line one\nline two\n");
    }
}
