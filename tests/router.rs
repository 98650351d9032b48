//! `runway router` end to end (issue 15, seed 002): the fake GitLab upstream, the router as its
//! own process (`runway -c router.toml router`), and two downstream runners: a `runway run`
//! manager (two-phase commit, declines when it cannot prepare) and a minimal runner written
//! here with plain HTTP that speaks as gitlab-runner does without two-phase commit.
//!
//! Shown: every job ends `success` and both runners get work (tags route jobs, artifacts pass
//! through the router both ways); a runner that cannot prepare declines and the job runs
//! elsewhere; a runner killed mid-job gets its job failed upstream with
//! `runner_system_failure`; the router killed with SIGKILL and started again loses no job;
//! one pipeline's fan-out does not starve another project (fair share); unknown tokens get 403.

#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;
#[path = "support/test_ca.rs"]
mod test_ca;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec};
use runway_process::RunwayProcess;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(120);
/// The router's deadlines in these tests (short, so the tests are).
const ACCEPT_TIMEOUT_S: u64 = 6;
const LEASE_TIMEOUT_S: u64 = 8;
/// The store key the routers of a test share (several routers on one Redis must).
const STORE_KEY: &str = "8f3b5c2a9d1e4f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
const RUNWAY_TOKEN: &str = "downstream-runway-token";
const PLAIN_TOKEN: &str = "downstream-plain-token";

/// A port that is free now and below Linux's ephemeral range (32768 and up by default), so
/// no outgoing connection of a test running beside this one is given it before the router
/// binds it (a port from `bind(0)` comes from that range, and was taken so under load).
fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = 20_000 + rand::random::<u16>() % 12_000;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between 20000 and 32000");
}

/// The fake GitLab, a runner registration for the router, and a directory for everything.
struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
}

async fn world() -> World {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("router");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "first");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir") }
}

/// `runway router` as a process with its own directory (identity, store, log).
struct RouterProcess {
    dir: PathBuf,
    api_port: u16,
    metrics_port: u16,
    child: Option<Child>,
}

impl RouterProcess {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("router.log"))
            .expect("router log");
        let child = Command::new(env!("CARGO_BIN_EXE_runway"))
            .arg("-c")
            .arg(self.dir.join("router.toml"))
            .arg("router")
            .current_dir(&self.dir)
            .env("RUST_LOG", "info")
            .env("RUNWAY_STORE_KEY", STORE_KEY)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway router starts");
        self.child = Some(child);
    }

    /// Wait until the runner API answers.
    async fn ready(&self) {
        let client = reqwest::Client::new();
        for _ in 0..200 {
            let answer = client
                .post(format!("{}/api/v4/runners/verify", self.url()))
                .json(&json!({ "token": PLAIN_TOKEN }))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status() == 200) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the router did not start; log:\n{}", self.log());
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("router.log")).unwrap_or_default()
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        match reqwest::get(url).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    async fn metric(&self, line_prefix: &str) -> f64 {
        let text = self.metrics().await;
        text.lines().find_map(|l| l.strip_prefix(line_prefix).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
    }

    /// Wait up to `WAIT` for the metric to read `value`, and give the last reading. The router
    /// updates its books after GitLab answers the update it relays, so a test that saw GitLab's
    /// side of the job can be a moment ahead of the router's.
    async fn metric_settles(&self, line_prefix: &str, value: f64) -> f64 {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let read = self.metric(line_prefix).await;
            if read == value || tokio::time::Instant::now() >= deadline {
                return read;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl World {
    /// A router for this world; `extra` lines go into `[router]`.
    fn router(&self, extra: &str) -> RouterProcess {
        self.router_with("5s", extra)
    }

    /// A router holding downstream job requests up to `long_poll`.
    fn router_with(&self, long_poll: &str, extra: &str) -> RouterProcess {
        self.router_in("router", long_poll, extra, "name = \"file\"")
    }

    /// A router in directory `name` with `store` lines in `[router.store]`; `extra` may set
    /// its own `accept_timeout` (else [`ACCEPT_TIMEOUT_S`]).
    fn router_in(&self, name: &str, long_poll: &str, extra: &str, store: &str) -> RouterProcess {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("router dir");
        let (api_port, metrics_port) = (free_port(), free_port());
        let accept_timeout = if extra.contains("accept_timeout") {
            String::new()
        } else {
            format!("accept_timeout = \"{ACCEPT_TIMEOUT_S}s\"")
        };
        let config = format!(
            r#"listen_address = "127.0.0.1:{metrics_port}"
log_level = "info"
[router]
  listen = "127.0.0.1:{api_port}"
  long_poll_timeout = "{long_poll}"
  {accept_timeout}
  lease_timeout = "{LEASE_TIMEOUT_S}s"
  keepalive_interval = "2s"
{extra}
  [[router.upstream]]
    url = "{url}"
    token = "{token}"
    request_concurrency = 4
  [[router.downstream]]
    name = "runway"
    token = "{RUNWAY_TOKEN}"
  [[router.downstream]]
    name = "plain"
    token = "{PLAIN_TOKEN}"
    tags = ["plain", "linux"]
  [router.store]
    health_interval = 1
    {store}
"#,
            url = self.fake.url(),
            token = self.token,
        );
        std::fs::write(dir.join("router.toml"), config).expect("router.toml");
        RouterProcess { dir, api_port, metrics_port, child: None }
    }

    /// A `runway run` downstream of `router` with `executor_lines` for its runner.
    fn runway(&self, router: &RouterProcess, name: &str, executor_lines: &str) -> RunwayProcess {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("runway dir");
        let config = format!(
            r#"concurrent = 2
check_interval = 1
shutdown_timeout = 5

[plugins.shell]
allow_process = true

[[runners]]
name = "{name}"
url = "{url}"
token = "{RUNWAY_TOKEN}"
builds_dir = "{builds}"
cache_dir = "{cache}"
{executor_lines}
"#,
            url = router.url(),
            builds = dir.join("builds").display(),
            cache = dir.join("cache").display(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("config.toml");
        RunwayProcess::new(dir)
    }

    fn enqueue(&self, spec: &JobSpec) -> i64 {
        self.fake.enqueue(self.fake.job_payload(spec))
    }

    async fn finished(&self, id: i64, router: &RouterProcess) -> JobRecord {
        // Finished: a final update arrived, or GitLab dropped the job unacknowledged (it has no
        // final update then).
        let ended = |j: &JobRecord| {
            j.final_state.is_some() || j.failure_reason.as_deref() == Some("runner_provisioning_timeout")
        };
        match self.fake.wait_for_job_state(id, ended, WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {id} did not finish: {:?} runner {:?} retried as {:?} updates {:?}; trace:\n{}\nrouter log:\n{}",
                self.fake.job(id).map(|j| j.status),
                self.fake.job(id).map(|j| j.runner_token),
                self.fake.job(id).map(|j| j.retried_as),
                self.fake.job(id).map(|j| j.updates.clone()),
                self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                router.log()
            ),
        }
    }
}

const SHELL: &str = "executor = \"shell\"\n  [runners.shell]\n  login = false";

/// A runner that is not Runway: plain HTTP as gitlab-runner speaks it, without two-phase
/// commit (its `info` does not advertise it, and it never sends `state=pending`).
#[derive(Clone)]
struct PlainRunner {
    url: String,
    http: reqwest::Client,
    /// The jobs it ran, in the order it got them (id, project id).
    ran: Arc<Mutex<Vec<(i64, i64)>>>,
}

impl PlainRunner {
    fn new(url: &str) -> Self {
        PlainRunner { url: url.to_string(), http: reqwest::Client::new(), ran: Arc::default() }
    }

    fn ran(&self) -> Vec<(i64, i64)> {
        self.ran.lock().expect("lock").clone()
    }

    /// One job request; `Some(payload)` when it got a job. Connection errors (the router
    /// restarting) count as no job.
    async fn request(&self) -> Option<Value> {
        let body = json!({
            "token": PLAIN_TOKEN,
            "info": { "name": "gitlab-runner", "version": "17.11.0", "executor": "shell",
                      "features": { "variables": true, "trace_reset": true, "trace_checksum": true,
                                    "trace_size": true, "cancelable": true, "two_phase_job_commit": false } },
        });
        let response = self.http.post(format!("{}/api/v4/jobs/request", self.url)).json(&body).send().await.ok()?;
        if response.status() != 201 {
            return None;
        }
        response.json::<Value>().await.ok()
    }

    /// Run `job`: its log, a while of work, the final update (each call retried through a
    /// router restart).
    async fn run(&self, job: &Value, work: Duration) {
        let id = job["id"].as_i64().expect("id");
        let token = job["token"].as_str().expect("token").to_string();
        let project = job.pointer("/job_info/project_id").and_then(Value::as_i64).unwrap_or_default();
        self.ran.lock().expect("lock").push((id, project));
        let text = format!("plain runner ran job {id}\n");
        let trace_url = format!("{}/api/v4/jobs/{id}/trace", self.url);
        let patch = || {
            self.http
                .patch(&trace_url)
                .header("JOB-TOKEN", &token)
                .header("Content-Range", format!("0-{}", text.len() - 1))
                .body(text.clone())
        };
        self.retry(patch, &[502]).await;
        tokio::time::sleep(work).await;
        let checksum = format!("crc32:{:08x}", crc32fast::hash(text.as_bytes()));
        let update = json!({ "token": token, "state": "success",
                             "output": { "checksum": checksum, "bytesize": text.len() }, "checksum": checksum });
        let job_url = format!("{}/api/v4/jobs/{id}", self.url);
        self.retry(|| self.http.put(&job_url).json(&update), &[202, 502]).await;
    }

    /// Send until the answer is neither a connection error nor one of `again`.
    async fn retry(&self, request: impl Fn() -> reqwest::RequestBuilder, again: &[u16]) -> u16 {
        for _ in 0..600 {
            match request().send().await {
                Ok(r) if !again.contains(&r.status().as_u16()) => return r.status().as_u16(),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("the router never answered");
    }

    /// Take and run jobs until `stop` (each with `work` of work).
    fn spawn_loop(&self, work: Duration, stop: tokio_util::sync::CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let job = tokio::select! {
                    j = me.request() => j,
                    _ = stop.cancelled() => return,
                };
                match job {
                    Some(job) => me.run(&job, work).await,
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        })
    }
}

/// Wait until downstream `name` has asked the router for a job (its manager is up).
async fn wait_for_polls(router: &RouterProcess, name: &str) {
    let metric = format!("runway_router_downstream_requests_total{{downstream=\"{name}\"}}");
    for _ in 0..1200 {
        if router.metric(&metric).await >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never asked the router for a job");
}

fn spec(name: &str, script: &[&str]) -> JobSpec {
    JobSpec::new("group/project", name, script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_reach_both_runners_with_tags_artifacts_and_403_for_strangers() {
    let w = world().await;
    let mut router = w.router("");
    router.start();
    router.ready().await;

    // Unknown downstream tokens are refused, as GitLab refuses unknown runners.
    let stranger = reqwest::Client::new()
        .post(format!("{}/api/v4/jobs/request", router.url()))
        .json(&json!({"token": "nobody", "info": {}}))
        .send()
        .await
        .expect("answer");
    assert_eq!(stranger.status(), 403);

    let mut runway = w.runway(&router, "runway", SHELL);
    runway.start();
    let plain = PlainRunner::new(&router.url());
    let stop = tokio_util::sync::CancellationToken::new();
    let plain_loop = plain.spawn_loop(Duration::from_millis(800), stop.clone());

    // Artifacts through the router both ways: a job tagged for Runway uploads, a dependent
    // job downloads (the plain runner, tagged `plain`/`linux`, may not take a `runway` job).
    let build = w.enqueue(
        &spec("build", &["mkdir -p out", "echo built-through-the-router > out/result.txt"])
            .variable("CI_JOB_TAGS", "runway")
            .artifacts(json!({"paths": ["out/"]})),
    );
    let built = w.finished(build, &router).await;
    assert_eq!(built.final_state.as_deref(), Some("success"), "{}", built.trace_text());
    assert_eq!(w.fake.artifacts(build).len(), 1, "the upload passed through the router");
    let test = w.enqueue(&spec("test", &["cat out/result.txt"]).variable("CI_JOB_TAGS", "runway").dependency(build));
    let tested = w.finished(test, &router).await;
    assert!(tested.trace_text().contains("built-through-the-router"), "{}", tested.trace_text());
    assert!(
        w.fake.requests_to("GET", &format!("/api/v4/jobs/{build}/artifacts")).len() == 1,
        "the download passed through the router"
    );

    let ids: Vec<i64> =
        (0..12).map(|i| w.enqueue(&spec(&format!("job {i}"), &["echo hello from the job", "sleep 0.5"]))).collect();
    let mut by_runway = 0;
    for id in &ids {
        let record = w.finished(*id, &router).await;
        assert_eq!(record.final_state.as_deref(), Some("success"), "job {id}: {}", record.trace_text());
        if record.trace_text().contains("hello from the job") {
            by_runway += 1;
        } else {
            assert!(record.trace_text().contains("plain runner ran job"), "{}", record.trace_text());
        }
    }
    stop.cancel();
    let _ = plain_loop.await;
    let by_plain = plain.ran().len();
    assert!(by_runway > 0 && by_plain > 0, "both runners got work: runway {by_runway}, plain {by_plain}");
    assert_eq!(by_runway + by_plain, ids.len());
    assert!(plain.ran().iter().all(|(id, _)| ![build, test].contains(id)), "tagged jobs went to Runway only");
    // Every job was requested from GitLab by the router alone, with two-phase commit.
    for id in ids.iter().chain([build, test].iter()) {
        let job = w.fake.job(*id).expect("job");
        assert_eq!(job.runner_token.as_deref(), Some(w.token.as_str()));
    }
    let held = router.metric_settles("runway_router_jobs{phase=\"accepted\"}", 0.0).await;
    let metrics = router.metrics().await;
    assert_eq!(held, 0.0, "nothing left held: {metrics}");
    assert!(router.metric("runway_router_dispatches_total{downstream=\"plain\"}").await >= 1.0, "{metrics}");
    assert!(router.metric("runway_router_dispatches_total{downstream=\"runway\"}").await >= 3.0, "{metrics}");
    assert!(metrics.contains("runway_router_queue_wait_seconds_count{project=\"group/project\"}"), "{metrics}");
    assert!(metrics.contains("runway_router_upstream_requests_saved_total"), "{metrics}");
    // docs/router.md lists what is exported, with its type.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/router.md")).expect("router.md");
    let table = doc
        .split("<!-- router-metrics-table -->")
        .nth(1)
        .and_then(|t| t.split("<!-- /router-metrics-table -->").next())
        .expect("the metrics table between its markers");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| `")).collect();
    assert!(rows.len() >= 13, "{table}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (name, kind) = (cells[1].trim_matches('`'), cells[2]);
        assert!(metrics.contains(&format!("# TYPE {name} {kind}\n")), "{name} {kind} is not exported:\n{metrics}");
    }
    let families = metrics.lines().filter(|l| l.starts_with("# TYPE ")).count();
    assert_eq!(families, 13, "every exported family is in docs/router.md:\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_that_cannot_prepare_declines_and_the_job_runs_elsewhere() {
    let w = world().await;
    // Failing to prepare takes the runner its attempts' retry intervals (≈ 6 s, with no pending
    // keep-alive in between: those come every 10 s); the router must wait longer than that, or
    // its accept timeout, not the decline, gives the job back.
    let preparing = runway::executor::PREPARATION_RETRY_INTERVAL * (runway::executor::PREPARATION_ATTEMPTS - 1);
    let accept_timeout = preparing.as_secs() + 15;
    let mut router = w.router(&format!("  accept_timeout = \"{accept_timeout}s\""));
    router.start();
    router.ready().await;
    // Runway's runner is an SSH executor whose host refuses connections: preparation fails.
    let key = sshd::ClientKey::generate();
    let known = w.root.path().join("known_hosts");
    std::fs::write(&known, "").expect("known_hosts");
    let ssh = format!(
        "executor = \"ssh\"\n[runners.ssh]\nhost = \"127.0.0.1\"\nport = \"{}\"\nuser = \"nobody\"\nidentity_file = \"{}\"\nknown_hosts_file = \"{}\"",
        free_port(),
        key.private_path.display(),
        known.display()
    );
    let mut runway = w.runway(&router, "runway-broken", &ssh);
    runway.start();
    let id = w.enqueue(&spec("needs a runner", &["echo hi"]));
    // Only Runway polls now: it gets the job, cannot prepare, and declines.
    let mut declined = false;
    for _ in 0..600 {
        if router.metric("runway_router_declines_total{downstream=\"runway\",reason=\"declined\"}").await >= 1.0
            && runway.log().contains("job declined back to the router")
        {
            declined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(declined, "runway log:\n{}\nrouter log:\n{}", runway.log(), router.log());
    assert_eq!(w.fake.job(id).map(|j| j.status.as_str()), Some("pending"), "still pending at GitLab");

    let plain = PlainRunner::new(&router.url());
    let stop = tokio_util::sync::CancellationToken::new();
    let plain_loop = plain.spawn_loop(Duration::from_millis(100), stop.clone());
    let record = w.finished(id, &router).await;
    stop.cancel();
    let _ = plain_loop.await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    assert!(record.trace_text().contains("plain runner ran job"), "{}", record.trace_text());
    assert_eq!(plain.ran().len(), 1);
    // Runway never took it again (never offered twice to one that gave it back).
    assert_eq!(router.metric("runway_router_dispatches_total{downstream=\"runway\"}").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_killed_mid_job_gets_the_job_failed_upstream() {
    let w = world().await;
    let mut router = w.router("");
    router.start();
    router.ready().await;
    let mut runway = w.runway(&router, "runway-doomed", SHELL);
    runway.start();
    let id = w.enqueue(&spec("long", &["for i in $(seq 1 40); do echo tick $i; sleep 1; done"]));
    let running = w.fake.wait_for_job_state(id, |j| j.trace_text().contains("tick 2"), WAIT).await;
    assert!(running.is_some(), "runway log:\n{}", runway.log());
    runway.kill9();
    let killed_at = std::time::Instant::now();
    let record = w.finished(id, &router).await;
    assert_eq!(record.final_state.as_deref(), Some("failed"));
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    assert!(record.trace_text().contains("stopped reporting on the job"), "{}", record.trace_text());
    assert!(record.trace_text().contains("tick 2"), "what the runner sent stays: {}", record.trace_text());
    // For the note: how long after the kill GitLab learned it (lease_timeout + the runner's
    // last patch interval + the sweep), printed rather than asserted.
    eprintln!("failed upstream {:?} after the kill (lease_timeout {LEASE_TIMEOUT_S}s)", killed_at.elapsed());
    assert_eq!(router.metric("runway_router_lost_total{downstream=\"runway\"}").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_router_killed_and_started_again_loses_no_job() {
    let w = world().await;
    // GitLab's acknowledgement expiry (Rails: 2 minutes), short here.
    w.fake.set_runner_ack_expiry(Duration::from_secs(10));
    let mut router = w.router("");
    router.start();
    router.ready().await;
    let mut runway = w.runway(&router, "runway", SHELL);
    runway.start();
    wait_for_polls(&router, "runway").await;
    let plain = PlainRunner::new(&router.url());
    let stop = tokio_util::sync::CancellationToken::new();
    let plain_loops = [
        plain.spawn_loop(Duration::from_millis(1500), stop.clone()),
        plain.spawn_loop(Duration::from_millis(1500), stop.clone()),
    ];
    let ids: Vec<i64> = (0..10)
        .map(|i| w.enqueue(&spec(&format!("job {i}"), &["for i in 1 2 3 4; do echo step $i; sleep 0.5; done"])))
        .collect();
    // Kill the router while jobs are running and others are still held for runners.
    let mut moment = false;
    for _ in 0..1200 {
        let jobs = w.fake.jobs();
        let running = jobs.iter().filter(|j| j.status.as_str() == "running").count();
        let waiting = jobs.iter().filter(|j| j.status.as_str() == "pending").count();
        if running >= 2 && waiting >= 2 {
            moment = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let states: Vec<String> = w.fake.jobs().iter().map(|j| format!("{}:{}", j.id, j.status.as_str())).collect();
    assert!(moment, "{states:?}\nrouter log:\n{}\nrunway log:\n{}", router.log(), runway.log());
    router.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    router.start();
    router.ready().await;
    // A job GitLab handed out in the very answer the router died receiving is one the router
    // never knew: GitLab drops it when its acknowledgement expires and retries it as a new
    // job (docs/router.md). Everything the router knew of ends `success` itself.
    let mut retried = 0;
    for id in &ids {
        let mut record = w.finished(*id, &router).await;
        if record.failure_reason.as_deref() == Some("runner_provisioning_timeout") {
            assert!(record.updates.is_empty(), "the router never held job {id}: {:?}", record.updates);
            retried += 1;
            let retry = record.retried_as.expect("GitLab retried the job");
            record = w.finished(retry, &router).await;
        }
        assert_eq!(
            record.final_state.as_deref(),
            Some("success"),
            "job {id}: {}\nrouter log:\n{}",
            record.trace_text(),
            router.log()
        );
    }
    eprintln!("{retried} job(s) were in flight from GitLab when the router was killed");
    stop.cancel();
    for l in plain_loops {
        let _ = l.await;
    }
    let mut plain_ids: Vec<i64> = plain.ran().iter().map(|(id, _)| *id).collect();
    plain_ids.sort_unstable();
    let before = plain_ids.len();
    plain_ids.dedup();
    assert_eq!(before, plain_ids.len(), "no job ran twice on the plain runner");
    assert!(
        router.log().contains("holding a stored job again"),
        "the restarted router held its jobs again:\n{}",
        router.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pipelines_fan_out_does_not_starve_another_project() {
    let w = world().await;
    let mut router = w.router_with("60s", "  policy = \"fair\"\n  queue_size = 300");
    router.start();
    router.ready().await;
    let fan_out = spec("fan-out", &["true"]);
    for _ in 0..200 {
        w.enqueue(&fan_out);
    }
    for _ in 0..10 {
        let mut payload = w.fake.job_payload(&spec("other", &["true"]));
        payload["job_info"]["project_id"] = json!(43);
        payload["job_info"]["pipeline_id"] = json!(88);
        payload["job_info"]["project_full_path"] = json!("other/project");
        w.fake.enqueue(payload);
    }
    let plain = PlainRunner::new(&router.url());
    // The first request makes the router ask GitLab: it fills its queue (room for the policy
    // to choose) while runners are polling.
    let first = loop {
        if let Some(job) = plain.request().await {
            break job;
        }
    };
    plain.run(&first, Duration::ZERO).await;
    let mut queued = 0.0;
    for _ in 0..600 {
        queued = router.metric("runway_router_jobs{phase=\"queued\"}").await;
        if queued >= 209.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(queued, 209.0, "{}", router.metrics().await);
    for _ in 1..20 {
        let job = loop {
            if let Some(job) = plain.request().await {
                break job;
            }
        };
        plain.run(&job, Duration::ZERO).await;
    }
    let first20 = plain.ran();
    let other = first20.iter().filter(|(_, project)| *project == 43).count();
    assert_eq!(other, 10, "the other project's 10 jobs within the first 20 dispatches: {first20:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_routers_on_one_redis_share_the_work_and_take_over_a_dead_ones_jobs() {
    let w = world().await;
    let redis = redis_server::RedisServer::start();
    let store =
        format!("name = \"redis\"\n    health_timeout = 3\n    [router.store.redis]\n      url = \"{}\"", redis.url());
    let mut a = w.router_in("router-a", "5s", "  queue_size = 20", &store);
    let mut b = w.router_in("router-b", "5s", "  queue_size = 20", &store);
    a.start();
    b.start();
    a.ready().await;
    b.ready().await;
    let ids: Vec<i64> = (0..6).map(|i| w.enqueue(&spec(&format!("job {i}"), &["true"]))).collect();
    // One runner asks router A once: A takes the jobs from GitLab (room for its policy) and
    // gives that runner one.
    let at_a = PlainRunner::new(&a.url());
    let first = loop {
        if let Some(job) = at_a.request().await {
            break job;
        }
    };
    at_a.run(&first, Duration::ZERO).await;
    let mut queued = 0.0;
    for _ in 0..600 {
        queued = a.metric("runway_router_jobs{phase=\"queued\"}").await;
        if queued >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(queued, 5.0, "{}", a.log());
    // A dies with five jobs held; B's runner waits at B, which takes A's jobs over once A's
    // heartbeat is older than health_timeout.
    a.kill9();
    let at_b = PlainRunner::new(&b.url());
    let stop = tokio_util::sync::CancellationToken::new();
    let loop_b = at_b.spawn_loop(Duration::ZERO, stop.clone());
    for id in &ids {
        let record = w.finished(*id, &b).await;
        assert_eq!(record.final_state.as_deref(), Some("success"), "job {id}: {}", record.trace_text());
    }
    stop.cancel();
    let _ = loop_b.await;
    assert_eq!(at_a.ran().len() + at_b.ran().len(), ids.len(), "each job ran once");
    assert_eq!(at_b.ran().len(), 5);
    let taken = b.log().matches("holding a stored job again").count();
    assert_eq!(taken, 5, "B took A's five jobs over:\n{}", b.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_runner_api_is_served_over_tls() {
    let w = world().await;
    let ca = test_ca::make_ca(&w.root.path().join("tls"), "router");
    let tls = format!("  tls_cert_file = \"{}\"\n  tls_key_file = \"{}\"", ca.cert.display(), ca.key.display());
    let mut router = w.router(&tls);
    router.start();
    // Runway trusts the router's CA through its runner's tls-ca-file.
    let https = router.url().replace("http://", "https://");
    let mut runway = w.runway(&router, "runway-tls", &format!("tls-ca-file = \"{}\"\n{SHELL}", ca.ca.display()));
    let config = runway.dir().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config").replace(&router.url(), &https);
    std::fs::write(&config, text).expect("config");
    runway.start();
    let id = w.enqueue(&spec("over tls", &["echo served over tls"]));
    let record = w.finished(id, &router).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}\n{}", record.trace_text(), runway.log());
    assert!(record.trace_text().contains("served over tls"));
    // Plain HTTP to the TLS port gets nowhere.
    let plain = reqwest::Client::new().post(format!("{}/api/v4/runners/verify", router.url())).send().await;
    assert!(plain.is_err() || plain.is_ok_and(|r| r.status() != 200));
}
