//! Detached commands: started so that they outlive whoever started them (the SSH connection,
//! the runner process), followed again from any byte offset, and stopped by process group.
//! The same POSIX `sh` snippets serve every place that can run a shell script: an instance
//! over SSH ([`super::SshSession`]) and the runner's own machine ([`super::LocalSession`]),
//! both through the small [`ShellHost`] trait.
//!
//! A detached command runs under `setsid` (its own session and process group without a
//! terminal, so no hangup reaches it; nothing that dies with the starter), with its output in
//! the log file, its process-group ID in `<exit>.pid`, and its exit code written to the exit
//! file via a temporary file and `mv` when it ends (on the runner's own machine directly, and
//! started by `posix_spawn` in a new session instead of `setsid`: [`DIRECT_EXIT_WRAPPER`]);
//! whatever it left running in its group is
//! then killed, so nothing a stage started outlives it ([`WRAPPER`]). The log (unmasked job
//! output) is created 0600; the standard input is a 0600 file next to it, removed as soon as
//! the command has it open (on the runner's own machine a memory file instead, where the
//! kernel has one: [`super::spawn::memory_file`]).
//!
//! Following ([`ShellHost::follow`]) is by default `tail -c +N -F` until the exit file appears
//! (polled every 5 ms at first, then every 100 ms), or the command's leader is gone, or the
//! follower's parent — the SSH session — is; then a final drain from the exact byte count
//! received, so nothing is lost or shown twice, which also reads the exit code. Where every
//! script is a costly round trip (an `exec` in a container), [`start_and_follow_script`] starts
//! the command and streams its log from the first byte to the exit code in one script. The runner's
//! own machine writes, starts and reads the same files itself ([`super::LocalSession`]), with
//! one process per start and none per poll.
//!
//! Every chunk goes to [`TraceSink::write_followed`] with the log's byte count after it, and a
//! follower starts past [`TraceSink::followed`]: a trace restored after a crash goes on from
//! exactly where it was.
//!
//! Owns: the snippets and the start/attach/kill logic of detached commands. Must not touch:
//! connections or processes themselves (the [`ShellHost`] implementations own them), WIT types.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
/// POSIX shell single-quoting, as every snippet here writes paths (the crate is shared with the
/// script builder and the plugin SDK).
pub use runway_shell_quote::quote;

use crate::connector::remote::{ExitStatus, RemoteError};
use crate::stop::StopSignal;
use crate::trace::TraceSink;

/// How a detached command is stopped: SIGTERM to its process group, SIGKILL after this many
/// tenths of a second.
const KILL_GRACE_TENTHS: u32 = 50;
/// Polls of the follow script at 5 ms (a short stage ends within them) before it polls every
/// 100 ms.
const FAST_POLLS: u32 = 40;

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

    /// Start `command` detached ([`start`]); by default with [`start_with_shell`], and a host
    /// that can write files and start processes itself does it with one process.
    async fn start(&self, command: &str, stdin: &[u8], log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
        start_with_shell(self, command, stdin, log_path, exit_path).await
    }

    /// Forward the log of the detached command of `log_path`/`exit_path` from byte `from` to
    /// `output` until the command has ended (its exit file exists, or its leader is gone
    /// without writing one) and every byte of the log is forwarded, in order and once; then
    /// return the code its exit file holds. When `stop` fires, return
    /// [`RemoteError::Canceled`] at once (the caller stops the command). By default, `tail -F`
    /// and a drain script through [`ShellHost::shell`]; a host that can read the files itself
    /// does it without starting processes.
    async fn follow(
        &self,
        log_path: &str,
        exit_path: &str,
        from: u64,
        output: &OutputFn<'_>,
        stop: &StopSignal,
    ) -> Result<i32, RemoteError> {
        follow_with_shell(self, log_path, exit_path, from, output, stop).await
    }

    /// Stop the detached command of `log_path`/`exit_path` if it still runs; best effort,
    /// bounded. By default [`kill`], which reads its pid file; a host that keeps the pid
    /// elsewhere reads it there.
    async fn stop(&self, _log_path: &str, exit_path: &str) {
        kill(self, exit_path).await
    }
}

/// The pid file of the detached command whose exit file is `exit_path`.
pub fn pid_path(exit_path: &str) -> String {
    format!("{exit_path}.pid")
}

/// The directory of `path` (`.` for a bare name, `/` for a file at the root).
fn parent(path: &str) -> &str {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) => "/",
        Some((dir, _)) => dir,
        None => ".",
    }
}

fn failed(what: &str, code: i32, output: &[u8]) -> RemoteError {
    RemoteError::Other(format!("{what} failed (exit code {code}): {}", String::from_utf8_lossy(output).trim()))
}

/// The `sh -c` script of a detached command's leader, run under `setsid` with the arguments
/// of [`wrapper_args`]: `$0` = command, `$1` = log, `$2` = pid file, `$3` = stdin file, `$4` =
/// exit file. It writes the pid file, takes the stdin file as its input, then closes its own
/// standard output: that EOF is what tells the starter it runs (no polling), after which the
/// starter removes the stdin file. The exit code goes to the exit file via tmp + `mv`; then
/// the group is killed (what the command left running). Few processes: every fork is a few
/// milliseconds of every stage.
pub const WRAPPER: &str = r#"echo $$ > "$2"; exec < "$3" > /dev/null 2>&1; (eval "$0") > "$1" 2>&1; echo $? > "$4.tmp" && mv -f -- "$4.tmp" "$4"; kill -s KILL 0"#;

/// The leader's script on the runner's own machine ([`super::LocalSession`]), run by `sh -c`
/// with `$0` = command and `$1` = exit file. The runner starts it in a session of its own with
/// the stdin file as its standard input, the log as its standard output and `/dev/null` as its
/// standard error, and writes the pid file itself ([`super::spawn`]): no redirections, no
/// readiness handshake, no `setsid` program. The exit code is written straight into the exit
/// file, no `mv` (one process less per stage): the reader takes the file as written once it
/// ends with a newline (`echo` writes code and newline in one `write`), or once the leader is
/// gone ([`exit_code_written`]). Then, as [`WRAPPER`], the group is killed.
pub const DIRECT_EXIT_WRAPPER: &str = r#"(eval "$0") 2>&1; echo $? > "$1"; kill -s KILL 0"#;

/// Whether the exit file text `text` is complete: a code and its newline (what both wrappers
/// write; [`DIRECT_EXIT_WRAPPER`]'s may be read between its creation and the write).
pub fn exit_code_written(text: &[u8]) -> bool {
    text.ends_with(b"\n")
}

/// The stdin file of the detached command whose log is `log_path`.
pub fn stdin_path(log_path: &str) -> String {
    format!("{log_path}.stdin")
}

/// `sh -c` [`WRAPPER`] and its arguments.
pub fn wrapper_args(command: &str, log_path: &str, exit_path: &str) -> Vec<String> {
    let args = [command, log_path, &pid_path(exit_path), &stdin_path(log_path), exit_path].map(str::to_string);
    ["sh", "-c", WRAPPER].into_iter().map(str::to_string).chain(args).collect()
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
    host.start(command, stdin.unwrap_or_default(), log_path, exit_path).await
}

/// [`ShellHost::start`] with one launcher script: directories, a fresh 0600 log and stdin file,
/// then [`WRAPPER`] under `setsid` in a command substitution, which returns when the wrapper
/// closes its standard output.
pub async fn start_with_shell<H: ShellHost + ?Sized>(
    host: &H,
    command: &str,
    stdin: &[u8],
    log_path: &str,
    exit_path: &str,
) -> Result<(), RemoteError> {
    launch(host, command, stdin, log_path, exit_path, false).await
}

/// [`start_with_shell`] for a connection that may drop while the standard input is on its
/// way (a `pods/exec` stream): the launcher checks that the stdin file holds all
/// `stdin.len()` bytes before it starts anything, so a cut stream never starts a script cut
/// short. One `wc` more per start.
pub async fn start_with_shell_checked<H: ShellHost + ?Sized>(
    host: &H,
    command: &str,
    stdin: &[u8],
    log_path: &str,
    exit_path: &str,
) -> Result<(), RemoteError> {
    launch(host, command, stdin, log_path, exit_path, true).await
}

async fn launch<H: ShellHost + ?Sized>(
    host: &H,
    command: &str,
    stdin: &[u8],
    log_path: &str,
    exit_path: &str,
    check_length: bool,
) -> Result<(), RemoteError> {
    let launcher = launcher_script(command, stdin.len(), log_path, exit_path, check_length);
    let (code, output) = host.capture(&launcher, Some(stdin), 4096).await?;
    if code != 0 {
        return Err(failed("starting the detached command", code, &output));
    }
    Ok(())
}

/// The launcher of [`start_with_shell`]: directories, a fresh 0600 log and stdin file (its
/// `stdin_len` bytes checked with `check_length`), then [`WRAPPER`] under `setsid`; exits
/// non-zero, with the reason on its standard error, when the command did not start.
fn launcher_script(command: &str, stdin_len: usize, log_path: &str, exit_path: &str, check_length: bool) -> String {
    let mut dirs: Vec<&str> = [log_path, exit_path].iter().map(|p| parent(p)).collect();
    dirs.dedup();
    let mkdirs: String =
        dirs.iter().map(|d| format!("[ -d {d} ] || mkdir -p -- {d} || exit 1\n", d = quote(d))).collect();
    let wrapper: Vec<String> = wrapper_args(command, log_path, exit_path).iter().map(|a| quote(a)).collect();
    let (log, exit, pid, input) =
        (quote(log_path), quote(exit_path), quote(&pid_path(exit_path)), quote(&stdin_path(log_path)));
    format!(
        "{mkdirs}\
         if [ -e {exit} ] || [ -e {pid} ]; then rm -f -- {exit} {pid} || exit 1; fi\n\
         (umask 077 && : > {log} && exec cat > {input}) || exit 1\n\
         {check}\
         : \"$(setsid {wrapper} 2> /dev/null < /dev/null &)\"\n\
         rm -f -- {input}\n\
         [ -s {pid} ] || {{ echo 'the command did not start (is setsid installed?)' >&2; exit 1; }}",
        wrapper = wrapper.join(" "),
        check = if check_length {
            format!(
                "[ $(($(wc -c < {input}))) -eq {stdin_len} ] || {{ rm -f -- {input}; echo 'the standard input was cut short' >&2; exit 1; }}\n"
            )
        } else {
            String::new()
        },
    )
}

/// The line [`start_and_follow_script`] writes to its standard error once the command runs.
pub const STARTED_MARKER: &str = "runway: the detached command runs";

/// One script that starts `command` detached (as [`start_with_shell_checked`]: the standard
/// input's `stdin_len` bytes checked) and then follows its log from its first byte until it
/// ended, for a host where every script costs a round trip (an `exec` in a container): once
/// the command runs it writes [`STARTED_MARKER`] and a newline to its standard error (before
/// that, only the launcher's errors go there), then the log to its standard output, byte-exact
/// and once — it holds the log open and `cat`s from that one open file at every poll (5 ms at
/// first, then 100 ms), so each `cat` goes on where the last stopped, and once more after the
/// exit file appeared or the leader is gone — and exits with the command's exit code (255 when
/// the exit file is missing, unreadable or says 255 or more: then the caller reads it).
pub fn start_and_follow_script(command: &str, stdin_len: usize, log_path: &str, exit_path: &str) -> String {
    let launcher = launcher_script(command, stdin_len, log_path, exit_path, true);
    let (log, exit, pid) = (quote(log_path), quote(exit_path), quote(&pid_path(exit_path)));
    format!(
        "{launcher}\n\
         exec 5< {log} || exit 1\n\
         echo {marker} >&2\n\
         {GONE_FN}\n\
         p=; read -r p 2>/dev/null < {pid}; s=0.005; n=0\n\
         while [ ! -e {exit} ]; do \
           cat <&5; \
           if [ -n \"$p\" ] && gone \"$p\"; then break; fi; \
           sleep $s; n=$((n+1)); [ $n -lt {FAST_POLLS} ] || s=0.1; \
         done\n\
         cat <&5\n\
         read -r c 2>/dev/null < {exit} || exit 255\n\
         case $c in ''|*[!0-9]*) exit 255;; esac; [ \"$c\" -lt 255 ] || exit 255; exit \"$c\"",
        marker = quote(STARTED_MARKER),
    )
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
    let received = AtomicU64::new(start);
    let forward = |bytes: &[u8]| {
        let end = received.fetch_add(bytes.len() as u64, Ordering::SeqCst) + bytes.len() as u64;
        trace.write_followed(log_path, end, bytes);
    };
    match host.follow(log_path, exit_path, start, &forward, stop).await {
        Ok(code) => Ok(ExitStatus::from_code(code)),
        Err(RemoteError::Canceled) => {
            host.stop(log_path, exit_path).await;
            Err(RemoteError::Canceled)
        }
        Err(e) => Err(e),
    }
}

/// The error of a command that ended without an exit code.
pub fn no_exit_code(exit_path: &str) -> RemoteError {
    RemoteError::Other(format!("{exit_path}: the command ended without an exit code (killed or the machine restarted)"))
}

/// The exit code in the text of an exit file.
pub fn parse_exit_code(exit_path: &str, text: &[u8]) -> Result<i32, RemoteError> {
    let text = String::from_utf8_lossy(text);
    text.trim().parse::<i32>().map_err(|_| RemoteError::Other(format!("{exit_path}: unreadable exit code {text:?}")))
}

/// [`ShellHost::follow`] with scripts: `tail -c +N -F` until the command ended, then a drain
/// from the exact byte count forwarded, which also reads the exit code.
pub async fn follow_with_shell<H: ShellHost + ?Sized>(
    host: &H,
    log_path: &str,
    exit_path: &str,
    from: u64,
    output: &OutputFn<'_>,
    stop: &StopSignal,
) -> Result<i32, RemoteError> {
    let (log, exit) = (quote(log_path), quote(exit_path));
    let pid = quote(&pid_path(exit_path));
    // Follow until the exit file appears, the command's leader is gone without writing it, or
    // the parent that runs this loop is (a dropped connection or a dead runner must not leave
    // it polling forever).
    let follow = format!(
        "{GONE_FN}\n\
         tail -c +{start} -F -- {log} 2>/dev/null & t=$!; p=; read -r p 2>/dev/null < {pid}; s=0.005; n=0; \
         while [ ! -e {exit} ]; do \
           if [ -n \"$p\" ] && gone \"$p\"; then break; fi; \
           kill -0 $PPID 2>/dev/null || break; \
           sleep $s; n=$((n+1)); [ $n -lt {FAST_POLLS} ] || s=0.1; \
         done; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0",
        start = from + 1
    );
    let forwarded = AtomicU64::new(from);
    let counted = |bytes: &[u8]| {
        forwarded.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        output(bytes);
    };
    host.shell(&follow, None, &counted, stop).await?;
    // What `tail -F` had not shown yet when it was stopped, and the exit code as the drain's
    // own (255 for anything else: then the exit file is read on its own, to tell why).
    let drain = format!(
        "tail -c +{start} -- {log}; read -r c 2>/dev/null < {exit} || exit 255; \
         case $c in ''|*[!0-9]*) exit 255;; esac; [ \"$c\" -lt 255 ] || exit 255; exit \"$c\"",
        start = forwarded.load(Ordering::SeqCst) + 1
    );
    let code = host.shell(&drain, None, &counted, &StopSignal::new()).await?;
    if (0..255).contains(&code) {
        return Ok(code);
    }
    read_exit_code(host, exit_path).await
}

/// The exit code in the exit file `exit_path`, read on its own (a follower's exit code said
/// 255: the file is missing or unreadable, or the code is 255 or more).
pub async fn read_exit_code<H: ShellHost + ?Sized>(host: &H, exit_path: &str) -> Result<i32, RemoteError> {
    let (code, text) = host.capture(&format!("cat -- {}", quote(exit_path)), None, 64).await?;
    if code != 0 {
        return Err(no_exit_code(exit_path));
    }
    parse_exit_code(exit_path, &text)
}

/// The script that stops the detached command of `exit_path` if it still runs: SIGTERM to its
/// process group, SIGKILL when a member is still alive after the grace period.
pub fn kill_script(exit_path: &str) -> String {
    let read = format!("p=$(cat -- {} 2>/dev/null) && [ -n \"$p\" ] || exit 0", quote(&pid_path(exit_path)));
    kill_group_script(&read)
}

/// [`kill_script`] for the group `$p` that the shell code `read` sets (or exits).
fn kill_group_script(read: &str) -> String {
    format!(
        "{LIVE_FN}\n\
         {read}; kill -s TERM -- -$p 2>/dev/null || exit 0; \
         i=0; while [ $i -lt {KILL_GRACE_TENTHS} ]; do live $p || exit 0; sleep 0.1; i=$((i+1)); done; \
         kill -s KILL -- -$p 2>/dev/null; exit 0"
    )
}

/// Stop the detached command of `exit_path` (see [`kill_script`]); best effort, bounded.
pub async fn kill<H: ShellHost + ?Sized>(host: &H, exit_path: &str) {
    run_kill(host, kill_script(exit_path)).await
}

/// Stop the detached command whose leader (and process group) is `pid`, as [`kill`] does.
pub async fn kill_group<H: ShellHost + ?Sized>(host: &H, pid: i32) {
    run_kill(host, kill_group_script(&format!("p={pid}"))).await
}

async fn run_kill<H: ShellHost + ?Sized>(host: &H, script: String) {
    // A timeout drops the script, which stops it.
    let limit = std::time::Duration::from_secs(30);
    let _ = tokio::time::timeout(limit, host.shell(&script, None, &|_| {}, &StopSignal::new())).await;
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn parents_of_paths() {
        assert_eq!(super::parent("/b/s/01.log"), "/b/s");
        assert_eq!(super::parent("/01.log"), "/");
        assert_eq!(super::parent("01.log"), ".");
        assert_eq!(super::parent("s/01.log"), "s");
    }

    /// The one-exec script starts the command, says so on stderr, streams its whole log on
    /// stdout byte-exact (output written across the fast and slow polls) and exits with its code.
    #[test]
    fn start_and_follow_streams_the_whole_log_and_the_exit_code() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let (log, exit) = (dir.path().join("s/01.log"), dir.path().join("s/01.exit"));
        let command = "sh";
        let stdin =
            b"printf 'a\\000b'; for i in 1 2 3; do echo line $i; sleep 0.1; done; head -c 100000 /dev/zero; exit 7";
        let script =
            super::start_and_follow_script(command, stdin.len(), log.to_str().unwrap(), exit.to_str().unwrap());
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{}\n", super::STARTED_MARKER));
        let mut expected = b"a\0bline 1\nline 2\nline 3\n".to_vec();
        expected.extend(std::iter::repeat_n(0u8, 100_000));
        assert_eq!(out.stdout.len(), expected.len());
        assert!(out.stdout == expected);
        assert_eq!(std::fs::read(&log).unwrap(), expected);
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
