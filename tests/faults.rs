//! GitLab faults that must never strand a job (issue 10): the fault-injecting proxy between the
//! runner manager and the fake GitLab, a GitLab that answers 416 without `Range`, a plugin whose
//! `cleanup` never returns, and a soak of every fault on every kind of request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_gitlab::proxy::{Fault, FaultPlan, FaultProxy, RequestKind};
use fake_gitlab::{FakeGitLab, JobRecord, JobSpec, JobStatus};
use runway::config::grant::PluginGrant;
use runway::executor::ResolvedExecutor;
use runway::gitlab::client::{ClientOptions, GitLabClient, RunnerCredentials};
use runway::gitlab::retry::RetryPolicy;
use runway::job::JobEnvironment;
use runway::manager::{identity, Manager, ManagerSettings, RunnerSettings, Shutdown};
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};
use runway::script::ScriptSettings;
use runway::trace::upload::UploadConfig;

const GUEST_DIR: &str = env!("RUNWAY_GUEST_DIR");

struct World {
    fake: FakeGitLab,
    token: String,
    root: tempfile::TempDir,
}

async fn world() -> World {
    // Update interval 0: the fake sends no usable interval, so the runner keeps its own
    // (short) one. No long polling: job requests come every check_interval.
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::ZERO, trace_update_interval: 0 }).await;
    let runner = fake.create_runner("faults test");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "hello\n")], "first");
    World { fake, token: runner.token, root: tempfile::tempdir().expect("tempdir") }
}

fn upload() -> UploadConfig {
    UploadConfig {
        update_interval: Duration::from_millis(100),
        force_send_interval: Duration::from_secs(30),
        patch_limit: 4096,
        final_backoff_base: Duration::from_millis(50),
        final_backoff_max: Duration::from_millis(500),
        final_trace_retry_limit: 10,
        final_trace_timeout: Duration::from_secs(20),
        ..UploadConfig::default()
    }
}

impl World {
    async fn plugins(&self, grants: BTreeMap<String, PluginGrant>) -> PluginHost {
        let dir = self.root.path().join("plugins");
        std::fs::create_dir_all(&dir).expect("plugins dir");
        PluginHost::new(HostSettings {
            plugins_dir: Some(dir),
            cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
            state_dir: None,
            grants,
            builtins: builtin_plugins(),
            helper_image: None,
            stage_output: Default::default(),
        })
        .await
        .expect("plugin host")
    }

    /// A runner talking to `url` (the fake, or the proxy in front of it).
    fn runner(&self, url: &str, executor: ResolvedExecutor) -> RunnerSettings {
        let short_token: String = self.token.trim_start_matches("glrt-").chars().take(9).collect();
        let settings = ScriptSettings {
            builds_dir: self.root.path().join("builds"),
            cache_dir: self.root.path().join("cache"),
            shared_builds_dir: true,
            short_token: short_token.clone(),
            executor: executor.name().to_string(),
            shell: "bash".into(),
            runner_version: "0.1.0".into(),
            runner_revision: "test".into(),
            shared_environment: true,
            ..ScriptSettings::default()
        };
        RunnerSettings {
            client: None,
            credentials: RunnerCredentials {
                url: url.into(),
                token: self.token.clone(),
                system_id: "s_0123456789ab".into(),
            },
            env: JobEnvironment {
                executor,
                settings,
                identity: identity("faults runner", &short_token, "s_0123456789ab"),
                instance: None,
            },
            limit: 0,
            request_concurrency: 1,
            output_limit_kib: 4096,
            unhealthy_requests_limit: 1000,
            unhealthy_interval: Duration::from_secs(1),
            final_update_retry_limit: 10,
            strict_check_interval: false,
            fleet: None,
            store: None,
            labels: Default::default(),
        }
    }

    /// `concurrent = 2` with one job at a time: the runner keeps asking for jobs (and meeting
    /// faults) while one runs.
    fn manager(&self, runner: RunnerSettings, shutdown: Shutdown, upload: UploadConfig) -> Manager {
        let client = GitLabClient::new(ClientOptions {
            retry: RetryPolicy {
                backoff_base: Duration::from_millis(20),
                backoff_max: Duration::from_millis(200),
                ..RetryPolicy::default()
            },
            ..ClientOptions::default()
        })
        .expect("client");
        let settings = ManagerSettings {
            concurrent: 2,
            check_interval: Duration::from_millis(100),
            shutdown_timeout: Duration::from_secs(5),
            pending_keepalive: Duration::from_secs(10),
            upload,
            ..ManagerSettings::default()
        };
        Manager::new(settings, vec![runner], Arc::new(client), shutdown)
    }

    /// The job's final record, following GitLab's retries of a job whose handout was lost.
    async fn finished(&self, mut id: i64, within: Duration) -> Option<JobRecord> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let job = self
                .fake
                .wait_for_job_state(
                    id,
                    |j| (j.final_state.is_some() && j.status.is_final()) || j.retried_as.is_some(),
                    left,
                )
                .await?;
            match job.retried_as {
                Some(retry) => id = retry,
                None => return Some(job),
            }
        }
    }
}

fn numbered_lines(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim_end_matches('\r').strip_prefix("line ")?.parse().ok()).collect()
}

fn assert_trace_consistent(job: &JobRecord) {
    assert_eq!(job.checksum.as_deref(), Some(job.trace_checksum().as_str()), "checksum of what the server stored");
    assert_eq!(job.bytesize, Some(job.trace.len() as u64));
}

/// Prints `count` numbered lines over about `count / 200 * 0.2` seconds, then exits `exit`.
fn counting_job(name: &str, count: u32, exit: i32) -> JobSpec {
    let script = format!(
        "for i in $(seq 1 {count}); do echo \"line $i\"; if [ $((i % 200)) -eq 0 ]; then sleep 0.2; fi; done; exit {exit}"
    );
    JobSpec::new("group/project", name, &[script.as_str()])
}

async fn shell(plugins: &PluginHost) -> ResolvedExecutor {
    ResolvedExecutor::resolve(plugins, "shell", "{}").await.expect("shell executor")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_is_retried_through_connection_resets() {
    let w = world().await;
    let plugins = w.plugins(BTreeMap::new()).await;
    // Every PUT is cut twice, then goes through: the acceptance's first two tries fail.
    let plan = FaultPlan {
        rate: 1.0,
        faults: vec![Fault::Cut],
        kinds: vec![RequestKind::UpdateJob],
        max_consecutive: 2,
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start(&w.fake.url(), plan).await;
    let shutdown = Shutdown::default();
    let manager = w.manager(w.runner(&proxy.url(), shell(&plugins).await), shutdown.clone(), upload());
    let running = tokio::spawn(manager.run());
    let id = w.fake.enqueue(w.fake.job_payload(&JobSpec::new("group/project", "accept", &["echo accepted"])));
    let job = w.finished(id, Duration::from_secs(30)).await.expect("the job finishes");
    assert_eq!(
        (job.final_state.as_deref(), job.failure_reason.as_deref()),
        (Some("success"), None),
        "{}",
        job.trace_text()
    );
    assert!(job.trace_text().contains("accepted"), "{}", job.trace_text());
    assert!(proxy.injected().get(&(RequestKind::UpdateJob, Fault::Cut)).copied().unwrap_or(0) >= 2);
    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_without_range_and_lost_patch_replies_still_ends_the_job() {
    let w = world().await;
    w.fake.set_trace_range_header(false);
    let plugins = w.plugins(BTreeMap::new()).await;
    // Every other PATCH reaches GitLab but its reply is lost; GitLab's 416s carry no Range.
    let plan = FaultPlan {
        rate: 1.0,
        faults: vec![Fault::LostReply],
        kinds: vec![RequestKind::PatchTrace],
        max_consecutive: 1,
        ..FaultPlan::default()
    };
    let proxy = FaultProxy::start(&w.fake.url(), plan).await;
    let shutdown = Shutdown::default();
    let manager = w.manager(w.runner(&proxy.url(), shell(&plugins).await), shutdown.clone(), upload());
    let running = tokio::spawn(manager.run());
    let id = w.fake.enqueue(w.fake.job_payload(&counting_job("no-range", 600, 0)));
    let job = w.finished(id, Duration::from_secs(40)).await.unwrap_or_else(|| {
        panic!("the job never got its final state: {:?}", w.fake.jobs().iter().map(|j| j.status).collect::<Vec<_>>())
    });
    assert_eq!(job.final_state.as_deref(), Some("success"));
    assert_eq!(numbered_lines(&job.trace_text()), (1..=600).collect::<Vec<_>>(), "every line once, in order");
    assert_trace_consistent(&job);
    assert!(proxy.injected().get(&(RequestKind::PatchTrace, Fault::LostReply)).copied().unwrap_or(0) >= 2);
    shutdown.graceful.cancel();
    running.await.expect("manager stops");
}

fn install(dir: &Path, wasm: &str, as_name: &str) -> PathBuf {
    let tmp = dir.join(format!(".{as_name}.tmp"));
    std::fs::copy(Path::new(GUEST_DIR).join(wasm), &tmp).expect("copy plugin");
    std::fs::rename(&tmp, dir.join(as_name)).expect("rename plugin");
    dir.join(as_name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_update_is_not_held_back_by_a_stuck_cleanup() {
    let w = world().await;
    std::fs::create_dir_all(w.root.path().join("plugins")).expect("plugins dir");
    install(&w.root.path().join("plugins"), "test_stubborn.wasm", "stubborn.wasm");
    let grant = PluginGrant { call_timeout: Duration::from_secs(20), ..PluginGrant::default() };
    let plugins = w.plugins(BTreeMap::from([("stubborn".to_string(), grant)])).await;
    let executor =
        ResolvedExecutor::resolve(&plugins, "stubborn", r#"{"mode":"cleanup_loop"}"#).await.expect("stubborn executor");
    let shutdown = Shutdown::default();
    let manager = w.manager(w.runner(&w.fake.url(), executor), shutdown.clone(), upload());
    let stats = manager.stats();
    let running = tokio::spawn(manager.run());
    let id = w.fake.enqueue(w.fake.job_payload(&JobSpec::new("group/project", "cleanup", &["true"])));
    // The first job compiles the plugin (slow on a loaded machine): wait for it generously.
    let started = w.fake.wait_for_job_state(id, |j| j.status == JobStatus::Running, Duration::from_secs(120)).await;
    assert!(started.is_some(), "the job starts");
    let clock = Instant::now();
    let job = w.finished(id, Duration::from_secs(10)).await.expect("the final state does not wait for cleanup");
    assert!(clock.elapsed() < Duration::from_secs(10));
    assert_eq!(job.final_state.as_deref(), Some("success"), "{}", job.trace_text());
    assert!(job.trace_text().contains("ok step_script"), "{}", job.trace_text());
    // The cleanup still holds the job's slot (and is cut off at call_timeout).
    assert_eq!(stats.finished.load(std::sync::atomic::Ordering::SeqCst), 0, "cleanup still running");
    shutdown.forceful.cancel();
    running.abort();
}

/// Every fault the proxy knows except latency (which is not a failure).
const FAILURES: [Fault; 6] =
    [Fault::ServerError, Fault::TooManyRequests, Fault::Cut, Fault::Dropped, Fault::LostReply, Fault::CutReply];
const KINDS: [RequestKind; 3] = [RequestKind::RequestJob, RequestKind::PatchTrace, RequestKind::UpdateJob];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_soak_every_line_once_in_order_and_the_right_final_state() {
    let started = Instant::now();
    let mut total: BTreeMap<(RequestKind, Fault), u64> = BTreeMap::new();
    // One plugin host (one compile of the shell plugin) for every run.
    let plugins = PluginHost::new(HostSettings {
        builtins: builtin_plugins(),
        // Compiled once for every test binary (keyed by plugin content and engine).
        cache_dir: Some(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("plugin-cache")),
        ..HostSettings::default()
    })
    .await
    .expect("plugin host");
    let shell = shell(&plugins).await;
    for seed in [11u64, 23, 37] {
        let w = world().await;
        // A job handed out in a reply the proxy lost is retried by GitLab after the ack expiry.
        w.fake.set_runner_ack_expiry(Duration::from_secs(2));
        let plan = FaultPlan {
            seed,
            rate: 0.35,
            faults: Fault::ALL.to_vec(),
            kinds: KINDS.to_vec(),
            max_consecutive: 2,
            drop_hold: Duration::from_millis(150),
            latency: Duration::from_millis(50),
        };
        let proxy = FaultProxy::start(&w.fake.url(), plan).await;
        let shutdown = Shutdown::default();
        // Keep-alive PUTs on every tick, so job updates see as many faults as patches.
        let upload = UploadConfig { force_send_interval: Duration::from_millis(50), ..upload() };
        let manager = w.manager(w.runner(&proxy.url(), shell.clone()), shutdown.clone(), upload);
        let running = tokio::spawn(manager.run());
        for (name, exit) in [("soak-success", 0), ("soak-failure", 3)] {
            let id = w.fake.enqueue(w.fake.job_payload(&counting_job(name, 2000, exit)));
            let job = w
                .finished(id, Duration::from_secs(40))
                .await
                .unwrap_or_else(|| panic!("seed {seed}: {name} did not finish; injected {:?}", proxy.injected()));
            eprintln!(
                "seed {seed}: {name} (job {}) ended after {:?}; {} patches, {} updates",
                job.id,
                started.elapsed(),
                job.patches.len(),
                job.updates.len()
            );
            let lines = numbered_lines(&job.trace_text());
            assert_eq!(lines, (1..=2000).collect::<Vec<_>>(), "seed {seed}: {name}: every line once, in order");
            assert_trace_consistent(&job);
            if exit == 0 {
                assert_eq!(job.final_state.as_deref(), Some("success"), "seed {seed}");
                assert_eq!(job.status, JobStatus::Success);
            } else {
                assert_eq!(job.final_state.as_deref(), Some("failed"), "seed {seed}");
                assert_eq!(job.failure_reason.as_deref(), Some("script_failure"), "seed {seed}");
                assert_eq!(job.exit_code, Some(3), "seed {seed}");
            }
        }
        // How many requests of each kind a seed makes depends on timing (a loaded machine
        // sends fewer keep-alive PUTs between patches), so coverage is asserted over all seeds
        // together, per kind and fault, below.
        let injected = proxy.injected();
        eprintln!("seed {seed}: injected {injected:?}");
        for (key, n) in injected {
            *total.entry(key).or_default() += n;
        }
        shutdown.graceful.cancel();
        running.await.expect("manager stops");
    }
    // Job updates are few (a job sends keep-alive PUTs only while its trace is idle), so not
    // every (kind, fault) pair is drawn on every machine: every kind met faults and every
    // fault hit some kind.
    for kind in KINDS {
        let n: u64 = total.iter().filter(|((k, f), _)| *k == kind && FAILURES.contains(f)).map(|(_, n)| n).sum();
        assert!(n > 0, "no fault on {kind:?}: {total:?}");
    }
    for fault in FAILURES {
        assert!(total.iter().any(|((_, f), n)| *f == fault && *n > 0), "{fault:?} never hit: {total:?}");
    }
    // About 25 s on an idle machine; every wait above is bounded (no timed assertion here:
    // a loaded machine is slower, not wrong).
    eprintln!("the soak took {:?}", started.elapsed());
}
