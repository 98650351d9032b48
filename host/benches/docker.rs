//! A trivial job (`script: [true]`, `GIT_STRATEGY: none`) through the docker executor — `runway
//! run` as a process against the fake GitLab on loopback and a real `dockerd` of its own
//! (`tests/support/dockerd.rs`: vfs storage, no iptables) — against `docker run --rm IMAGE
//! true` for the same image on the same daemon. The goal is stated per container start: a
//! job needs several (helper and build containers), counted from the engine's events for the
//! job's label with their images, and the bench also times `docker run --rm HELPER true` for
//! Runway's helper image, so it prints `job / (the same starts as docker runs)` next to the
//! raw ratio, and the helper image's size.
//!
//! With `RUNWAY_BASELINE=/path/to/runway` (another build, e.g. main's), a second runner of
//! that binary runs the same trivial job, alternating with this build's, 10 pairs: the two
//! medians and containers per job side by side.

// criterion_group! generates undocumented public functions.
#![allow(missing_docs)]

#[path = "support/docker_runner.rs"]
mod docker_runner;
#[path = "../../tests/support/dockerd.rs"]
mod dockerd;
#[path = "support/runway_guard.rs"]
mod runway_guard;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use docker_runner::{median, DockerRunner};
use fake_gitlab::JobSpec;

/// Wall times of each side, for the ratio printed at the end.
static JOB_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
static RUN_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());
static HELPER_RUN_TIMES: Mutex<Vec<Duration>> = Mutex::new(Vec::new());

/// Runs a trivial job on `runner`: its ID and wall time from enqueue to the final update.
fn trivial_job(rt: &tokio::runtime::Runtime, runner: &DockerRunner) -> (i64, Duration) {
    let fake = &runner.fake;
    let spec = JobSpec::new("group/project", "bench", &["true"]).variable("GIT_STRATEGY", "none");
    let started = Instant::now();
    let job = fake.enqueue(fake.job_payload(&spec));
    let record = rt.block_on(fake.wait_for_job_state(job, |j| j.final_state.is_some(), Duration::from_secs(300)));
    let elapsed = started.elapsed();
    let record = record.unwrap_or_else(|| panic!("job {job} did not finish; runway log:\n{}", runner.log()));
    assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    (job, elapsed)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// This build against `baseline` (another build's runner on the same engine): 10 pairs of
/// trivial jobs, alternating, so load weighs on both alike.
fn side_by_side(rt: &tokio::runtime::Runtime, docker: &dockerd::Dockerd, this: &DockerRunner, baseline: &DockerRunner) {
    // Each first job imports its build's helper image and compiles the plugin: not measured.
    trivial_job(rt, baseline);
    let (mut this_times, mut base_times) = (Vec::new(), Vec::new());
    let (mut this_starts, mut base_starts) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        let since = now_secs().saturating_sub(1);
        let (job, elapsed) = trivial_job(rt, baseline);
        base_times.push(elapsed);
        base_starts = container_starts(docker, job, since);
        let since = now_secs().saturating_sub(1);
        let (job, elapsed) = trivial_job(rt, this);
        this_times.push(elapsed);
        this_starts = container_starts(docker, job, since);
    }
    this_times.sort();
    base_times.sort();
    let (this_median, base_median) = (this_times[this_times.len() / 2], base_times[base_times.len() / 2]);
    println!(
        "side by side, 10 pairs: baseline median {base_median:?} (min {:?}, max {:?}), containers {base_starts:?}; \
         this build median {this_median:?} (min {:?}, max {:?}), containers {this_starts:?}; this / baseline = {:.3}",
        base_times[0],
        base_times[base_times.len() - 1],
        this_times[0],
        this_times[this_times.len() - 1],
        this_median.as_secs_f64() / base_median.as_secs_f64().max(f64::EPSILON)
    );
}

/// The images of the containers the engine started for `job` between `since` and now (Unix
/// seconds), one entry per start.
fn container_starts(docker: &dockerd::Dockerd, job: i64, since: u64) -> Vec<String> {
    let until =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0) + 1;
    let filters = serde_json::json!({
        "type": ["container"], "event": ["start"], "label": [format!("runway.job.id={job}")]
    })
    .to_string();
    let encoded: String = filters
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    match docker.api("GET", &format!("/events?since={since}&until={until}&filters={encoded}"), None) {
        Ok((200, body)) => String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|e| e["Actor"]["Attributes"]["image"].as_str().unwrap_or_default().to_string())
            .collect(),
        _ => Vec::new(),
    }
}

fn benches(c: &mut Criterion) {
    let docker = dockerd::shared();
    let image = docker.job_image();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let runner = DockerRunner::start(&rt, docker, 900_000, "");
    let run_job = || trivial_job(&rt, &runner);
    // The first job imports the helper image and compiles the plugin: not measured.
    run_job();
    let since = now_secs();
    let (probe, _) = run_job();
    let starts = container_starts(docker, probe, since.saturating_sub(1));
    let helper_starts = starts.iter().filter(|i| i.starts_with("runway-helper")).count();
    let job_starts = starts.len() - helper_starts;
    let helper = docker.docker_ok(&["images", "--format", "{{.Repository}}:{{.Tag}}", "runway-helper"]);
    let helper = helper.lines().next().unwrap_or_default().to_string();
    println!("containers started by one job: {starts:?}");
    if !helper.is_empty() {
        let size = docker.docker_ok(&["image", "inspect", "--format", "{{.Size}}", &helper]);
        println!("helper image {helper}: {size} bytes");
    }
    if let Some(binary) = std::env::var("RUNWAY_BASELINE").ok().filter(|b| !b.is_empty()) {
        let baseline = DockerRunner::start_binary(&rt, docker, 950_000, "", &binary);
        side_by_side(&rt, docker, &runner, &baseline);
        let old = docker.docker_ok(&["images", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}", "runway-helper"]);
        println!("helper images on the engine:\n{old}");
    }

    let mut group = c.benchmark_group("docker executor");
    group.sample_size(10).measurement_time(Duration::from_secs(30)).warm_up_time(Duration::from_secs(1));
    group.bench_function("trivial job through the docker executor", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let (_, elapsed) = run_job();
                JOB_TIMES.lock().unwrap_or_else(|e| e.into_inner()).push(elapsed);
                total += elapsed;
            }
            total
        })
    });
    let docker_run = |name: &'static str, image: String, times: &'static Mutex<Vec<Duration>>| {
        move |b: &mut criterion::Bencher| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let started = Instant::now();
                    let out = docker.docker(&["run", "--rm", &image, "true"]);
                    let elapsed = started.elapsed();
                    assert!(out.status.success(), "{name}: {out:?}");
                    times.lock().unwrap_or_else(|e| e.into_inner()).push(elapsed);
                    total += elapsed;
                }
                total
            })
        }
    };
    group.bench_function("docker run --rm IMAGE true", docker_run("job image", image.to_string(), &RUN_TIMES));
    if !helper.is_empty() {
        group.bench_function(
            "docker run --rm HELPER true",
            docker_run("helper image", helper.clone(), &HELPER_RUN_TIMES),
        );
    }
    group.finish();
    let job = median(&JOB_TIMES);
    let run = median(&RUN_TIMES);
    let helper_run = median(&HELPER_RUN_TIMES);
    let ratio = job.as_secs_f64() / run.as_secs_f64().max(f64::EPSILON);
    let needed = run * job_starts as u32 + helper_run * helper_starts as u32;
    println!(
        "docker executor: job median {job:?}; docker run median {run:?} (job image), {helper_run:?} ({helper}); \
         job / docker run = {ratio:.2}; the job started {job_starts} job-image and {helper_starts} helper container(s), \
         as docker runs {needed:?}: job / those = {:.2} (goal <= 1.5)",
        job.as_secs_f64() / needed.as_secs_f64().max(f64::EPSILON)
    );
}

criterion_group!(docker, benches);
criterion_main!(docker);
