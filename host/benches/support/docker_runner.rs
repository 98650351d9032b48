//! A `docker` runner for the docker benches: a fake GitLab with one project and a `bench`
//! runner, and `runway run` as a process on a config whose `[runners.docker]` uses the bench's
//! engine and job image (plus the bench's own lines), stopped when dropped; and the median of
//! timed samples. Shared by `docker` and `docker_artifacts`.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use fake_gitlab::FakeGitLab;

use crate::dockerd::Dockerd;
use crate::runway_guard::RunwayProcess;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

/// The fake GitLab and the running `runway run`.
pub(crate) struct DockerRunner {
    pub(crate) fake: FakeGitLab,
    pub(crate) dir: tempfile::TempDir,
    /// `runway run`: stopped when dropped (with the value, or on its own, moved out).
    #[allow(dead_code, reason = "docker_artifacts stops it early; docker keeps it to the end")]
    pub(crate) process: RunwayProcess,
}

impl DockerRunner {
    /// Start it: jobs numbered from `first_job_id`, `docker_lines` appended to
    /// `[runners.docker]`.
    pub(crate) fn start(rt: &tokio::runtime::Runtime, docker: &Dockerd, first_job_id: i64, docker_lines: &str) -> Self {
        Self::start_binary(rt, docker, first_job_id, docker_lines, RUNWAY)
    }

    /// [`DockerRunner::start`] with another build's `runway` (a baseline measured side by side).
    pub(crate) fn start_binary(
        rt: &tokio::runtime::Runtime,
        docker: &Dockerd,
        first_job_id: i64,
        docker_lines: &str,
        binary: &str,
    ) -> Self {
        let fake = rt.block_on(FakeGitLab::start_with(fake_gitlab::Config {
            long_poll: Duration::from_secs(5),
            trace_update_interval: 3,
        }));
        fake.set_next_job_id(first_job_id);
        let runner = fake.create_runner("bench");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "x\n")], "init");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"concurrent = 1
check_interval = 1

[plugins.docker]
allow_docker = ["{host}"]

[[runners]]
name = "bench"
url = "{url}"
token = "{token}"
executor = "docker"
  [runners.docker]
  host = "{host}"
  image = "{image}"
  pull_policy = ["if-not-present"]
{docker_lines}
"#,
                host = docker.host(),
                url = fake.url(),
                token = runner.token,
                image = docker.job_image(),
            ),
        )
        .expect("config");
        let log = std::fs::File::create(dir.path().join("runway.log")).expect("log");
        let process = RunwayProcess(
            Command::new(binary)
                .arg("-c")
                .arg(&config)
                .arg("run")
                .current_dir(dir.path())
                .env("XDG_CACHE_HOME", dir.path().join("cache"))
                .env_remove("DOCKER_HOST")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("runway run"),
        );
        DockerRunner { fake, dir, process }
    }

    /// The runner's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runway.log")).unwrap_or_default()
    }
}

/// The median of `times`.
pub(crate) fn median(times: &Mutex<Vec<Duration>>) -> Duration {
    let mut v = times.lock().unwrap_or_else(|e| e.into_inner()).clone();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
