//! A shell on this machine in a pseudo-terminal: the shell executor's terminal. It starts in
//! the job's directory with the job's variables, as the job's `user` when one is set (through
//! `su`, as gitlab-runner runs shell jobs), in its own session with the pty as its controlling
//! terminal; dropping the [`Attached`] ends its process group.
//!
//! Owns the pty and the process. Must not touch: the WebSocket, sessions.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use async_trait::async_trait;

use super::{Attached, Resize, TerminalError, TerminalTarget};

/// A login-less interactive shell for one job.
#[derive(Debug, Clone)]
pub struct LocalShell {
    /// The shell (`bash`).
    pub shell: String,
    /// The job's project directory.
    pub dir: PathBuf,
    /// The job's variables.
    pub env: Vec<(String, String)>,
    /// The job's `user`, when set.
    pub user: Option<String>,
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> TerminalError {
    move |source| TerminalError::Io { what, source }
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

fn set_size(fd: &OwnedFd, cols: u16, rows: u16) -> Result<(), TerminalError> {
    let size = winsize(cols, rows);
    // SAFETY: `fd` is an open pty master for the call's duration; TIOCSWINSZ reads one winsize.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &size) };
    if rc != 0 {
        return Err(TerminalError::Io { what: "resizing the terminal", source: std::io::Error::last_os_error() });
    }
    Ok(())
}

fn open_pty(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd), TerminalError> {
    let (mut master, mut slave) = (-1, -1);
    let size = winsize(cols, rows);
    // SAFETY: openpty writes two new descriptors into the locals; name and termios may be null.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    if rc != 0 {
        return Err(TerminalError::Io { what: "opening a pseudo-terminal", source: std::io::Error::last_os_error() });
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) })
}

impl LocalShell {
    /// The shell's command (through `su` for a `user`), in the job's directory (or, before
    /// it exists, its nearest existing parent) with its variables; standard input, output
    /// and error are the caller's to set.
    pub fn command(&self) -> Command {
        let mut cmd = match &self.user {
            Some(user) => {
                let mut c = Command::new("su");
                // -m keeps the variables set below; the shell runs in the job's directory.
                c.args(["-m", "-s", &self.shell, user]);
                c
            }
            None => Command::new(&self.shell),
        };
        // A terminal opened before the sources are fetched starts where the project will be,
        // in its nearest directory that exists already.
        let dir = self.dir.ancestors().find(|d| d.is_dir()).unwrap_or(&self.dir);
        cmd.current_dir(dir).envs(self.env.iter().map(|(k, v)| (k, v)));
        if std::env::var_os("TERM").is_none() && !self.env.iter().any(|(k, _)| k == "TERM") {
            cmd.env("TERM", "xterm");
        }
        cmd
    }
}

struct Shell {
    child: Child,
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: signals the shell's own process group (it leads a new session).
            unsafe { libc::kill(-pid, libc::SIGHUP) };
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

struct PtyResize {
    master: OwnedFd,
    _shell: Shell,
}

#[async_trait]
impl Resize for PtyResize {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), TerminalError> {
        set_size(&self.master, cols, rows)
    }
}

#[async_trait]
impl TerminalTarget for LocalShell {
    async fn open(&self, cols: u16, rows: u16) -> Result<Attached, TerminalError> {
        let (master, slave) = open_pty(cols, rows)?;
        let mut cmd = self.command();
        let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from).map_err(io("duplicating the terminal"));
        cmd.stdin(stdio(&slave)?).stdout(stdio(&slave)?).stderr(stdio(&slave)?);
        // SAFETY: only async-signal-safe calls between fork and exec: a new session whose
        // controlling terminal is the pty on standard input.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io("starting the terminal's shell"))?;
        drop(slave);
        let reader = master.try_clone().map_err(io("duplicating the terminal"))?;
        let writer = master.try_clone().map_err(io("duplicating the terminal"))?;
        Ok(Attached {
            output: Box::new(tokio::fs::File::from_std(std::fs::File::from(reader))),
            input: Box::new(tokio::fs::File::from_std(std::fs::File::from(writer))),
            resize: Box::new(PtyResize { master, _shell: Shell { child } }),
        })
    }
}
