//! `runway run --syslog`: the log to the system logger (`syslog(3)`, facility daemon, the
//! service name as ident), as gitlab-runner's `--syslog` — for init systems that do not keep a
//! service's standard error (on systemd, journald keeps it, and gitlab-runner's unit leaves
//! the flag out). Each tracing event becomes one message at its level's priority.
//!
//! Owns the writer; must not decide what is logged (the subscriber in `cli` does).

use std::ffi::CString;
use std::io::Write;

use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;

/// Makes a [`Line`] per event, at the event's priority.
pub(crate) struct Syslog;

impl Syslog {
    /// Open the system log as `ident` (gitlab-runner's `--service` name).
    pub(crate) fn open(ident: &str) -> Syslog {
        let ident = CString::new(ident.replace('\0', "")).unwrap_or_default();
        // openlog keeps the pointer: the ident lives as long as the process.
        let ident: &'static CString = Box::leak(Box::new(ident));
        // SAFETY: `ident` is a valid C string that is never freed.
        unsafe { libc::openlog(ident.as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
        Syslog
    }
}

/// One event's text, sent when it is dropped (tracing writes an event, then drops the writer).
pub(crate) struct Line {
    priority: libc::c_int,
    text: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.text);
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        if let Ok(message) = CString::new(text.replace('\0', "")) {
            // SAFETY: a constant format string with one C string argument.
            unsafe { libc::syslog(self.priority, c"%s".as_ptr(), message.as_ptr()) };
        }
    }
}

impl<'a> MakeWriter<'a> for Syslog {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { priority: libc::LOG_INFO, text: Vec::new() }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        let priority = match *meta.level() {
            Level::ERROR => libc::LOG_ERR,
            Level::WARN => libc::LOG_WARNING,
            Level::INFO => libc::LOG_INFO,
            Level::DEBUG | Level::TRACE => libc::LOG_DEBUG,
        };
        Line { priority, text: Vec::new() }
    }
}
