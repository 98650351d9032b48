//! Real object stores for the cache tests, each on a free port of 127.0.0.1 and killed by PID
//! when dropped: moto's S3 server (`moto_server`) and Azurite's blob service (`azurite-blob`).
//! Both must be installed (`.ci/run` installs them); a missing one fails the test.

#![allow(dead_code)]

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Azurite's well-known development account.
pub(crate) const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Its well-known key (published in Azurite's README; not a secret).
pub(crate) const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A server process, killed by PID on drop.
pub(crate) struct Server {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind").local_addr().expect("addr").port()
}

fn wait_listening(child: &mut Child, port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening on 127.0.0.1:{port}: {status}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what} is not listening on 127.0.0.1:{port} after 60 s");
}

fn spawn(program: &str, args: &[String], install: &str) -> (Child, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let child = Command::new(program)
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} ({e}): install it with `{install}`"));
    (child, dir)
}

impl Server {
    /// `moto_server -H 127.0.0.1 -p PORT`: a real S3 API (it does not check signatures).
    pub(crate) fn moto() -> Server {
        let port = free_port();
        let args = ["-H".to_string(), "127.0.0.1".into(), "-p".into(), port.to_string()];
        let (mut child, dir) = spawn("moto_server", &args, "pip install \"moto[server]\"");
        wait_listening(&mut child, port, "moto_server");
        Server { child, port, _dir: dir }
    }

    /// `azurite-blob` with its data in a temporary directory: checks SAS and SharedKey signatures.
    pub(crate) fn azurite() -> Server {
        Server::azurite_with(&[])
    }

    /// `azurite-blob` over HTTPS with `cert` and `key` (PEM) and `--oauth basic`: it also takes
    /// Entra ID bearer tokens (their `iss`, `aud` and lifetime checked, not their signature),
    /// answers Get User Delegation Key and checks user delegation SAS signatures.
    pub(crate) fn azurite_https(cert: &std::path::Path, key: &std::path::Path) -> Server {
        let extra = ["--cert".to_string(), cert.display().to_string(), "--key".into(), key.display().to_string()];
        Server::azurite_with(&[&extra[..], &["--oauth".to_string(), "basic".into()]].concat())
    }

    fn azurite_with(extra: &[String]) -> Server {
        let port = free_port();
        // Its data go to the working directory spawn makes (`--location .`).
        let args = [
            "--blobHost".to_string(),
            "127.0.0.1".into(),
            "--blobPort".into(),
            port.to_string(),
            "--location".into(),
            ".".into(),
            "--skipApiVersionCheck".into(),
            "--silent".into(),
        ];
        let args = [&args[..], extra].concat();
        let (mut child, dir) = spawn("azurite-blob", &args, "npm install -g azurite");
        wait_listening(&mut child, port, "azurite-blob");
        Server { child, port, _dir: dir }
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// moto: record every request from now on (`/moto-api/recorder/start-recording`).
    pub(crate) async fn moto_start_recording(&self) {
        let started = reqwest::Client::new().post(self.url() + "/moto-api/recorder/start-recording").send().await;
        assert!(started.is_ok_and(|r| r.status().is_success()), "moto records requests");
    }

    /// moto: the requests recorded since [`Server::moto_start_recording`], one JSON record each
    /// (`method`, `url`, `headers`, `body`, `body_encoded`).
    pub(crate) async fn moto_recording(&self) -> Vec<serde_json::Value> {
        let url = format!("{}/moto-api/recorder/download-recording", self.url());
        let text = reqwest::get(url).await.expect("recording").text().await.expect("recording body");
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// moto: the roles its STS handed out (`/moto-api/data.json`): role ARN, session name,
    /// session policy, access key and session token of each `AssumeRole`.
    pub(crate) async fn moto_assumed_roles(&self) -> Vec<serde_json::Value> {
        let data: serde_json::Value = reqwest::get(format!("{}/moto-api/data.json", self.url()))
            .await
            .expect("moto data")
            .json()
            .await
            .expect("JSON");
        data["sts"]["AssumedRole"].as_array().cloned().unwrap_or_default()
    }
}
