//! Artifacts and caches on the `docker` and `docker-autoscaler` executors (issue 28): `runway
//! run` as a real process against the fake GitLab and the real `dockerd` this binary shares
//! (`support/dockerd.rs`), the predefined stages running in Runway's helper image, which
//! carries the runner's own binary at `/usr/local/bin/runway`. The job containers use
//! `network_mode = "host"`, so the helper reaches the fake GitLab and moto on 127.0.0.1.
//! `docker-autoscaler` runs the same jobs on a static fleet instance over a real OpenSSH
//! server (the instance's engine is the shared daemon, reached through the SSH connection).
//!
//! Every test numbers its jobs from its own base, so what the executor labels
//! `runway.job.id=<id>` is told apart on the one daemon.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/object_servers.rs"]
mod object_servers;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use dockerd::Dockerd;
use fake_gitlab::{FakeGitLab, JobRecord, JobSpec};
use object_servers::Server;
use runway_process::RunwayProcess;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(300);

static NEXT_BASE: AtomicI64 = AtomicI64::new(0);

fn job_id_base() -> i64 {
    500_000 + (std::process::id() as i64 % 1000) * 10_000 + NEXT_BASE.fetch_add(100, Ordering::SeqCst)
}

/// Where a runner runs its jobs.
enum Where<'a> {
    /// `executor = "docker"` on the shared daemon.
    Docker,
    /// `executor = "docker-autoscaler"`, one static instance behind this sshd.
    Autoscaler(&'a sshd::SshServer, &'a sshd::ClientKey),
}

struct World {
    fake: FakeGitLab,
    root: tempfile::TempDir,
    docker: &'static Dockerd,
}

async fn world() -> World {
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.set_next_job_id(job_id_base());
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    World { fake, root: tempfile::tempdir().expect("tempdir"), docker }
}

impl World {
    /// A started `runway run` with one runner (a new one at the fake) of `place`; `docker`
    /// lines go into `[runners.docker]`, `tail` after it (`[runners.cache]`, …).
    fn manager(&self, name: &str, place: &Where<'_>, docker: &str, tail: &str) -> RunwayProcess {
        let runner = self.fake.create_runner(name);
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("manager dir");
        let host = self.docker.host();
        let (executor, allow, autoscaler) = match place {
            Where::Docker => ("docker", format!("\"{host}\""), String::new()),
            Where::Autoscaler(server, key) => (
                "docker-autoscaler",
                format!("\"{host}\", \"instance\""),
                format!(
                    r#"  [runners.autoscaler]
  plugin = "static"
  capacity_per_instance = 2
  max_instances = 1
  update_interval = "1s"
  update_interval_when_expecting = "1s"
  [runners.autoscaler.plugin_config]
  hosts = ["{entry}"]
  [runners.autoscaler.connector_config]
  username = "{user}"
  key_path = "{key}"
  timeout = "10s"
  keepalive = "2s"
  [[runners.autoscaler.policy]]
  idle_count = 1
  idle_time = "60s"
"#,
                    entry = server.host_entry(),
                    user = server.user,
                    key = key.private_path.display(),
                ),
            ),
        };
        let config = format!(
            r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[plugins.docker]
allow_docker = [{allow}]

[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "{executor}"
  [runners.docker]
  host = "{host}"
  image = "{image}"
  pull_policy = ["if-not-present"]
  network_mode = "host"
{docker}
{autoscaler}
{tail}
"#,
            url = self.fake.url(),
            token = runner.token,
            image = self.docker.job_image(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        let mut process = RunwayProcess::new(dir).env_remove("DOCKER_HOST").quit_on_drop();
        process.start();
        process
    }

    async fn run(&self, manager: &RunwayProcess, spec: JobSpec) -> JobRecord {
        let id = self.fake.enqueue(self.fake.job_payload(&spec));
        match self.fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {id} did not finish; trace:\n{}\nrunway log:\n{}",
                self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                manager.log()
            ),
        }
    }
}

fn spec(name: &str, script: &[&str]) -> JobSpec {
    JobSpec::new("group/project", name, script).variable("GIT_STRATEGY", "clone")
}

fn succeeded(record: &JobRecord, manager: &RunwayProcess) {
    assert_eq!(
        record.final_state.as_deref(),
        Some("success"),
        "trace:\n{}\nrunway log:\n{}",
        record.trace_text(),
        manager.log()
    );
    assert!(!record.trace_text().contains("not supported by this executor"), "{}", record.trace_text());
    assert!(!record.trace_text().contains("is disabled"), "{}", record.trace_text());
}

/// The files of a zip, extracted with the runner's own extractor: relative path → contents.
fn zip_files(data: &[u8]) -> std::collections::BTreeMap<String, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("a.zip");
    std::fs::write(&file, data).expect("write zip");
    let into = dir.path().join("x");
    std::fs::create_dir_all(&into).expect("mkdir");
    runway::archive::extract_zip(&file, &into).expect("extracts");
    let mut out = std::collections::BTreeMap::new();
    collect(&into, &into, &mut out);
    out
}

fn collect(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(root, &path, out);
        } else {
            let rel = path.strip_prefix(root).expect("inside").display().to_string();
            out.insert(rel, std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
}

fn gunzip(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    child.stdin.take().expect("stdin").write_all(data).expect("write");
    String::from_utf8_lossy(&child.wait_with_output().expect("gzip output").stdout).into_owned()
}

/// Every `cache.zip` under `dir`.
fn cache_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            cache_files(&path, out);
        } else if path.file_name().is_some_and(|n| n == "cache.zip") {
            out.push(path);
        }
    }
}

/// Upload with reports, a dependency in a later job's container, a local cache hit, fallback
/// keys and `CACHE_FALLBACK_KEY`, a `pull` policy and `when: on_failure` artifacts.
async fn artifacts_and_caches(w: &World, manager: &RunwayProcess) {
    let cache = |key: &str| json!({"key": key, "paths": ["vendor/"]});
    let build = w
        .run(
            manager,
            spec(
                "build",
                &[
                    "mkdir -p out/sub vendor",
                    "echo a > out/a.txt",
                    "echo b > out/sub/b.txt",
                    "echo tmp > out/skip.tmp",
                    "echo '<testsuite/>' > report.xml",
                    "echo '{}' > gl-sast-report.json",
                    "echo cached > vendor/lib.txt",
                    "echo ignored > untracked.txt",
                ],
            )
            .artifacts(json!({
                "name": "build-$CI_JOB_ID",
                "paths": ["out/"],
                "exclude": ["out/*.tmp"],
                "untracked": true,
                "expire_in": "1 week",
            }))
            .artifacts(json!({"name": "junit.xml", "paths": ["report.xml"], "when": "always",
                              "artifact_type": "junit", "artifact_format": "gzip"}))
            .artifacts(json!({"name": "gl-sast-report.json", "paths": ["gl-sast-report.json"], "when": "always",
                              "artifact_type": "sast", "artifact_format": "raw"}))
            .artifacts(json!({"name": "only-on-failure", "paths": ["out/"], "when": "on_failure"}))
            .cache(cache("deps-$CI_COMMIT_REF_NAME")),
        )
        .await;
    succeeded(&build, manager);
    let trace = build.trace_text();
    assert!(trace.contains("Created cache"), "{trace}");
    let stored = w.fake.artifacts(build.id);
    assert_eq!(stored.len(), 3, "on_failure artifacts are not uploaded for a successful job: {stored:?}");
    assert_eq!((stored[0].artifact_type.as_str(), stored[0].format.as_str()), ("archive", "zip"));
    assert_eq!(stored[0].filename, format!("build-{}.zip", build.id));
    assert_eq!(stored[0].expire_in.as_deref(), Some("1 week"));
    let files = zip_files(&stored[0].data);
    assert_eq!(files.get("out/sub/b.txt").map(String::as_str), Some("b\n"), "{files:?}");
    assert!(files.contains_key("untracked.txt"), "untracked files: {files:?}");
    assert!(!files.contains_key("out/skip.tmp"), "excluded: {files:?}");
    assert_eq!((stored[1].artifact_type.as_str(), stored[1].format.as_str()), ("junit", "gzip"));
    assert_eq!(gunzip(&stored[1].data), "<testsuite/>\n");
    assert_eq!((stored[2].artifact_type.as_str(), stored[2].format.as_str()), ("sast", "raw"));
    assert_eq!(stored[2].data, b"{}\n");
    let upload = w.fake.requests_to("POST", &format!("/api/v4/jobs/{}/artifacts", build.id));
    assert_eq!(upload.first().and_then(|r| r.header("job-token")), Some(build.token.as_str()));

    // A later job, in a container of its own (its own build volume, a fresh clone): the
    // dependency's artifacts and the cache arrive.
    let test = w
        .run(
            manager,
            spec("test", &["cat out/a.txt", "cat vendor/lib.txt", "test ! -e out/skip.tmp"])
                .dependency(build.id)
                .cache(cache("deps-main")),
        )
        .await;
    succeeded(&test, manager);
    let trace = test.trace_text();
    assert!(trace.contains(&format!("Downloading artifacts for build ({})", build.id)), "{trace}");
    assert!(trace.contains("Successfully extracted cache"), "{trace}");
    let gets = w.fake.requests_to("GET", &format!("/api/v4/jobs/{}/artifacts", build.id));
    assert_eq!(gets.first().and_then(|r| r.header("job-token")), Some(test.token.as_str()));

    // A missing key falls back to fallback_keys, then to CACHE_FALLBACK_KEY.
    let mut entry = cache("feature-x");
    entry["fallback_keys"] = json!(["nothing-here", "deps-main"]);
    let fallback = w.run(manager, spec("fallback", &["cat vendor/lib.txt"]).cache(entry)).await;
    succeeded(&fallback, manager);
    let trace = fallback.trace_text();
    assert!(
        trace.contains("Checking cache for deps-main") && trace.contains("Successfully extracted cache"),
        "{trace}"
    );
    let global = w
        .run(
            manager,
            spec("global", &["cat vendor/lib.txt"]).cache(cache("other")).variable("CACHE_FALLBACK_KEY", "deps-main"),
        )
        .await;
    succeeded(&global, manager);

    // policy: pull never saves; a failed job uploads its on_failure artifacts.
    let mut pull = cache("pull-only");
    pull["policy"] = json!("pull");
    let failed = w
        .run(
            manager,
            spec("broken", &["mkdir -p out vendor", "echo partial > out/p.txt", "echo x > vendor/y", "exit 3"])
                .artifacts(json!({"paths": ["out/"], "when": "on_failure"}))
                .cache(pull),
        )
        .await;
    assert_eq!(failed.final_state.as_deref(), Some("failed"), "{}", failed.trace_text());
    let stored = w.fake.artifacts(failed.id);
    assert_eq!(stored.len(), 1, "{}", failed.trace_text());
    assert_eq!(zip_files(&stored[0].data).get("out/p.txt").map(String::as_str), Some("partial\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_moves_artifacts_and_caches_in_the_helper_container() {
    let w = world().await;
    // `[runners.docker] cache_dir`: the cache volume is a directory of this machine.
    let cache_dir = w.root.path().join("docker-cache");
    let manager = w.manager("docker", &Where::Docker, &format!("  cache_dir = \"{}\"", cache_dir.display()), "");
    artifacts_and_caches(&w, &manager).await;
    let mut files = Vec::new();
    cache_files(&cache_dir, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("group/project/deps-main/cache.zip")),
        "gitlab-runner's layout in the cache directory: {files:?}"
    );
    assert!(!files.iter().any(|f| f.to_string_lossy().contains("pull-only")), "{files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_autoscaler_moves_artifacts_and_caches_on_the_instance() {
    let w = world().await;
    let key = sshd::ClientKey::generate();
    let server = sshd::SshServer::start(Ipv4Addr::new(127, 0, 0, 41), &key);
    let manager = w.manager("autoscaler", &Where::Autoscaler(&server, &key), "", "");
    artifacts_and_caches(&w, &manager).await;
}

/// A bucket on moto, and `[runners.cache]` pointing at it with `Shared = true`.
async fn s3_cache(server: &Server, bucket: &str) -> String {
    let status = reqwest::Client::new().put(format!("{}/{bucket}", server.url())).send().await.expect("put").status();
    assert!(status.is_success(), "create bucket: {status}");
    format!(
        r#"  [runners.cache]
  Type = "s3"
  Shared = true
  [runners.cache.s3]
  ServerAddress = "127.0.0.1:{port}"
  AccessKey = "AKIDRUNWAYDOCKER"
  SecretKey = "runway-docker-secret-key"
  BucketName = "{bucket}"
  Insecure = true
"#,
        port = server.port
    )
}

/// Two runners with their own cache volumes share one S3 cache: what the first saves, the
/// second restores through a pre-signed URL. The helper container sees no credentials.
async fn s3_shared_by_two_runners(second: &Where<'_>) {
    let w = world().await;
    let moto = Server::moto();
    let cache = s3_cache(&moto, "docker-cache").await;
    let entry = json!({"key": "shared", "paths": ["vendor/"]});
    let first = w.manager("first", &Where::Docker, "", &cache);
    let saved =
        w.run(&first, spec("save", &["mkdir -p vendor", "echo from-s3 > vendor/lib.txt"]).cache(entry.clone())).await;
    succeeded(&saved, &first);
    drop(first);
    let listing = reqwest::get(format!("{}/docker-cache?list-type=2", moto.url()))
        .await
        .expect("list")
        .text()
        .await
        .expect("listing");
    assert!(listing.contains("/shared</Key>"), "the shared cache is in the bucket: {listing}");

    let other = w.manager("second", second, "", &cache);
    let restored = w.run(&other, spec("restore", &["cat vendor/lib.txt"]).cache(entry)).await;
    succeeded(&restored, &other);
    let trace = restored.trace_text();
    assert!(trace.contains("from-s3") && trace.contains("Successfully extracted cache"), "{trace}");
    for record in [&saved, &restored] {
        let trace = record.trace_text();
        assert!(!trace.contains("runway-docker-secret-key") && !trace.contains("AKIDRUNWAYDOCKER"), "{trace}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_cache_on_moto_is_shared_by_two_docker_runners() {
    s3_shared_by_two_runners(&Where::Docker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_cache_on_moto_is_shared_by_a_docker_and_a_docker_autoscaler_runner() {
    let key = sshd::ClientKey::generate();
    let server = sshd::SshServer::start(Ipv4Addr::new(127, 0, 0, 42), &key);
    s3_shared_by_two_runners(&Where::Autoscaler(&server, &key)).await;
}

/// The `info.features` of the job requests of `token`.
fn requested_features(fake: &FakeGitLab, token: &str) -> serde_json::Value {
    fake.requests_to("POST", "/api/v4/jobs/request")
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .find(|body| body["token"] == token)
        .map(|body| body["info"]["features"].clone())
        .unwrap_or(serde_json::Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_and_shell_runners_advertise_artifacts_and_caches() {
    let w = world().await;
    let docker = w.fake.create_runner("docker-features");
    let shell = w.fake.create_runner("shell-features");
    let dir = w.root.path().join("features");
    std::fs::create_dir_all(&dir).expect("dir");
    let config = format!(
        r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[plugins.docker]
allow_docker = ["{host}"]

[plugins.shell]
allow_process = true

[[runners]]
name = "docker"
url = "{url}"
token = "{docker}"
executor = "docker"
  [runners.docker]
  host = "{host}"
  image = "{image}"

[[runners]]
name = "shell"
url = "{url}"
token = "{shell}"
executor = "shell"
  [runners.shell]
  login = false
"#,
        host = w.docker.host(),
        url = w.fake.url(),
        docker = docker.token,
        shell = shell.token,
        image = w.docker.job_image(),
    );
    std::fs::write(dir.join("config.toml"), config).expect("config");
    let mut process = RunwayProcess::new(dir).env_remove("DOCKER_HOST").quit_on_drop();
    process.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let (mut d, mut s) = (serde_json::Value::Null, serde_json::Value::Null);
    while std::time::Instant::now() < deadline && (d.is_null() || s.is_null()) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        d = requested_features(&w.fake, &docker.token);
        s = requested_features(&w.fake, &shell.token);
    }
    assert!(!d.is_null() && !s.is_null(), "no job requests of both runners; log:\n{}", process.log());
    for feature in [
        "artifacts",
        "upload_multiple_artifacts",
        "upload_raw_artifacts",
        "artifacts_exclude",
        "fallback_cache_keys",
        "cache",
    ] {
        assert_eq!(d[feature], json!(true), "docker: {feature} in {d}");
        assert_eq!(s[feature], json!(true), "shell: {feature} in {s}");
    }
    assert_eq!((d["image"].clone(), s["image"].clone()), (json!(true), json!(false)), "{d} {s}");
    assert_eq!((d["services"].clone(), s["services"].clone()), (json!(true), json!(false)), "{d} {s}");
}
