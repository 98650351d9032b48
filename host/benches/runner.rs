//! Issue 18's three goals, measured in one run so their ratios share the machine's load:
//!
//! 1. 200 trivial jobs (`script: true`, `GIT_STRATEGY: none`) at `concurrent = 16` through
//!    `runway run` as a process against the fake GitLab on loopback (long polling, two-phase
//!    commit), shell executor with `[runners.shell] login = false`: jobs/s and the CPU the
//!    runner process and every process it started used per job (`/proc/<pid>/stat` utime +
//!    stime + cutime + cstime of the runner and of every live process under it — the stage
//!    reaper, which waits for the stages —, so that every stage is counted once).
//!    The job store is off (`[runners.store] name = "none"`), as in the issue's figures; this
//!    build runs once more with the default file store for comparison. Beside it, the bash-only floor: four `bash -c true` per job, 16 jobs at a time, its CPU
//!    from `getrusage(RUSAGE_CHILDREN)`.
//! 2. `runway exec` of a job printing 200 MB in 100-byte lines (stdout to /dev/null) against
//!    the same pipeline run by bash into /dev/null.
//! 3. The `runway run` trace path in memory: [`JobTrace`] (50 masked values of 8–64 bytes, the
//!    URL and token-prefix sanitizers, the kept buffer and its CRC32) fed the same 200 MB in
//!    64 KiB writes, as the followed stage log delivers it, without and with per-line
//!    timestamps (`FF_TIMESTAMPS`, on by default): MB/s.
//!
//! Plain timings (not criterion samples): each side runs a few times in one process and the
//! medians are printed with their ratios. `RUNWAY_BENCH_ROUNDS` sets the rounds (default 3);
//! `RUNWAY_BEFORE=<path of an earlier runway binary>` measures it beside this build's, round by
//! round (1 and 2; the trace path is this build's library only). An argument picks one part:
//! `throughput`, `exec` or `trace`.

// A bench's main needs no docs.
#![allow(missing_docs)]

#[path = "support/runway_guard.rs"]
mod runway_guard;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fake_gitlab::{FakeGitLab, JobSpec};
use runway::trace::{JobTrace, TraceOptions, TraceSink};
use runway_guard::RunwayProcess;

/// The runway binaries measured: this build's, and with `RUNWAY_BEFORE=<path>` an earlier one
/// beside it (named "before"), round by round in the same run.
fn binaries() -> Vec<(&'static str, String)> {
    let mut bins = Vec::new();
    if let Ok(before) = std::env::var("RUNWAY_BEFORE") {
        bins.push(("before", before));
    }
    bins.push(("this build", env!("CARGO_BIN_EXE_runway").to_string()));
    bins
}
const JOBS: usize = 200;
const CONCURRENT: usize = 16;
/// 200 MB of 100-byte lines: `yes` of 99 characters, cut by `head`.
const BIG_PIPELINE: &str = "seq -f '%099g' 2000000";
const BIG_BYTES: f64 = 200_000_000.0;

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Parent pid and CPU ticks (utime, stime, cutime, cstime: its own and its waited-for
/// children's) of every process.
fn all_processes() -> Vec<(u32, u32, f64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.filter_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(") ")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command: state is field 3 of stat(5), ppid 4, utime 14 … cstime 17.
        let ppid = fields.get(1)?.parse().ok()?;
        let ticks: f64 = (11..=14).filter_map(|i| fields.get(i)?.parse::<f64>().ok()).sum();
        Some((pid, ppid, ticks))
    })
    .collect()
}

/// CPU seconds of process `pid`, every live process under it (the stage reaper, stages still
/// running) and every child they waited for: what the runner has cost so far.
fn process_cpu(pid: u32) -> f64 {
    let processes = all_processes();
    let mut tree = vec![pid];
    let mut ticks = 0.0;
    while let Some(parent) = tree.pop() {
        for &(child, ppid, cpu) in &processes {
            if child == parent {
                ticks += cpu;
            }
            if ppid == parent {
                tree.push(child);
            }
        }
    }
    ticks / clock_ticks()
}

/// CPU seconds of this process's waited-for children so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// One `runway run` process of `binary` polling as a runner of its own.
struct Runner {
    name: &'static str,
    process: RunwayProcess,
    token: String,
    dir: tempfile::TempDir,
}

fn start_runner(fake: &FakeGitLab, name: &'static str, binary: &str, store: bool) -> Runner {
    let runner = fake.create_runner(name);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"concurrent = {CONCURRENT}
check_interval = 1

[[runners]]
name = "bench"
url = "{url}"
token = "{token}"
executor = "shell"
request_concurrency = 4
builds_dir = "{builds}"
  [runners.shell]
  login = false
  [runners.store]
  name = "{store}"
"#,
            url = fake.url(),
            token = runner.token,
            builds = dir.path().join("builds").display(),
            store = if store { "file" } else { "none" },
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway run"),
    );
    Runner { name, process, token: runner.token, dir }
}

/// One round of the throughput goal: (seconds, runner CPU seconds) for `jobs` jobs.
fn run_jobs(rt: &tokio::runtime::Runtime, fake: &FakeGitLab, runner: &Runner, jobs: usize) -> (f64, f64) {
    let pid = runner.process.0.id();
    // The payloads are made first: making one asks git for the commit, the harness's work.
    let payloads: Vec<serde_json::Value> = (0..jobs)
        .map(|i| {
            let spec = JobSpec::new("group/project", &format!("j{i}"), &["true"]).variable("GIT_STRATEGY", "none");
            fake.job_payload(&spec)
        })
        .collect();
    let cpu_before = process_cpu(pid);
    let started = Instant::now();
    let ids: Vec<i64> = payloads.into_iter().map(|payload| fake.enqueue_for(&runner.token, payload)).collect();
    for id in ids {
        let record = rt.block_on(fake.wait_for_job_state(id, |j| j.final_state.is_some(), Duration::from_secs(300)));
        let record = record.unwrap_or_else(|| {
            panic!(
                "job {id} did not finish; runway log:\n{}",
                std::fs::read_to_string(runner.dir.path().join("runway.log")).unwrap_or_default()
            )
        });
        assert_eq!(record.final_state.as_deref(), Some("success"), "{}", record.trace_text());
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The last job's leaders are reaped right after its final update: let the counters settle.
    std::thread::sleep(Duration::from_millis(300));
    (elapsed, process_cpu(pid) - cpu_before)
}

/// The bash-only floor: four `bash -c true` per job, [`CONCURRENT`] jobs at a time.
fn bash_floor() -> (f64, f64) {
    let cpu_before = children_cpu();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..CONCURRENT {
            scope.spawn(move || {
                for _ in (worker..JOBS).step_by(CONCURRENT) {
                    for _ in 0..4 {
                        let status = Command::new("bash").args(["-c", "true"]).status().expect("bash");
                        assert!(status.success());
                    }
                }
            });
        }
    });
    (started.elapsed().as_secs_f64(), children_cpu() - cpu_before)
}

fn throughput(rounds: usize) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fake = rt.block_on(FakeGitLab::start_with(fake_gitlab::Config {
        long_poll: Duration::from_secs(5),
        trace_update_interval: 3,
    }));
    fake.create_repo("group/project");
    fake.commit_files("group/project", "main", &[("README.md", "x\n")], "init");
    // Without the job store, as issue 18 measured; this build also with the default file store
    // (an fsync'd save at every stage boundary: the disk, not the CPU, bounds it).
    let mut runners: Vec<Runner> =
        binaries().into_iter().map(|(name, bin)| start_runner(&fake, name, &bin, false)).collect();
    runners.push(start_runner(&fake, "this build, file job store", env!("CARGO_BIN_EXE_runway"), true));
    // Warm-up: the plugin compile and the first connections are not measured.
    for runner in &runners {
        run_jobs(&rt, &fake, runner, 2);
    }
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = runners.iter().map(|_| (vec![], vec![])).collect();
    let (mut floor_secs, mut floor_cpu) = (vec![], vec![]);
    for round in 0..rounds {
        for (runner, (secs_list, cpu_list)) in runners.iter().zip(results.iter_mut()) {
            let (secs, cpu) = run_jobs(&rt, &fake, runner, JOBS);
            println!(
                "round {round}: {}: runway run {JOBS} jobs {secs:.2} s ({:.1} jobs/s, {:.1} ms CPU/job)",
                runner.name,
                JOBS as f64 / secs,
                cpu * 1e3 / JOBS as f64,
            );
            secs_list.push(secs);
            cpu_list.push(cpu);
        }
        let (bsecs, bcpu) = bash_floor();
        println!(
            "round {round}: bash floor {bsecs:.2} s ({:.1} jobs/s, {:.1} ms CPU/job)",
            JOBS as f64 / bsecs,
            bcpu * 1e3 / JOBS as f64
        );
        floor_secs.push(bsecs);
        floor_cpu.push(bcpu);
    }
    let (bsecs, bcpu) = (median(floor_secs), median(floor_cpu));
    println!(
        "bash floor (median of {rounds}): {:.1} jobs/s, {:.1} ms CPU/job",
        JOBS as f64 / bsecs,
        bcpu * 1e3 / JOBS as f64
    );
    for (runner, (secs, cpu)) in runners.iter().zip(results) {
        let (secs, cpu) = (median(secs), median(cpu));
        println!(
            "throughput, {} (median of {rounds}): {:.1} jobs/s = {:.0} % of the bash floor (goal >= 35 %, \
             ~110 jobs/s); runner CPU {:.1} ms/job (goal <= 12)",
            runner.name,
            JOBS as f64 / secs,
            100.0 * bsecs / secs,
            cpu * 1e3 / JOBS as f64,
        );
    }
}

fn exec_big(rounds: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let project = dir.path().join("project");
    std::fs::create_dir(&project).expect("project dir");
    let yaml = format!("big:\n  script:\n    - {}\n", serde_json::to_string(BIG_PIPELINE).expect("quote"));
    std::fs::write(project.join(".gitlab-ci.yml"), yaml).expect("write");
    for args in
        [&["init", "-q"][..], &["add", "."], &["-c", "user.email=b@e", "-c", "user.name=b", "commit", "-q", "-m", "x"]]
    {
        Command::new("git").arg("-C").arg(&project).args(args).output().expect("git");
    }
    let cache = dir.path().join("cache");
    let exec = |binary: &str| {
        let started = Instant::now();
        let status = Command::new(binary)
            .args(["exec", "big"])
            .current_dir(&project)
            .env("XDG_CACHE_HOME", &cache)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("runway exec");
        assert!(status.success());
        started.elapsed().as_secs_f64()
    };
    let bare = || {
        let started = Instant::now();
        let status =
            Command::new("bash").args(["-c", BIG_PIPELINE]).stdout(Stdio::null()).status().expect("bash pipeline");
        assert!(status.success());
        started.elapsed().as_secs_f64()
    };
    let bins = binaries();
    for (_, binary) in &bins {
        exec(binary); // fills the compiled-plugin cache
    }
    let mut runway: Vec<Vec<f64>> = bins.iter().map(|_| vec![]).collect();
    let mut pipeline = vec![];
    for round in 0..rounds {
        let p = bare();
        println!("round {round}: bare pipeline {p:.2} s");
        pipeline.push(p);
        for ((name, binary), times) in bins.iter().zip(runway.iter_mut()) {
            let r = exec(binary);
            println!("round {round}: {name}: runway exec {r:.2} s, ratio {:.2}", r / p);
            times.push(r);
        }
    }
    let p = median(pipeline);
    println!("the pipeline into /dev/null (median of {rounds}): {p:.2} s");
    for ((name, _), times) in bins.iter().zip(runway) {
        let r = median(times);
        println!(
            "runway exec of 200 MB in 100-byte lines, {name} (median of {rounds}): {r:.2} s; ratio {:.2} (goal <= 1.5)",
            r / p
        );
    }
}

fn trace_path(rounds: usize) {
    // 50 masked values of 8..=64 bytes, some of which occur in the output.
    let phrases: Vec<String> = (0..50).map(|i| format!("s3cr3t{i:02}{}", "x".repeat(i % 57))).collect();
    let mut line = format!("{:098}", 0).into_bytes();
    line.push(b'\n');
    let mut chunk = Vec::with_capacity(64 * 1024);
    let mut n = 0;
    while chunk.len() + line.len() <= 64 * 1024 {
        if n % 100 == 7 {
            // A secret now and then, and one split across two writes at the chunk's end.
            let secret = phrases[n % phrases.len()].as_bytes();
            chunk.extend_from_slice(&line[..100 - secret.len() - 1]);
            chunk.extend_from_slice(secret);
            chunk.push(b'\n');
        } else {
            chunk.extend_from_slice(&line);
        }
        n += 1;
    }
    let split = phrases[3].as_bytes();
    chunk.extend_from_slice(&split[..4]);
    let mut next = chunk.clone();
    next.splice(0..0, split[4..].iter().copied());
    // Without and with per-line timestamps (`FF_TIMESTAMPS`, on by default): one header per
    // 100-byte line is the timestamper's whole cost.
    for timestamps in [false, true] {
        let options = TraceOptions {
            masked_phrases: phrases.clone(),
            output_limit_kib: 300 * 1024,
            timestamps,
            ..TraceOptions::default()
        };
        let what = if timestamps { "masking + timestamps" } else { "masking" };
        let mut rates = vec![];
        for round in 0..rounds {
            let trace = JobTrace::new(&options).expect("trace");
            let started = Instant::now();
            let mut written = 0usize;
            let mut i = 0;
            while (written as f64) < BIG_BYTES {
                let data = if i % 2 == 0 { &chunk } else { &next };
                trace.write_followed("/builds/x/00-step_script.log", written as u64, data);
                written += data.len();
                i += 1;
            }
            trace.finish();
            let _ = trace.checksum();
            let secs = started.elapsed().as_secs_f64();
            let kept = trace.contents();
            assert!(!kept.windows(split.len()).any(|w| w == split), "a split secret was not masked");
            let rate = written as f64 / secs / 1e6;
            println!("round {round}: trace path, {what}: {rate:.0} MB/s ({written} bytes in {secs:.2} s)");
            rates.push(rate);
        }
        println!(
        "runway run trace path, {what} (50 masked values, 64 KiB writes; median of {rounds}): {:.0} MB/s (goal >= 200)",
        median(rates)
    );
    }
    let _ = std::io::stdout().flush();
}

fn main() {
    // `cargo bench` passes `--bench`; a filter picks one part.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with("--")).unwrap_or_default();
    let rounds = std::env::var("RUNWAY_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    if filter.is_empty() || "throughput".contains(&filter) {
        throughput(rounds);
    }
    if filter.is_empty() || "exec".contains(&filter) {
        exec_big(rounds);
    }
    if filter.is_empty() || "trace".contains(&filter) {
        trace_path(rounds);
    }
}
