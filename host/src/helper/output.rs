//! Log lines of the helper commands, in gitlab-runner's helper format: plain information,
//! `WARNING:` in yellow, `ERROR:` in red. They go to standard output, which the stage's
//! output carries into the job log.

use std::io::Write;

fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (the job's log is gone) is no reason to fail the transfer.
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// An information line.
pub fn info(text: &str) {
    line(text);
}

/// A yellow `WARNING:` line.
pub fn warning(text: &str) {
    line(&format!("\x1b[0;33mWARNING: {text}\x1b[0;m"));
}

/// A red `ERROR:` line.
pub fn error(text: &str) {
    line(&format!("\x1b[31;1mERROR: {text}\x1b[0;m"));
}
