//! The executors an administrator switching from gitlab-runner brings along, each through
//! `runway run` against the fake GitLab with real parts:
//!
//! - `custom`: a driver set in bash written from GitLab's documentation
//!   (`tests/fixtures/custom-executor/`): `config_exec`'s JSON moves the job, the drivers see
//!   `CUSTOM_ENV_*`, `BUILD_FAILURE_EXIT_CODE` is a script failure with the driver's exit code,
//!   `SYSTEM_FAILURE_EXIT_CODE` a system failure, and a driver that ignores SIGTERM is killed
//!   when the job times out;
//! - `ssh`: a real `sshd` on 127.0.0.x, its host key in a `known_hosts` file, and a runner whose
//!   `known_hosts` lists another key failing clearly;
//! - `user`: shell jobs run as a throwaway user (`useradd`, removed after).

#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::net::Ipv4Addr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec};
use runway_process::RunwayProcess;

const WAIT: Duration = Duration::from_secs(120);

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/custom-executor")
}

async fn fake_with_repo() -> FakeGitLab {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "init");
    fake
}

/// Wait until job `id` has its final state; panics with the runner's log when it does not.
async fn finished(fake: &FakeGitLab, runway: &RunwayProcess, id: i64) -> JobRecord {
    match fake.wait_for_job_state(id, |j| j.final_state.is_some(), WAIT).await {
        Some(job) => job,
        None => panic!(
            "job {id} did not finish; trace:\n{}\nrunway log:\n{}",
            fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
            runway.log()
        ),
    }
}

/// Wait (bounded) for `path` to exist: what a runner does after the final update.
async fn appears(path: &Path) -> bool {
    for _ in 0..600 {
        if path.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Wait (bounded) for `path` to be gone.
async fn disappears(path: &Path) -> bool {
    for _ in 0..600 {
        if !path.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn job(name: &str, script: &[&str], variables: &[(&str, &str)]) -> JobSpec {
    let mut spec = JobSpec::new("group/project", name, script);
    spec.variables = variables.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_executor_runs_gitlab_documented_drivers() {
    let fake = fake_with_repo().await;
    let runner = fake.create_runner("custom");
    let dir = tempfile::tempdir().expect("tempdir");
    let (builds, cache, state) =
        (dir.path().join("custom-builds"), dir.path().join("custom-cache"), dir.path().join("state"));
    let driver = |name: &str| fixtures().join(name).display().to_string();
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            r#"concurrent = 1
check_interval = 1

[[runners]]
name = "custom"
url = "{url}"
token = "{token}"
executor = "custom"
builds_dir = "{default_builds}"

[runners.custom]
config_exec = "{config}"
config_args = ["{builds}", "{cache}", "{state}"]
prepare_exec = "{prepare}"
run_exec = "{run}"
cleanup_exec = "{cleanup}"
graceful_kill_timeout = 1
force_kill_timeout = 5
"#,
            url = fake.url(),
            token = runner.token,
            default_builds = dir.path().join("default-builds").display(),
            config = driver("config.sh"),
            builds = builds.display(),
            cache = cache.display(),
            state = state.display(),
            prepare = driver("prepare.sh"),
            run = driver("run.sh"),
            cleanup = driver("cleanup.sh"),
        ),
    )
    .expect("config");
    let mut runway = RunwayProcess::new(dir.path().to_path_buf());
    runway.start();

    // A job that passes: config_exec's JSON takes effect, the drivers see the job.
    let ok = fake.enqueue(fake.job_payload(&job(
        "ok",
        &["echo \"project=$CI_PROJECT_DIR\"", "cat README.md"],
        &[("MY_VARIABLE", "from the job")],
    )));
    let record = finished(&fake, &runway, ok).await;
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "{trace}");
    assert!(trace.contains("Using Custom executor with driver test driver v1.0.0..."), "{trace}");
    assert!(trace.contains(&format!("via custom-host-{ok}...")), "hostname from config_exec: {trace}");
    assert!(trace.contains(&format!("project={}/", builds.display())), "builds_dir from config_exec: {trace}");
    assert!(trace.contains("hello"), "{trace}");
    assert!(trace.contains("config: preparing job"), "config_exec's stderr is in the log: {trace}");
    let job_state = state.join(ok.to_string());
    let prepared = std::fs::read_to_string(job_state.join("prepare.env")).expect("prepare ran");
    assert!(prepared.contains("CUSTOM_ENV_MY_VARIABLE=from the job"), "{prepared}");
    assert!(prepared.contains(&format!("CUSTOM_ENV_CI_PROJECT_DIR={}/", builds.display())), "{prepared}");
    assert!(prepared.contains(&format!("CUSTOM_ENV_CI_JOB_ID={ok}")), "{prepared}");
    assert!(prepared.contains("BUILD_FAILURE_EXIT_CODE=1") && prepared.contains("SYSTEM_FAILURE_EXIT_CODE=2"));
    assert!(prepared.contains(&format!("DRIVER_STATE={}", job_state.display())), "job_env: {prepared}");
    let cwd = std::fs::read_to_string(job_state.join("prepare.cwd")).expect("cwd");
    assert!(prepared.contains(&format!("JOB_RESPONSE_FILE={}/response.json", cwd.trim())), "{prepared}");
    let response: serde_json::Value =
        serde_json::from_slice(&std::fs::read(job_state.join("response.json")).expect("response")).expect("json");
    assert_eq!(response["id"], serde_json::json!(ok), "JOB_RESPONSE_FILE holds the job: {response}");
    assert!(prepared.contains(&format!("TMPDIR={}", cwd.trim())), "drivers run in their TMPDIR: {prepared}");
    let stages = std::fs::read_to_string(job_state.join("stages")).expect("stages");
    let stages: Vec<&str> = stages.lines().collect();
    assert_eq!(&stages[..2], ["prepare_script", "get_sources"], "{stages:?}");
    assert!(stages.contains(&"build_script") && !stages.contains(&"step_script"), "{stages:?}");
    assert!(appears(&job_state.join("cleaned")).await, "cleanup_exec ran");
    assert!(disappears(Path::new(cwd.trim())).await, "the drivers' temporary directory is removed");

    // BUILD_FAILURE_EXIT_CODE: a script failure with the code the driver wrote.
    let failing = fake.enqueue(fake.job_payload(&job("fails", &["echo failing", "exit 7"], &[])));
    let record = finished(&fake, &runway, failing).await;
    assert_eq!(
        (record.final_state.as_deref(), record.failure_reason.as_deref(), record.exit_code),
        (Some("failed"), Some("script_failure"), Some(7)),
        "{}",
        record.trace_text()
    );

    // SYSTEM_FAILURE_EXIT_CODE: a system failure.
    let broken = fake.enqueue(fake.job_payload(&job("system", &["echo never"], &[("SIMULATE_SYSTEM_FAILURE", "yes")])));
    let record = finished(&fake, &runway, broken).await;
    let trace = record.trace_text();
    assert_eq!(
        (record.final_state.as_deref(), record.failure_reason.as_deref()),
        (Some("failed"), Some("runner_system_failure")),
        "{trace}"
    );
    assert!(trace.contains("run: the machine is gone"), "{trace}");

    // The job times out while run_exec ignores SIGTERM: SIGTERM first, then SIGKILL.
    let mut spec = job("hangs", &["echo never"], &[("IGNORE_SIGTERM", "yes")]);
    spec.timeout = 10;
    let hanging = fake.enqueue(fake.job_payload(&spec));
    let record = finished(&fake, &runway, hanging).await;
    let trace = record.trace_text();
    assert_eq!(record.failure_reason.as_deref(), Some("job_execution_timeout"), "{trace}");
    assert!(trace.contains("run: got SIGTERM, ignoring it"), "SIGTERM came first: {trace}");
    let pid = std::fs::read_to_string(state.join(hanging.to_string()).join("run.pid")).expect("run.pid");
    let pid: i32 = pid.trim().parse().expect("pid");
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(!alive, "the driver that ignored SIGTERM was killed with SIGKILL");
    assert!(appears(&state.join(hanging.to_string()).join("cleaned")).await, "cleanup_exec ran after the timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_executor_runs_jobs_on_its_host_and_checks_the_host_key() {
    let fake = fake_with_repo().await;
    let good = fake.create_runner("ssh");
    let wrong = fake.create_runner("ssh wrong key");
    let key = sshd::ClientKey::generate();
    let server = sshd::SshServer::start(Ipv4Addr::new(127, 0, 0, 61), &key);
    let dir = tempfile::tempdir().expect("tempdir");
    let known = dir.path().join("known_hosts");
    std::fs::write(&known, server.known_hosts_line()).expect("known_hosts");
    // The same host with another key: what a man in the middle (or a rebuilt host) shows.
    let other = sshd::ClientKey::generate();
    let mut fields = other.public_line.split_whitespace();
    let (kind, public) = (fields.next().unwrap_or_default(), fields.next().unwrap_or_default());
    let stale = dir.path().join("known_hosts_stale");
    std::fs::write(&stale, format!("[{}]:{} {kind} {public}\n", server.addr, server.port)).expect("known_hosts");
    let runner = |name: &str, token: &str, known_hosts: &Path| {
        format!(
            r#"
[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "ssh"
builds_dir = "{builds}"
[runners.ssh]
host = "{host}"
port = "{port}"
user = "{user}"
identity_file = "{identity}"
known_hosts_file = "{known}"
"#,
            url = fake.url(),
            builds = dir.path().join("remote-builds").display(),
            host = server.addr,
            port = server.port,
            user = server.user,
            identity = key.private_path.display(),
            known = known_hosts.display(),
        )
    };
    let config = format!(
        "concurrent = 2\ncheck_interval = 1\n{}{}",
        runner("ssh", &good.token, &known),
        runner("ssh wrong key", &wrong.token, &stale)
    );
    std::fs::write(dir.path().join("config.toml"), config).expect("config");
    let mut runway = RunwayProcess::new(dir.path().to_path_buf());
    runway.start();

    let ok = fake.enqueue_for(
        &good.token,
        fake.job_payload(&job("over ssh", &["echo \"connection=$SSH_CONNECTION\"", "cat README.md"], &[])),
    );
    let record = finished(&fake, &runway, ok).await;
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "{trace}\n{}", server.log());
    assert!(trace.contains("Preparing the \"ssh\" executor") && trace.contains("Using SSH executor..."), "{trace}");
    assert!(trace.contains(&format!("{} {}", server.addr, server.port)), "the job ran over SSH: {trace}");
    assert!(trace.contains("hello"), "{trace}");
    assert!(dir.path().join("remote-builds").exists(), "the job checked out on the host");

    let refused = fake.enqueue_for(&wrong.token, fake.job_payload(&job("wrong key", &["echo never"], &[])));
    let record = finished(&fake, &runway, refused).await;
    let trace = record.trace_text();
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{trace}");
    assert!(trace.contains("host key verification failed") && trace.contains("key mismatch"), "{trace}");
    assert!(trace.contains(&stale.display().to_string()), "the error names the known_hosts file: {trace}");
    assert!(!trace.contains("echo never\n"), "{trace}");
}

/// A throwaway user, removed (with its home) when dropped.
struct ThrowawayUser(String);

impl ThrowawayUser {
    fn create(name: &str) -> ThrowawayUser {
        let _ = Command::new("userdel").args(["-r", name]).output();
        let status = Command::new("useradd").args(["-m", "-s", "/bin/bash", name]).status().expect("useradd runs");
        assert!(status.success(), "useradd {name}");
        // As GitLab's install guide says for its gitlab-runner user: Debian's skeleton
        // `.bash_logout` fails every login shell that ends under `set -e` (clear_console).
        let _ = std::fs::remove_file(format!("/home/{name}/.bash_logout"));
        ThrowawayUser(name.to_string())
    }

    fn uid(&self) -> u32 {
        let out = Command::new("id").args(["-u", &self.0]).output().expect("id");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("uid")
    }
}

impl Drop for ThrowawayUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.0]).output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_jobs_run_as_the_configured_user() {
    // Running jobs as another user needs a root runner (`su` asks root no password): without
    // root this test cannot check anything, so it fails instead of passing untested.
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "shell_jobs_run_as_the_configured_user must run as root (as CI runs the tests): the runner it starts switches \
         to a throwaway user with su"
    );
    let user = ThrowawayUser::create("runway-job-user");
    let fake = fake_with_repo().await;
    let runner = fake.create_runner("as user");
    let dir = tempfile::tempdir().expect("tempdir");
    // The job's user must reach the builds directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let builds = dir.path().join("builds");
    std::fs::write(
        dir.path().join("config.toml"),
        format!(
            "concurrent = 1\ncheck_interval = 1\nuser = \"{user}\"\n\n[[runners]]\nname = \"as user\"\nurl = \"{url}\"\n\
             token = \"{token}\"\nexecutor = \"shell\"\nbuilds_dir = \"{builds}\"\n",
            user = user.0,
            url = fake.url(),
            token = runner.token,
            builds = builds.display(),
        ),
    )
    .expect("config");
    let mut runway = RunwayProcess::new(dir.path().to_path_buf());
    runway.start();
    let id = fake.enqueue(fake.job_payload(&job(
        "as user",
        &["echo \"whoami=$(id -un)\"", "echo made > made-by-job", "pwd > where"],
        &[],
    )));
    let record = finished(&fake, &runway, id).await;
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "{trace}\n{}", runway.log());
    assert!(trace.contains(&format!("whoami={}", user.0)), "{trace}");
    let project = walk_for(&builds, "made-by-job").expect("the job's file");
    let meta = std::fs::metadata(&project).expect("metadata");
    assert_eq!(meta.uid(), user.uid(), "the job's files belong to its user");
    let checkout = project.parent().expect("project dir").join("README.md");
    assert_eq!(std::fs::metadata(checkout).expect("checkout").uid(), user.uid(), "the checkout too");
    drop(runway);
}

/// The first file named `name` under `dir`.
fn walk_for(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if path.is_dir() && !path.is_symlink() {
            if let Some(found) = walk_for(&path, name) {
                return Some(found);
            }
        }
    }
    None
}
