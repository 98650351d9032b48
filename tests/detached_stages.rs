//! Detached stages on the runner's own machine, with real processes: a stage outlives the
//! call that follows it (a manager that died), a restored trace gets the rest of its log and
//! no byte twice, cancel and cleanup leave no process behind, and a resumed shell executor
//! reattaches to a stage a previous session started instead of running it again.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runway::capability::CallContext;
use runway::connector::marks;
use runway::connector::{ConnectSpec, LocalSession, RemoteError, RemoteSession, SshAuth, SshSession, StageOutput};
use runway::executor::{ExecutorFailure, ExecutorSession, Stage};
use runway::plugin::{HostSettings, PluginHost};
use runway::stop::{StopReason, StopSignal};
use runway::trace::{JobTrace, TraceOptions, TraceSink};

#[path = "support/sshd.rs"]
mod sshd;
#[path = "support/wit_job.rs"]
mod wit_job;
use sshd::{ClientKey, SshServer};
use wit_job::job;

/// Generous: only the event matters, and the machine may be loaded.
const WAIT: Duration = Duration::from_secs(30);

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Is `pid` a running process (not gone, not a zombie nobody reaped)?
fn running(pid: i32) -> bool {
    // SAFETY: probing a pid with signal 0 has no effect.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists && stat(pid).is_none_or(|fields| fields[0] != "Z")
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, pgrp, session, ….
fn stat(pid: i32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn trace() -> Arc<JobTrace> {
    Arc::new(JobTrace::new(&TraceOptions::default()).expect("trace"))
}

/// A trace as a resumed manager restores it from the checkpoint of `trace`.
fn restored(trace: &JobTrace) -> Arc<JobTrace> {
    let (checkpoint, bytes) = trace.checkpoint(0);
    Arc::new(JobTrace::restore(&TraceOptions::default(), bytes, checkpoint).expect("restore"))
}

fn text(trace: &JobTrace) -> String {
    trace.finish();
    String::from_utf8_lossy(&trace.contents()).into_owned()
}

fn lines(from: u32, to: u32) -> String {
    (from..=to).map(|i| format!("line {i}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_detached_command_outlives_its_follower_and_a_restored_trace_gets_every_byte_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, exit) = (dir.path().join("s/00.log"), dir.path().join("s/00.exit"));
    let (log, exit) = (log.display().to_string(), exit.display().to_string());
    let gate = dir.path().join("gate");
    let script = format!(
        "i=1; while [ $i -le 10 ]; do echo \"line $i\"; i=$((i+1)); done\n\
         while [ ! -e {gate} ]; do sleep 0.05; done\n\
         while [ $i -le 20 ]; do echo \"line $i\"; i=$((i+1)); done; exit 5\n",
        gate = gate.display()
    );
    let session = Arc::new(LocalSession::new());
    session.start_detached("sh", Some(script.as_bytes()), &log, &exit).await.expect("start");

    // A follower that dies mid-stage, as a manager killed with -9 would.
    let first = trace();
    let follower = {
        let (session, first, log, exit) = (session.clone(), first.clone(), log.clone(), exit.clone());
        tokio::spawn(async move { session.attach(&log, &exit, 0, &*first, &StopSignal::new()).await })
    };
    let followed_all = || first.followed(&log) == Some(lines(1, 10).len() as u64);
    wait_until("the first ten lines are followed", followed_all).await;
    follower.abort();
    let _ = follower.await;

    // The command runs on, in its own session, not a member of any group of ours.
    // The pid is noted on the log (an extended attribute): no pid file beside it.
    let pid = marks::read_pid(&log, &exit).expect("the leader's pid");
    assert!(!Path::new(&format!("{exit}.pid")).exists(), "a pid file beside the log");
    assert!(running(pid), "the detached command died with its follower");
    let fields = stat(pid).expect("stat");
    assert_eq!((fields[2].as_str(), fields[3].as_str()), (pid.to_string().as_str(), pid.to_string().as_str()));
    assert!(!Path::new(&exit).exists());
    assert_eq!(marks::read_exit(&log, &exit), None);
    // The unmasked output is the runner user's alone; the script (secrets) is not left on disk.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&log).expect("log").permissions().mode() & 0o777, 0o600);
    assert!(!Path::new(&format!("{log}.stdin")).exists(), "the script's stdin file was left behind");

    // A resumed manager follows on from what its restored trace holds: the rest, once.
    let second = restored(&first);
    std::fs::write(&gate, "").expect("open the gate");
    let status = session.attach(&log, &exit, 0, &*second, &StopSignal::new()).await.expect("attach again");
    assert_eq!((status.code, status.signal), (5, None));
    assert_eq!(text(&second), lines(1, 20));
    assert_eq!(second.followed(&log), Some(lines(1, 20).len() as u64));
    // An explicit offset further on wins over the trace's cursor.
    let third = restored(&first);
    session.attach(&log, &exit, lines(1, 15).len() as u64, &*third, &StopSignal::new()).await.expect("attach");
    assert_eq!(text(&third), format!("{}{}", lines(1, 10), lines(16, 20)));
    wait_until("the finished command is gone", || !running(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_process_group_of_a_local_detached_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, exit) =
        (dir.path().join("00.log").display().to_string(), dir.path().join("00.exit").display().to_string());
    let pids = dir.path().join("pids");
    // A background child and a foreground child.
    let script = format!("sleep 300 & echo $! > {p}; sh -c 'echo $$ >> {p}; sleep 300'\n", p = pids.display());
    let session = Arc::new(LocalSession::new());
    session.start_detached("sh", Some(script.as_bytes()), &log, &exit).await.expect("start");
    let stop = StopSignal::new();
    let attached = {
        let (session, stop, log, exit) = (session.clone(), stop.clone(), log.clone(), exit.clone());
        tokio::spawn(async move { session.attach(&log, &exit, 0, &*trace(), &stop).await })
    };
    let count = || std::fs::read_to_string(&pids).map(|s| s.lines().count()).unwrap_or(0);
    wait_until("both children run", || count() == 2).await;
    let leader = marks::read_pid(&log, &exit).expect("pid");
    stop.stop(StopReason::Canceled);
    let result = attached.await.expect("task");
    assert!(matches!(result, Err(RemoteError::Canceled)), "{result:?}");
    let mut all: Vec<i32> =
        std::fs::read_to_string(&pids).expect("pids").lines().map(|l| l.trim().parse().expect("pid")).collect();
    all.push(leader);
    for pid in all {
        assert!(!running(pid), "process {pid} of the cancelled command survived");
    }
}

/// The command line of process `pid`, its arguments joined by spaces.
fn cmdline(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    String::from_utf8_lossy(&raw).trim_end_matches('\0').replace('\0', " ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stage_reaper_starts_the_command_itself_and_writes_its_exit_code_with_no_follower() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, exit) =
        (dir.path().join("00.log").display().to_string(), dir.path().join("00.exit").display().to_string());
    let (gate, background) = (dir.path().join("gate"), dir.path().join("background"));
    let script = format!(
        "echo out; echo err >&2; echo \"in $PWD\"; sleep 300 & echo $! > {bg}\n\
         while [ ! -e {gate} ]; do sleep 0.05; done; exit 7\n",
        bg = background.display(),
        gate = gate.display()
    );
    let session = LocalSession::with_reaper(env!("CARGO_BIN_EXE_runway"));
    let command = format!("cd {} && exec sh", runway::connector::detached::quote(&dir.path().display().to_string()));
    session.start_detached(&command, Some(script.as_bytes()), &log, &exit).await.expect("start");
    wait_until("the stage runs", || background.exists()).await;
    let leader = marks::read_pid(&log, &exit).expect("pid");
    let fields = stat(leader).expect("stat");
    // The command itself leads its own session, no `sh` wrapper in between: `cd && exec` was
    // done by the spawn. Its parent is the reaper.
    assert_eq!(cmdline(leader), "sh");
    assert_eq!((fields[2].as_str(), fields[3].as_str()), (leader.to_string().as_str(), leader.to_string().as_str()));
    let reaper: i32 = fields[1].parse().expect("ppid");
    assert!(cmdline(reaper).ends_with(" __stage-reaper"), "{}", cmdline(reaper));

    // Nobody follows: the reaper writes the exit code and kills what the stage left behind.
    std::fs::write(&gate, "").expect("open the gate");
    wait_until("the exit code is written", || marks::read_exit(&log, &exit).is_some_and(|c| c == b"7\n")).await;
    assert!(!Path::new(&exit).exists(), "an exit file beside the log");
    let left: i32 = std::fs::read_to_string(&background).expect("bg").trim().parse().expect("pid");
    wait_until("the stage's background process is killed", || !running(left)).await;
    wait_until("the leader is reaped", || !Path::new(&format!("/proc/{leader}")).exists()).await;

    // A follower then gets every byte, stdout and stderr in order, and the code.
    let followed = trace();
    let status = session.attach(&log, &exit, 0, &*followed, &StopSignal::new()).await.expect("attach");
    assert_eq!((status.code, status.signal), (7, None));
    assert_eq!(text(&followed), format!("out\nerr\nin {}\n", dir.path().display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pipes_a_stage_streams_past_the_pipe_size_to_its_one_follower_and_cancel_ends_it() {
    use std::os::unix::fs::FileTypeExt;
    // Through the reaper, and through an `sh` leader (a library user without a reaper).
    let sessions = [
        ("reaper", LocalSession::with_reaper(env!("CARGO_BIN_EXE_runway")).with_output(StageOutput::Pipes)),
        ("sh leader", LocalSession::with_reaper("/nonexistent/runway").with_output(StageOutput::Pipes)),
    ];
    for (how, session) in sessions {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = |name: &str| dir.path().join(name).display().to_string();
        let (log, exit, gate) = (path("00.log"), path("00.exit"), path("gate"));
        // 3 MiB, three times the pipe, then stderr; it waits for the gate so the test sees it run.
        let script = format!(
            "while [ ! -e {gate} ]; do sleep 0.02; done\n\
             head -c 3145728 /dev/zero | tr '\\0' x; echo; echo err >&2; exit 3\n"
        );
        let session = Arc::new(session);
        session.start_detached("sh", Some(script.as_bytes()), &log, &exit).await.expect("start");
        let kind = std::fs::symlink_metadata(&log).expect("log").file_type();
        assert!(kind.is_fifo(), "{how}: the log is a pipe");
        std::fs::write(&gate, "").expect("open the gate");
        let followed = trace();
        let status = session.attach(&log, &exit, 0, &*followed, &StopSignal::new()).await.expect("attach");
        assert_eq!(status.code, 3, "{how}");
        assert_eq!(text(&followed), format!("{}\nerr\n", "x".repeat(3 << 20)), "{how}: every byte, in order");
        // Nothing can read it again: a second follower is told so at once, not left waiting.
        let again = session.attach(&log, &exit, 0, &*trace(), &StopSignal::new()).await;
        match again {
            Err(RemoteError::Other(message)) => assert!(message.contains("followed once"), "{how}: {message}"),
            other => panic!("{how}: a second follower got {other:?}"),
        }

        // Cancel while the stage writes and nobody reads for a while: it ends, nothing stays.
        let (log, exit) = (path("01.log"), path("01.exit"));
        let script = "yes output; sleep 300\n";
        session.start_detached("sh", Some(script.as_bytes()), &log, &exit).await.expect("start");
        let pid = || std::fs::read_to_string(format!("{exit}.pid")).ok().and_then(|p| p.trim().parse::<i32>().ok());
        wait_until("the stage's leader is known", || pid().is_some()).await;
        let leader = pid().expect("pid");
        let (stop, followed) = (StopSignal::new(), trace());
        let attached = {
            let (session, stop, log, exit, followed) =
                (session.clone(), stop.clone(), log.clone(), exit.clone(), followed.clone());
            tokio::spawn(async move { session.attach(&log, &exit, 0, &*followed, &stop).await })
        };
        wait_until("the follower reads the stage's output", || !followed.contents().is_empty()).await;
        stop.stop(StopReason::Canceled);
        let result = attached.await.expect("task");
        assert!(matches!(result, Err(RemoteError::Canceled)), "{how}: {result:?}");
        wait_until("the cancelled stage is gone", || !running(leader)).await;
    }
}

/// One frame of the stage reaper's protocol (`connector::reaper`): a little-endian `u32`
/// length, then the bytes.
fn frame(bytes: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(bytes.len()).expect("small").to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

#[test]
fn the_stage_reaper_writes_exit_codes_while_its_runner_reads_none_of_its_messages() {
    use std::io::Write;
    use std::os::fd::{AsRawFd, OwnedFd};
    // A runner that stopped reading (SIGSTOP): the reaper's end of the socket gets the
    // smallest send buffer, so its unread `Started`/`Ended` messages fill it after a few
    // dozen commands.
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    let size: libc::c_int = 4096;
    // SAFETY: setsockopt reads `size` for its length; `theirs` is an open socket.
    let set = unsafe {
        libc::setsockopt(
            theirs.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            std::ptr::addr_of!(size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_SNDBUF");
    let mut reaper = std::process::Command::new(env!("CARGO_BIN_EXE_runway"))
        .arg("__stage-reaper")
        .stdin(std::process::Stdio::from(OwnedFd::from(theirs)))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the reaper");
    let dir = tempfile::tempdir().expect("tempdir");
    const COMMANDS: usize = 300;
    let path = |i: usize, ext: &str| dir.path().join(format!("{i}.{ext}")).display().to_string();
    let exits: Vec<(String, String)> = (0..COMMANDS).map(|i| (path(i, "log"), path(i, "exit"))).collect();
    for (i, (log, exit)) in exits.iter().enumerate() {
        std::fs::write(log, "").expect("log");
        let start = serde_json::json!({"Start": {
            "id": i, "program": "sh", "args": ["-c", format!("exit {}", i % 7)], "env": [], "cwd": null,
            "log": log, "exit": exit,
        }});
        let request = [frame(start.to_string().as_bytes()), frame(b"")].concat();
        ours.write_all(&request).expect("send a request");
    }
    let deadline = Instant::now() + WAIT;
    let written = |(log, exit): &(String, String)| marks::read_exit(log, exit).is_some_and(|t| t.ends_with(b"\n"));
    while !exits.iter().all(written) {
        let done = exits.iter().filter(|e| written(e)).count();
        assert!(Instant::now() < deadline, "{done} of {COMMANDS} exit codes written while the runner read nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, (log, exit)) in exits.iter().enumerate() {
        assert_eq!(marks::read_exit(log, exit).expect("exit"), format!("{}\n", i % 7).into_bytes());
    }
    // The runner goes away: the reaper, with nothing left running, ends too.
    drop(ours);
    let deadline = Instant::now() + WAIT;
    while reaper.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the reaper outlived its runner with no command left");
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn shell_host(root: &Path) -> PluginHost {
    PluginHost::new(HostSettings {
        plugins_dir: Some(root.to_path_buf()),
        // Compiled once for every test of this file (the cache is keyed by the wasm's hash and
        // written atomically), not once per test.
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("detached-stages-plugin-cache")),
        state_dir: None,
        grants: BTreeMap::new(),
        builtins: runway::plugin::builtin_plugins(),
        helper_image: None,
        stage_output: StageOutput::LogFiles,
    })
    .await
    .expect("plugin host starts")
}

async fn shell_session(host: &PluginHost, trace: Arc<JobTrace>) -> ExecutorSession {
    let plugin = host.executor("shell").expect("the built-in shell executor");
    let call = CallContext { trace: Some(trace), ..CallContext::default() };
    ExecutorSession::start(host, &plugin, call).await.expect("instantiates")
}

/// An instance executor session on a new SSH connection to `server`.
async fn instance_session(
    host: &PluginHost,
    trace: Arc<JobTrace>,
    server: &SshServer,
    key: &ClientKey,
) -> ExecutorSession {
    let spec = ConnectSpec {
        host: server.addr.to_string(),
        port: server.port,
        username: server.user.clone(),
        auth: SshAuth::Key { pem: key.private_pem.clone(), passphrase: None },
        keepalive: Some(Duration::from_secs(1)),
        timeout: Duration::from_secs(10),
        host_key: None,
        known_hosts: None,
    };
    let ssh = SshSession::connect(&spec).await.unwrap_or_else(|e| panic!("connect: {e}\n{}", server.log()));
    let plugin = host.executor("instance").expect("the built-in instance executor");
    let call = CallContext { trace: Some(trace), remote: Some(Arc::new(ssh)), ..CallContext::default() };
    ExecutorSession::start(host, &plugin, call).await.expect("instantiates")
}

/// The stage directories in builds directory `dir`.
fn stage_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("builds dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(".runway-stages"))
        .collect()
}

fn stage(name: &str, script: &str) -> Stage {
    Stage { name: name.into(), script: script.into(), predefined: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_shell_executor_reattaches_to_a_started_stage_instead_of_running_it_twice() {
    let root = tempfile::tempdir().expect("tempdir");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let host = shell_host(root.path()).await;
    let (runs, gate) = (root.path().join("runs"), root.path().join("gate"));
    let script = format!(
        "echo run >> {runs}\necho before\nwhile [ ! -e {gate} ]; do sleep 0.05; done\necho after\nexit 3\n",
        runs = runs.display(),
        gate = gate.display()
    );

    // Session 1 prepares, its state is stored, it starts the stage — and its manager dies.
    let first = trace();
    let mut session = shell_session(&host, first.clone()).await;
    session.prepare(&job(&work)).await.expect("prepares");
    let dirs = stage_dirs(&work);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(work.join(&dirs[0])).expect("stage dir").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the stage files are the runner user's alone");
    let state = session.state().await.expect("the shell executor has state");
    let running_stage = {
        let script = script.clone();
        tokio::spawn(async move { session.run(&stage("step_script", &script), StopSignal::new()).await })
    };
    wait_until("the stage printed", || first.contents() == b"before\n").await;
    running_stage.abort();
    let _ = running_stage.await;

    // Session 2 resumes from the stored state: the stage is followed, not started again.
    let second = restored(&first);
    let mut session = shell_session(&host, second.clone()).await;
    session.resume(&job(&work), &state).await.expect("resumes");
    let resumed_run = tokio::spawn(async move {
        let code = session.run(&stage("step_script", &script), StopSignal::new()).await;
        (session, code, script)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(&gate, "").expect("open the gate");
    let (mut session, code, script) = resumed_run.await.expect("task");
    assert_eq!(code.expect("the stage's exit code"), 3);
    assert_eq!(text(&second), "before\nafter\n");
    assert_eq!(std::fs::read_to_string(&runs).expect("runs"), "run\n", "the stage ran twice");

    // State taken after the stage started: a resumed run of it attaches to the finished stage.
    let state = session.state().await.expect("state");
    let third = restored(&second);
    let mut again = shell_session(&host, third.clone()).await;
    again.resume(&job(&work), &state).await.expect("resumes");
    assert_eq!(again.run(&stage("step_script", &script), StopSignal::new()).await.expect("runs"), 3);
    assert_eq!(text(&third), "before\nafter\n", "output was repeated");
    assert_eq!(std::fs::read_to_string(&runs).expect("runs"), "run\n", "the stage ran twice");
    // The next stage is a new one and runs.
    assert_eq!(again.run(&stage("after_script", "echo after_script"), StopSignal::new()).await.expect("runs"), 0);
    assert_eq!(text(&third), "before\nafter\nafter_script\n");

    again.cleanup().await;
    session.cleanup().await;
    assert_eq!(stage_dirs(&work), Vec::<String>::new(), "cleanup left stage files");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_after_resume_stops_the_stage_a_previous_manager_started() {
    let root = tempfile::tempdir().expect("tempdir");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let host = shell_host(root.path()).await;
    let pids = root.path().join("pids");
    let script = format!("sleep 300 & echo $! > {p}; sh -c 'echo $$ >> {p}; sleep 300'\n", p = pids.display());

    let first = trace();
    let mut session = shell_session(&host, first.clone()).await;
    session.prepare(&job(&work)).await.expect("prepares");
    let state = session.state().await.expect("state");
    let running_stage =
        tokio::spawn(async move { session.run(&stage("step_script", &script), StopSignal::new()).await });
    let count = || std::fs::read_to_string(&pids).map(|s| s.lines().count()).unwrap_or(0);
    wait_until("both children run", || count() == 2).await;
    running_stage.abort();
    let _ = running_stage.await;
    let pids: Vec<i32> =
        std::fs::read_to_string(&pids).expect("pids").lines().map(|l| l.trim().parse().expect("pid")).collect();
    assert!(pids.iter().all(|pid| running(*pid)), "the stage died with its manager");

    // The job cannot go on: a new manager resumes the environment only to clean it up.
    let mut session = shell_session(&host, restored(&first)).await;
    session.resume(&job(&work), &state).await.expect("resumes");
    session.cleanup().await;
    for pid in pids {
        assert!(!running(pid), "process {pid} of the abandoned stage survived the cleanup");
    }
    assert_eq!(stage_dirs(&work), Vec::<String>::new(), "cleanup left stage files");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_shell_stage_returns_canceled_and_the_environment_serves_on() {
    let root = tempfile::tempdir().expect("tempdir");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let host = shell_host(root.path()).await;
    let log = trace();
    let mut session = shell_session(&host, log.clone()).await;
    session.prepare(&job(&work)).await.expect("prepares");
    let stop = StopSignal::new();
    let stopper = {
        let (stop, log) = (stop.clone(), log.clone());
        tokio::spawn(async move {
            wait_until("the stage printed", || log.contents() == b"started\n").await;
            stop.stop(StopReason::Canceled);
        })
    };
    let result = session.run(&stage("step_script", "echo started; sleep 300"), stop).await;
    stopper.await.expect("stopper");
    assert!(matches!(result, Err(ExecutorFailure::Canceled)), "{result:?}");
    // after_script runs in the same environment after a cancel.
    let code = session.run(&stage("after_script", "echo cleaning up"), StopSignal::new()).await.expect("runs");
    assert_eq!(code, 0);
    assert_eq!(text(&log), "started\ncleaning up\n");
    session.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_instance_executor_reattaches_over_a_new_connection_instead_of_running_a_stage_twice() {
    let key = ClientKey::generate();
    let server = SshServer::start(std::net::Ipv4Addr::new(127, 0, 0, 5), &key);
    let root = tempfile::tempdir().expect("tempdir");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("mkdir");
    let host = shell_host(root.path()).await;
    let (runs, gate) = (root.path().join("runs"), root.path().join("gate"));
    let script = format!(
        "echo run >> {runs}\necho before\nwhile [ ! -e {gate} ]; do sleep 0.05; done\necho after\nexit 4\n",
        runs = runs.display(),
        gate = gate.display()
    );

    // The manager dies mid-stage, with its connection.
    let first = trace();
    let mut session = instance_session(&host, first.clone(), &server, &key).await;
    session.prepare(&job(&work)).await.expect("prepares");
    let state = session.state().await.expect("the instance executor has state");
    let running_stage = {
        let script = script.clone();
        tokio::spawn(async move { session.run(&stage("step_script", &script), StopSignal::new()).await })
    };
    wait_until("the stage printed", || first.contents() == b"before\n").await;
    running_stage.abort();
    let _ = running_stage.await;

    let second = restored(&first);
    let mut session = instance_session(&host, second.clone(), &server, &key).await;
    session.resume(&job(&work), &state).await.expect("resumes");
    let resumed_run = tokio::spawn(async move {
        let code = session.run(&stage("step_script", &script), StopSignal::new()).await;
        (session, code)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(&gate, "").expect("open the gate");
    let (session, code) = resumed_run.await.expect("task");
    assert_eq!(code.expect("the stage's exit code"), 4);
    assert_eq!(text(&second), "before\nafter\n");
    assert_eq!(std::fs::read_to_string(&runs).expect("runs"), "run\n", "the stage ran twice");
    session.cleanup().await;
    let left: Vec<_> =
        std::fs::read_dir(work.join(".runway-stages")).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "cleanup left stage files: {left:?}");
}
