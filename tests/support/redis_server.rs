//! Real Redis servers for tests: each `redis-server` listens on 127.0.0.1 on a free port, with
//! its own directory, no persistence, and is killed by PID when dropped (or stopped and
//! started again on the same port to play a restart). [`RedisServer::start_tls`] adds a TLS
//! port with a certificate from a test CA that `openssl` makes.

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One running `redis-server`.
pub(crate) struct RedisServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The TLS port and the CA certificate (PEM) that signed the server's, when started with TLS.
    pub tls: Option<(u16, PathBuf)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind").local_addr().expect("addr").port()
}

impl RedisServer {
    /// Start a server on a free port of 127.0.0.1 and wait until it answers `PING`.
    pub(crate) fn start() -> RedisServer {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let child = spawn(dir.path(), port, None);
        let mut server = RedisServer { dir, child: Some(child), port, tls: None };
        server.wait_ready();
        server
    }

    /// A server with a plain port and a TLS port; its certificate (for 127.0.0.1) is signed by
    /// a fresh test CA whose certificate is in `tls`.
    pub(crate) fn start_tls() -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = make_certificates(dir.path());
        let (port, tls_port) = (free_port(), free_port());
        let child = spawn(dir.path(), port, Some(tls_port));
        let mut server = RedisServer { dir, child: Some(child), port, tls: Some((tls_port, ca)) };
        server.wait_ready();
        server
    }

    /// `rediss://127.0.0.1:<tls port>/0`.
    pub(crate) fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("a TLS server");
        format!("rediss://127.0.0.1:{port}/0")
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The `owner` (a manager's system id) of `job`'s entry when this server is a Runway
    /// Redis job store.
    pub(crate) async fn job_owner(&self, job: i64) -> Option<String> {
        let client = redis::Client::open(self.url()).expect("redis url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("redis connection");
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("keys");
        for key in keys.clone() {
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.expect("type");
            if kind != "hash" {
                continue;
            }
            let meta: Option<String> =
                redis::cmd("HGET").arg(&key).arg("meta").query_async(&mut conn).await.expect("meta");
            if let Some(meta) = meta.and_then(|m| serde_json::from_str::<serde_json::Value>(&m).ok()) {
                if meta["job_id"].as_i64() == Some(job) {
                    let owner: Option<String> =
                        redis::cmd("HGET").arg(&key).arg("owner").query_async(&mut conn).await.expect("owner");
                    return owner.or_else(|| meta["owner"].as_str().map(str::to_string));
                }
            }
        }
        eprintln!("no entry for job {job} in Redis: {keys:?}");
        None
    }

    /// The server's pid (to kill it from a test).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kill the server (its data is gone: no persistence).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port.
    pub(crate) fn restart(&mut self) {
        self.stop();
        let tls_port = self.tls.as_ref().map(|(port, _)| *port);
        self.child = Some(spawn(self.dir.path(), self.port, tls_port));
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

fn spawn(dir: &Path, port: u16, tls_port: Option<u16>) -> Child {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no", "--dir"])
        .arg(dir);
    if let Some(tls_port) = tls_port {
        command.args(["--tls-port", &tls_port.to_string(), "--tls-auth-clients", "no"]);
        command.arg("--tls-cert-file").arg(dir.join("server.crt"));
        command.arg("--tls-key-file").arg(dir.join("server.key"));
        command.arg("--tls-ca-cert-file").arg(dir.join("ca.crt"));
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (apt-get install redis-server)")
}

/// A CA and a server certificate for 127.0.0.1 in `dir`; returns the CA certificate's path.
fn make_certificates(dir: &Path) -> PathBuf {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=runway test CA"],
        ]
        .concat(),
    );
    openssl(&[&["req"][..], &ec, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").expect("ext");
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    dir.join("ca.crt")
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
