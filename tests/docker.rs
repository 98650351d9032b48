//! The `docker` and `docker-autoscaler` executors end to end (issue 12): `runway run` as a real
//! process against the fake GitLab and a real `dockerd` this binary starts on its own socket
//! (`support/dockerd.rs`: vfs, no iptables, no default bridge; user-defined networks work),
//! with images made by `docker import` from this machine's files and Debian's
//! `docker-registry` on 127.0.0.1 for pulls.
//!
//! Every test numbers its jobs from its own base, so the containers, networks and volumes the
//! executor labels `runway.job.id=<id>` are told apart on the one daemon the tests share. Most
//! jobs use `GIT_STRATEGY: none` (a job network cannot reach the fake GitLab on the runner's
//! loopback); one runs with `network_mode = "host"` and clones for real.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;
#[path = "support/workhorse.rs"]
mod workhorse;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use dockerd::Dockerd;
use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use runway_process::RunwayProcess;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(180);
/// The label the executor puts on everything it creates for a job.
const JOB_LABEL: &str = "runway.job.id";

/// Job ids of each test start here (plus a step per test), apart from other tests'.
static NEXT_BASE: AtomicI64 = AtomicI64::new(0);

fn job_id_base() -> i64 {
    // The process id keeps two runs on one daemon apart too (a daemon is per binary, but a
    // stale one may still hold containers while it is being removed).
    100_000 + (std::process::id() as i64 % 1000) * 10_000 + NEXT_BASE.fetch_add(100, Ordering::SeqCst)
}

/// A fake GitLab with a project, a runner, and the shared daemon.
struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
    docker: &'static Dockerd,
}

async fn world() -> World {
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    fake.set_next_job_id(job_id_base());
    let runner = fake.create_runner("docker test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello from the repository\n")], "first");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir"), docker }
}

/// One `runway run` process with its own config directory; stopped with SIGQUIT when dropped,
/// so the jobs it runs are cleaned up.
type Manager = RunwayProcess;

impl World {
    /// A manager whose runner is `executor = "docker"` on the test daemon, with the job image
    /// as default and `if-not-present` pulls; `runner` lines go into `[[runners]]`, `docker`
    /// lines into `[runners.docker]`, `tail` after both (more sections).
    fn manager(&self, name: &str, runner: &str, docker: &str, tail: &str) -> Manager {
        let image = self.docker.job_image();
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("manager dir");
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5

[plugins.docker]
allow_docker = ["{host}"]

[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "docker"
{runner}
  [runners.docker]
  host = "{host}"
  image = "{image}"
  pull_policy = ["if-not-present"]
{docker}
{tail}
"#,
            url = self.fake.url(),
            token = self.token,
            host = self.docker.host(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        RunwayProcess::new(dir).env_remove("DOCKER_HOST").quit_on_drop()
    }

    /// Queue a job (`GIT_STRATEGY: none` unless `spec` sets one); `edit` changes the payload.
    fn enqueue(&self, mut spec: JobSpec, edit: impl FnOnce(&mut serde_json::Value)) -> i64 {
        if !spec.variables.iter().any(|(k, _)| k == "GIT_STRATEGY") {
            spec = spec.variable("GIT_STRATEGY", "none");
        }
        let mut payload = self.fake.job_payload(&spec);
        edit(&mut payload);
        self.fake.enqueue(payload)
    }

    fn job(&self, name: &str, script: &[&str]) -> JobSpec {
        JobSpec::new("group/project", name, script)
    }

    async fn wait_for(&self, job: i64, what: &str, manager: &Manager, f: impl Fn(&JobRecord) -> bool) -> JobRecord {
        match self.fake.wait_for_job_state(job, f, WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {job}: {what} did not happen; trace:\n{}\nrunway log:\n{}\ndockerd log (tail):\n{}",
                self.trace(job),
                manager.log(),
                tail(&self.docker.log(), 40)
            ),
        }
    }

    async fn finished(&self, job: i64, manager: &Manager) -> JobRecord {
        self.wait_for(job, "the final update", manager, |j| j.final_state.is_some()).await
    }

    fn trace(&self, job: i64) -> String {
        self.fake.job(job).map(|j| j.trace_text()).unwrap_or_default()
    }

    /// What the engine still holds for `job`: containers, networks and volumes labelled with
    /// its id, cache volumes left out (they outlive jobs on purpose).
    fn leftovers(&self, job: i64) -> Vec<String> {
        let label = format!("{JOB_LABEL}={job}");
        let mut out: Vec<String> = Vec::new();
        for c in self.docker.containers_labelled(&label) {
            out.push(format!("container {} ({})", c["Names"], c["State"]));
        }
        for n in self.docker.networks_labelled(&label) {
            out.push(format!("network {}", n["Name"]));
        }
        for v in self.docker.volumes_labelled(&label) {
            if !is_cache_volume(&v) {
                out.push(format!("volume {}", v["Name"]));
            }
        }
        out
    }

    /// Wait until nothing of `job` is left on the engine (cleanup runs after the final update).
    async fn assert_cleaned_up(&self, job: i64, manager: &Manager) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = tokio::task::block_in_place(|| self.leftovers(job));
            if left.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!("job {job} left {left:?} behind; runway log:\n{}", manager.log());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn is_cache_volume(volume: &serde_json::Value) -> bool {
    let labels = volume["Labels"].as_object().cloned().unwrap_or_default();
    volume["Name"].as_str().unwrap_or_default().contains("cache")
        || labels.iter().any(|(k, v)| k.contains("cache") || v.as_str().unwrap_or_default().contains("cache"))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn assert_state(record: &JobRecord, status: JobStatus, manager: &Manager) {
    assert_eq!(record.status, status, "trace:\n{}\nrunway log:\n{}", record.trace_text(), manager.log());
}

// ---- The infrastructure itself: a daemon, images, a registry. ----

#[test]
fn daemon_runs_imported_images_on_a_user_defined_network() {
    let docker = dockerd::shared();
    let (_, ping) = docker.api("GET", "/_ping", None).expect("ping");
    assert_eq!(ping, b"OK");
    let job = docker.job_image();
    assert_eq!(docker.docker_ok(&["run", "--rm", job, "cat", "/etc/runway-image"]), "job");
    assert_eq!(docker.docker_ok(&["run", "--rm", docker.other_image(), "cat", "/etc/runway-image"]), "other");

    // A service on a network of its own, reached by its alias (the engine's DNS).
    let network = format!("infra-{}", std::process::id());
    let service = docker.service_image();
    docker.docker_ok(&["network", "create", "--label", "runway.test=infra", &network]);
    let svc = docker.docker_ok(&["run", "-d", "--network", &network, "--network-alias", "svc", service]);
    let probe =
        format!("for i in $(seq 1 50); do nc -z -w 1 svc {} && exit 0; sleep 0.2; done; exit 1", dockerd::SERVICE_PORT);
    let out = docker.docker(&["run", "--rm", "--network", &network, job, "bash", "-c", &probe]);
    docker.docker_ok(&["rm", "-f", &svc]);
    docker.docker_ok(&["network", "rm", &network]);
    assert!(out.status.success(), "service not reachable by alias: {out:?}");
    let exposed = docker.api_json(&format!("/images/{}/json", service.replace('/', "%2F")));
    assert!(exposed["Config"]["ExposedPorts"].get(format!("{}/tcp", dockerd::SERVICE_PORT)).is_some(), "{exposed}");
    assert!(docker.networks_labelled("runway.test=infra").is_empty());
}

#[test]
fn registry_push_then_pull() {
    let docker = dockerd::shared();
    let job = docker.job_image();
    let remote = docker.push_to_registry(job, "infra/pushed:1");
    let before = docker.registry().manifest_requests("infra/pushed");
    docker.docker_ok(&["pull", &remote]);
    assert!(docker.has_image(&remote));
    assert!(docker.registry().manifest_requests("infra/pushed") > before, "{}", docker.registry().log());
    docker.docker_ok(&["rmi", &remote]);
}

// ---- Jobs through the docker executor. ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_runs_in_the_default_image_and_then_in_its_own() {
    let w = world().await;
    let mut manager = w.manager("images", "", "", "");
    manager.start();
    let default = w.enqueue(w.job("default", &["echo \"image: $(cat /etc/runway-image)\""]), |_| {});
    let mut spec = w.job("own", &["echo \"image: $(cat /etc/runway-image)\""]);
    spec.image = Some(w.docker.other_image().to_string());
    let own = w.enqueue(spec, |_| {});
    let record = w.finished(default, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("image: job"), "{}", record.trace_text());
    let record = w.finished(own, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("image: other"), "{}", record.trace_text());
    w.assert_cleaned_up(default, &manager).await;
    w.assert_cleaned_up(own, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_is_reachable_by_its_alias() {
    let w = world().await;
    let service = w.docker.service_image();
    let mut manager = w.manager("services", "", "", "");
    manager.start();
    let script = format!("nc -z -w 5 svc {} && echo service-reachable", dockerd::SERVICE_PORT);
    let job = w.enqueue(w.job("service", &[&script]), |p| {
        p["services"] = json!([{ "name": service, "alias": "svc", "entrypoint": null, "command": null }]);
    });
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("service-reachable"), "{}", record.trace_text());
    w.assert_cleaned_up(job, &manager).await;
}

/// A service image of this machine's `sh`, `nc` and `sleep`, exposing [`dockerd::SERVICE_PORT`],
/// with no command of its own: the job's service entry gives it one.
const SLOW_SERVICE_IMAGE: &str = "runway-test/slow-service:1";

fn slow_service_image(docker: &Dockerd) -> &'static str {
    docker.ensure_image(SLOW_SERVICE_IMAGE, || {
        let mut rootfs = runway::connector::rootfs::RootfsBuilder::new();
        rootfs.base_system().expect("base system");
        for program in ["sh", "nc", "sleep"] {
            rootfs.program(program).unwrap_or_else(|e| panic!("{e}"));
        }
        (rootfs, vec![format!("EXPOSE {}", dockerd::SERVICE_PORT)])
    });
    SLOW_SERVICE_IMAGE
}

/// GitLab's services as the payload sends them: one service with two aliases (`alias: "db-a,
/// db-b"`), its own variable, an entrypoint and a command that sleeps before it listens. The
/// executor waits for the port, so the script's first connection succeeds; both names reach
/// it; the service sees its variable (it serves it back); the job's variables do not carry it;
/// `CI_DEBUG_SERVICES` puts the service's output into the trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_with_two_aliases_its_variables_and_a_slow_port_is_waited_for() {
    let w = world().await;
    let service = tokio::task::block_in_place(|| slow_service_image(w.docker));
    let mut manager = w.manager("slow-service", "", "  wait_for_services_timeout = 60", "");
    manager.start();
    let port = dockerd::SERVICE_PORT;
    let serve = format!(
        "echo \"service up, greeting $SVC_GREETING\"; sleep 6; echo listening-now; \
         while true; do echo \"$SVC_GREETING\" | nc -N -l {port}; done"
    );
    let script = format!(
        "echo \"job sees greeting=[${{SVC_GREETING:-}}]\"; \
         a=$(nc -N -w 5 db-a {port} </dev/null) || {{ echo first-connection-refused; exit 1; }}; \
         echo \"via db-a: $a\"; \
         for i in 1 2 3 4 5; do b=$(nc -N -w 5 db-b {port} </dev/null) && [ -n \"$b\" ] && break; sleep 1; done; \
         echo \"via db-b: $b\""
    );
    let job = w.enqueue(w.job("slow-service", &[&script]).variable("CI_DEBUG_SERVICES", "true"), |p| {
        p["services"] = json!([{
            "name": service,
            "alias": "db-a, db-b",
            "entrypoint": ["sh", "-c"],
            "command": [serve],
            "variables": [{ "key": "SVC_GREETING", "value": "hello-from-service-vars" }],
            "pull_policy": ["if-not-present"],
        }]);
    });
    let record = w.finished(job, &manager).await;
    let trace = record.trace_text();
    assert_state(&record, JobStatus::Success, &manager);
    assert!(trace.contains("Waiting for services to be up and running"), "{trace}");
    assert!(!trace.contains("probably didn't start properly"), "{trace}");
    assert!(trace.contains("via db-a: hello-from-service-vars"), "{trace}");
    assert!(trace.contains("via db-b: hello-from-service-vars"), "{trace}");
    assert!(trace.contains("job sees greeting=[]"), "service variables leaked into the job: {trace}");
    let debug = trace.lines().find(|l| l.contains("[service:") && l.contains("listening-now"));
    let debug = debug.unwrap_or_else(|| panic!("no CI_DEBUG_SERVICES line: {trace}"));
    assert!(debug.contains("db-a-db-b"), "{debug}");
    // GitLab sends per-service variables and several aliases only to runners that say so.
    let asked = w.fake.requests_to("POST", "/api/v4/jobs/request");
    let features = asked.last().and_then(|r| r.json()).map(|b| b["info"]["features"].clone()).expect("features");
    assert_eq!((&features["service_variables"], &features["service_multiple_aliases"]), (&json!(true), &json!(true)));
    w.assert_cleaned_up(job, &manager).await;
}

/// `docker: platform:` is honoured: the local image is for the engine's own platform, so
/// asking for another one with `pull_policy: never` fails the job, saying why; asking for the
/// engine's own runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_platform_is_checked_against_the_local_image() {
    let w = world().await;
    let image = w.docker.job_image();
    let mut manager = w.manager("platform", "", "  allowed_pull_policies = [\"if-not-present\", \"never\"]", "");
    manager.start();
    let own = match std::env::consts::ARCH {
        "aarch64" => ("linux/arm64", "linux/amd64"),
        _ => ("linux/amd64", "linux/arm64"),
    };
    let with_platform = |platform: &str| {
        let platform = platform.to_string();
        move |p: &mut serde_json::Value| {
            p["image"] = json!({
                "name": image,
                "pull_policy": ["never"],
                "executor_opts": { "docker": { "platform": platform } },
            });
        }
    };
    let ok = w.enqueue(w.job("platform-own", &["echo own-platform-ran"]), with_platform(own.0));
    let record = w.finished(ok, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("own-platform-ran"), "{}", record.trace_text());

    let other = w.enqueue(w.job("platform-other", &["echo must-not-run"]), with_platform(own.1));
    let record = w.finished(other, &manager).await;
    let trace = record.trace_text();
    assert_state(&record, JobStatus::Failed, &manager);
    assert!(!trace.contains("must-not-run"), "{trace}");
    assert!(trace.contains(&format!("not for platform {}, and pull_policy is never", own.1)), "{trace}");
    w.assert_cleaned_up(other, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policies_against_the_local_registry() {
    let w = world().await;
    let job_image = w.docker.job_image();
    let remote = tokio::task::block_in_place(|| w.docker.push_to_registry(job_image, "pulls/job:1"));
    let missing = format!("{}/pulls/missing:1", w.docker.registry().address());
    let mut manager =
        w.manager("pulls", "", "  allowed_pull_policies = [\"always\", \"if-not-present\", \"never\"]", "");
    manager.start();
    let with_image = |name: &str, image: &str, policy: &str| {
        let mut spec = w.job(name, &["echo \"image: $(cat /etc/runway-image)\""]);
        spec.image = Some(image.to_string());
        let policy = policy.to_string();
        w.enqueue(spec, move |p| p["image"]["pull_policy"] = json!([policy]))
    };

    // if-not-present with the image missing: pulled.
    let pulls = w.docker.registry().manifest_requests("pulls/job");
    let job = with_image("if-not-present", &remote, "if-not-present");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(w.docker.has_image(&remote), "if-not-present did not pull {remote}");
    let after_first = w.docker.registry().manifest_requests("pulls/job");
    assert!(after_first > pulls, "no pull reached the registry:\n{}", w.docker.registry().log());

    // always: pulled again although present.
    let job = with_image("always", &remote, "always");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(w.docker.registry().manifest_requests("pulls/job") > after_first, "always did not pull again");

    // never with the image present: runs without asking the registry.
    let before = w.docker.registry().manifest_requests("pulls/job");
    let job = with_image("never-present", &remote, "never");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert_eq!(w.docker.registry().manifest_requests("pulls/job"), before, "never asked the registry");

    // never with the image missing: a clear error naming the image, the job failed.
    let job = with_image("never-missing", &missing, "never");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert!(trace.contains(&missing) && trace.contains("never"), "no clear error:\n{trace}");
    assert_eq!(w.docker.registry().manifest_requests("pulls/missing"), 0, "never pulled");
    w.assert_cleaned_up(job, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_stage_removes_everything() {
    let w = world().await;
    let service = w.docker.service_image();
    let mut manager = w.manager("cancel", "", "", "");
    manager.start();
    let job = w.enqueue(w.job("cancel", &["echo started-the-long-stage", "sleep 300"]), |p| {
        p["services"] = json!([{ "name": service, "alias": "svc" }]);
    });
    w.wait_for(job, "the stage starting", &manager, |j| j.trace_text().contains("started-the-long-stage")).await;
    assert!(!tokio::task::block_in_place(|| w.leftovers(job)).is_empty(), "nothing labelled {JOB_LABEL}={job}");
    w.fake.cancel(job);
    let record = w.wait_for(job, "the cancel", &manager, |j| j.status.is_final()).await;
    assert_state(&record, JobStatus::Canceled, &manager);
    w.assert_cleaned_up(job, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_fails_the_job_and_removes_everything() {
    let w = world().await;
    let mut manager = w.manager("timeout", "", "", "");
    manager.start();
    let mut spec = w.job("timeout", &["echo started-sleeping", "sleep 300"]);
    spec.timeout = 8;
    let job = w.enqueue(spec, |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    assert_eq!(record.failure_reason.as_deref(), Some("job_execution_timeout"), "{}", record.trace_text());
    w.assert_cleaned_up(job, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_script_runs_in_the_job_image() {
    let w = world().await;
    let mut manager = w.manager("after", "", "", "");
    manager.start();
    let mut spec = w
        .job("after", &["echo main-script", "exit 3"])
        .after_script(&["echo \"after_script in: $(cat /etc/runway-image)\""]);
    spec.image = Some(w.docker.other_image().to_string());
    let job = w.enqueue(spec, |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Failed, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("after_script in: other"), "{trace}");
    w.assert_cleaned_up(job, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_volume_is_reused_by_the_next_job() {
    let w = world().await;
    let mut manager = w.manager("cache", "", "  volumes = [\"/cache\"]", "");
    manager.start();
    let marker = format!("left-by-the-first-job-{}", std::process::id());
    let write = format!("echo {marker} > /cache/marker && echo wrote");
    let first = w.enqueue(w.job("first", &[&write]), |_| {});
    let record = w.finished(first, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let second = w.enqueue(w.job("second", &["echo \"found: $(cat /cache/marker)\""]), |_| {});
    let record = w.finished(second, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains(&format!("found: {marker}")), "{}", record.trace_text());
    w.assert_cleaned_up(second, &manager).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_limit_cuts_the_log_and_the_job_goes_on() {
    let w = world().await;
    let mut manager = w.manager("limit", "", "", "");
    manager.start();
    // 5.5 MB of output (no pipe: the script runs with pipefail), then a line that must not
    // reach the log.
    let job = w.enqueue(w.job("limit", &["seq 1 800000", "echo after-the-flood"]), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("Job's log exceeded limit of 4194304 bytes."), "{}", tail(&trace, 5));
    assert!(!trace.contains("after-the-flood"));
    assert!(record.trace.len() < 4_194_304 + 4096, "trace is {} bytes", record.trace.len());
    w.assert_cleaned_up(job, &manager).await;
}

/// Issue 34: a job's stages run by `exec` in long-lived containers — its build container and
/// at most one helper container for the predefined stages — never in a container per stage:
/// a trivial job (no git, no cache) makes the build container only, and a job with a cache
/// (restore and archive stages in the helper) one helper container more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stages_share_one_build_and_at_most_one_helper_container() {
    let w = world().await;
    let creates = tokio::task::block_in_place(|| w.docker.record_creates("long-lived"));
    let mut manager = w.manager("long-lived", "", "", "");
    manager.start();
    let trivial = w.enqueue(w.job("trivial", &["true"]), |_| {});
    let record = w.finished(trivial, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let spec = w
        .job("cached", &["mkdir -p vendor", "echo cached > vendor/lib.txt", "echo in: $(cat /etc/runway-image)"])
        .after_script(&["echo after: $(cat /etc/runway-image)"])
        .cache(json!({"key": "long-lived", "paths": ["vendor/"]}));
    let cached = w.enqueue(spec, |_| {});
    let record = w.finished(cached, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("Created cache") && trace.contains("in: job") && trace.contains("after: job"), "{trace}");
    for (job, roles) in [(trivial, &["build"][..]), (cached, &["build", "helper"][..])] {
        w.assert_cleaned_up(job, &manager).await;
        assert_eq!(creates.roles(job), roles, "containers of job {job}; runway log:\n{}", manager.log());
    }
}

/// The stage goes on while no runner follows it, in the job's long-lived build container, and
/// the restarted runner attaches to it again from the offset its trace holds: every line
/// once, in order, and no container made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_killed_mid_job_resumes_the_running_container() {
    const LINES: u32 = 60;
    let w = world().await;
    let creates = tokio::task::block_in_place(|| w.docker.record_creates("resume"));
    let mut manager = w.manager("resume", "", "", "  [runners.store]\n  health_interval = 1");
    manager.start();
    let count = format!("for i in $(seq 1 {LINES}); do echo \"line $i of {LINES}\"; sleep 0.2; done");
    let job = w.enqueue(w.job("resume", &[&count]), |_| {});
    let needle = format!("line 10 of {LINES}");
    w.wait_for(job, "line 10", &manager, |j| j.trace_text().contains(&needle)).await;
    manager.kill9();
    let running = tokio::task::block_in_place(|| w.docker.containers_labelled(&format!("{JOB_LABEL}={job}")));
    assert!(
        running.iter().any(|c| c["State"] == "running"),
        "the stage container did not outlive the manager: {running:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    manager.start();
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    let numbers: Vec<u32> = trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("line ")?.strip_suffix(&format!(" of {LINES}"))?.parse().ok())
        .collect();
    assert_eq!(numbers, (1..=LINES).collect::<Vec<_>>(), "every line once, in order:\n{trace}");
    w.assert_cleaned_up(job, &manager).await;
    assert_eq!(creates.roles(job), ["build"], "reattached, not made again: {:?}", creates.of_job(job));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_clones_the_repository_in_the_helper() {
    let w = world().await;
    let mut manager = w.manager("clone", "", "  network_mode = \"host\"", "");
    manager.start();
    let job =
        w.enqueue(w.job("clone", &["cat README.md", "echo \"in $PWD\""]).variable("GIT_STRATEGY", "clone"), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    assert!(record.trace_text().contains("hello from the repository"), "{}", record.trace_text());
    w.assert_cleaned_up(job, &manager).await;
}

// ---- docker-autoscaler: the engine on a fleet instance, reached over SSH. ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_autoscaler_runs_the_job_on_the_instance_engine() {
    let w = world().await;
    let key = sshd::ClientKey::generate();
    let server = sshd::SshServer::start(Ipv4Addr::new(127, 0, 0, 12), &key);
    let autoscaler = format!(
        r#"  [runners.autoscaler]
  plugin = "static"
  capacity_per_instance = 1
  max_instances = 1
  update_interval = "1s"
  update_interval_when_expecting = "1s"
  [runners.autoscaler.plugin_config]
  hosts = ["{host}"]
  [runners.autoscaler.connector_config]
  username = "{user}"
  key_path = "{key}"
  timeout = "10s"
  keepalive = "2s"
  [[runners.autoscaler.policy]]
  idle_count = 1
  idle_time = "60s"
"#,
        host = server.host_entry(),
        user = server.user,
        key = key.private_path.display(),
    );
    let mut manager = w.manager("autoscaler", "", "", &autoscaler);
    let config = manager.dir().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replace("executor = \"docker\"", "executor = \"docker-autoscaler\"").replace(
        &format!("allow_docker = [\"{}\"]", w.docker.host()),
        &format!("allow_docker = [\"{}\", \"instance\"]", w.docker.host()),
    );
    std::fs::write(&config, text).expect("config");
    manager.start();
    let job = w.enqueue(w.job("on-instance", &["echo \"image: $(cat /etc/runway-image) on $(uname -n)\""]), |_| {});
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("image: job"), "{trace}");
    assert!(trace.contains(&server.host_entry()) || trace.contains("127.0.0.12"), "no instance in the trace:\n{trace}");
    w.assert_cleaned_up(job, &manager).await;
}

/// GitLab's web terminal on a Docker job, played as Workhorse plays it: the session the runner
/// sent with the job request, a shell `exec`ed with a tty in the job's container — the job's
/// image, its project directory on the build volume the script sees, its variables — resized
/// by the browser's size; a wrong token is refused; the job waits for the connected terminal
/// after its script and finishes once it disconnects, or once `session_timeout` ends an idle
/// one; nothing of the job is left on the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workhorse_types_into_a_docker_jobs_terminal() {
    use workhorse::{closed_by_server, status_of, type_and_read, Session};

    const SESSION_TIMEOUT: u64 = 3;
    let w = world().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let session_server =
        format!("[session_server]\n  listen_address = \"127.0.0.1:{port}\"\n  session_timeout = {SESSION_TIMEOUT}\n");
    let mut manager = w.manager("terminal", "", "", &session_server);
    manager.start();
    let waiting = |name: &str| {
        let script = "while [ ! -f released ]; do sleep 0.1; done; echo script-over";
        w.enqueue(w.job(name, &[script]).variable("TERMINAL_MARK", "from-the-job"), |_| {})
    };
    let connect = |session: &Session, token: &str| {
        let (session, token) = (session.clone(), token.to_string());
        async move { workhorse::connect(&session, &token, "terminal.gitlab.com").await }
    };

    let job = waiting("debug-me");
    let record =
        w.wait_for(job, "the script", &manager, |j| j.trace_text().contains("Executing \"step_script\"")).await;
    let session = Session::of(&record);
    let request = w
        .fake
        .requests_to("POST", "/api/v4/jobs/request")
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .find(|body| body["session"]["authorization"] == session.authorization.as_str())
        .expect("the job request that carried the session");
    let features = &request["info"]["features"];
    assert_eq!((&features["session"], &features["terminal"]), (&json!(true), &json!(true)), "{features}");
    assert_eq!(status_of(connect(&session, "wrong-token").await), 401);
    let mut ws = connect(&session, &session.authorization).await.expect("connects");
    // Inside the job's container: its image, its project directory, its variables; the
    // browser's size reaches the tty.
    let dirs = workhorse::container_shell(&mut ws).await;
    assert_eq!(dirs, ("/builds/group/project".to_string(), "/builds/group/project".to_string()));
    // The script sees what the terminal does (the build volume); then the job waits for it.
    type_and_read(&mut ws, "touch released && echo released-$((1+1))", "released-2").await;
    w.wait_for(job, "the wait for the terminal", &manager, |j| {
        j.trace_text().contains("Terminal is connected, will time out in")
    })
    .await;
    assert!(w.fake.job(job).expect("job").final_state.is_none(), "the job waits while the terminal is connected");
    ws.close(None).await.expect("closed");
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let trace = record.trace_text();
    assert!(trace.contains("script-over") && trace.contains("Terminal disconnected"), "{trace}");
    w.assert_cleaned_up(job, &manager).await;

    // An idle terminal: session_timeout closes it, and the job finishes.
    let job = waiting("idle");
    let record =
        w.wait_for(job, "the script", &manager, |j| j.trace_text().contains("Executing \"step_script\"")).await;
    let session = Session::of(&record);
    let mut ws = connect(&session, &session.authorization).await.expect("connects");
    type_and_read(&mut ws, "touch released && echo idle-$((2+2))", "idle-4").await;
    closed_by_server(&mut ws).await;
    let record = w.finished(job, &manager).await;
    assert_state(&record, JobStatus::Success, &manager);
    let wanted = format!("terminal session timed out (maximum time allowed - {SESSION_TIMEOUT}s)");
    assert!(record.trace_text().contains(&wanted), "{}", record.trace_text());
    w.assert_cleaned_up(job, &manager).await;
}
