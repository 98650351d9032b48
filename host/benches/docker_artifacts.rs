//! A docker job uploading a 200 MB artifact and saving a cache (issue 28's benchmark) against
//! the same work done by hand in one `docker run`. The tree (`support/tree.rs`: 2,000 files of
//! 100 KB, half text, half random) is generated once on this machine and bind-mounted read-only
//! at `/src` into both sides' containers; both sides copy it into their build volume first.
//!
//! - (a) Runway: `runway run` (a process) with a `docker` runner on a `dockerd` of the bench's
//!   own (`tests/support/dockerd.rs`, vfs) against the fake GitLab on loopback, `network_mode =
//!   "host"`; the job `cp -r /src/data data`, `artifacts: paths: [data/]`, `cache: {key: bench,
//!   paths: [data/], policy: push}` (a local cache in the runner's cache volume). Timed from
//!   enqueue to the final update accepted: the whole job, every container included.
//! - (b) by hand: `docker run --rm --network host` of an image with `zip` and `curl` (made from
//!   this machine's files) doing `cp -r /src/data data && zip -r -q a.zip data && curl -F
//!   file=@a.zip` to the same fake GitLab's artifacts endpoint (with the token of a job the
//!   bench picked up itself) `&& zip -r -q /cache/cache.zip data` into a named volume.
//!
//! The ratio (a)/(b) of the medians is printed at the end; the goal is ≤ 1.3. Needs `zip` and
//! `curl` on this machine.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

#[path = "support/docker_runner.rs"]
mod docker_runner;
#[path = "../../tests/support/dockerd.rs"]
mod dockerd;
#[path = "support/runway_guard.rs"]
mod runway_guard;
#[path = "support/tree.rs"]
mod tree;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use docker_runner::{median, DockerRunner};
use fake_gitlab::JobSpec;

/// The baseline's image: bash, coreutils, zip and curl of this machine.
const ZIP_IMAGE: &str = "runway-bench/zip-curl:1";

static JOB_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
static HAND_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

fn benches(c: &mut Criterion) {
    let docker = dockerd::shared();
    docker.ensure_image(ZIP_IMAGE, || {
        (dockerd::job_rootfs("zip", &["cp", "rm", "mkdir", "zip", "curl", "cat"]), Vec::new())
    });
    let data = tempfile::tempdir().expect("tempdir");
    let total = tree::generate(data.path());
    println!("tree: {total} bytes in {}", data.path().display());

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let bench_runner = DockerRunner::start(
        &rt,
        docker,
        950_000,
        &format!("  network_mode = \"host\"\n  volumes = [\"{}:/src:ro\"]", data.path().display()),
    );
    let fake = &bench_runner.fake;
    let by_hand = fake.create_runner("by hand");
    let run_job = || {
        let spec = JobSpec::new("group/project", "bench", &["cp -r /src/data data"])
            .variable("GIT_STRATEGY", "none")
            .artifacts(serde_json::json!({"paths": ["data/"]}))
            .cache(serde_json::json!({"key": "bench", "paths": ["data/"], "policy": "push"}));
        let started = Instant::now();
        let job = fake.enqueue(fake.job_payload(&spec));
        let record = rt.block_on(fake.wait_for_job_state(job, |j| j.final_state.is_some(), Duration::from_secs(600)));
        let elapsed = started.elapsed();
        let record = record.unwrap_or_else(|| panic!("job {job} did not finish; runway log:\n{}", bench_runner.log()));
        assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
        assert_eq!(fake.artifacts(job).len(), 1, "{}", record.trace_text());
        elapsed
    };
    // The first job imports the helper image and compiles the plugin: not measured.
    run_job();

    let mut group = c.benchmark_group("docker artifacts and cache");
    group.sample_size(10).measurement_time(Duration::from_secs(60)).warm_up_time(Duration::from_secs(1));
    group.bench_function("(a) docker job: 200 MB artifact + cache", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let elapsed = run_job();
                JOB_TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(elapsed);
                total += elapsed;
            }
            total
        })
    });
    // The bench takes the baseline's jobs itself: the runner must not poll any more.
    drop(bench_runner.process);

    let client = reqwest::Client::new();
    let pick_job = || {
        fake.enqueue(fake.job_payload(&JobSpec::new("group/project", "by-hand", &["true"])));
        let response = rt
            .block_on(async {
                client
                    .post(format!("{}/api/v4/jobs/request", fake.url()))
                    .json(&serde_json::json!({"token": by_hand.token, "info": {"features": {"artifacts": true}}}))
                    .send()
                    .await?
                    .json::<serde_json::Value>()
                    .await
            })
            .expect("job request");
        let id = response["id"].as_i64().expect("a job");
        (id, response["token"].as_str().expect("job token").to_string())
    };
    let volume = "runway-bench-hand-cache";
    let run_by_hand = || {
        let (id, token) = pick_job();
        let script = format!(
            "set -e; mkdir -p /builds && cd /builds && cp -r /src/data data && zip -r -q a.zip data \
             && curl -s -f -o /dev/null -H 'JOB-TOKEN: {token}' -F file=@a.zip '{url}/api/v4/jobs/{id}/artifacts' \
             && rm -f /cache/cache.zip && zip -r -q /cache/cache.zip data",
            url = fake.url()
        );
        let started = Instant::now();
        let out = docker.docker(&[
            "run",
            "--rm",
            "--network",
            "host",
            "-v",
            &format!("{}:/src:ro", data.path().display()),
            "-v",
            &format!("{volume}:/cache"),
            ZIP_IMAGE,
            "bash",
            "-c",
            &script,
        ]);
        let elapsed = started.elapsed();
        assert!(out.status.success(), "by hand: {out:?}");
        assert_eq!(fake.artifacts(id).len(), 1);
        elapsed
    };
    group.bench_function("(b) docker run + zip + curl", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let elapsed = run_by_hand();
                HAND_TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(elapsed);
                total += elapsed;
            }
            total
        })
    });
    group.finish();
    let (job, hand) = (median(&JOB_TIMES), median(&HAND_TIMES));
    println!(
        "docker artifacts: job median {job:?} ({} samples); docker run + zip + curl median {hand:?} ({} samples); \
         ratio {:.2} (goal <= 1.3)",
        JOB_TIMES.lock().map(|v| v.len()).unwrap_or_default(),
        HAND_TIMES.lock().map(|v| v.len()).unwrap_or_default(),
        job.as_secs_f64() / hand.as_secs_f64().max(f64::EPSILON)
    );
}

criterion_group!(docker_artifacts, benches);
criterion_main!(docker_artifacts);
