//! Real OpenSSH servers for tests: each `sshd` listens on its own loopback address and port
//! with a freshly generated host key, accepts one generated client key, and is killed by PID
//! when dropped.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// A client key pair (ed25519) in a directory of its own.
pub(crate) struct ClientKey {
    _dir: tempfile::TempDir,
    pub private_path: PathBuf,
    pub private_pem: Vec<u8>,
    pub public_line: String,
}

impl ClientKey {
    pub(crate) fn generate() -> ClientKey {
        let dir = tempfile::tempdir().expect("tempdir");
        let private_path = dir.path().join("id_ed25519");
        keygen(&private_path);
        let private_pem = std::fs::read(&private_path).expect("private key");
        let public_line = std::fs::read_to_string(dir.path().join("id_ed25519.pub")).expect("public key");
        ClientKey { _dir: dir, private_path, private_pem, public_line }
    }
}

fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .expect("ssh-keygen runs");
    assert!(status.success(), "ssh-keygen failed");
}

/// The user tests log in as (the one running them).
pub(crate) fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().expect("id");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A port free on `addr` right now.
pub(crate) fn free_port(addr: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind((addr, 0)).expect("bind").local_addr().expect("addr").port()
}

/// One running `sshd`.
pub(crate) struct SshServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    pub addr: Ipv4Addr,
    pub port: u16,
    pub user: String,
}

impl SshServer {
    /// Start `sshd` on `addr` (127.0.0.x) accepting `key`.
    pub(crate) fn start(addr: Ipv4Addr, key: &ClientKey) -> SshServer {
        Self::start_on(addr, free_port(addr), key)
    }

    /// Start on a given port (to bring an instance back at the same address).
    pub(crate) fn start_on(addr: Ipv4Addr, port: u16, key: &ClientKey) -> SshServer {
        Self::start_on_many(&[addr], port, key)
    }

    /// One `sshd` listening on `port` of every address in `addrs` (all 127.x.y.z, at most 16:
    /// sshd's MAX_LISTEN_SOCKS): the
    /// instances of a cloud fake whose addresses are handed out from a loopback range.
    pub(crate) fn start_on_many(addrs: &[Ipv4Addr], port: u16, key: &ClientKey) -> SshServer {
        Self::start_on_many_with(addrs, port, key, "")
    }

    /// As [`SshServer::start_on_many`], with `extra` lines appended to `sshd_config`.
    pub(crate) fn start_on_many_with(addrs: &[Ipv4Addr], port: u16, key: &ClientKey, extra: &str) -> SshServer {
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.is_loopback()), "tests only listen on loopback");
        let addr = addrs[0];
        let listen: String = addrs.iter().map(|a| format!("ListenAddress {a}:{port}\n")).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let host_key = dir.path().join("host_ed25519");
        keygen(&host_key);
        let authorized = dir.path().join("authorized_keys");
        std::fs::write(&authorized, &key.public_line).expect("authorized_keys");
        let config = dir.path().join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "{listen}HostKey {}\nPidFile {}\nAuthorizedKeysFile {}\nStrictModes no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin yes\n\
                 PrintMotd no\nLogLevel ERROR\nMaxStartups 100\nMaxSessions 100\nClientAliveInterval 0\n{extra}",
                host_key.display(),
                dir.path().join("sshd.pid").display(),
                authorized.display()
            ),
        )
        .expect("sshd_config");
        std::fs::create_dir_all("/run/sshd").expect("privilege separation directory");
        let log = std::fs::File::create(dir.path().join("sshd.log")).expect("log");
        let child = Command::new(SSHD)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("sshd starts (apt-get install openssh-server)");
        let server = SshServer { dir, child: Some(child), addr, port, user: current_user() };
        server.wait_listening();
        server
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&SocketAddr::from((self.addr, self.port)), Duration::from_millis(200)).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sshd on {}:{} did not start: {}", self.addr, self.port, self.log());
    }

    /// `addr:port`, as a static fleet host entry.
    pub(crate) fn host_entry(&self) -> String {
        format!("{}:{}", self.addr, self.port)
    }

    /// The server's host key as a `known_hosts` line (`[addr]:port ssh-ed25519 …`).
    pub(crate) fn known_hosts_line(&self) -> String {
        let public = std::fs::read_to_string(self.dir.path().join("host_ed25519.pub")).expect("host public key");
        let mut fields = public.split_whitespace();
        let (kind, key) = (fields.next().unwrap_or_default(), fields.next().unwrap_or_default());
        format!("[{}]:{} {kind} {key}\n", self.addr, self.port)
    }

    /// What sshd wrote.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    /// Kill sshd and every session it serves (as a crashed or vanished machine would), by PID.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id();
            // Session processes are children of the listener.
            let _ = Command::new("pkill").args(["-KILL", "-P", &pid.to_string()]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        self.kill();
    }
}
