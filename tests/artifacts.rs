//! Artifacts and caches end to end: `runway run` as a real process against the fake GitLab
//! (which stores uploads, serves downloads with job tokens and can redirect them to its
//! object store), the shell executor running the helper commands of this very binary, and
//! the instance executor over a real OpenSSH server, where the runner copies its helper.

#[path = "support/object_servers.rs"]
mod object_servers;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fake_gitlab::{Endpoint, FakeGitLab, InjectedResponse, JobRecord, JobSpec};
use runway_process::RunwayProcess;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

struct Harness {
    fake: FakeGitLab,
    root: tempfile::TempDir,
    process: RunwayProcess,
}

impl Harness {
    /// A fake GitLab with `group/project`, and `runway run` with one shell runner whose
    /// `[[runners]]` entry gets `extra` lines.
    async fn shell(extra: &str) -> Harness {
        Harness::shell_with_env(extra, &[]).await
    }

    /// [`Harness::shell`] with `env` in the runner's environment.
    async fn shell_with_env(extra: &str, env: &[(&str, &str)]) -> Harness {
        let fake =
            FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
                .await;
        let runner = fake.create_runner("artifacts");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n"), (".gitignore", "ignored.txt\n")], "init");
        let root = tempfile::tempdir().expect("tempdir");
        let config = format!(
            r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[plugins.shell]
allow_process = true

[[runners]]
name = "artifacts"
url = "{url}"
token = "{token}"
executor = "shell"
builds_dir = "{builds}"
cache_dir = "{cache}"
{extra}
  [runners.shell]
  login = false
"#,
            url = fake.url(),
            token = runner.token,
            builds = root.path().join("builds").display(),
            cache = root.path().join("cache").display(),
        );
        std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
        let mut process = RunwayProcess::new(root.path().to_path_buf());
        for (key, value) in env {
            process = process.env(key, value);
        }
        process.start();
        Harness { fake, root, process }
    }

    fn cache_dir(&self) -> PathBuf {
        self.root.path().join("cache")
    }

    async fn run(&self, spec: JobSpec) -> JobRecord {
        let id = self.fake.enqueue(self.fake.job_payload(&spec));
        self.finished(id).await
    }

    async fn finished(&self, id: i64) -> JobRecord {
        match self.fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {id} did not finish; trace:\n{}\nrunway log:\n{}",
                self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                self.process.log()
            ),
        }
    }
}

fn spec(name: &str, script: &[&str]) -> JobSpec {
    JobSpec::new("group/project", name, script)
}

fn succeeded(record: &JobRecord) {
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{}", record.trace_text());
}

/// The files of a zip, extracted with the runner's own extractor, as relative path → contents.
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

#[tokio::test(flavor = "multi_thread")]
async fn artifacts_are_uploaded_with_paths_globs_excludes_reports_and_when() {
    let h = Harness::shell("").await;
    let record = h
        .run(
            spec(
                "build",
                &[
                    "mkdir -p out/sub logs",
                    "echo a > out/a.txt",
                    "echo b > out/sub/b.txt",
                    "echo tmp > out/skip.tmp",
                    "echo l > logs/x.log",
                    "echo ignored > ignored.txt",
                    "echo '<testsuite/>' > report.xml",
                    "echo '{}' > gl-sast-report.json",
                ],
            )
            .artifacts(json!({
                "name": "build-$CI_JOB_ID",
                "paths": ["out/", "**/*.log"],
                "exclude": ["out/*.tmp"],
                "expire_in": "1 week",
            }))
            .artifacts(json!({"name": "junit.xml", "paths": ["report.xml"], "when": "always",
                              "artifact_type": "junit", "artifact_format": "gzip"}))
            .artifacts(json!({"name": "gl-sast-report.json", "paths": ["gl-sast-report.json"], "when": "always",
                              "artifact_type": "sast", "artifact_format": "raw"}))
            .artifacts(json!({"name": "only-on-failure", "paths": ["out/"], "when": "on_failure",
                              "artifact_type": "archive"})),
        )
        .await;
    succeeded(&record);
    let trace = record.trace_text();
    assert!(trace.contains("upload_artifacts_on_success"), "{trace}");
    assert!(!trace.contains("upload_artifacts_on_failure"), "{trace}");
    let stored = h.fake.artifacts(record.id);
    assert_eq!(stored.len(), 3, "on_failure artifacts are not uploaded for a successful job: {stored:?}");
    let archive = &stored[0];
    assert_eq!((archive.artifact_type.as_str(), archive.format.as_str()), ("archive", "zip"));
    assert_eq!(archive.filename, format!("build-{}.zip", record.id));
    assert_eq!(archive.expire_in.as_deref(), Some("1 week"));
    let files = zip_files(&archive.data);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    assert_eq!(names, ["logs/x.log", "out/a.txt", "out/sub/b.txt"], "excluded and unmatched files stay out");
    assert_eq!(files["out/sub/b.txt"], "b\n");
    assert_eq!((stored[1].artifact_type.as_str(), stored[1].format.as_str()), ("junit", "gzip"));
    assert_eq!(stored[1].filename, "junit.xml.gz");
    assert_eq!(gunzip(&stored[1].data), "<testsuite/>\n");
    assert_eq!((stored[2].artifact_type.as_str(), stored[2].format.as_str()), ("sast", "raw"));
    assert_eq!(stored[2].data, b"{}\n");
    let upload = h.fake.requests_to("POST", &format!("/api/v4/jobs/{}/artifacts", record.id));
    assert_eq!(upload.len(), 3);
    assert_eq!(upload[0].header("job-token"), Some(record.token.as_str()));
    assert!(upload[0].header("content-type").is_some_and(|c| c.starts_with("multipart/form-data")));

    // A failing job uploads its on_failure and always artifacts, in their own section.
    let failed = h
        .run(
            spec("broken", &["mkdir -p out", "echo partial > out/p.txt", "echo '<t/>' > report.xml", "exit 3"])
                .artifacts(json!({"paths": ["out/"], "when": "on_failure"}))
                .artifacts(json!({"name": "junit.xml", "paths": ["report.xml"], "when": "always",
                                  "artifact_type": "junit", "artifact_format": "gzip"}))
                .artifacts(
                    json!({"name": "never", "paths": ["out/"], "artifact_type": "archive", "when": "on_success"}),
                ),
        )
        .await;
    assert_eq!(failed.final_state.as_deref(), Some("failed"));
    assert_eq!(failed.failure_reason.as_deref(), Some("script_failure"));
    assert!(failed.trace_text().contains("upload_artifacts_on_failure"), "{}", failed.trace_text());
    let stored = h.fake.artifacts(failed.id);
    let kinds: Vec<&str> = stored.iter().map(|a| a.artifact_type.as_str()).collect();
    assert_eq!(kinds, ["archive", "junit"]);
    assert_eq!(zip_files(&stored[0].data)["out/p.txt"], "partial\n");

    // Nothing matches: the job says so and succeeds, nothing is uploaded.
    let none = h.run(spec("none", &["true"]).artifacts(json!({"paths": ["missing/"]}))).await;
    succeeded(&none);
    assert!(h.fake.artifacts(none.id).is_empty());
    assert!(none.trace_text().contains("No files to upload"), "{}", none.trace_text());

    // The runner advertises what GitLab checks.
    let runner = h.fake.runners().into_iter().next().expect("runner");
    for feature in [
        "artifacts",
        "upload_multiple_artifacts",
        "upload_raw_artifacts",
        "artifacts_exclude",
        "fallback_cache_keys",
        "cache",
    ] {
        assert_eq!(runner.info.pointer(&format!("/features/{feature}")), Some(&json!(true)), "{feature}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_retry_server_errors_and_stop_at_too_large_and_forbidden() {
    let h = Harness::shell("").await;
    h.fake.inject(Endpoint::UploadArtifacts, 2, InjectedResponse::status(500));
    let retried = h.run(spec("retried", &["echo x > f.txt"]).artifacts(json!({"paths": ["f.txt"]}))).await;
    succeeded(&retried);
    let posts = h.fake.requests_to("POST", &format!("/api/v4/jobs/{}/artifacts", retried.id));
    assert_eq!(posts.iter().map(|r| r.status).collect::<Vec<_>>(), [500, 500, 201]);
    assert!(retried.trace_text().contains("Retrying"), "{}", retried.trace_text());

    h.fake.set_max_artifacts_size(10);
    let large =
        h.run(spec("large", &["head -c 1000 /dev/urandom > f.bin"]).artifacts(json!({"paths": ["f.bin"]}))).await;
    assert_eq!(large.final_state.as_deref(), Some("failed"));
    let posts = h.fake.requests_to("POST", &format!("/api/v4/jobs/{}/artifacts", large.id));
    assert_eq!(posts.len(), 1, "413 is not retried");
    assert!(large.trace_text().contains("too large"), "{}", large.trace_text());
    h.fake.set_max_artifacts_size(0);

    h.fake.inject(Endpoint::UploadArtifacts, 7, InjectedResponse::status(503));
    let unavailable = h.run(spec("unavailable", &["echo x > f.txt"]).artifacts(json!({"paths": ["f.txt"]}))).await;
    assert_eq!(unavailable.final_state.as_deref(), Some("failed"));
    let posts = h.fake.requests_to("POST", &format!("/api/v4/jobs/{}/artifacts", unavailable.id));
    assert_eq!(posts.len(), 6, "503 is tried 6 times");
}

#[tokio::test(flavor = "multi_thread")]
async fn dependencies_are_downloaded_with_their_token_and_through_object_storage() {
    let h = Harness::shell("").await;
    let build = h
        .run(
            spec("build", &["mkdir -p dist", "echo v1 > dist/app.txt", "ln -s app.txt dist/link"])
                .artifacts(json!({"paths": ["dist/"]})),
        )
        .await;
    succeeded(&build);

    // Through GitLab.
    let test = h
        .run(
            spec("test", &["cat dist/app.txt", "test \"$(readlink dist/link)\" = app.txt"])
                .dependency(build.id)
                .variable("FF_USE_DIRECT_DOWNLOAD", "false"),
        )
        .await;
    succeeded(&test);
    let trace = test.trace_text();
    assert!(
        trace.contains("download_artifacts")
            && trace.contains(&format!("Downloading artifacts for build ({})", build.id)),
        "{trace}"
    );
    let gets = h.fake.requests_to("GET", &format!("/api/v4/jobs/{}/artifacts", build.id));
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].header("job-token"), Some(test.token.as_str()), "the dependency token (the running job's)");
    assert_eq!(gets[0].query.as_deref(), Some("direct_download=false"));

    // Redirected to object storage, which never sees the job token.
    h.fake.set_object_storage(true);
    let direct = h.run(spec("direct", &["cat dist/app.txt"]).dependency(build.id)).await;
    succeeded(&direct);
    let gets = h.fake.requests_to("GET", &format!("/api/v4/jobs/{}/artifacts", build.id));
    assert_eq!(gets.last().map(|r| r.status), Some(302));
    let store: Vec<_> = h.fake.requests().into_iter().filter(|r| r.path.starts_with("/objectstore/")).collect();
    assert_eq!(store.len(), 1);
    assert_eq!(store[0].status, 200);
    assert_eq!(store[0].header("job-token"), None);

    // A dependency whose artifacts are gone fails the job after ARTIFACT_DOWNLOAD_ATTEMPTS.
    h.fake.inject(Endpoint::DownloadArtifacts, 10, InjectedResponse::status(404));
    let gone =
        h.run(spec("gone", &["echo never"]).dependency(build.id).variable("ARTIFACT_DOWNLOAD_ATTEMPTS", "2")).await;
    assert_eq!(gone.final_state.as_deref(), Some("failed"));
    let trace = gone.trace_text();
    assert!(trace.contains("not found"), "{trace}");
    assert!(trace.contains("Retrying download_artifacts in ") && trace.contains("(attempt 2 of 2)"), "{trace}");
    assert!(!trace.contains("$ echo never"), "{trace}");
}

#[tokio::test(flavor = "multi_thread")]
async fn local_caches_keep_gitlab_runner_layout_with_fallbacks_and_policies() {
    let h = Harness::shell("").await;
    let cache = |key: &str| json!({"key": key, "paths": ["vendor/"]});
    let first = h
        .run(
            spec("deps", &["test ! -e vendor/lib.txt", "mkdir -p vendor", "echo cached > vendor/lib.txt"])
                .cache(cache("deps-$CI_COMMIT_REF_NAME")),
        )
        .await;
    succeeded(&first);
    let file = h.cache_dir().join("group/project/deps-main/cache.zip");
    assert!(file.is_file(), "gitlab-runner's layout: {}", first.trace_text());
    assert_eq!(zip_files(&std::fs::read(&file).expect("cache.zip"))["vendor/lib.txt"], "cached\n");

    // The next job (a fresh clone removes untracked files) restores it.
    let second =
        h.run(spec("use", &["cat vendor/lib.txt"]).cache(cache("deps-main")).variable("GIT_STRATEGY", "clone")).await;
    succeeded(&second);
    assert!(second.trace_text().contains("Successfully extracted cache"), "{}", second.trace_text());

    // A missing key falls back to fallback_keys, then CACHE_FALLBACK_KEY.
    let mut entry = cache("feature-x");
    entry["fallback_keys"] = json!(["nothing-here", "deps-main"]);
    let fallback =
        h.run(spec("fallback", &["cat vendor/lib.txt"]).cache(entry).variable("GIT_STRATEGY", "clone")).await;
    succeeded(&fallback);
    let trace = fallback.trace_text();
    assert!(
        trace.contains("Checking cache for feature-x") && trace.contains("Checking cache for deps-main"),
        "{trace}"
    );
    let global = h
        .run(
            spec("global", &["cat vendor/lib.txt"])
                .cache(cache("other"))
                .variable("CACHE_FALLBACK_KEY", "deps-main")
                .variable("GIT_STRATEGY", "clone"),
        )
        .await;
    succeeded(&global);
    let blocked = h
        .run(
            spec("blocked", &["true"])
                .cache(cache("other2"))
                .variable("CACHE_FALLBACK_KEY", "deps-main-protected")
                .variable("GIT_STRATEGY", "clone"),
        )
        .await;
    assert!(blocked.trace_text().contains("not allowed to end in"), "{}", blocked.trace_text());

    // policy: pull never writes; push never reads.
    let mut pull = cache("pull-only");
    pull["policy"] = json!("pull");
    let pulled = h.run(spec("pull", &["mkdir -p vendor", "echo x > vendor/y"]).cache(pull)).await;
    succeeded(&pulled);
    assert!(!h.cache_dir().join("group/project/pull-only").exists());
    assert!(pulled.trace_text().contains("Not uploading cache pull-only due to policy"), "{}", pulled.trace_text());
    let mut push = cache("deps-main");
    push["policy"] = json!("push");
    let pushed = h
        .run(
            spec("push", &["test ! -e vendor/lib.txt", "mkdir -p vendor", "echo new > vendor/lib.txt"])
                .cache(push)
                .variable("GIT_STRATEGY", "clone"),
        )
        .await;
    succeeded(&pushed);
    assert!(pushed.trace_text().contains("Not downloading cache deps-main due to policy"), "{}", pushed.trace_text());

    // when: on_failure caches only after a failure; untracked picks up what git ignores too.
    let mut on_failure = json!({"key": "failures", "untracked": true, "when": "on_failure"});
    on_failure["paths"] = json!([]);
    let failed = h.run(spec("fails", &["echo i > ignored.txt", "echo n > new.txt", "exit 1"]).cache(on_failure)).await;
    assert_eq!(failed.final_state.as_deref(), Some("failed"));
    let files =
        zip_files(&std::fs::read(h.cache_dir().join("group/project/failures/cache.zip")).expect("on_failure cache"));
    assert!(files.contains_key("new.txt") && files.contains_key("ignored.txt"), "{files:?}");

    // RESTORE_CACHE_ATTEMPTS retries the stage; a missing cache is a warning, not a failure.
    let missing =
        h.run(spec("missing", &["true"]).cache(cache("never-made")).variable("RESTORE_CACHE_ATTEMPTS", "2")).await;
    succeeded(&missing);
    assert!(missing.trace_text().contains("Failed to extract cache"), "{}", missing.trace_text());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_an_instance_the_runner_copies_its_helper_and_moves_artifacts_and_caches() {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("instance");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
    let key = sshd::ClientKey::generate();
    let server = sshd::SshServer::start(Ipv4Addr::new(127, 0, 0, 31), &key);
    let root = tempfile::tempdir().expect("tempdir");
    let builds = root.path().join("instance-builds");
    let config = format!(
        r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[[runners]]
name = "instance"
url = "{url}"
token = "{token}"
executor = "instance"
builds_dir = "{builds}"
cache_dir = "{cache}"

[runners.autoscaler]
plugin = "static"
update_interval = "1s"
update_interval_when_expecting = "1s"

[runners.autoscaler.plugin_config]
hosts = [{host:?}]

[runners.autoscaler.connector_config]
username = "{user}"
key_path = "{key}"
timeout = "10s"

[[runners.autoscaler.policy]]
idle_count = 1
"#,
        url = fake.url(),
        token = runner.token,
        builds = builds.display(),
        cache = root.path().join("instance-cache").display(),
        host = server.host_entry(),
        user = server.user,
        key = key.private_path.display(),
    );
    std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
    let mut process = RunwayProcess::new(root.path().to_path_buf());
    process.start();
    let run = |spec: JobSpec| {
        let fake = &fake;
        let process = &process;
        async move {
            let id = fake.enqueue(fake.job_payload(&spec));
            match fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await {
                Some(record) => record,
                None => panic!(
                    "job {id} did not finish; trace:\n{}\nlog:\n{}",
                    fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                    process.log()
                ),
            }
        }
    };
    let build = run(spec("build", &["mkdir -p dist vendor", "echo v1 > dist/app.txt", "echo dep > vendor/d.txt"])
        .artifacts(json!({"paths": ["dist/"]}))
        .cache(json!({"key": "deps", "paths": ["vendor/"]})))
    .await;
    succeeded(&build);
    let helpers: Vec<_> = std::fs::read_dir(builds.join(".runway-helper")).expect("helper dir").collect();
    assert_eq!(helpers.len(), 1, "the helper is copied once");
    assert_eq!(zip_files(&fake.artifacts(build.id)[0].data)["dist/app.txt"], "v1\n");
    assert!(root.path().join("instance-cache/group/project/deps/cache.zip").is_file());

    let test = run(spec("test", &["cat dist/app.txt", "cat vendor/d.txt"])
        .dependency(build.id)
        .cache(json!({"key": "deps", "paths": ["vendor/"], "policy": "pull"}))
        .variable("GIT_STRATEGY", "clone"))
    .await;
    succeeded(&test);
    let trace = test.trace_text();
    assert!(trace.contains("v1") && trace.contains("dep"), "{trace}");
    let helpers: Vec<_> = std::fs::read_dir(builds.join(".runway-helper")).expect("helper dir").collect();
    assert_eq!(helpers.len(), 1, "the second job reuses the copy");
    drop(server);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_s3_cache_is_shared_between_builds_directories_through_presigned_urls_only() {
    let moto = object_servers::Server::moto();
    moto.moto_start_recording().await;
    let status =
        reqwest::Client::new().put(format!("{}/fleet-cache", moto.url())).send().await.expect("bucket").status();
    assert!(status.is_success(), "create bucket: {status}");
    const SECRET: &str = "runway-e2e-secret-key";
    let cache = format!(
        r#"  [runners.cache]
  Type = "s3"
  Path = "ci"
  Shared = true
  [runners.cache.s3]
  ServerAddress = "127.0.0.1:{port}"
  AccessKey = "AKIDRUNWAYE2E"
  SecretKey = "{SECRET}"
  BucketName = "fleet-cache"
  BucketLocation = "us-east-1"
  Insecure = true"#,
        port = moto.port
    );
    // The first runner uploads with a role (UploadRoleARN), the second restores with one
    // (RoleARN): the manager assumes them through moto's STS and signs with what it returns.
    let sts = [("AWS_ENDPOINT_URL_STS", moto.url())];
    let sts: Vec<(&str, &str)> = sts.iter().map(|(k, v)| (*k, v.as_str())).collect();
    const UPLOAD_ROLE: &str = "arn:aws:iam::123456789012:role/cache-upload";
    const ROLE: &str = "arn:aws:iam::123456789012:role/cache";
    let first = Harness::shell_with_env(&format!("{cache}\n  UploadRoleARN = \"{UPLOAD_ROLE}\""), &sts).await;
    let job = |h: &Harness| {
        h.fake.job_payload(
            &spec(
                "deps",
                &[
                    "test -e vendor/lib.txt && echo RESTORED || echo MISSED",
                    "mkdir -p vendor",
                    "echo v > vendor/lib.txt",
                    "env | grep -c runway-e2e-secret || true",
                ],
            )
            .cache(json!({"key": "deps", "paths": ["vendor/"]}))
            .variable("CI_DEBUG_TRACE", "true"),
        )
    };
    let miss = first.finished(first.fake.enqueue(job(&first))).await;
    succeeded(&miss);
    let trace = miss.trace_text();
    assert!(trace.contains("MISSED") && trace.contains("Failed to extract cache"), "{trace}");
    assert!(trace.contains("Uploading cache.zip to http://127.0.0.1"), "{trace}");
    assert!(trace.contains("X-Amz-Signature"), "pre-signed URLs in the commands: {trace}");
    assert!(!trace.contains(SECRET), "the secret key never reaches the job: {trace}");
    let assumed = |roles: &[serde_json::Value], role: &str| -> Vec<String> {
        roles
            .iter()
            .filter(|r| r["role_arn"] == role)
            .filter_map(|r| r["access_key_id"].as_str().map(str::to_string))
            .collect()
    };
    let roles = moto.moto_assumed_roles().await;
    let keys = assumed(&roles, UPLOAD_ROLE);
    assert_eq!(keys.len(), 1, "one AssumeRole for the upload: {roles:?}");
    // The trace masks credentials in URLs (gitlab-runner's rule): moto's request recording
    // shows what the helper sent.
    let sent = s3_requests(&moto).await;
    assert!(
        sent.iter().any(|(m, u)| m == "PUT" && u.contains(&format!("X-Amz-Credential={}/", keys[0]))),
        "the upload is signed with the role's key: {sent:?}"
    );
    assert!(sent.iter().all(|(m, u)| m == "PUT" || u.contains("X-Amz-Credential=AKIDRUNWAYE2E/")), "{sent:?}");
    let objects = reqwest::get(format!("{}/fleet-cache?list-type=2", moto.url()))
        .await
        .expect("list")
        .text()
        .await
        .expect("body");
    assert!(
        objects.contains("<Key>ci/project/42/deps/cache.zip</Key>") || objects.contains("ci/project/42/deps"),
        "{objects}"
    );

    // Another runner, with its own builds and cache directories, restores it from S3.
    let second = Harness::shell_with_env(&format!("{cache}\n  RoleARN = \"{ROLE}\""), &sts).await;
    let hit = second.finished(second.fake.enqueue(job(&second))).await;
    succeeded(&hit);
    let trace = hit.trace_text();
    assert!(trace.contains("RESTORED") && trace.contains("Successfully extracted cache"), "{trace}");
    assert!(!trace.contains(SECRET), "{trace}");
    let roles = moto.moto_assumed_roles().await;
    let keys = assumed(&roles, ROLE);
    assert!(!keys.is_empty(), "RoleARN assumed: {roles:?}");
    let gets: Vec<String> = s3_requests(&moto).await.into_iter().filter(|(m, _)| m == "GET").map(|(_, u)| u).collect();
    assert!(
        gets.iter().any(|u| keys.iter().any(|k| u.contains(&format!("X-Amz-Credential={k}/")))),
        "the restore is signed with the role's key: {gets:?}"
    );
}

/// The method and URL of every pre-signed request moto received (its request recording),
/// with `%2F` read as `/`: moto's recording keeps the query as sent in some versions and
/// decoded in others (5.2 decodes it).
async fn s3_requests(moto: &object_servers::Server) -> Vec<(String, String)> {
    moto.moto_recording()
        .await
        .into_iter()
        .filter(|r| r["url"].as_str().is_some_and(|u| u.contains("X-Amz-Signature=")))
        .map(|r| {
            let url = r["url"].as_str().unwrap_or_default().replace("%2F", "/").replace("%2f", "/");
            (r["method"].as_str().unwrap_or_default().to_string(), url)
        })
        .collect()
}
