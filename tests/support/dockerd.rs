//! A real Docker Engine for tests: `dockerd` on its own unix socket with its own data root,
//! exec root and pid file under a short `/tmp/rwd-<test pid>-<n>/` (unix socket paths are
//! limited to 108 bytes), `--storage-driver vfs --iptables=false --bridge=none` (user-defined
//! networks still work), an address pool of its own and an empty daemon config, so it shares
//! nothing with a daemon of the machine or of another test binary. Stopped by PID (SIGTERM,
//! then SIGKILL), its mounts undone and its directory removed on drop.
//!
//! Starting a daemon and importing images costs seconds, so a test binary shares one:
//! [`shared`] starts it on first use and an exit hook stops it when the binary ends; a daemon
//! left by a binary that was killed is stopped and removed by the next one that starts.
//!
//! Images are made with `docker import` from root filesystems of this machine's files
//! ([`runway::connector::rootfs::RootfsBuilder`]): the job images, a service image with
//! `nc -lk PORT` and `EXPOSE PORT`, and Debian's `docker-registry` on 127.0.0.1 ([`Registry`])
//! for pulls. Nothing here reaches beyond 127.0.0.0/8.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use runway::connector::rootfs::RootfsBuilder;

/// The docker CLI of Debian's `docker.io` (speaks the daemon's API version).
const DOCKER_CLI: &str = "/usr/bin/docker";
const DOCKERD: &str = "/usr/sbin/dockerd";
const REGISTRY: &str = "/usr/bin/docker-registry";
/// Where the test daemons live: short, for the socket path limit.
const DIR_PREFIX: &str = "/tmp/rwd-";

/// The job image: bash, sh, coreutils, grep, sed, nc; `/etc/runway-image` says `job`.
pub(crate) const JOB_IMAGE: &str = "runway-test/job:1";
/// A second job image (`/etc/runway-image` says `other`), for `image:`.
pub(crate) const OTHER_IMAGE: &str = "runway-test/other:1";
/// The service image: `nc -lk SERVICE_PORT` as its command, `EXPOSE SERVICE_PORT`.
pub(crate) const SERVICE_IMAGE: &str = "runway-test/service:1";
/// The port the service image listens on.
pub(crate) const SERVICE_PORT: u16 = 7777;

/// Programs of the job image (besides bash and sh).
pub(crate) const JOB_PROGRAMS: &[&str] = &[
    "cat", "cp", "mv", "rm", "mkdir", "rmdir", "ls", "chmod", "ln", "touch", "dirname", "basename", "env", "sleep",
    "head", "tail", "sort", "wc", "tr", "cut", "date", "id", "mktemp", "printf", "test", "[", "true", "false", "seq",
    "yes", "grep", "sed", "nc", "stat", "uname", "find", "xargs", "tee", "timeout", "setsid",
];

/// One running `dockerd`.
pub(crate) struct Dockerd {
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    /// The daemon's socket.
    pub socket: PathBuf,
    /// Imports run one at a time, and each image once.
    imported: Mutex<BTreeSet<String>>,
    registry: OnceLock<Registry>,
    auth_registry: OnceLock<Registry>,
}

static SHARED: OnceLock<Dockerd> = OnceLock::new();

/// The daemon of this test binary, started on first use, stopped when the binary exits.
pub(crate) fn shared() -> &'static Dockerd {
    SHARED.get_or_init(|| {
        let daemon = Dockerd::start();
        // SAFETY: registering a plain function to run at exit.
        unsafe {
            libc::atexit(stop_shared);
        }
        daemon
    })
}

extern "C" fn stop_shared() {
    if let Some(daemon) = SHARED.get() {
        daemon.shutdown();
    }
}

/// Whether `pid` names a live process.
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

fn signal(pid: i32, sig: i32) {
    if pid > 0 {
        // SAFETY: signalling a process this test code started.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// SIGTERM, then SIGKILL after `grace`; true when the process is gone.
fn terminate(pid: i32, grace: Duration) -> bool {
    signal(pid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}

/// Processes whose command line names `dir` (the managed containerd and its shims, which a
/// daemon killed with SIGKILL leaves behind).
fn processes_under(dir: &Path) -> Vec<i32> {
    let needle = format!("{}/", dir.display());
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// Undo every mount under `dir` (deepest first): container shm, network namespaces.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<String> =
        info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|p| p.starts_with(&prefix)).map(String::from).collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        if let Ok(c) = std::ffi::CString::new(point) {
            // SAFETY: a valid C string; detaching a mount this test's daemon made.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// Stop what a daemon in `dir` left running (the daemon first, so it stops its containers,
/// then its containerd and shims), undo its mounts, remove the directory. Processes are found
/// by their command line naming `dir`, so a reused PID is never signalled.
fn tear_down(dir: &Path) {
    let is_dockerd = |pid: &i32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.starts_with(DOCKERD.as_bytes()) || c.starts_with(b"dockerd"))
            .unwrap_or(false)
    };
    let (daemons, others): (Vec<i32>, Vec<i32>) = processes_under(dir).into_iter().partition(is_dockerd);
    for pid in daemons {
        terminate(pid, Duration::from_secs(20));
    }
    for pid in others.into_iter().filter(|pid| alive(*pid)) {
        terminate(pid, Duration::from_secs(2));
    }
    unmount_under(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// Daemons of test binaries that died without their exit hook (killed): stop and remove them.
fn remove_stale_daemons() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(rest) = path.to_str().and_then(|p| p.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if !alive(owner) {
            tear_down(&path);
        }
    }
}

impl Dockerd {
    /// Start a daemon of its own and wait until `/_ping` answers.
    pub(crate) fn start() -> Dockerd {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        remove_stale_daemons();
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = PathBuf::from(format!("{DIR_PREFIX}{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("cli")).expect("daemon dir");
        std::fs::write(dir.join("daemon.json"), "{}\n").expect("daemon.json");
        let socket = dir.join("docker.sock");
        // An address pool of its own (10.<100..227>.0.0/16), so daemons of other test binaries
        // on this machine hand out other subnets for their job networks.
        let second = 100 + (std::process::id() as u64 * 31 + n as u64) % 128;
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("log");
        let namespace = format!("rw{}-{n}", std::process::id());
        let child = Command::new(DOCKERD)
            .arg("--host")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("dockerd.pid"))
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .args(["--storage-driver", "vfs", "--iptables=false", "--bridge=none", "--shutdown-timeout", "2"])
            .arg("--default-address-pool")
            .arg(format!("base=10.{second}.0.0/16,size=24"))
            .arg("--containerd-namespace")
            .arg(&namespace)
            .arg("--containerd-plugins-namespace")
            .arg(format!("{namespace}-plugins"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("dockerd starts (apt-get install docker.io)");
        let daemon = Dockerd {
            dir,
            child: Mutex::new(Some(child)),
            socket,
            imported: Mutex::default(),
            registry: OnceLock::new(),
            auth_registry: OnceLock::new(),
        };
        daemon.wait_ready();
        daemon
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok((200, body)) = self.api("GET", "/_ping", None) {
                if body == b"OK" {
                    return;
                }
            }
            let exited = self
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .map(|c| c.try_wait().ok().flatten().is_some());
            if exited == Some(true) {
                panic!("dockerd exited:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("dockerd did not answer /_ping within 60 s:\n{}", self.log());
    }

    /// `unix:///…/docker.sock`, as `[runners.docker] host`.
    pub(crate) fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The daemon's directory (data root, exec root, pid file, log).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the daemon wrote.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default()
    }

    /// The daemon's PID.
    pub(crate) fn pid(&self) -> i32 {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// The docker CLI against this daemon, with a config directory of its own.
    pub(crate) fn docker_cmd(&self) -> Command {
        let mut cmd = Command::new(DOCKER_CLI);
        cmd.env("DOCKER_CONFIG", self.dir.join("cli")).arg("--host").arg(self.host());
        cmd
    }

    /// Run the CLI with `args`; its output, whatever the exit status.
    pub(crate) fn docker(&self, args: &[&str]) -> Output {
        self.docker_cmd().args(args).stdin(Stdio::null()).output().expect("docker CLI runs")
    }

    /// Run the CLI with `args`, which must succeed; its stdout, trimmed.
    pub(crate) fn docker_ok(&self, args: &[&str]) -> String {
        let out = self.docker(args);
        assert!(out.status.success(), "docker {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Whether the daemon has an image (or container, by `inspect`) called `reference`.
    pub(crate) fn has_image(&self, reference: &str) -> bool {
        self.docker(&["image", "inspect", "--format", "{{.Id}}", reference]).status.success()
    }

    /// `docker import` the root filesystem of `rootfs` as `reference`, with Dockerfile
    /// `changes` (`CMD …`, `EXPOSE …`, `ENV …`).
    pub(crate) fn import(&self, reference: &str, rootfs: &RootfsBuilder, changes: &[&str]) {
        let tar = rootfs.build().unwrap_or_else(|e| panic!("root filesystem of {reference}: {e}"));
        let mut cmd = self.docker_cmd();
        cmd.arg("import");
        for change in changes {
            cmd.arg("--change").arg(change);
        }
        let mut child = cmd
            .arg("-")
            .arg(reference)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker import runs");
        let mut stdin = child.stdin.take().expect("stdin");
        let writer = std::thread::spawn(move || stdin.write_all(&tar.tar));
        let out = child.wait_with_output().expect("docker import");
        writer.join().expect("writer").expect("tar written to docker import");
        assert!(out.status.success(), "docker import {reference}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Import `reference` unless this daemon already has it (once per daemon, serialized).
    pub(crate) fn ensure_image(&self, reference: &str, make: impl FnOnce() -> (RootfsBuilder, Vec<String>)) {
        let mut imported = self.imported.lock().unwrap_or_else(|e| e.into_inner());
        if imported.contains(reference) || self.has_image(reference) {
            imported.insert(reference.to_string());
            return;
        }
        let (rootfs, changes) = make();
        let changes: Vec<&str> = changes.iter().map(String::as_str).collect();
        self.import(reference, &rootfs, &changes);
        imported.insert(reference.to_string());
    }

    /// [`JOB_IMAGE`], imported on first use; returns its reference.
    pub(crate) fn job_image(&self) -> &'static str {
        self.ensure_image(JOB_IMAGE, || (job_rootfs("job", JOB_PROGRAMS), Vec::new()));
        JOB_IMAGE
    }

    /// [`OTHER_IMAGE`], imported on first use; returns its reference.
    pub(crate) fn other_image(&self) -> &'static str {
        self.ensure_image(OTHER_IMAGE, || (job_rootfs("other", &["cat", "sleep", "ls", "mkdir", "rm"]), Vec::new()));
        OTHER_IMAGE
    }

    /// [`SERVICE_IMAGE`], imported on first use; returns its reference.
    pub(crate) fn service_image(&self) -> &'static str {
        self.ensure_image(SERVICE_IMAGE, || {
            let mut rootfs = RootfsBuilder::new();
            rootfs.base_system().expect("base system");
            for program in ["sh", "nc"] {
                rootfs.program(program).unwrap_or_else(|e| panic!("{e} (apt-get install netcat-openbsd)"));
            }
            let changes = vec![format!("CMD [\"nc\", \"-lk\", \"{SERVICE_PORT}\"]"), format!("EXPOSE {SERVICE_PORT}")];
            (rootfs, changes)
        });
        SERVICE_IMAGE
    }

    /// The local registry of this daemon, started on first use.
    pub(crate) fn registry(&self) -> &Registry {
        self.registry.get_or_init(|| Registry::start(&self.dir.join("registry")))
    }

    /// A second registry on the same storage as [`Dockerd::registry`] that asks for
    /// [`AUTH_USER`]/[`AUTH_PASSWORD`] (htpasswd): what the local registry holds can be pulled
    /// from it only with those credentials.
    pub(crate) fn auth_registry(&self) -> &Registry {
        self.registry();
        self.auth_registry
            .get_or_init(|| Registry::start_with(&self.dir.join("auth-registry"), Some(&self.dir.join("registry"))))
    }

    /// Push `image` to the local registry as `name` (`repo:tag`), then remove the local
    /// reference, so a job naming the returned reference has to pull it.
    pub(crate) fn push_to_registry(&self, image: &str, name: &str) -> String {
        let remote = format!("{}/{name}", self.registry().address());
        self.docker_ok(&["tag", image, &remote]);
        self.docker_ok(&["push", &remote]);
        self.docker_ok(&["rmi", &remote]);
        assert!(!self.has_image(&remote));
        remote
    }

    /// One Engine API request over the socket (HTTP/1.0, so the answer is not chunked):
    /// status and body.
    pub(crate) fn api(&self, method: &str, path: &str, body: Option<&[u8]>) -> std::io::Result<(u16, Vec<u8>)> {
        let mut stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: docker\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        let split = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| std::io::Error::other("no HTTP header end"))?;
        let status_line = String::from_utf8_lossy(&answer[..split]).lines().next().unwrap_or_default().to_string();
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok((status, answer[split + 4..].to_vec()))
    }

    /// A GET that must answer 200 with JSON.
    pub(crate) fn api_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.api("GET", path, None).expect("engine API");
        assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("JSON answer")
    }

    /// Containers (running or not) with the label `key` (or `key=value`).
    pub(crate) fn containers_labelled(&self, label: &str) -> Vec<serde_json::Value> {
        as_list(self.api_json(&format!("/containers/json?all=1&filters={}", label_filter(label))))
    }

    /// Networks with the label.
    pub(crate) fn networks_labelled(&self, label: &str) -> Vec<serde_json::Value> {
        as_list(self.api_json(&format!("/networks?filters={}", label_filter(label))))
    }

    /// Volumes with the label.
    pub(crate) fn volumes_labelled(&self, label: &str) -> Vec<serde_json::Value> {
        as_list(self.api_json(&format!("/volumes?filters={}", label_filter(label)))["Volumes"].take())
    }

    /// Stop the daemon by PID (SIGTERM, then SIGKILL), undo its mounts, remove its directory.
    pub(crate) fn shutdown(&self) {
        for registry in [self.registry.get(), self.auth_registry.get()].into_iter().flatten() {
            registry.stop();
        }
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            terminate(child.id() as i32, Duration::from_secs(20));
            let _ = child.wait();
        }
        tear_down(&self.dir);
    }
}

/// `docker events` of the containers created from its start on (every job's), kept in a file
/// until [`ContainerCreates::of_job`] reads them; the CLI is stopped on drop.
pub(crate) struct ContainerCreates {
    child: Child,
    file: PathBuf,
}

impl Dockerd {
    /// Start recording container creations, and wait until the CLI is subscribed (a first
    /// `ping` reaches the daemon after it).
    pub(crate) fn record_creates(&self, name: &str) -> ContainerCreates {
        let file = self.dir.join(format!("creates-{name}-{}.jsonl", std::process::id()));
        let out = std::fs::File::create(&file).expect("events file");
        let child = self
            .docker_cmd()
            .args(["events", "--filter", "type=container", "--filter", "event=create", "--format", "{{json .}}"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .expect("docker events runs");
        // The CLI subscribes within its first round trip; give it a moment.
        std::thread::sleep(Duration::from_millis(1500));
        ContainerCreates { child, file }
    }
}

impl ContainerCreates {
    /// The creation events of containers labelled `runway.job.id=<job>` so far.
    pub(crate) fn of_job(&self, job: i64) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.file).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["Actor"]["Attributes"]["runway.job.id"].as_str() == Some(job.to_string().as_str()))
            .collect()
    }

    /// The `runway.role` labels of the containers created for `job`, sorted.
    pub(crate) fn roles(&self, job: i64) -> Vec<String> {
        let mut roles: Vec<String> = self
            .of_job(job)
            .iter()
            .map(|e| e["Actor"]["Attributes"]["runway.role"].as_str().unwrap_or("?").to_string())
            .collect();
        roles.sort();
        roles
    }
}

impl Drop for ContainerCreates {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.file);
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn as_list(value: serde_json::Value) -> Vec<serde_json::Value> {
    match value {
        serde_json::Value::Array(items) => items,
        _ => Vec::new(),
    }
}

/// `{"label":["…"]}`, percent-encoded for a query.
fn label_filter(label: &str) -> String {
    let json = serde_json::json!({ "label": [label] }).to_string();
    json.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A job image: base system, bash, sh and `programs`, `/etc/runway-image` holding `marker`.
pub(crate) fn job_rootfs(marker: &str, programs: &[&str]) -> RootfsBuilder {
    let mut rootfs = RootfsBuilder::new();
    rootfs.base_system().expect("base system");
    for program in ["bash", "sh"].iter().chain(programs) {
        rootfs.program(program).unwrap_or_else(|e| panic!("job image: {e}"));
    }
    rootfs.file("/etc/runway-image", format!("{marker}\n"), 0o644).expect("marker");
    rootfs
}

/// The user [`Dockerd::auth_registry`] asks for.
pub(crate) const AUTH_USER: &str = "runway-puller";
/// Its password.
pub(crate) const AUTH_PASSWORD: &str = "pull-secret-password";

/// Debian's `docker-registry` on 127.0.0.1:<free port>, with its own storage and config.
pub(crate) struct Registry {
    dir: PathBuf,
    child: Mutex<Option<Child>>,
    port: u16,
}

impl Registry {
    /// Start a registry keeping its data under `dir`.
    pub(crate) fn start(dir: &Path) -> Registry {
        Registry::start_with(dir, None)
    }

    /// Start a registry with its config and log under `dir`; with `shared`, one that serves the
    /// storage of the registry under `shared` and asks for [`AUTH_USER`]/[`AUTH_PASSWORD`].
    pub(crate) fn start_with(dir: &Path, shared: Option<&Path>) -> Registry {
        std::fs::create_dir_all(dir.join("storage")).expect("registry dir");
        let storage = shared.unwrap_or(dir).join("storage");
        let auth = match shared {
            None => String::new(),
            Some(_) => {
                let hash = Command::new("python3")
                    .args([
                        "-W",
                        "ignore",
                        "-c",
                        &format!(
                            "import crypt; print(crypt.crypt({AUTH_PASSWORD:?}, crypt.mksalt(crypt.METHOD_BLOWFISH)))"
                        ),
                    ])
                    .output()
                    .expect("python3 makes the bcrypt hash");
                let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
                assert!(hash.starts_with("$2"), "bcrypt hash: {hash:?}");
                std::fs::write(dir.join("htpasswd"), format!("{AUTH_USER}:{hash}\n")).expect("htpasswd");
                format!("auth:\n  htpasswd:\n    realm: runway-test\n    path: {}\n", dir.join("htpasswd").display())
            }
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                storage.display()
            ),
        )
        .expect("registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("registry log");
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("docker-registry starts (apt-get install docker-registry)");
        let registry = Registry { dir: dir.to_path_buf(), child: Mutex::new(Some(child)), port };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = std::net::TcpStream::connect(("127.0.0.1", port))
                .and_then(|mut s| {
                    s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n")?;
                    let mut answer = String::new();
                    s.read_to_string(&mut answer)?;
                    let status = answer.split(' ').nth(1).unwrap_or_default();
                    Ok(status == "200" || (shared.is_some() && status == "401"))
                })
                .unwrap_or(false);
            if ok {
                return registry;
            }
            assert!(Instant::now() < deadline, "docker-registry did not start:\n{}", registry.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `127.0.0.1:PORT`.
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the registry wrote (its access log among it).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// How many times a manifest of `repository` was asked for (`HEAD` or `GET`): every pull
    /// resolves its tag so, even when the image is present.
    pub(crate) fn manifest_requests(&self, repository: &str) -> usize {
        let log = self.log();
        ["GET", "HEAD"].iter().map(|m| log.matches(&format!("\"{m} /v2/{repository}/manifests/")).count()).sum()
    }

    /// Stop by PID.
    pub(crate) fn stop(&self) {
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut child) = child {
            terminate(child.id() as i32, Duration::from_secs(5));
            let _ = child.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
