//! Host overhead per trivial job against the fake GitLab on loopback, and jobs per second at
//! concurrent = 16. The shell executor runs with `login = false` here so bash's own startup
//! (≈100 ms for a login shell on this machine) does not drown the runner's overhead; the
//! baseline runs the very same stage scripts with bash directly.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use fake_gitlab::{FakeGitLab, JobSpec};
use runway::executor::ResolvedExecutor;
use runway::gitlab::client::{ClientOptions, GitLabClient, RunnerCredentials};
use runway::job::JobEnvironment;
use runway::manager::{identity, Manager, ManagerSettings, RunnerSettings, Shutdown};
use runway::payload::JobResponse;
use runway::plugin::{builtin_plugins, HostSettings, PluginHost};
use runway::script::{JobPlan, ScriptSettings};
use runway::trace::upload::UploadConfig;

struct Setup {
    fake: FakeGitLab,
    shutdown: Shutdown,
    settings: ScriptSettings,
    _dir: tempfile::TempDir,
}

async fn setup(concurrent: usize) -> Setup {
    // Stages start as a runner starts them: through the stage reaper of the runway binary.
    runway::connector::reaper::use_executable(env!("CARGO_BIN_EXE_runway"));
    let fake =
        FakeGitLab::start_with(fake_gitlab::Config { long_poll: Duration::from_secs(5), trace_update_interval: 3 })
            .await;
    let runner = fake.create_runner("bench");
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "x\n")], "init");
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = PluginHost::new(HostSettings { builtins: builtin_plugins(), ..HostSettings::default() })
        .await
        .expect("plugins");
    let executor = ResolvedExecutor::resolve(&plugins, "shell", r#"{"login":false}"#).await.expect("shell");
    let settings = ScriptSettings {
        builds_dir: dir.path().join("builds"),
        cache_dir: dir.path().join("cache"),
        shared_builds_dir: true,
        short_token: "bench".into(),
        executor: "shell".into(),
        shell: "bash".into(),
        shared_environment: true,
        ..ScriptSettings::default()
    };
    let runner_settings = RunnerSettings {
        client: None,
        credentials: RunnerCredentials {
            url: fake.url(),
            token: runner.token.clone(),
            system_id: "s_000000000000".into(),
        },
        env: JobEnvironment {
            executor,
            settings: settings.clone(),
            identity: identity("bench", "bench", "s_000000000000"),
            instance: None,
        },
        limit: 0,
        request_concurrency: concurrent.min(4),
        output_limit_kib: 4096,
        unhealthy_requests_limit: 3,
        unhealthy_interval: Duration::from_secs(60),
        final_update_retry_limit: 10,
        strict_check_interval: false,
        fleet: None,
        store: None,
        labels: Default::default(),
    };
    let shutdown = Shutdown::default();
    let manager = Manager::new(
        ManagerSettings {
            concurrent,
            check_interval: Duration::from_millis(50),
            upload: UploadConfig::default(),
            ..ManagerSettings::default()
        },
        vec![runner_settings],
        Arc::new(GitLabClient::new(ClientOptions::default()).expect("client")),
        shutdown.clone(),
    );
    tokio::spawn(manager.run());
    Setup { fake, shutdown, settings, _dir: dir }
}

fn payload(fake: &FakeGitLab, i: usize) -> serde_json::Value {
    fake.job_payload(&JobSpec::new("group/project", &format!("j{i}"), &["true"]).variable("GIT_STRATEGY", "none"))
}

async fn run_jobs(s: &Setup, n: usize) -> Duration {
    let start = Instant::now();
    let ids: Vec<i64> = (0..n).map(|i| s.fake.enqueue(payload(&s.fake, i))).collect();
    for id in ids {
        s.fake
            .wait_for_job_state(id, |j| j.final_state.is_some(), Duration::from_secs(120))
            .await
            .expect("job finishes");
    }
    start.elapsed()
}

fn bash_baseline(settings: &ScriptSettings, job: &JobResponse) -> Duration {
    let plan = JobPlan::new(job, settings).expect("plan");
    let start = Instant::now();
    for stage in plan.stages() {
        let script = plan.script(&stage, "running").expect("script");
        std::fs::create_dir_all(plan.builds_dir()).expect("builds dir");
        let mut child = std::process::Command::new("bash")
            .current_dir(plan.builds_dir())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("bash");
        if let Some(mut stdin) = child.stdin.take() {
            std::io::Write::write_all(&mut stdin, script.as_bytes()).expect("stdin");
        }
        child.wait().expect("wait");
    }
    start.elapsed()
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let one = rt.block_on(setup(1));
    let mut group = c.benchmark_group("trivial job (`true`)");
    group.sample_size(20).measurement_time(Duration::from_secs(10));
    group.bench_function("end to end via fake GitLab", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let one = &one;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += run_jobs(one, 1).await;
                }
                total
            }
        })
    });
    let job: JobResponse = serde_json::from_value(payload(&one.fake, 0)).expect("payload");
    group.bench_function("the same stage scripts run by bash directly", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| bash_baseline(&one.settings, &job)).sum())
    });
    group.finish();
    one.shutdown.graceful.cancel();

    let sixteen = rt.block_on(setup(16));
    let mut group = c.benchmark_group("throughput at concurrent = 16");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    group.throughput(criterion::Throughput::Elements(64));
    group.bench_function("64 trivial jobs", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let sixteen = &sixteen;
            async move {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += run_jobs(sixteen, 64).await;
                }
                total
            }
        })
    });
    group.finish();
    sixteen.shutdown.graceful.cancel();
}

criterion_group!(job, benches);
criterion_main!(job);
