//! Detached commands: started so that they outlive whoever started them (the SSH connection,
//! the runner process), followed again from any byte offset, and stopped by process group.
//! The same POSIX `sh` snippets serve every place that can run a shell script: an instance
//! over SSH ([`super::SshSession`]) and the runner's own machine ([`super::LocalSession`]),
//! both through the small [`ShellHost`] trait.
//!
//! A detached command runs under `setsid` (its own session and process group, nothing that
//! dies with the starter), with its output in the log file, its process-group ID in
//! `<exit>.pid`, and its exit code written to the exit file via a temporary file and `mv`
//! when it ends; whatever it left running in its group is then killed, so nothing a stage
//! started outlives it. The log (unmasked job output) is created 0600; the standard input is a
//! 0600 file next to it, removed as soon as the command has it open.
//!
//! Following is `tail -c +N -F` until the exit file appears (or the command's leader is gone,
//! or the follower's parent — the SSH session, the runner — is), then a final drain from the
//! exact byte count received, so nothing is lost or shown twice.
//! Every chunk goes to [`TraceSink::write_followed`] with the log's byte count after it, and a
//! follower starts past [`TraceSink::followed`]: a trace restored after a crash goes on from
//! exactly where it was.
//!
//! Owns: the snippets and the start/attach/kill logic of detached commands. Must not touch:
//! connections or processes themselves (the [`ShellHost`] implementations own them), WIT types.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;

use crate::connector::remote::{ExitStatus, RemoteError};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// How a detached command is stopped: SIGTERM to its process group, SIGKILL after this many
/// tenths of a second.
const KILL_GRACE_TENTHS: u32 = 50;
/// How long starting may take before the command's pid file must exist, in twentieths of a
/// second.
const START_WAIT_TWENTIETHS: u32 = 200;

/// Where a script's output goes, chunk by chunk (stdout and stderr in arrival order).
pub type OutputFn<'a> = dyn Fn(&[u8]) + Send + Sync + 'a;

/// A place that runs `sh` scripts: an instance over SSH, the runner's own machine.
#[async_trait]
pub trait ShellHost: Send + Sync {
    /// Run `script` with `sh`, `stdin` on its standard input (empty when `None`), stdout and
    /// stderr in arrival order to `output`, until it exits or `stop` fires (then the script
    /// is stopped and the result is [`RemoteError::Canceled`]). Returns the exit code
    /// (`128 + n` for signal `n`).
    async fn shell(
        &self,
        script: &str,
        stdin: Option<&[u8]>,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError>;

    /// Run `script` with its output collected (at most `limit` bytes kept, plus one so that a
    /// caller can tell the output was longer).
    async fn capture(&self, script: &str, stdin: Option<&[u8]>, limit: usize) -> Result<(i32, Vec<u8>), RemoteError> {
        let collected = Mutex::new(Vec::new());
        let sink = |bytes: &[u8]| {
            if let Ok(mut c) = collected.lock() {
                let room = (limit + 1).saturating_sub(c.len());
                c.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
        };
        let code = self.shell(script, stdin, &sink, &StopSignal::new()).await?;
        Ok((code, collected.into_inner().unwrap_or_default()))
    }
}

/// POSIX shell single-quoting.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The pid file of the detached command whose exit file is `exit_path`.
pub fn pid_path(exit_path: &str) -> String {
    format!("{exit_path}.pid")
}

fn failed(what: &str, code: i32, output: &[u8]) -> RemoteError {
    RemoteError::Other(format!("{what} failed (exit code {code}): {}", String::from_utf8_lossy(output).trim()))
}

/// Start `command` (an `sh -c` command line) detached: output to `log_path`, exit code to
/// `exit_path`, process group in `<exit_path>.pid`, `stdin` on its standard input. Returns once
/// the command runs in its own session (its pid file exists), not when it ends.
pub async fn start(
    host: &dyn ShellHost,
    command: &str,
    stdin: Option<&[u8]>,
    log_path: &str,
    exit_path: &str,
) -> Result<(), RemoteError> {
    // $0 = command, $1 = log, $2 = pid file, $3 = stdin file, $4 = exit file. The stdin file
    // is opened before it is removed; the group is killed once the exit code is safe.
    let body = r#"echo $$ > "$2"; { rm -f -- "$3"; sh -c "$0"; } > "$1" 2>&1 < "$3"; echo $? > "$4.tmp" && mv -f -- "$4.tmp" "$4"; kill -s KILL 0"#;
    let pid = pid_path(exit_path);
    let (log, exit, pid, input) = (quote(log_path), quote(exit_path), quote(&pid), quote(&format!("{log_path}.stdin")));
    let launcher = format!(
        "mkdir -p \"$(dirname -- {log})\" \"$(dirname -- {exit})\" && rm -f -- {exit} {pid} \
           && (umask 077 && : > {log} && cat > {input}) || exit 1\n\
         nohup setsid sh -c {body} {command} {log} {pid} {input} {exit} > /dev/null 2>&1 < /dev/null &\n\
         i=0; while [ ! -s {pid} ]; do \
           if [ $i -ge {START_WAIT_TWENTIETHS} ]; then echo 'the command did not start (is setsid installed?)' >&2; exit 1; fi; \
           sleep 0.05; i=$((i+1)); \
         done",
        body = quote(body),
        command = quote(command),
    );
    let (code, output) = host.capture(&launcher, Some(stdin.unwrap_or_default()), 4096).await?;
    if code != 0 {
        return Err(failed("starting the detached command", code, &output));
    }
    Ok(())
}

/// A shell function `gone P`: true when process `P` no longer runs (exited, or a zombie that
/// nobody reaps — on Linux, read from `/proc`).
const GONE_FN: &str = "gone() { kill -0 \"$1\" 2>/dev/null || return 0; [ -r /proc/$1/stat ] || return 1; \
     read -r l 2>/dev/null < /proc/$1/stat || return 0; set -- ${l##*) }; [ \"$1\" = Z ]; }";

/// A shell function `live G`: true while process group `G` has a member that is not a zombie.
const LIVE_FN: &str = "live() { kill -s 0 -- -\"$1\" 2>/dev/null || return 1; [ -r /proc/self/stat ] || return 0; \
     g=$1; for f in /proc/[0-9]*/stat; do read -r l 2>/dev/null < \"$f\" || continue; set -- ${l##*) }; \
     [ \"$3\" = \"$g\" ] && [ \"$1\" != Z ] && return 0; done; return 1; }";

/// Follow the detached command of `log_path`/`exit_path` into `trace` until it exits, from
/// byte `offset` of its log or past what the trace already holds of it
/// ([`TraceSink::followed`]), whichever is further. When `stop` fires the command's process
/// group is killed and the result is [`RemoteError::Canceled`].
pub async fn attach(
    host: &dyn ShellHost,
    log_path: &str,
    exit_path: &str,
    offset: u64,
    trace: &dyn TraceSink,
    stop: &StopSignal,
) -> Result<ExitStatus, RemoteError> {
    let start = offset.max(trace.followed(log_path).unwrap_or(0));
    let (log, exit) = (quote(log_path), quote(exit_path));
    let pid = quote(&pid_path(exit_path));
    // Follow until the exit file appears, the command's leader is gone without writing it, or
    // the parent that runs this loop is (a dropped connection or a dead runner must not leave
    // it polling forever).
    let follow = format!(
        "{GONE_FN}\n\
         tail -c +{from} -F -- {log} 2>/dev/null & t=$!; p=$(cat -- {pid} 2>/dev/null); \
         while [ ! -e {exit} ]; do \
           if [ -n \"$p\" ] && gone \"$p\"; then break; fi; \
           kill -0 $PPID 2>/dev/null || break; \
           sleep 0.1; \
         done; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0",
        from = start + 1
    );
    let received = AtomicU64::new(start);
    let forward = |bytes: &[u8]| {
        let end = received.fetch_add(bytes.len() as u64, Ordering::SeqCst) + bytes.len() as u64;
        trace.write_followed(log_path, end, bytes);
    };
    match host.shell(&follow, None, &forward, stop).await {
        Ok(_) => {}
        Err(RemoteError::Canceled) => {
            kill(host, exit_path).await;
            return Err(RemoteError::Canceled);
        }
        Err(e) => return Err(e),
    }
    // What `tail -F` had not shown yet when it was stopped.
    let drain = format!("tail -c +{} -- {log}", received.load(Ordering::SeqCst) + 1);
    host.shell(&drain, None, &forward, &StopSignal::new()).await?;
    let (code, text) = host.capture(&format!("cat -- {exit}"), None, 64).await?;
    if code != 0 {
        return Err(RemoteError::Other(format!(
            "{exit_path}: the command ended without an exit code (killed or the machine restarted)"
        )));
    }
    let text = String::from_utf8_lossy(&text);
    let code = text
        .trim()
        .parse::<i32>()
        .map_err(|_| RemoteError::Other(format!("{exit_path}: unreadable exit code {text:?}")))?;
    Ok(ExitStatus::from_code(code))
}

/// The script that stops the detached command of `exit_path` if it still runs: SIGTERM to its
/// process group, SIGKILL when a member is still alive after the grace period.
pub fn kill_script(exit_path: &str) -> String {
    format!(
        "{LIVE_FN}\n\
         p=$(cat -- {pid} 2>/dev/null) && [ -n \"$p\" ] || exit 0; kill -s TERM -- -$p 2>/dev/null || exit 0; \
         i=0; while [ $i -lt {KILL_GRACE_TENTHS} ]; do live $p || exit 0; sleep 0.1; i=$((i+1)); done; \
         kill -s KILL -- -$p 2>/dev/null; exit 0",
        pid = quote(&pid_path(exit_path))
    )
}

/// Stop the detached command of `exit_path` (see [`kill_script`]); best effort, bounded.
pub async fn kill(host: &dyn ShellHost, exit_path: &str) {
    let script = kill_script(exit_path);
    // A timeout drops the script, which stops it.
    let limit = std::time::Duration::from_secs(30);
    let _ = tokio::time::timeout(limit, host.shell(&script, None, &|_| {}, &StopSignal::new())).await;
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
