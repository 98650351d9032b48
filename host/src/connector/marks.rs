//! The two marks of a detached command on the runner's own machine, its leader's pid and its
//! exit code, kept as extended attributes of its log file (`user.runway.pid`,
//! `user.runway.exit`) instead of in files of their own ([`super::detached::pid_path`] and the
//! exit file), which is where they go when the log's file system takes no user attributes (a
//! `runway exec` pipe, some network file systems).
//!
//! Why: a stage's log exists anyway, and an attribute is written into its inode. Two more
//! files per stage were two inode allocations and two unlinks per stage, which is most of a
//! trivial job's cost in the runner on a file system where creating a file is slow (ext4
//! without a journal skips every inode freed in the last seconds: docs/benchmarks.md, "Runner
//! cost per job"). The marks live and die with the log: a resumed runner finds them where the
//! stage left them, and the plugin's removal of its stage directory takes them along.
//!
//! Readers look at the attribute first and then at the file, so marks written the other way
//! (an `sh` leader writes the exit file itself: [`super::detached::DIRECT_EXIT_WRAPPER`];
//! an older reaper) are read the same. Each mark is one `setxattr`, which a reader sees whole
//! or not at all, as the single write of an exit file.
//!
//! Owns: reading, writing and clearing the marks. Must not touch: processes, the log's
//! content, following.

use std::ffi::{CStr, CString};
use std::io::{Error, ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use crate::connector::detached;

/// The leader's pid, as `<pid>\n`.
const PID: &CStr = c"user.runway.pid";
/// The exit code, as `<code>\n` (what an exit file holds).
const EXIT: &CStr = c"user.runway.exit";
/// The longest mark: a decimal `i32` and a newline.
const MARK_LEN: usize = 16;

/// Whether `error` says the file takes no user attributes, so the mark goes into its file.
fn unsupported(error: &Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM | libc::EACCES))
}

fn c_path(path: &str) -> std::io::Result<CString> {
    CString::new(path).map_err(|_| Error::new(ErrorKind::InvalidInput, format!("{path:?}: a NUL in the path")))
}

fn set(path: &str, name: &CStr, value: &[u8]) -> std::io::Result<()> {
    let path = c_path(path)?;
    // SAFETY: both strings are NUL-terminated and `value` is valid for its length.
    let got = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if got == 0 {
        Ok(())
    } else {
        Err(Error::last_os_error())
    }
}

/// The attribute `name` of `path`: `None` when it has none (or takes none).
fn get(path: &str, name: &CStr) -> Option<Vec<u8>> {
    let path = c_path(path).ok()?;
    let mut value = [0u8; MARK_LEN];
    // SAFETY: both strings are NUL-terminated and `value` is writable for its length.
    let got = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    usize::try_from(got).ok().map(|n| value[..n].to_vec())
}

/// Write a mark: into the attribute `name` of `log`, or into `file` where `log` takes none.
fn write(log: &str, name: &CStr, file: &str, value: &[u8]) -> std::io::Result<()> {
    match set(log, name, value) {
        Err(e) if unsupported(&e) => std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(file)
            // One write: a reader never takes a partial code for a whole one.
            .and_then(|mut f| f.write_all(value)),
        other => other,
    }
}

/// Note `pid` as the leader of the detached command of `log`/`exit`.
pub fn write_pid(log: &str, exit: &str, pid: i32) -> std::io::Result<()> {
    write(log, PID, &detached::pid_path(exit), format!("{pid}\n").as_bytes())
}

/// Note `code` as the exit code of the detached command of `log`/`exit`.
pub fn write_exit(log: &str, exit: &str, code: i32) -> std::io::Result<()> {
    write(log, EXIT, exit, format!("{code}\n").as_bytes())
}

/// The leader of the detached command of `log`/`exit`, where it was noted.
pub fn read_pid(log: &str, exit: &str) -> Option<i32> {
    let text = get(log, PID).or_else(|| std::fs::read(detached::pid_path(exit)).ok())?;
    String::from_utf8_lossy(&text).trim().parse().ok()
}

/// What the detached command of `log`/`exit` noted as its exit code: the text of the mark
/// (see [`detached::exit_code_written`] for whether it is whole), `None` before it ended.
pub fn read_exit(log: &str, exit: &str) -> Option<Vec<u8>> {
    get(log, EXIT).or_else(|| std::fs::read(exit).ok())
}

/// Clear the marks of an earlier command from a log about to be reused (`file`, open on it).
pub fn clear(file: &std::fs::File) {
    for name in [PID, EXIT] {
        // SAFETY: the descriptor is open and the name NUL-terminated; a missing attribute or
        // a file system without them is the state wanted.
        unsafe { libc::fremovexattr(file.as_raw_fd(), name.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_ride_on_the_log_and_leave_no_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("1-step.log").display().to_string();
        let exit = dir.path().join("1-step.exit").display().to_string();
        let file = std::fs::File::create(&log).unwrap();
        assert_eq!(read_pid(&log, &exit), None);
        assert_eq!(read_exit(&log, &exit), None);
        write_pid(&log, &exit, 4242).unwrap();
        write_exit(&log, &exit, 3).unwrap();
        assert_eq!(read_pid(&log, &exit), Some(4242));
        assert_eq!(read_exit(&log, &exit).as_deref(), Some(&b"3\n"[..]));
        // This machine's temporary directory takes user attributes: no file beside the log.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("1-step.log")]);
        clear(&file);
        assert_eq!(read_pid(&log, &exit), None);
        assert_eq!(read_exit(&log, &exit), None);
    }

    #[test]
    fn a_log_that_takes_no_attributes_gets_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("1-step.log");
        // A FIFO (a `runway exec` stage's log) takes no user attributes.
        let c = CString::new(log.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (log, exit) = (log.display().to_string(), dir.path().join("1-step.exit").display().to_string());
        write_pid(&log, &exit, 7).unwrap();
        write_exit(&log, &exit, 0).unwrap();
        assert_eq!(std::fs::read_to_string(detached::pid_path(&exit)).unwrap(), "7\n");
        assert_eq!(std::fs::read_to_string(&exit).unwrap(), "0\n");
        assert_eq!(read_pid(&log, &exit), Some(7));
        assert_eq!(read_exit(&log, &exit).as_deref(), Some(&b"0\n"[..]));
    }

    #[test]
    fn an_exit_file_written_by_a_shell_leader_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("1-step.log").display().to_string();
        let exit = dir.path().join("1-step.exit").display().to_string();
        std::fs::write(&log, "").unwrap();
        std::fs::write(&exit, "130\n").unwrap();
        std::fs::write(detached::pid_path(&exit), "99\n").unwrap();
        assert_eq!(read_exit(&log, &exit).as_deref(), Some(&b"130\n"[..]));
        assert_eq!(read_pid(&log, &exit), Some(99));
    }
}
