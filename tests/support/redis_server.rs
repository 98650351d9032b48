//! Real Redis servers for tests: each `redis-server` listens on 127.0.0.1 on a free port, with
//! its own directory, no persistence, and is killed by PID when dropped (or stopped and
//! started again on the same port to play a restart).

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One running `redis-server`.
pub struct RedisServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl RedisServer {
    /// Start a server on a free port of 127.0.0.1 and wait until it answers `PING`.
    pub fn start() -> RedisServer {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind").local_addr().expect("addr").port();
        let dir = tempfile::tempdir().expect("tempdir");
        let child = spawn(dir.path(), port);
        let mut server = RedisServer { dir, child: Some(child), port };
        server.wait_ready();
        server
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The server's pid (to kill it from a test).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kill the server (its data is gone: no persistence).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn(self.dir.path(), self.port));
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if ping(self.port) {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("redis-server exited at start: {status}");
                }
            }
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer PING", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn(dir: &Path, port: u16) -> Child {
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (apt-get install redis-server)")
}

/// Does a server on `port` answer `PING` with `+PONG`?
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
