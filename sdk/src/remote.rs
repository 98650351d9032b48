//! The machine the current job runs on: the instance acquired for it (reached over the host's
//! SSH connector), or — for a plugin with the `allow_process` grant whose job has no fleet
//! instance — the runner's own machine. Without either, calls fail with
//! [`RemoteError::NoInstance`].

pub use crate::bindings::executor::runway::host0_1_0::process::ExitStatus;
use crate::bindings::executor::runway::host0_1_0::remote as wit;
pub use crate::bindings::executor::runway::host0_1_0::remote::RemoteError;

/// Run a shell command, streaming its output into the job log.
pub fn run(command: &str, stdin: Option<&[u8]>) -> Result<ExitStatus, RemoteError> {
    wit::run(&wit::RemoteCommand { command: command.to_string(), stdin: stdin.map(<[u8]>::to_vec) })
}
/// Start a command detached from the connection and from the runner (it keeps running when
/// either is gone), logging to `log_path` and writing its exit code to `exit_path`; its
/// process group ID goes to `<exit_path>.pid`. Returns once it runs.
pub fn start_detached(command: &str, stdin: Option<&[u8]>, log_path: &str, exit_path: &str) -> Result<(), RemoteError> {
    let cmd = wit::RemoteCommand { command: command.to_string(), stdin: stdin.map(<[u8]>::to_vec) };
    wit::start_detached(&cmd, log_path, exit_path)
}
/// Follow a detached command's log into the job log until it exits. The host starts at
/// `offset` or past what the job log already holds of this log (after a resume), whichever is
/// further, so attaching again never repeats output; pass 0 to get everything not yet shown.
pub fn attach(log_path: &str, exit_path: &str, offset: u64) -> Result<ExitStatus, RemoteError> {
    wit::attach(log_path, exit_path, offset)
}
/// Write a file.
pub fn upload(path: &str, data: &[u8], mode: u32) -> Result<(), RemoteError> {
    wit::upload(path, data, mode)
}
/// Read a file.
pub fn download(path: &str, max_bytes: u32) -> Result<Vec<u8>, RemoteError> {
    wit::download(path, max_bytes)
}

/// POSIX shell single-quoting, for paths in commands (the host quotes with the same crate).
pub use runway_shell_quote::quote;

/// Does `path` exist? One cheap command (`test -e`).
pub fn exists(path: &str) -> Result<bool, RemoteError> {
    Ok(run(&format!("test -e {}", quote(path)), None)?.code == 0)
}

/// Stop every detached command started with its exit file directly in `dir` that has not
/// ended (no exit file yet): SIGTERM to its process group, SIGKILL to what is still alive
/// after `grace_seconds`. A command whose pid is not in a file (the runner's own machine
/// keeps it on the log as an extended attribute) is found by its leader writing into its
/// `*.log` there (`/proc/*/fd/1`). For an executor's `cleanup`, which must also stop what a previous
/// runner started before it died (cleanup after `resume`).
pub fn stop_detached_in(dir: &str, grace_seconds: u32) -> Result<(), RemoteError> {
    run(&stop_detached_script(dir, grace_seconds), None).map(|_| ())
}

/// The shell script of [`stop_detached_in`], to run with more commands in one [`run`].
pub fn stop_detached_script(dir: &str, grace_seconds: u32) -> String {
    // `live G`: does process group G have a member that is not a zombie nobody reaps?
    format!(
        r#"live() {{ kill -s 0 -- -"$1" 2>/dev/null || return 1; [ -r /proc/self/stat ] || return 0; g=$1; for f in /proc/[0-9]*/stat; do read -r l 2>/dev/null < "$f" || continue; set -- ${{l##*) }}; [ "$3" = "$g" ] && [ "$1" != Z ] && return 0; done; return 1; }}
groups=""
for f in {dir}/*.exit.pid; do
  [ -e "$f" ] && [ ! -e "${{f%.pid}}" ] || continue
  p=; read -r p 2>/dev/null < "$f"; [ -n "$p" ] || continue
  kill -s TERM -- -"$p" 2>/dev/null && groups="$groups $p"
done
for l in {dir}/*.log; do
  [ -f "$l" ] && [ ! -e "${{l%.log}}.exit.pid" ] || continue
  for o in /proc/[0-9]*/fd/1; do
    [ "$o" -ef "$l" ] || continue
    s=; read -r s 2>/dev/null < "${{o%/fd/1}}/stat" || continue; set -- ${{s##*) }}
    [ "$1" != Z ] && kill -s TERM -- -"$3" 2>/dev/null && groups="$groups $3"
  done
done
i=0
while [ -n "$groups" ] && [ $i -lt {tenths} ]; do
  left=""; for p in $groups; do live "$p" && left="$left $p"; done; groups=$left
  [ -n "$groups" ] && sleep 0.1; i=$((i+1))
done
for p in $groups; do kill -s KILL -- -"$p" 2>/dev/null; done
"#,
        dir = quote(dir.trim_end_matches('/')),
        tenths = grace_seconds.saturating_mul(10),
    )
}
