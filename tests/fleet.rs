//! Autoscaled fleets end to end: `runway run` as a real process against the fake GitLab, the
//! `static` fleeting plugin over real OpenSSH servers (one per 127.0.0.x address, each with a
//! generated host key), the instance executor running jobs on them over SSH, and the fleeting
//! metrics as the administrator sees them on `/metrics`.

#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_gitlab::{CreatedRunner, FakeGitLab, JobRecord, JobSpec, JobStatus};
use sshd::{ClientKey, SshServer};

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");
const WAIT: Duration = Duration::from_secs(90);

struct Fleet {
    fake: FakeGitLab,
    runner: CreatedRunner,
    key: ClientKey,
    servers: Vec<SshServer>,
    dir: tempfile::TempDir,
    metrics_port: u16,
    child: Option<Child>,
    /// Appended to config.toml (more `[[runners]]`, `[plugins.NAME]` grants).
    extra: String,
}

impl Fleet {
    /// A fake GitLab with a project, and one sshd per address.
    async fn new(addresses: &[u8]) -> Fleet {
        let fake =
            FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(1), trace_update_interval: 1 })
                .await;
        let runner = fake.create_runner("fleet");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
        let key = ClientKey::generate();
        let servers = addresses.iter().map(|last| SshServer::start(Ipv4Addr::new(127, 0, 0, *last), &key)).collect();
        let metrics_port = sshd::free_port(Ipv4Addr::LOCALHOST);
        let dir = tempfile::tempdir().expect("tempdir");
        Fleet { fake, runner, key, servers, dir, metrics_port, child: None, extra: String::new() }
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    /// Write config.toml with `autoscaler` lines (keys of `[runners.autoscaler]`) and `policy`
    /// lines (keys of one `[[runners.autoscaler.policy]]`).
    fn write_config(&self, autoscaler: &str, policy: &str) {
        let hosts: Vec<String> = self.servers.iter().map(|s| format!("{:?}", s.host_entry())).collect();
        let text = format!(
            r#"concurrent = 4
check_interval = 1
listen_address = "127.0.0.1:{port}"
shutdown_timeout = 10

[[runners]]
name = "fleet"
url = "{url}"
token = "{token}"
executor = "instance"
builds_dir = "{builds}"

[runners.autoscaler]
plugin = "static"
update_interval = "1s"
update_interval_when_expecting = "1s"
deletion_retry_interval = "2s"
{autoscaler}

[runners.autoscaler.plugin_config]
hosts = [{hosts}]

[runners.autoscaler.connector_config]
username = "{user}"
key_path = "{key}"
timeout = "10s"
keepalive = "2s"

[[runners.autoscaler.policy]]
{policy}

{extra}
"#,
            extra = self.extra,
            port = self.metrics_port,
            url = self.fake.url(),
            token = self.runner.token,
            builds = self.dir.path().join("builds").display(),
            hosts = hosts.join(", "),
            user = self.servers[0].user,
            key = self.key.private_path.display(),
        );
        std::fs::write(self.config_path(), text).expect("config.toml");
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("runway.log"))
            .expect("log");
        let child = Command::new(RUNWAY)
            .arg("-c")
            .arg(self.config_path())
            .arg("run")
            .current_dir(self.dir.path())
            .env("RUST_LOG", "info")
            // Only for a runner whose grant names them (none but the broken-provider test's).
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway run starts");
        self.child = Some(child);
    }

    /// SIGQUIT, and wait for the process to exit.
    async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGQUIT);
        }
        for _ in 0..300 {
            if child.try_wait().expect("wait").is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        panic!("runway did not stop on SIGQUIT:\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runway.log")).unwrap_or_default()
    }

    fn enqueue(&self, name: &str, script: &[&str]) -> i64 {
        self.fake.enqueue(self.fake.job_payload(&JobSpec::new("group/project", name, script)))
    }

    async fn finished(&self, job: i64) -> JobRecord {
        match self.fake.wait_for_job_state(job, |j| j.final_state.is_some(), WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {job} did not finish; trace:\n{}\nrunway log:\n{}",
                self.fake.job(job).map(|j| j.trace_text()).unwrap_or_default(),
                self.log()
            ),
        }
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        // Until runway serves them: its start compiles the plugins, which takes a while on a
        // busy machine.
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(response) = reqwest::get(&url).await {
                if let Ok(text) = response.text().await {
                    return text;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no metrics at {url}:\n{}", self.log());
    }

    /// The value of the first sample whose name and labels contain every part of `pattern`.
    async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_value(&self.metrics().await, name, labels)
    }

    /// Wait until `name{labels}` satisfies `check`.
    async fn wait_metric(&self, name: &str, labels: &[&str], check: impl Fn(f64) -> bool, what: &str) -> f64 {
        // Counted from the first scrape: runway's start (compiling plugins) has its own wait.
        let mut deadline = None;
        loop {
            let text = self.metrics().await;
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
            let value = metric_value(&text, name, labels);
            if check(value) {
                return value;
            }
            if Instant::now() > deadline {
                panic!("{what}: {name}{labels:?} = {value}\n{text}\nrunway log:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn server_by_entry(&mut self, entry: &str) -> &mut SshServer {
        self.servers.iter_mut().find(|s| s.host_entry() == entry).expect("a server of the fleet")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn metric_value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| labels.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The instance a job ran on, from its trace ("Instance 127.0.0.2:2222 acquired ...").
fn instance_of(record: &JobRecord) -> String {
    let trace = record.trace_text();
    trace
        .lines()
        .find_map(|l| l.split("Instance ").nth(1).and_then(|rest| rest.split(' ').next()).map(str::to_string))
        .unwrap_or_else(|| panic!("no instance in the trace:\n{trace}"))
}

fn assert_success(record: &JobRecord) {
    assert_eq!(record.status, JobStatus::Success, "{}", record.trace_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_from_zero_runs_jobs_on_instances_and_scales_down_when_idle() {
    let mut fleet = Fleet::new(&[2, 3, 4]).await;
    fleet.write_config(
        "max_instances = 3\ninstance_ready_command = \"test -d /\"",
        "idle_count = 0\nidle_time = \"3s\"",
    );
    fleet.start();
    assert_eq!(
        fleet.metric("fleeting_provisioner_instances", &["state=\"running\""]).await,
        0.0,
        "nothing before jobs arrive"
    );
    // gitlab-runner's const labels on the fleeting families, and the configured limits.
    assert_eq!(
        fleet.metric("fleeting_provisioner_max_instances", &["runner_name=\"fleet\"", "system_id=\""]).await,
        3.0
    );
    assert_eq!(fleet.metric("fleeting_taskscaler_max_tasks_per_instance", &["runner_name=\"fleet\""]).await, 1.0);

    // Three jobs that overlap in time need three instances.
    let jobs: Vec<i64> = (0..3)
        .map(|i| fleet.enqueue(&format!("job{i}"), &["echo \"ran in $PWD on $SSH_CONNECTION\"", "sleep 4"]))
        .collect();
    let mut instances = BTreeSet::new();
    for job in &jobs {
        let record = fleet.finished(*job).await;
        assert_success(&record);
        let trace = record.trace_text();
        assert!(trace.contains("Preparing the \"instance\" executor"), "{trace}");
        assert!(trace.contains(&format!("ran in {}", fleet.dir.path().join("builds").display())), "{trace}");
        let instance = instance_of(&record);
        let address = instance.split(':').next().unwrap_or_default().to_string();
        assert!(trace.contains(&format!(" {address} ")), "the job ran over SSH on its instance {instance}:\n{trace}");
        instances.insert(instance);
        // The fake is a GitLab with two-phase commit on (its default): the job stayed pending
        // until Runway accepted it with its instance ready.
        assert_eq!(record.handed_out, Some(JobStatus::Pending), "two-phase commit kept");
    }
    assert_eq!(fleet.fake.rejected_updates(), vec![], "no update GitLab refused");
    assert_eq!(instances.len(), 3, "jobs ran on three instances: {instances:?}");
    assert_eq!(fleet.metric("fleeting_provisioner_instance_operations_total", &["operation=\"create\""]).await, 3.0);

    // idle_time passes with no jobs: every instance leaves, reason idle.
    fleet
        .wait_metric(
            "fleeting_provisioner_instance_operations_total",
            &["reason=\"idle\""],
            |v| v == 3.0,
            "idle scale-down",
        )
        .await;
    fleet.wait_metric("fleeting_provisioner_instances", &["state=\"running\""], |v| v == 0.0, "instances gone").await;
    // The fleeting timing histograms saw the three instances come and go.
    fleet
        .wait_metric(
            "fleeting_provisioner_instance_life_duration_seconds_count",
            &["runner_name=\"fleet\""],
            |v| v == 3.0,
            "three lives timed",
        )
        .await;
    assert_eq!(
        fleet.metric("fleeting_taskscaler_task_instance_readiness_time_seconds_bucket", &["le=\"+Inf\""]).await,
        3.0
    );
    fleet.stop().await;
}

/// A GitLab without two-phase commit (`allow_runner_job_acknowledgement` off, as on most
/// instances since GitLab parked it) hands every job out `running` whatever the runner
/// advertises and refuses `PUT state=pending`. Runway takes the job at once, as gitlab-runner
/// does: GitLab shows it running with its log while it waits for its instance, and nothing
/// Runway sends is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_without_two_phase_commit_refuses_nothing_while_a_job_waits_for_its_instance() {
    let mut fleet = Fleet::new(&[16]).await;
    fleet.fake.set_two_phase_commit(false);
    // The instance is ready only once the test says so: the job waits for it as long as needed.
    let gate = fleet.dir.path().join("instance-may-be-ready");
    fleet.write_config(
        &format!(
            "max_instances = 1\ninstance_ready_command = \"while [ ! -e {} ]; do sleep 0.1; done\"",
            gate.display()
        ),
        "idle_count = 0\nidle_time = \"1h\"",
    );
    fleet.start();
    let job = fleet.enqueue("no-two-phase", &["echo ran on its instance"]);

    let accepted_while_waiting = |j: &JobRecord| {
        j.updates.iter().any(|u| u["state"] == "running")
            && j.trace_text().contains("Preparing the \"instance\" executor")
    };
    let Some(waiting) = fleet.fake.wait_for_job_state(job, accepted_while_waiting, WAIT).await else {
        panic!(
            "the job was not taken while it waited for its instance: {:?}\nrunway log:\n{}",
            fleet.fake.job(job).map(|j| (j.status, j.updates)),
            fleet.log()
        );
    };
    assert_eq!(waiting.handed_out, Some(JobStatus::Running));
    assert!(!waiting.trace_text().contains("ran on its instance"), "the instance was not ready yet");

    std::fs::write(&gate, "").expect("gate");
    let record = fleet.finished(job).await;
    assert_success(&record);
    assert!(record.trace_text().contains("ran on its instance"), "{}", record.trace_text());
    let states: Vec<&str> = record.updates.iter().filter_map(|u| u["state"].as_str()).collect();
    assert!(!states.contains(&"pending"), "no two-phase keep-alive: {states:?}");
    assert_eq!(fleet.fake.rejected_updates(), vec![], "no update GitLab refused");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_retire_at_max_use_count() {
    let mut fleet = Fleet::new(&[5, 6]).await;
    fleet.write_config("max_instances = 2\nmax_use_count = 2", "idle_count = 1\nidle_time = \"1h\"");
    fleet.start();
    // Six jobs one after the other. At most two instances live at a time and one leaves only
    // when retired, so with each serving at most two jobs, at least (6 - 2) / 2 = 2 were
    // retired, and at least three were created. (Fewer jobs prove less: a static host
    // comes back under the same address once released, so 4 jobs may end with one
    // retirement — A, B, A retired, then A again — and addresses cannot tell lives apart.)
    const JOBS: usize = 6;
    for i in 0..JOBS {
        let job = fleet.enqueue(&format!("use{i}"), &["echo hello"]);
        let record = fleet.finished(job).await;
        assert_success(&record);
        instance_of(&record);
    }
    fleet
        .wait_metric(
            "fleeting_provisioner_instance_operations_total",
            &["reason=\"max_use_count\""],
            |v| v >= 2.0,
            "retirements",
        )
        .await;
    let creations = fleet.metric("fleeting_provisioner_instance_operations_total", &["operation=\"create\""]).await;
    assert!(creations * 2.0 >= JOBS as f64, "{creations} instances served {JOBS} jobs\n{}", fleet.log());
    fleet.stop().await;
}

/// `[runners.instance] use_common_build_dir` as gitlab-runner's instance executor honours it:
/// with one job per instance (`max_use_count = 1`) the project directory is
/// `<builds_dir>/<namespace>/<project>`, not namespaced by runner token and slot; with reused
/// instances it has no effect and the job's log says so. `allowed_images` is accepted and
/// named at load. (One runner, started twice: two `static` fleets in one process would share
/// the plugin's key-value store.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_common_build_dir_applies_with_one_job_per_instance_and_warns_otherwise() {
    let mut fleet = Fleet::new(&[17]).await;
    fleet.extra = "[runners.instance]\nuse_common_build_dir = true\nallowed_images = [\"ruby:*\"]\n".into();
    let script = ["echo \"dir=$CI_PROJECT_DIR pwd=$(pwd).\""];
    let warning = "WARNING: use_common_build_dir has no effect: requires vm isolation or max_use_count = 1";
    let builds = fleet.dir.path().join("builds");

    fleet.write_config("max_instances = 1\nmax_use_count = 1", "idle_count = 0\nidle_time = \"1h\"");
    fleet.start();
    let record = fleet.finished(fleet.enqueue("common", &script)).await;
    assert_success(&record);
    let trace = record.trace_text();
    let dir = builds.join("group/project");
    assert!(trace.contains(&format!("dir={0} pwd={0}.", dir.display())), "{trace}");
    assert!(!trace.contains(warning), "{trace}");
    // allowed_images is named at load: it applies only with vm_isolation.
    let log = fleet.log();
    assert!(log.contains("runners.0.instance.allowed_images: applies only with vm_isolation"), "{log}");
    fleet.stop().await;

    fleet.write_config("max_instances = 1\nmax_use_count = 5", "idle_count = 0\nidle_time = \"1h\"");
    fleet.start();
    let record = fleet.finished(fleet.enqueue("namespaced", &script)).await;
    assert_success(&record);
    let trace = record.trace_text();
    let short = &fleet.runner.token["glrt-".len().."glrt-".len() + 9];
    let dir = builds.join(short).join("0").join("group/project");
    assert!(trace.contains(&format!("dir={0} pwd={0}.", dir.display())), "{trace}");
    // Once, in prepare_executor, after its header.
    assert_eq!(trace.matches(warning).count(), 1, "{trace}");
    let header = trace.find("Preparing the \"instance\" executor").expect("header");
    assert!(trace.find(warning).is_some_and(|at| at > header), "{trace}");
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_ready_command_replaces_the_instance_without_a_storm() {
    let mut fleet = Fleet::new(&[7, 8]).await;
    // The instance at 127.0.0.7 never becomes ready. Two idle instances are wanted, so the
    // fleet keeps trying to replace it for as long as the test watches: without a back-off it
    // would be re-created on every update (1 s).
    let ready = r#"instance_ready_command = "case \"$SSH_CONNECTION\" in *' 127.0.0.7 '*) exit 1;; esac""#;
    fleet.write_config(&format!("max_instances = 2\n{ready}"), "idle_count = 2\nidle_time = \"1h\"");
    fleet.start();
    let started = Instant::now();
    let job = fleet.enqueue("ready", &["echo hello"]);
    let record = fleet.finished(job).await;
    assert_success(&record);
    assert!(instance_of(&record).starts_with("127.0.0.8:"), "{}", record.trace_text());
    assert!(fleet.metric("fleeting_provisioner_failures_total", &["kind=\"ready_command\""]).await >= 1.0);
    assert!(fleet.metric("fleeting_provisioner_instance_operations_total", &["reason=\"ready_failed\""]).await >= 1.0);
    // No storm: creations stay few, bounded by the back-off, not by the poll interval. First
    // the failing instance must have been re-created and failed again (so there was demand to
    // storm on)...
    fleet
        .wait_metric("fleeting_provisioner_failures_total", &["kind=\"ready_command\""], |v| v >= 2.0, "a retry")
        .await;
    // ...then the runner goes through eight more job-request rounds (each a 1 s long poll or
    // check_interval, timed by the same process that times the fleet's updates): without a
    // back-off that is several more creations; with it (5 s, then 10 s) at most one.
    let requests = "/api/v4/jobs/request";
    let seen = fleet.fake.requests_to("POST", requests).len();
    assert!(
        fleet.fake.wait_for_request_count("POST", requests, seen + 8, WAIT).await,
        "runway stopped polling:\n{}",
        fleet.log()
    );
    let creations = fleet.metric("fleeting_provisioner_instance_operations_total", &["operation=\"create\""]).await;
    let seconds = started.elapsed().as_secs_f64();
    assert!(creations <= 4.0, "{creations} creations in {seconds:.0}s\n{}", fleet.log());
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_lost_mid_job_fails_the_job_and_capacity_recovers() {
    let mut fleet = Fleet::new(&[9, 10]).await;
    fleet.write_config("max_instances = 2\nfailure_threshold = 2", "idle_count = 0\nidle_time = \"1h\"");
    fleet.start();
    let job = fleet.enqueue("doomed", &["echo started", "sleep 60"]);
    let record = match fleet.fake.wait_for_job_state(job, |j| j.trace_text().contains("started"), WAIT).await {
        Some(r) => r,
        None => panic!("the job did not start:\n{}", fleet.log()),
    };
    let instance = instance_of(&record);
    fleet.server_by_entry(&instance).kill();
    let record = fleet.finished(job).await;
    assert_eq!(record.failure_reason.as_deref(), Some("runner_system_failure"), "{}", record.trace_text());
    fleet
        .wait_metric(
            "fleeting_provisioner_instance_operations_total",
            &["reason=\"unhealthy\""],
            |v| v == 1.0,
            "the dead instance is removed",
        )
        .await;

    // Capacity recovers on the other instance.
    let job = fleet.enqueue("after", &["echo fine"]);
    let record = fleet.finished(job).await;
    assert_success(&record);
    assert_ne!(instance_of(&record), instance);
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_adopts_its_instances_and_deletes_none() {
    let mut fleet = Fleet::new(&[11, 12]).await;
    fleet.write_config("max_instances = 2\nmax_use_count = 10", "idle_count = 2\nidle_time = \"1h\"");
    fleet.start();
    fleet
        .wait_metric("fleeting_provisioner_instances", &["state=\"running\""], |v| v == 2.0, "two idle instances")
        .await;
    let job = fleet.enqueue("before", &["echo one"]);
    let first = instance_of(&fleet.finished(job).await);
    fleet.stop().await;
    let state = std::fs::read_dir(fleet.dir.path().join(".taskscaler")).expect("fleet state saved").count();
    assert_eq!(state, 1);

    fleet.start();
    fleet
        .wait_metric("fleeting_provisioner_instances", &["state=\"running\""], |v| v == 2.0, "adopted instances")
        .await;
    let text = fleet.metrics().await;
    assert_eq!(
        metric_value(&text, "fleeting_provisioner_instance_operations_total", &["operation=\"create\""]),
        0.0,
        "{text}"
    );
    for reason in ["idle", "unknown", "shutdown", "lost", "unhealthy"] {
        let removed =
            metric_value(&text, "fleeting_provisioner_instance_operations_total", &[&format!("reason=\"{reason}\"")]);
        assert_eq!(removed, 0.0, "removed for {reason}:\n{text}");
    }
    let job = fleet.enqueue("after", &["echo two"]);
    let record = fleet.finished(job).await;
    assert_success(&record);
    let second = instance_of(&record);
    assert!(
        [first.clone(), second.clone()].iter().all(|i| fleet.servers.iter().any(|s| s.host_entry() == *i)),
        "{first} {second}"
    );
    fleet.stop().await;
}

/// The lines of metric `name` (its samples), for families with one sample per runner.
fn samples(text: &str, name: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_whose_provider_fails_requests_no_job_and_the_others_serve() {
    let mut fleet = Fleet::new(&[13]).await;
    let broken = fleet.fake.create_runner("broken");
    // An AWS fleet whose grant lets the plugin read its credentials but reach no host: every
    // request is refused by the host (as with a forgotten `allow_hosts` entry).
    let nowhere = sshd::free_port(Ipv4Addr::LOCALHOST);
    fleet.extra = format!(
        r#"[[runners]]
name = "broken"
url = "{url}"
token = "{token}"
executor = "instance"

[runners.autoscaler]
plugin = "aws"
update_interval = "1s"
update_interval_when_expecting = "1s"

[runners.autoscaler.plugin_config]
name = "ci"
region = "us-east-1"
endpoint = "http://127.0.0.1:{nowhere}/"

[[runners.autoscaler.policy]]
idle_count = 1

[plugins.aws]
env = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
"#,
        url = fleet.fake.url(),
        token = broken.token,
    );
    fleet.write_config("max_instances = 1", "idle_count = 1\nidle_time = \"1h\"");
    fleet.start();
    // A job only the broken runner may take stays pending; the working runner runs its own.
    let stranded = fleet.fake.enqueue_for(
        &broken.token,
        fleet.fake.job_payload(&JobSpec::new("group/project", "stranded", &["echo never"])),
    );
    let job = fleet.enqueue("served", &["echo served"]);
    assert_success(&fleet.finished(job).await);

    let text = fleet.metrics().await;
    let up = samples(&text, "runway_fleet_provider_up");
    assert_eq!(up.len(), 2, "{text}");
    assert_eq!(up.iter().filter(|l| l.ends_with(" 0")).count(), 1, "one provider failing:\n{text}");
    assert_eq!(up.iter().filter(|l| l.ends_with(" 1")).count(), 1, "one answering:\n{text}");
    let provider_failures = |text: &str| -> f64 {
        samples(text, "fleeting_provisioner_failures_total")
            .iter()
            .filter(|l| l.contains("kind=\"provider\""))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    let failures = provider_failures(&text);
    assert!(failures >= 1.0, "{text}");
    let ready = reqwest::get(format!("http://127.0.0.1:{}/health/ready", fleet.metrics_port))
        .await
        .expect("ready")
        .text()
        .await;
    let ready = ready.expect("body");
    assert!(ready.contains("fleet provider failing") && ready.contains("allow_hosts"), "{ready}");

    // The failing runner never asked GitLab for a job; its job is still pending.
    let asked = fleet
        .fake
        .requests_to("POST", "/api/v4/jobs/request")
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains(&broken.token))
        .count();
    assert_eq!(asked, 0, "the broken runner asked for jobs");
    assert_eq!(fleet.fake.job(stranded).map(|j| j.status), Some(JobStatus::Pending));
    let log = fleet.log();
    assert!(log.contains("fleet provider failed to start") && log.contains("allow_hosts"), "{log}");
    // Retried with back-off: the failure counter grows.
    let deadline = Instant::now() + WAIT;
    while provider_failures(&fleet.metrics().await) <= failures {
        assert!(Instant::now() < deadline, "the provider is not retried:\n{}", fleet.log());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let child = fleet.child.as_mut().expect("running");
    assert!(child.try_wait().expect("wait").is_none(), "runway run stopped:\n{}", fleet.log());
    fleet.stop().await;
}

/// A wasm custom section (`name`, `payload`): appended to a component, it changes the file's
/// bytes (a new version to the plugin host) and nothing else.
fn custom_section(name: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![u8::try_from(name.len()).expect("short name")];
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    let mut section = vec![0u8, u8::try_from(body.len()).expect("short section")];
    section.extend(body);
    section
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleeting_plugin_hot_swapped_under_a_running_job_adopts_its_instances() {
    let mut fleet = Fleet::new(&[14, 15]).await;
    let plugins = fleet.dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugins dir");
    let wasm = std::fs::read(PathBuf::from(env!("RUNWAY_GUEST_DIR")).join("fleeting_static.wasm")).expect("static");
    std::fs::write(plugins.join("static.wasm"), &wasm).expect("install v1");
    fleet.extra = "[plugins.static]\nfile = \"static.wasm\"\n".into();
    fleet.write_config("max_instances = 2", "idle_count = 2\nidle_time = \"1h\"");
    fleet.start();
    fleet
        .wait_metric("fleeting_provisioner_instances", &["state=\"running\""], |v| v == 2.0, "two idle instances")
        .await;
    let go = fleet.dir.path().join("go");
    let wait_for_go = format!("while [ ! -e {} ]; do sleep 0.2; done", go.display());
    let job = fleet.enqueue("long", &["echo started", &wait_for_go, "echo finished"]);
    let record = match fleet.fake.wait_for_job_state(job, |j| j.trace_text().contains("started"), WAIT).await {
        Some(r) => r,
        None => panic!("the job did not start:\n{}", fleet.log()),
    };
    let instance = instance_of(&record);

    // Publish a new build of the plugin atomically, as the docs tell operators to.
    let mut v2 = wasm.clone();
    v2.extend(custom_section("runway-test-build", b"2"));
    let tmp = plugins.join(".static.wasm.tmp");
    std::fs::write(&tmp, &v2).expect("write v2");
    std::fs::rename(&tmp, plugins.join("static.wasm")).expect("publish v2");
    let deadline = Instant::now() + WAIT;
    while fleet.log().matches("fleeting plugin initialised").count() < 2 {
        assert!(Instant::now() < deadline, "the new version never served a call:\n{}", fleet.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The job keeps running on its instance and ends well.
    std::fs::write(&go, "").expect("go");
    let record = fleet.finished(job).await;
    assert_success(&record);
    assert!(record.trace_text().contains("finished"));
    // The new version serves the same instances: another job runs on them.
    let next = fleet.enqueue("after", &["echo after"]);
    let after = fleet.finished(next).await;
    assert_success(&after);
    assert!(fleet.servers.iter().any(|s| s.host_entry() == instance_of(&after)));

    let text = fleet.metrics().await;
    assert_eq!(
        metric_value(&text, "fleeting_provisioner_instance_operations_total", &["operation=\"create\""]),
        2.0,
        "no instance was created again:\n{text}"
    );
    for line in text.lines().filter(|l| l.contains("operation=\"remove\"")) {
        assert!(line.ends_with(" 0"), "an instance was removed: {line}\n{}", fleet.log());
    }
    assert_eq!(metric_value(&text, "fleeting_provisioner_instances", &["state=\"running\""]), 2.0, "{text}");
    assert!(fleet.servers.iter().any(|s| s.host_entry() == instance));
    fleet.stop().await;
}

/// Milliseconds since the Unix epoch (the engine's `Moment` on its real clock).
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Seconds from `from_ms` to `to_ms` (negative when `to_ms` is earlier), for the timeline.
fn secs_between(from_ms: u64, to_ms: u64) -> f64 {
    (to_ms as f64 - from_ms as f64) / 1000.0
}

/// The predictive policy in production (issue 17): `runway run`, the static provider over
/// real sshd and the fake GitLab with long polling. The fleet state holds a previous week's
/// record, written through Runway's own types and state file, of three jobs arriving in a
/// 20-second slot a minute or so from now. `idle_count = 0`, so nothing but that forecast asks
/// for instances: they are created and become ready while runway long-polls an empty queue,
/// before the burst's jobs exist; the jobs then run on them and no instance is created for
/// them. Order of events is asserted, durations are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_predictive_policy_pre_warms_before_the_burst_its_history_expects() {
    use runway::autoscaler::predictive::{DayRecord, PredictorState};
    use runway::autoscaler::{EngineSnapshot, Moment};

    const SLOT_S: u64 = 20;
    let mut fleet = Fleet::new(&[13, 14, 15]).await;
    fleet.write_config(
        "max_instances = 3\ninstance_ready_command = \"test -d /\"\n\
         predictive = { enabled = true, slot_length = \"20s\", lead_time = \"20s\", max_idle_time = \"20m\" }",
        "idle_count = 0\nidle_time = \"20m\"",
    );

    // The burst's slot: the first one starting 60 s or more from now (runway's start, with the
    // static plugin compiled, fits well within that).
    let seeded_at = wall_ms();
    let burst_s = (seeded_at / 1000 + 60).div_ceil(SLOT_S) * SLOT_S;
    let burst_ms = burst_s * 1000;
    let (day, slot) = (burst_s / 86_400, ((burst_s % 86_400) / SLOT_S) as usize);
    let mut rise = vec![0u16; (86_400 / SLOT_S) as usize];
    rise[slot] = 3;
    let history = PredictorState {
        slot_secs: SLOT_S,
        days: [DayRecord { day: day - 7, rise, rise_long: Vec::new() }].into(),
        ..PredictorState::default()
    };
    let manager = runway::config::system_id(fleet.dir.path()).expect("system id");
    let state_file = runway::store::fleet_state::state_file(
        true,
        None,
        fleet.dir.path(),
        &runway::config::token_digest(&fleet.runner.token),
        &runway::config::short_token(&fleet.runner.token),
    )
    .expect("state file path");
    let snapshot =
        EngineSnapshot { version: 1, taken_at: Moment(seeded_at), instances: Vec::new(), predictor: Some(history) };
    runway::store::fleet_state::write_state(&state_file, &manager, &snapshot).expect("seed the fleet state");

    fleet.start();
    let started = wall_ms();
    // Watch the fleet while runway long-polls an empty queue.
    let deadline = Instant::now() + Duration::from_millis(burst_ms.saturating_sub(wall_ms())) + WAIT;
    let mut created_at = None;
    let (polls_before_ready, ready_at) = loop {
        let text = fleet.metrics().await;
        let now = wall_ms();
        let created = metric_value(&text, "fleeting_provisioner_instance_operations_total", &["operation=\"create\""]);
        let ready = metric_value(&text, "fleeting_provisioner_instances", &["state=\"running\""]);
        let idle = metric_value(&text, "fleeting_taskscaler_tasks", &["state=\"idle\""]);
        if created > 0.0 && created_at.is_none() {
            created_at = Some(now);
        }
        if ready == 3.0 && idle == 3.0 {
            break (fleet.fake.requests_to("POST", "/api/v4/jobs/request").len(), now);
        }
        assert!(
            Instant::now() < deadline,
            "no pre-warmed fleet by the burst's slot ({created} created, {ready} ready)\n{text}\nrunway log:\n{}",
            fleet.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let created_at = created_at.unwrap_or(ready_at);
    assert!(polls_before_ready >= 1, "runway was polling GitLab (long polling) while the fleet warmed up");
    assert_eq!(
        fleet.metric("fleeting_provisioner_instance_operations_total", &["operation=\"create\""]).await,
        3.0,
        "exactly the forecast: three instances"
    );

    // The burst arrives at its slot (or now, had warming taken longer): only after the fleet
    // was ready.
    let wait = Duration::from_millis(burst_ms.saturating_sub(wall_ms()));
    tokio::time::sleep(wait).await;
    let enqueued_at = wall_ms();
    assert!(ready_at <= enqueued_at, "instances ready before the burst's jobs were enqueued");
    let jobs: Vec<i64> = (0..3)
        .map(|i| fleet.enqueue(&format!("burst{i}"), &["echo \"burst on $SSH_CONNECTION\"", "sleep 3"]))
        .collect();
    let mut instances = BTreeSet::new();
    let mut acquire_waits = Vec::new();
    for job in &jobs {
        let record = fleet.finished(*job).await;
        assert_success(&record);
        instances.insert(instance_of(&record));
        let trace = record.trace_text();
        acquire_waits.extend(
            trace
                .lines()
                .filter_map(|l| l.split(" acquired (slot ").nth(1)?.split("after ").nth(1)?.get(..4))
                .map(str::to_string),
        );
    }
    assert_eq!(instances.len(), 3, "the burst ran on three instances at once: {instances:?}");
    assert_eq!(
        fleet.metric("fleeting_provisioner_instance_operations_total", &["operation=\"create\""]).await,
        3.0,
        "the burst's jobs waited for no new instance: they ran on the pre-warmed ones"
    );
    println!(
        "timeline (s, relative to the burst's slot): seeded {:+.1}, runway started {:+.1}, first creation {:+.1}, \
         three ready {:+.1}, jobs enqueued {:+.1}; each job's instance acquired after (s): {acquire_waits:?}",
        secs_between(burst_ms, seeded_at),
        secs_between(burst_ms, started),
        secs_between(burst_ms, created_at),
        secs_between(burst_ms, ready_at),
        secs_between(burst_ms, enqueued_at),
    );
    fleet.stop().await;
}
