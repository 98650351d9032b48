//! Jobs that survive the death of their manager (issue 11), with real processes: `runway run`
//! killed with SIGKILL at random moments and started again, with the file store and with a
//! real `redis-server`; two managers on one Redis; and the stored jobs that may not go on
//! (stale, resumed too often, cancelled meanwhile, corrupt), which are failed and cleaned up
//! while the manager keeps serving.
//!
//! Jobs on autoscaled instances (issue 30) survive the same: the `instance` and
//! `docker-autoscaler` executors on a `static` fleet over real OpenSSH servers (the Docker
//! Engine this binary starts behind them), the manager killed mid-stage and restarted, or a
//! second manager on the same Redis taking the job over.
//!
//! Every job counts its side effects in files (one line per start of a stage script), so a
//! stage that ran twice shows; its log must hold each numbered line exactly once, in order.

#[path = "support/dockerd.rs"]
mod dockerd;
#[path = "support/redis_server.rs"]
mod redis_server;
#[path = "support/runway_process.rs"]
mod runway_process;
#[path = "support/sshd.rs"]
mod sshd;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use redis_server::RedisServer;
use runway::store::jobs::file::FileStore;
use runway::store::jobs::seal::StoreKey;
use runway_process::RunwayProcess;

const WAIT: Duration = Duration::from_secs(120);
/// A masked variable's value: never in the store in clear.
const SECRET: &str = "s3cr3t-resume-Value-91ab";
/// The store key every manager of these tests shares (a Redis store's managers must).
const STORE_KEY: &str = "8f3b5c2a9d1e4f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8";
/// Lines the counting job prints, 100 ms apart.
const LINES: u32 = 200;

struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
}

async fn world() -> World {
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
            .await;
    let runner = fake.create_runner("resume test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "first");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir") }
}

/// A small deterministic generator (seed printed, so a failing run can be replayed).
struct Rng(u64);

impl Rng {
    fn from_clock() -> Self {
        let seed = std::env::var("RESUME_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
        });
        eprintln!("RESUME_SEED={seed}");
        Rng(seed | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// One `runway run` process with its own config directory (so its own system id).
struct Manager {
    process: RunwayProcess,
    /// `/metrics` is served here.
    port: u16,
}

impl World {
    /// A manager named `name` whose `[runners.store]` section is `store`.
    fn manager(&self, name: &str, store: &str) -> Manager {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("manager dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5
listen_address = "127.0.0.1:{port}"

[plugins.shell]
allow_process = true

[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "shell"
builds_dir = "{builds}"
cache_dir = "{cache}"
  [runners.shell]
  login = false
  [runners.store]
{store}
"#,
            url = self.fake.url(),
            token = self.token,
            builds = self.root.path().join("builds").display(),
            cache = self.root.path().join("cache").display(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        Manager { process: RunwayProcess::new(dir).env("RUNWAY_STORE_KEY", STORE_KEY), port }
    }

    /// The counting job: its step and after_script record each start in `effects`.
    fn counting_job(&self, name: &str) -> (i64, PathBuf) {
        let effects = self.root.path().join(format!("effects-{name}"));
        std::fs::create_dir_all(&effects).expect("effects dir");
        let step = format!("echo started >> {}/step", effects.display());
        let count = format!("for i in $(seq 1 {LINES}); do echo \"line $i of {LINES}\"; sleep 0.1; done");
        let after = format!("echo ran >> {}/after", effects.display());
        let mut spec = JobSpec::new("group/project", name, &[&step, "echo \"the secret is $RESUME_SECRET\"", &count]);
        spec = spec.after_script(&[&after]);
        spec.masked_variables.push(("RESUME_SECRET".into(), SECRET.into()));
        (self.fake.enqueue(self.fake.job_payload(&spec)), effects)
    }

    async fn wait_for(&self, job: i64, what: &str, f: impl Fn(&JobRecord) -> bool) -> JobRecord {
        match self.fake.wait_for_job_state(job, f, WAIT).await {
            Some(record) => record,
            None => panic!("job {job}: {what} did not happen; trace:\n{}", self.trace(job)),
        }
    }

    fn trace(&self, job: i64) -> String {
        self.fake.job(job).map(|j| j.trace_text()).unwrap_or_default()
    }

    /// Wait until `job`'s trace shows its `n`th line.
    async fn wait_line(&self, job: i64, n: u32) {
        let needle = format!("line {n} of {LINES}");
        self.wait_for(job, &needle, |j| j.trace_text().contains(&needle)).await;
    }
}

impl Manager {
    /// Give this manager a system id of its own (as on a machine of its own) and the shared
    /// store key every manager of one Redis store needs.
    fn on_own_machine(self, id: &str) -> Self {
        std::fs::write(self.process.dir().join(".runner_system_id"), format!("{id}\n")).expect("system id");
        self
    }

    fn start(&mut self) {
        self.process.start();
    }

    /// SIGKILL: no cleanup, no final update, nothing saved on the way out.
    fn kill9(&mut self) {
        self.process.kill9();
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.port);
        match reqwest::get(url).await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    fn log(&self) -> String {
        self.process.log()
    }

    fn system_id(&self) -> String {
        std::fs::read_to_string(self.process.dir().join(".runner_system_id")).unwrap_or_default().trim().to_string()
    }

    fn store_dir(&self) -> PathBuf {
        self.process.dir().join(".runway/store")
    }
}

/// The numbered lines of a trace, in order.
fn numbered_lines(trace: &str) -> Vec<u32> {
    trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("line ")?.strip_suffix(&format!(" of {LINES}"))?.parse().ok())
        .collect()
}

/// How many times each counted stage started.
fn starts(effects: &Path, stage: &str) -> usize {
    std::fs::read_to_string(effects.join(stage)).map(|t| t.lines().count()).unwrap_or(0)
}

/// The job succeeded with every line exactly once, in order, and each stage started once.
fn assert_whole(w: &World, job: i64, effects: &Path, logs: &[&Manager]) {
    let record = w.fake.job(job).expect("job");
    let trace = record.trace_text();
    let logs = logs.iter().map(|m| m.log()).collect::<Vec<_>>().join("\n----\n");
    assert_eq!(
        (record.status, record.final_state.as_deref()),
        (JobStatus::Success, Some("success")),
        "trace:\n{trace}\nmanager logs:\n{logs}"
    );
    assert_eq!(numbered_lines(&trace), (1..=LINES).collect::<Vec<_>>(), "trace:\n{trace}\nmanager logs:\n{logs}");
    assert_eq!(starts(effects, "step"), 1, "step_script started more than once; trace:\n{trace}");
    assert_eq!(starts(effects, "after"), 1, "after_script did not run exactly once; trace:\n{trace}");
    assert!(trace.contains("the secret is [MASKED]") && !trace.contains(SECRET), "{trace}");
    assert_eq!(Some(record.trace_checksum()), record.checksum, "{trace}");
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(files_under(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The length of the journal's header: a longer journal holds writes.
const JOURNAL_MAGIC_LEN: u64 = runway::store::jobs::journal::MAGIC.len() as u64;

/// The file store holds the job and never the masked value in clear.
fn assert_store_sealed(manager: &Manager) {
    let files = files_under(&manager.store_dir());
    // An entry file, or the journal holding writes not yet in the files.
    let holds_entry = |f: &PathBuf| {
        f.extension().is_some_and(|e| e == "json")
            || (f.file_name().is_some_and(|n| n == "journal")
                && std::fs::metadata(f).is_ok_and(|m| m.len() > JOURNAL_MAGIC_LEN))
    };
    assert!(files.iter().any(holds_entry), "no entry in {files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(!contains(&bytes, SECRET.as_bytes()), "{} holds the masked value in clear", file.display());
    }
}

/// Every value in `redis` (strings, hashes, sets), none holding the masked value in clear.
async fn assert_redis_sealed(redis: &RedisServer) {
    let client = redis::Client::open(redis.url()).expect("redis url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis connection");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("keys");
    assert!(!keys.is_empty(), "nothing stored in Redis");
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.expect("type");
        let values: Vec<Vec<u8>> = match kind.as_str() {
            "string" => vec![redis::cmd("GET").arg(&key).query_async(&mut conn).await.expect("get")],
            "hash" => redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.expect("hgetall"),
            "set" => redis::cmd("SMEMBERS").arg(&key).query_async(&mut conn).await.expect("smembers"),
            _ => Vec::new(),
        };
        for value in values {
            assert!(!contains(&value, SECRET.as_bytes()), "{key} holds the masked value in clear");
        }
    }
}

/// Kill `manager` at random moments of `job` (`rounds` times) and start it again, checking
/// the store (`check`) while no manager runs. Each round waits until the manager resumed the
/// job and GitLab saw it make progress, then kills it somewhere in the next 0 to 1.5 s.
async fn kill_at_random_moments(w: &World, manager: &mut Manager, job: i64, rounds: u32, check: impl AsyncCheck) {
    let mut rng = Rng::from_clock();
    let mut seen = 0;
    for round in 0..rounds {
        let deadline = Instant::now() + WAIT;
        while numbered_lines(&w.trace(job)).len() <= seen && !w.fake.job(job).is_some_and(|j| j.status.is_final()) {
            assert!(Instant::now() < deadline, "job {job} made no progress after a restart:\n{}", manager.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        if w.fake.job(job).is_some_and(|j| j.status.is_final()) {
            break;
        }
        seen = numbered_lines(&w.trace(job)).len();
        eprintln!("round {round}: kill -9 at {seen} lines");
        manager.kill9();
        check.check().await;
        tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
        manager.start();
    }
}

/// A check run while no manager is alive.
trait AsyncCheck {
    async fn check(&self);
}

struct FileStoreSealed<'a>(&'a Path);

impl AsyncCheck for FileStoreSealed<'_> {
    async fn check(&self) {
        for file in files_under(self.0) {
            let bytes = std::fs::read(&file).unwrap_or_default();
            assert!(!contains(&bytes, SECRET.as_bytes()), "{} holds the masked value in clear", file.display());
        }
    }
}

struct RedisSealed<'a>(&'a RedisServer);

impl AsyncCheck for RedisSealed<'_> {
    async fn check(&self) {
        assert_redis_sealed(self.0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_job_survives_kill_9_at_random_moments() {
    let w = world().await;
    let mut manager = w.manager("file", "  health_interval = 1");
    manager.start();
    let (job, effects) = w.counting_job("file");
    w.wait_line(job, 1).await;
    assert_store_sealed(&manager);
    let store = manager.store_dir();
    kill_at_random_moments(&w, &mut manager, job, 5, FileStoreSealed(&store)).await;
    w.wait_for(job, "success", |j| j.final_state.is_some()).await;
    assert_whole(&w, job, &effects, &[&manager]);
    // The entry goes once GitLab has the final state (and the executor is cleaned up).
    let entries =
        || files_under(&manager.store_dir()).into_iter().filter(|f| f.extension().is_some_and(|e| e == "json")).count();
    wait_until(|| entries() == 0, "the store entry is removed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_job_survives_kill_9_at_random_moments() {
    let w = world().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis, 2);
    let mut manager = w.manager("redis", &store);
    manager.start();
    let (job, effects) = w.counting_job("redis");
    w.wait_line(job, 1).await;
    assert_redis_sealed(&redis).await;
    kill_at_random_moments(&w, &mut manager, job, 5, RedisSealed(&redis)).await;
    w.wait_for(job, "success", |j| j.final_state.is_some()).await;
    assert_whole(&w, job, &effects, &[&manager]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_on_one_redis_the_live_one_finishes_the_dead_ones_job() {
    let w = world().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis, 3);
    let mut a = w.manager("a", &store).on_own_machine("s_aaaaaaaaaaaa");
    let mut b = w.manager("b", &store).on_own_machine("s_bbbbbbbbbbbb");
    a.start();
    b.start();
    let (job, effects) = w.counting_job("two");
    w.wait_line(job, 10).await;
    // Whoever owns it dies; the other takes it over once the lease expires.
    let Some(owner) = redis.job_owner(job).await else {
        panic!("no entry for job {job} in Redis; logs:\n{}\n----\n{}", a.log(), b.log());
    };
    eprintln!("owner {owner}; a = {}, b = {}", a.system_id(), b.system_id());
    let (dead, live) = if owner == a.system_id() { (&mut a, &mut b) } else { (&mut b, &mut a) };
    assert_eq!(owner, dead.system_id(), "the job's owner is one of the two managers");
    dead.kill9();
    let taken = Instant::now();
    w.wait_for(job, "success after takeover", |j| j.final_state.is_some()).await;
    eprintln!("taken over and finished {:?} after the kill", taken.elapsed());
    assert!(live.log().contains("taking over a job"), "{}", live.log());
    let metrics = live.metrics().await;
    assert!(
        metrics.contains("runway_store_lease_takeovers_total{")
            && !metrics.contains("takeovers_total{system_id=\"s_bbbbbbbbbbbb\"} 0")
            && !metrics.contains("takeovers_total{system_id=\"s_aaaaaaaaaaaa\"} 0"),
        "{metrics}"
    );
    // The dead manager comes back: the job is someone else's (and over); it leaves it alone.
    dead.start();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_whole(&w, job, &effects, &[&*dead, &*live]);
}

/// `[runners.store]` lines for `redis`, heartbeat every second, taken over after `timeout` s.
fn redis_store(redis: &RedisServer, timeout: u32) -> String {
    format!(
        "  name = \"redis\"\n  health_interval = 1\n  health_timeout = {timeout}\n  [runners.store.redis]\n  url = \"{}\"",
        redis.url()
    )
}

/// The stage's processes are gone: no process has `marker` on its command line.
fn no_process_with(marker: &str) -> bool {
    let out = Command::new("pgrep").arg("-f").arg(marker).output().expect("pgrep");
    out.stdout.is_empty()
}

/// A job that sleeps under a unique process name, to find its processes.
fn sleeping_job(w: &World, name: &str) -> (i64, String) {
    let marker = format!("runway-resume-{}-{name}", std::process::id());
    let spec = JobSpec::new("group/project", name, &["echo begun", &format!("(exec -a {marker} sleep 600)")]);
    (w.fake.enqueue(w.fake.job_payload(&spec)), marker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_jobs_that_may_not_go_on_are_failed_and_cleaned_up() {
    let w = world().await;
    // Stale: the entry is older than stale_timeout when a manager comes back.
    let mut manager = w.manager("stale", "  health_interval = 1\n  health_timeout = 2\n  stale_timeout = 4");
    manager.start();
    let (job, marker) = sleeping_job(&w, "stale");
    w.wait_for(job, "start", |j| j.trace_text().contains("begun")).await;
    manager.kill9();
    tokio::time::sleep(Duration::from_secs(5)).await;
    manager.start();
    let record = w.wait_for(job, "failure", |j| j.final_state.is_some()).await;
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    assert!(record.trace_text().contains("cannot be resumed") && record.trace_text().contains("stale_timeout"));
    wait_until(|| no_process_with(&marker), "the stale job's process is killed").await;
    let metrics = manager.metrics().await;
    assert!(metrics.contains("runway_store_resumes_total{result=\"stale\""), "{metrics}");
    assert!(metrics.contains("runway_store_entries{"), "{metrics}");
    manager.kill9();

    // max_retries: the second resume is one too many.
    let mut manager = w.manager("retries", "  health_interval = 1\n  max_retries = 1");
    manager.start();
    let (job, marker) = sleeping_job(&w, "retries");
    w.wait_for(job, "start", |j| j.trace_text().contains("begun")).await;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        manager.kill9();
        manager.start();
    }
    let record = w.wait_for(job, "failure", |j| j.final_state.is_some()).await;
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    assert!(record.trace_text().contains("max_retries = 1"), "{}", record.trace_text());
    wait_until(|| no_process_with(&marker), "the job's process is killed").await;

    // Cancelled in GitLab while no manager was alive: cancelled and cleaned up.
    let (job, marker) = sleeping_job(&w, "cancel");
    w.wait_for(job, "start", |j| j.trace_text().contains("begun")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    manager.kill9();
    w.fake.cancel(job);
    manager.start();
    let record = w.wait_for(job, "cancel", |j| j.status.is_final()).await;
    assert_eq!(record.status, JobStatus::Canceled, "{}", record.trace_text());
    wait_until(|| no_process_with(&marker), "the cancelled job's process is killed").await;

    // Corrupt: an entry that is not one, and a job whose stored trace is cut short.
    let (job, marker) = sleeping_job(&w, "corrupt");
    w.wait_for(job, "start", |j| j.trace_text().contains("begun")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    manager.kill9();
    // What the journal holds goes into the files first (as the next manager would do).
    let runner_store = files_under(&manager.store_dir())
        .into_iter()
        .find_map(|f| f.file_name().is_some_and(|n| n == "journal").then(|| f.with_file_name("")))
        .expect("the runner's store directory");
    let key = StoreKey::load_or_create(&manager.process.dir().join(".runway-store.key")).expect("store key");
    drop(FileStore::open(&runner_store, key).expect("open the store"));
    let dir = runner_store.join(format!("{job}.trace"));
    assert!(dir.exists(), "no stored trace in {:?}", files_under(&runner_store));
    std::fs::write(&dir, b"cut").expect("cut the stored trace");
    let garbage = dir.with_file_name("999999.json");
    std::fs::write(&garbage, b"{ this is not an entry").expect("garbage entry");
    manager.start();
    let record = w.wait_for(job, "failure", |j| j.final_state.is_some()).await;
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    wait_until(|| !garbage.exists(), "the corrupt entry is removed").await;
    assert!(manager.log().contains("corrupt"), "{}", manager.log());
    wait_until(|| no_process_with(&marker), "the corrupt job's process is killed").await;
    // The manager keeps serving.
    let next = w.fake.enqueue(w.fake.job_payload(&JobSpec::new("group/project", "after", &["echo still serving"])));
    let record = w.wait_for(next, "the next job", |j| j.final_state.is_some()).await;
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
}

async fn wait_until(f: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_reload_does_not_resume_what_the_retiring_manager_still_runs() {
    let w = world().await;
    let mut manager = w.manager("reload", "  health_interval = 1\n  cleanup_interval = 1");
    manager.start();
    let (job, effects) = w.counting_job("reload");
    w.wait_line(job, 10).await;
    // SIGHUP: a new manager takes over polling while the old one's job runs on; the new one's
    // store watcher (sweeping every second) must leave that job to it.
    let pid = manager.process.pid().expect("running");
    // SAFETY: signalling our own child process.
    unsafe {
        libc::kill(pid as i32, libc::SIGHUP);
    }
    w.wait_for(job, "success", |j| j.final_state.is_some()).await;
    assert_whole(&w, job, &effects, &[&manager]);
    assert!(manager.log().contains("reload"), "{}", manager.log());
    assert!(!manager.log().contains("resuming a stored job"), "{}", manager.log());
}

// ---- Jobs on fleet instances (issue 30). ----

/// The fleet a manager's runner runs on: `static` hosts (each a real sshd) and, for
/// `docker-autoscaler`, the engine reached through them.
struct FleetSetup<'a> {
    executor: &'a str,
    hosts: Vec<String>,
    user: String,
    key: &'a sshd::ClientKey,
    docker: Option<&'static dockerd::Dockerd>,
    /// Bound into the job's containers (where the counting job records its starts).
    effects: &'a Path,
}

impl World {
    /// A manager named `name` whose runner runs `fleet`'s executor on its instances, one job
    /// per instance, with the fleet state kept (the default) and `[runners.store]` `store`.
    fn fleet_manager(&self, name: &str, fleet: &FleetSetup<'_>, store: &str) -> Manager {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).expect("manager dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
        let hosts: Vec<String> = fleet.hosts.iter().map(|h| format!("{h:?}")).collect();
        let docker = match fleet.docker {
            Some(d) => format!("[plugins.docker]\nallow_docker = [\"{host}\", \"instance\"]\n\n", host = d.host()),
            None => String::new(),
        };
        let docker_section = match fleet.docker {
            Some(d) => format!(
                "  [runners.docker]\n  host = \"{host}\"\n  image = \"{image}\"\n  pull_policy = [\"if-not-present\"]\n  volumes = [\"{effects}:{effects}\"]\n",
                host = d.host(),
                image = d.job_image(),
                effects = fleet.effects.display()
            ),
            None => String::new(),
        };
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5
listen_address = "127.0.0.1:{port}"

{docker}[[runners]]
name = "{name}"
url = "{url}"
token = "{token}"
executor = "{executor}"
builds_dir = "{builds}"
cache_dir = "{cache}"
{docker_section}  [runners.autoscaler]
  plugin = "static"
  capacity_per_instance = 1
  max_instances = {max}
  update_interval = "1s"
  update_interval_when_expecting = "1s"
  [runners.autoscaler.plugin_config]
  hosts = [{hosts}]
  [runners.autoscaler.connector_config]
  username = "{user}"
  key_path = "{key}"
  timeout = "10s"
  keepalive = "2s"
  [[runners.autoscaler.policy]]
  idle_count = 1
  idle_time = "2s"
  [runners.store]
{store}
"#,
            url = self.fake.url(),
            token = self.token,
            executor = fleet.executor,
            // Shared, as a runner's managers share their config.
            builds = self.root.path().join("fleet-builds").display(),
            cache = self.root.path().join("cache").display(),
            max = fleet.hosts.len(),
            hosts = hosts.join(", "),
            user = fleet.user,
            key = fleet.key.private_path.display(),
        );
        std::fs::write(dir.join("config.toml"), config).expect("config");
        Manager { process: RunwayProcess::new(dir).env("RUNWAY_STORE_KEY", STORE_KEY).env_remove("DOCKER_HOST"), port }
    }

    /// The counting job, cloning nothing (a job container's network cannot reach the fake
    /// GitLab; the instance's shell could, but both executors run the same job).
    fn fleet_counting_job(&self, name: &str) -> (i64, PathBuf) {
        let effects = self.root.path().join(format!("effects-{name}"));
        std::fs::create_dir_all(&effects).expect("effects dir");
        let step = format!("echo started >> {}/step", effects.display());
        let count = format!("for i in $(seq 1 {LINES}); do echo \"line $i of {LINES}\"; sleep 0.1; done");
        let after = format!("echo ran >> {}/after", effects.display());
        let mut spec = JobSpec::new("group/project", name, &[&step, "echo \"the secret is $RESUME_SECRET\"", &count])
            .variable("GIT_STRATEGY", "none");
        spec = spec.after_script(&[&after]);
        spec.masked_variables.push(("RESUME_SECRET".into(), SECRET.into()));
        (self.fake.enqueue(self.fake.job_payload(&spec)), effects)
    }
}

/// The instance a job connected to, from its trace.
fn instance_in(trace: &str) -> Option<String> {
    trace.lines().find_map(|l| l.split("Connected to instance ").nth(1)?.split_whitespace().next().map(str::to_string))
}

/// Kill `manager` once while `job` runs on its instance, run a second job while it is down
/// and after its restart (it must go to the other instance: the first one's slot is held), and
/// check the first job's whole log, and that no manager removed its instance meanwhile.
async fn a_fleet_job_survives_kill_9(executor: &str, net: u8, docker: Option<&'static dockerd::Dockerd>) {
    let w = world().await;
    let key = sshd::ClientKey::generate();
    let servers: Vec<sshd::SshServer> =
        [1, 2].iter().map(|last| sshd::SshServer::start(Ipv4Addr::new(127, 0, net, *last), &key)).collect();
    let (job, effects) = w.fleet_counting_job(executor);
    let fleet = FleetSetup {
        executor,
        hosts: servers.iter().map(|s| s.host_entry()).collect(),
        user: servers[0].user.clone(),
        key: &key,
        docker,
        effects: &effects,
    };
    let mut manager = w.fleet_manager(executor, &fleet, "  health_interval = 1");
    manager.start();
    w.wait_line(job, 20).await;
    let on = instance_in(&w.trace(job)).unwrap_or_else(|| panic!("no instance in the trace:\n{}", w.trace(job)));
    assert_store_sealed(&manager);
    manager.kill9();
    let lines_at_kill = numbered_lines(&w.trace(job)).len();
    // Another job while no manager runs, and the manager back: it gets the other instance.
    let other = w.fake.enqueue(w.fake.job_payload(
        &JobSpec::new("group/project", "meanwhile", &["echo meanwhile"]).variable("GIT_STRATEGY", "none"),
    ));
    manager.start();
    let record = w.wait_for(other, "the second job", |j| j.final_state.is_some()).await;
    let trace = record.trace_text();
    assert_eq!(record.status, JobStatus::Success, "{trace}\n{}", manager.log());
    let other_on = instance_in(&trace).unwrap_or_else(|| panic!("no instance:\n{trace}"));
    assert_ne!(other_on, on, "the held instance was handed to another job:\n{}", manager.log());
    w.wait_for(job, "success after the restart", |j| j.final_state.is_some()).await;
    assert!(numbered_lines(&w.trace(job)).len() > lines_at_kill);
    assert_whole(&w, job, &effects, &[&manager]);
    let log = manager.log();
    assert!(
        !log.lines().any(|l| l.contains("removing instance") && l.contains(&on) && !l.contains("idle")),
        "the job's instance {on} was removed while the job ran:\n{log}"
    );
    assert!(log.contains("resuming a stored job"), "{log}");
    // Its slot is freed afterwards like any job's: the instance serves the next one.
    let next = w.fake.enqueue(
        w.fake.job_payload(&JobSpec::new("group/project", "next", &["echo next"]).variable("GIT_STRATEGY", "none")),
    );
    let record = w.wait_for(next, "a job after the resumed one", |j| j.final_state.is_some()).await;
    assert_eq!(record.status, JobStatus::Success, "{}", record.trace_text());
    drop(servers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_executor_job_survives_kill_9_on_its_instance() {
    a_fleet_job_survives_kill_9("instance", 61, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_autoscaler_job_survives_kill_9_on_its_instance() {
    let docker = tokio::task::spawn_blocking(dockerd::shared).await.expect("daemon");
    a_fleet_job_survives_kill_9("docker-autoscaler", 62, Some(docker)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_manager_on_redis_finishes_a_fleet_job_on_the_dead_ones_instance() {
    let w = world().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis, 3);
    let key = sshd::ClientKey::generate();
    // Each manager has a fleet of its own (one host each): the survivor's provider does not
    // know the dead one's instance, and reaches it with the connect info stored with the job.
    let a_host = sshd::SshServer::start(Ipv4Addr::new(127, 0, 63, 1), &key);
    let b_host = sshd::SshServer::start(Ipv4Addr::new(127, 0, 63, 2), &key);
    let (job, effects) = w.fleet_counting_job("takeover");
    let setup = |host: &sshd::SshServer| FleetSetup {
        executor: "instance",
        hosts: vec![host.host_entry()],
        user: host.user.clone(),
        key: &key,
        docker: None,
        effects: &effects,
    };
    let mut a = w.fleet_manager("fleet-a", &setup(&a_host), &store).on_own_machine("s_aaaaaaaaaaa1");
    a.start();
    w.wait_line(job, 10).await;
    let on = instance_in(&w.trace(job)).expect("instance");
    assert_eq!(on, a_host.host_entry(), "a ran it");
    let mut b = w.fleet_manager("fleet-b", &setup(&b_host), &store).on_own_machine("s_bbbbbbbbbbb1");
    b.start();
    a.kill9();
    w.wait_for(job, "success after takeover", |j| j.final_state.is_some()).await;
    assert!(b.log().contains("taking over a job"), "{}", b.log());
    assert!(b.log().contains("reconnecting with the stored connect info"), "{}", b.log());
    assert_whole(&w, job, &effects, &[&a, &b]);
    assert_redis_sealed(&redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_executor_job_survives_kill_9_on_its_host() {
    let w = world().await;
    let key = sshd::ClientKey::generate();
    let host = sshd::SshServer::start(Ipv4Addr::new(127, 0, 64, 1), &key);
    let known = w.root.path().join("known_hosts");
    std::fs::write(&known, host.known_hosts_line()).expect("known_hosts");
    let ssh = format!(
        "executor = \"ssh\"\nbuilds_dir = \"{}\"\n[runners.ssh]\nhost = \"{}\"\nport = \"{}\"\nuser = \"{}\"\nidentity_file = \"{}\"\nknown_hosts_file = \"{}\"\n[runners.store]\n  health_interval = 1\n",
        w.root.path().join("ssh-builds").display(),
        host.addr,
        host.port,
        host.user,
        key.private_path.display(),
        known.display()
    );
    let mut manager = w.manager("ssh", "");
    let config = manager.process.dir().join("config.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    let shell_runner = text.find("executor = \"shell\"").expect("runner");
    std::fs::write(&config, format!("{}{ssh}", &text[..shell_runner])).expect("config");
    manager.start();
    let (job, effects) = w.fleet_counting_job("ssh");
    w.wait_line(job, 1).await;
    let store = manager.store_dir();
    kill_at_random_moments(&w, &mut manager, job, 2, FileStoreSealed(&store)).await;
    w.wait_for(job, "success", |j| j.final_state.is_some()).await;
    assert_whole(&w, job, &effects, &[&manager]);
}
