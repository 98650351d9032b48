//! The SSH connector against real OpenSSH servers on loopback: authentication, commands with
//! streamed output, file transfer, detached commands that survive the connection, stopping
//! them, and dead servers.

#[path = "support/sshd.rs"]
mod sshd;
#[path = "support/wait.rs"]
mod wait;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runway::connector::{ConnectError, ConnectSpec, RemoteError, RemoteSession, SshAuth, SshSession};
use runway::stop::{StopReason, StopSignal};
use runway::trace::MemorySink;
use sshd::{ClientKey, SshServer};

const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn spec(server: &SshServer, key: &ClientKey) -> ConnectSpec {
    ConnectSpec {
        host: server.addr.to_string(),
        port: server.port,
        username: server.user.clone(),
        auth: SshAuth::Key { pem: key.private_pem.clone(), passphrase: None },
        keepalive: Some(Duration::from_secs(1)),
        timeout: Duration::from_secs(10),
        host_key: None,
        known_hosts: None,
    }
}

async fn connect(server: &SshServer, key: &ClientKey) -> SshSession {
    SshSession::connect(&spec(server, key)).await.unwrap_or_else(|e| panic!("connect: {e}\n{}", server.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_and_host_key_pinning() {
    let key = ClientKey::generate();
    let server = SshServer::start(ADDR, &key);
    let session = connect(&server, &key).await;
    assert!(session.host_key().starts_with("SHA256:"), "{}", session.host_key());

    let stranger = ClientKey::generate();
    match SshSession::connect(&spec(&server, &stranger)).await {
        Err(ConnectError::Auth { user, .. }) => assert_eq!(user, server.user),
        Err(other) => panic!("expected an authentication error, got {other}"),
        Ok(_) => panic!("an unknown key was accepted"),
    }

    let mut pinned = spec(&server, &key);
    pinned.host_key = Some(session.host_key().to_string());
    SshSession::connect(&pinned).await.expect("the pinned key matches");
    pinned.host_key = Some("SHA256:somethingelse".into());
    let error = SshSession::connect(&pinned).await.err().expect("a different host key is refused");
    assert!(matches!(error, ConnectError::HostKey { .. }), "{error}");
    assert!(error.to_string().contains("does not match"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_stream_output_and_return_exit_codes() {
    let key = ClientKey::generate();
    let server = SshServer::start(ADDR, &key);
    let session = connect(&server, &key).await;
    let trace = MemorySink::default();
    let status =
        session.run("echo one; echo two >&2; echo three; exit 7", None, &trace, &StopSignal::new()).await.expect("run");
    assert_eq!(status.code, 7);
    assert_eq!(trace.text(), "one\ntwo\nthree\n");
    let trace = MemorySink::default();
    let status =
        session.run("cat; kill -TERM $$", Some(b"from stdin\n"), &trace, &StopSignal::new()).await.expect("run");
    assert_eq!((status.code, status.signal), (143, Some(15)));
    assert_eq!(trace.text(), "from stdin\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_round_trip_with_mode_and_size_limit() {
    let key = ClientKey::generate();
    let server = SshServer::start(ADDR, &key);
    let session = connect(&server, &key).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sub dir/it's.bin");
    let path = path.to_str().expect("utf-8");
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    session.upload(path, &data, 0o750).await.expect("upload");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(path).expect("written").permissions().mode() & 0o777, 0o750);
    assert_eq!(session.download(path, 1 << 20).await.expect("download"), data);
    assert!(matches!(session.download(path, 1000).await, Err(RemoteError::TooLarge(1000))));
    assert!(matches!(session.download("/nonexistent/file", 10).await, Err(RemoteError::Other(_))));

    // Directories (`runway:host/files`): `mkdir -m`, `mkdir -p -m`, `rm -rf` over the session.
    let private = dir.path().join("private").display().to_string();
    session.make_dir(&private, 0o700, false).await.expect("a new directory");
    assert_eq!(std::fs::metadata(&private).expect("made").permissions().mode() & 0o7777, 0o700);
    assert!(
        matches!(session.make_dir(&private, 0o700, false).await, Err(RemoteError::Other(m)) if m.contains("private"))
    );
    let deep = dir.path().join("a/b c/d").display().to_string();
    session.make_dir(&deep, 0o751, true).await.expect("mkdir -p");
    assert_eq!(std::fs::metadata(&deep).expect("made").permissions().mode() & 0o7777, 0o751);
    session.make_dir(&deep, 0o700, true).await.expect("exists: no error");
    std::os::unix::fs::symlink(dir.path().join("sub dir"), dir.path().join("a/link")).expect("symlink");
    session.remove_all(&dir.path().join("a").display().to_string()).await.expect("rm -rf");
    assert!(!dir.path().join("a").exists());
    assert!(std::path::Path::new(path).exists(), "the link's target is untouched");
    session.remove_all(&dir.path().join("a").display().to_string()).await.expect("missing: no error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_commands_survive_the_connection_and_can_be_reattached() {
    let key = ClientKey::generate();
    let server = SshServer::start(ADDR, &key);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("stage.log").display().to_string();
    let exit = dir.path().join("stage.exit").display().to_string();
    let session = connect(&server, &key).await;
    let script = b"echo first; sleep 1; echo second; exit 3\n";
    session.start_detached("bash", Some(script), &log, &exit).await.expect("start");
    session.close().await;
    drop(session);

    // A new connection follows the whole log and gets the exit code.
    let session = connect(&server, &key).await;
    let trace = MemorySink::default();
    let status = session.attach(&log, &exit, 0, &trace, &StopSignal::new()).await.expect("attach");
    assert_eq!(status.code, 3);
    assert_eq!(trace.text(), "first\nsecond\n");
    // From an offset: only the rest, nothing twice.
    let trace = MemorySink::default();
    session.attach(&log, &exit, 6, &trace, &StopSignal::new()).await.expect("attach again");
    assert_eq!(trace.text(), "second\n");
}

/// Is `pid` a live process (not gone, not a zombie)?
fn alive(pid: i32) -> bool {
    // SAFETY: probing a pid with signal 0 has no effect.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')));
    exists && !zombie
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_an_attached_command_kills_its_process_group() {
    let key = ClientKey::generate();
    let server = SshServer::start(ADDR, &key);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("stage.log").display().to_string();
    let exit = dir.path().join("stage.exit").display().to_string();
    let marker = dir.path().join("child.pid");
    let session = Arc::new(connect(&server, &key).await);
    let script = format!("sleep 300 & echo $! > {}; echo started; wait\n", marker.display());
    let started = Instant::now();
    session.start_detached("bash", Some(script.as_bytes()), &log, &exit).await.expect("start");
    assert!(started.elapsed() < Duration::from_secs(60), "start_detached waited for the command");
    let stop = StopSignal::new();
    let attached = {
        let (session, stop, log, exit) = (session.clone(), stop.clone(), log.clone(), exit.clone());
        tokio::spawn(async move { session.attach(&log, &exit, 0, &MemorySink::default(), &stop).await })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&marker).is_ok_and(|p| !p.trim().is_empty()) {
        assert!(Instant::now() < deadline, "the detached command did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let child: i32 = std::fs::read_to_string(&marker).expect("pid").trim().parse().expect("pid number");
    stop.stop(StopReason::Canceled);
    let result = attached.await.expect("task");
    assert!(matches!(result, Err(RemoteError::Canceled)), "{result:?}");
    // Gone, or a zombie nobody has reaped yet (its parent was killed with it); the kill is
    // delivered by the time attach returns, the reaping is init's business.
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(child) {
        assert!(Instant::now() < deadline, "the background process of the stage survived the stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_servers_fail_fast_with_connection_errors() {
    let key = ClientKey::generate();
    let mut server = SshServer::start(ADDR, &key);
    let session = Arc::new(connect(&server, &key).await);
    let output = Arc::new(MemorySink::default());
    let running = {
        let (session, output) = (session.clone(), output.clone());
        tokio::spawn(async move { session.run("echo up; sleep 60", None, &*output, &StopSignal::new()).await })
    };
    wait::until("the command runs", wait::WAIT, || output.text().contains("up")).await;
    let started = Instant::now();
    server.kill();
    let result = tokio::time::timeout(Duration::from_secs(20), running).await.expect("exec returned").expect("task");
    assert!(matches!(result, Err(RemoteError::Connection(_))), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let error = SshSession::connect(&spec(&server, &key)).await.err().expect("nothing listens any more");
    assert!(matches!(error, ConnectError::Connect { .. }), "{error}");
}
