//! The request bodies, names, filters, script archive and health-check command of
//! `docker-logic` against a real Docker Engine: a `dockerd` this test starts on its own socket
//! and data directory (`--storage-driver vfs --iptables=false --bridge=none`), stopped by PID;
//! images from this machine's files through `docker import`. Skipped (with a message) where
//! `dockerd`, the docker CLI or root are missing. Nothing leaves 127.0.0.0/8.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use docker_logic::archive::{demux_logs, script_archive};
use docker_logic::config::parse;
use docker_logic::names;
use docker_logic::spec::{self, create_body, ContainerSpec, Role};
use docker_logic::volumes::plan_mounts;
use serde_json::Value;

const DOCKERD: &str = "/usr/sbin/dockerd";
const DOCKER: &str = "/usr/bin/docker";
const IMAGE: &str = "runway-logic-test/job:1";
const SERVICE_IMAGE: &str = "runway-logic-test/service:1";

/// A dockerd of this test, stopped (SIGTERM, then SIGKILL) and removed on drop.
struct Daemon {
    dir: PathBuf,
    child: Child,
}

impl Daemon {
    fn socket(&self) -> PathBuf {
        self.dir.join("d.sock")
    }

    fn start() -> Daemon {
        let dir = PathBuf::from(format!("/tmp/rwl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("daemon.json"), "{}\n").unwrap();
        let child = Command::new(DOCKERD)
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--host")
            .arg(format!("unix://{}", dir.join("d.sock").display()))
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("d.pid"))
            .args(["--storage-driver", "vfs", "--iptables=false", "--bridge=none"])
            .args(["--default-address-pool", "base=10.219.0.0/16,size=24"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .unwrap();
        let daemon = Daemon { dir, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if UnixStream::connect(daemon.socket()).is_ok() && request(&daemon, "GET", "/_ping", None, "").0 == 200 {
                return daemon;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("dockerd did not answer; see {}/dockerd.log", daemon.dir.display());
    }

    fn docker(&self, args: &[&str], stdin: Option<Vec<u8>>) {
        let mut child = Command::new(DOCKER)
            .env("DOCKER_HOST", format!("unix://{}", self.socket().display()))
            .env("DOCKER_CONFIG", self.dir.join("cli"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(data) = stdin {
            input.write_all(&data).unwrap();
        }
        drop(input);
        assert!(child.wait().unwrap().success(), "docker {args:?}");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = Command::new("umount").arg("-R").arg(self.dir.join("data")).stderr(Stdio::null()).status();
        let _ = Command::new("umount").arg("-R").arg(self.dir.join("exec")).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One HTTP/1.1 request over the daemon's socket: status and (de-chunked) body.
fn request(daemon: &Daemon, method: &str, path: &str, body: Option<&[u8]>, content_type: &str) -> (u16, Vec<u8>) {
    let mut stream = UnixStream::connect(daemon.socket()).unwrap();
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} /v1.41{path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, rest.to_vec());
    }
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return (status, out);
        }
        out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 4 + size..];
    }
}

fn json(daemon: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes());
    let (status, answer) = request(daemon, method, path, bytes.as_deref(), "application/json");
    (status, serde_json::from_slice(&answer).unwrap_or(Value::Null))
}

fn query(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// A root filesystem (as a tar) with `programs` and the libraries they load.
fn rootfs(programs: &[&str]) -> Option<Vec<u8>> {
    let root = std::env::temp_dir().join(format!("rwl-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["bin", "usr/bin", "tmp", "etc"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let copy = |path: &Path| {
        let target = root.join(path.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(path, &target).unwrap();
    };
    for program in programs {
        let path = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(program)).find(|p| p.exists())?;
        let real = std::fs::canonicalize(&path).unwrap();
        copy(&real);
        let _ = std::os::unix::fs::symlink(&real, root.join("bin").join(program));
        let ldd = Command::new("ldd").arg(&real).output().ok()?;
        for lib in String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|w| w.starts_with('/')) {
            copy(&std::fs::canonicalize(lib).unwrap());
            let link = root.join(lib.trim_start_matches('/'));
            if !link.exists() {
                std::fs::create_dir_all(link.parent().unwrap()).unwrap();
                let _ = std::os::unix::fs::symlink(std::fs::canonicalize(lib).unwrap(), link);
            }
        }
    }
    let out = Command::new("tar").arg("-C").arg(&root).args(["-c", "."]).output().ok()?;
    let _ = std::fs::remove_dir_all(&root);
    Some(out.stdout)
}

fn usable() -> bool {
    let root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if !(root && Path::new(DOCKERD).exists() && Path::new(DOCKER).exists()) {
        eprintln!("skipped: needs root, {DOCKERD} and {DOCKER}");
        return false;
    }
    true
}

#[test]
fn a_job_on_a_real_engine() {
    if !usable() {
        return;
    }
    let Some(tar) = rootfs(&["bash", "sh", "cat", "ls", "sleep", "nc", "id"]) else {
        eprintln!("skipped: bash, sh, coreutils and nc are needed for the test images");
        return;
    };
    let daemon = Daemon::start();
    daemon.docker(&["import", "-c", "ENV PATH=/usr/bin:/bin", "-", IMAGE], Some(tar.clone()));
    daemon.docker(
        &[
            "import",
            "-c",
            "ENV PATH=/usr/bin:/bin",
            "-c",
            "EXPOSE 7777",
            "-c",
            r#"CMD ["nc", "-lk", "-p", "7777"]"#,
            "-",
            SERVICE_IMAGE,
        ],
        Some(tar),
    );
    let config = parse(
        r#"{"memory": "256m", "cpus": "1", "hostname": "ci", "ulimit": {"nofile": "1024:2048"}, "volumes": ["/data"]}"#,
    )
    .unwrap()
    .config;
    let (job, suffix) = (7, "0123abcd");
    let prefix = names::job_prefix(job, suffix);
    let labels = names::job_labels(job, suffix, "");

    // The job's network (a second create is a conflict the executor tolerates) and volumes.
    assert_eq!(json(&daemon, "POST", "/networks/create", Some(&spec::network_body(&prefix, &labels))).0, 201);
    assert_eq!(json(&daemon, "POST", "/networks/create", Some(&spec::network_body(&prefix, &labels))).0, 409);
    let plan = plan_mounts(&config, &prefix, "group/project", "/builds", "/cache");
    for (name, _) in &plan.volumes {
        assert_eq!(json(&daemon, "POST", "/volumes/create", Some(&spec::volume_body(name, &labels))).0, 201);
    }

    // A service with host names, waited for; a wait for a host that is not there times out.
    let service = names::service_container(&prefix, 0, "db");
    let body = create_body(
        &ContainerSpec {
            image: SERVICE_IMAGE.into(),
            cmd: Vec::new(),
            entrypoint: None,
            env: vec!["SERVICE_VAR=1".into()],
            user: String::new(),
            working_dir: String::new(),
            labels: names::job_labels(job, suffix, "service"),
            binds: plan.binds.clone(),
            network: prefix.clone(),
            aliases: vec!["db".into(), "database".into()],
            links: Vec::new(),
            role: Role::Service,
        },
        &config,
    );
    assert_eq!(json(&daemon, "POST", &format!("/containers/create?name={service}"), Some(&body)).0, 201);
    assert_eq!(json(&daemon, "POST", &format!("/containers/{service}/start"), None).0, 204);
    let (_, inspect) = json(&daemon, "GET", &format!("/containers/{service}/json"), None);
    let ports = spec::exposed_tcp_ports(&inspect);
    assert_eq!(ports, vec![7777]);
    for (host, timeout, expected) in [("database", 20, 0), ("nothere", 2, 1)] {
        let (cmd, env) = spec::wait_command(host, &ports, timeout);
        let body = create_body(
            &ContainerSpec {
                image: IMAGE.into(),
                cmd,
                entrypoint: None,
                env,
                user: String::new(),
                working_dir: String::new(),
                labels: names::job_labels(job, suffix, "wait"),
                binds: Vec::new(),
                network: prefix.clone(),
                aliases: Vec::new(),
                links: Vec::new(),
                role: Role::Wait,
            },
            &config,
        );
        let (status, created) =
            json(&daemon, "POST", &format!("/containers/create?name={service}-{host}"), Some(&body));
        assert_eq!(status, 201, "{created}");
        let id = created["Id"].as_str().unwrap().to_string();
        assert_eq!(json(&daemon, "POST", &format!("/containers/{id}/start"), None).0, 204);
        let (_, waited) = json(&daemon, "POST", &format!("/containers/{id}/wait"), None);
        assert_eq!(waited["StatusCode"], expected, "health check of {host}");
    }

    // A stage: created stopped, the script uploaded, started, waited for; output and exit code.
    let stage = names::stage_container(&prefix, "step_script");
    let body = create_body(
        &ContainerSpec {
            image: IMAGE.into(),
            cmd: spec::stage_command(),
            entrypoint: None,
            env: Vec::new(),
            user: String::new(),
            working_dir: "/builds".into(),
            labels: names::job_labels(job, suffix, "stage"),
            binds: plan.binds.clone(),
            network: prefix.clone(),
            aliases: vec!["build".into()],
            links: Vec::new(),
            role: Role::Build,
        },
        &config,
    );
    let (status, created) = json(&daemon, "POST", &format!("/containers/create?name={stage}"), Some(&body));
    assert_eq!(status, 201, "{created}");
    let id = created["Id"].as_str().unwrap().to_string();
    let (_, inspect) = json(&daemon, "GET", &format!("/containers/{stage}/json"), None);
    assert_eq!(inspect["State"]["Status"], "created");
    let script = "echo \"shell=$0\"; echo host=$(cat /etc/hostname); ulimit -n; pwd; echo kept > /cache/f; \
                  echo data > /data/f; (exec 3<>/dev/tcp/db/7777) && echo db-answers; exit 3\n";
    let archive = script_archive(script.as_bytes()).unwrap();
    let (status, _) =
        request(&daemon, "PUT", &format!("/containers/{id}/archive?path=/"), Some(&archive), "application/x-tar");
    assert_eq!(status, 200);
    assert_eq!(json(&daemon, "POST", &format!("/containers/{id}/start"), None).0, 204);
    let (_, waited) = json(&daemon, "POST", &format!("/containers/{id}/wait"), None);
    assert_eq!(waited["StatusCode"], 3);
    let (_, logs) = request(&daemon, "GET", &format!("/containers/{id}/logs?stdout=1&stderr=1"), None, "");
    let logs = demux_logs(&logs);
    for line in ["shell=/usr/bin/bash", "host=ci", "1024", "/builds", "db-answers"] {
        assert!(logs.lines().any(|l| l == line), "{line:?} not in {logs:?}");
    }

    // Cleanup by label: every container, the network, the job's volumes; the caches stay.
    let filter = query(&names::job_filter(job, suffix));
    let (_, containers) = json(&daemon, "GET", &format!("/containers/json?all=1&filters={filter}"), None);
    assert_eq!(containers.as_array().unwrap().len(), 4, "service, two health checks, stage");
    for c in containers.as_array().unwrap() {
        let id = c["Id"].as_str().unwrap();
        assert_eq!(json(&daemon, "DELETE", &format!("/containers/{id}?force=1&v=1"), None).0, 204);
    }
    assert_eq!(json(&daemon, "DELETE", &format!("/networks/{prefix}"), None).0, 204);
    let (_, volumes) = json(&daemon, "GET", &format!("/volumes?filters={filter}"), None);
    let volumes: Vec<&str> =
        volumes["Volumes"].as_array().unwrap().iter().map(|v| v["Name"].as_str().unwrap()).collect();
    assert!(volumes.contains(&names::build_volume(&prefix).as_str()), "{volumes:?}");
    assert_eq!(json(&daemon, "GET", "/images/runway-logic-test/missing:1/json", None).0, 404);
}
