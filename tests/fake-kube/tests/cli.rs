//! The `fake-kube` program as a user starts it (no Docker Engine needed for this much): it
//! refuses a Docker host that is not a unix socket with a clear message, writes a kubeconfig
//! naming its address, CA and token once it listens, and exits cleanly on SIGTERM. The API
//! and the kubelet are driven by kubectl in the workspace's tests/fake_kube.rs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fake-kube");

#[test]
fn a_docker_host_that_is_not_a_unix_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--docker-host", "tcp://127.0.0.1:2375", "--kubeconfig-out"])
        .arg(dir.path().join("kc"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--docker-host must be unix:///absolute/path"), "{stderr}");
    assert!(!dir.path().join("kc").exists());
}

#[test]
fn writes_its_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kc");
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--docker-host", "unix:///nonexistent/docker.sock", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        assert!(Instant::now() < deadline, "no kubeconfig");
        std::thread::sleep(Duration::from_millis(20));
    }
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(&kubeconfig).unwrap()).unwrap();
    assert_eq!(config["current-context"], "fake-kube");
    let server = config["clusters"][0]["cluster"]["server"].as_str().unwrap();
    let port: u16 = server.strip_prefix("https://127.0.0.1:").unwrap().parse().unwrap();
    assert!(port > 0);
    assert!(config["clusters"][0]["cluster"]["certificate-authority-data"].as_str().is_some_and(|c| c.len() > 100));
    assert!(config["users"][0]["user"]["token"].as_str().is_some_and(|t| t.len() >= 32));
    // It listens on that port.
    std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "fake-kube did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!dir.path().join("state").exists(), "its state directory is removed");
}
