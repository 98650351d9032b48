//! Job-arrival traces for `runway simulate`: the JSONL format (one job per line:
//! `{"at": <seconds after trace start>, "duration": <seconds>}`, optional `"pipeline"`), and
//! the seeded generators of the 4-week *diurnal* and *bursty* traces of autoscaling.md §3.4.
//! Trace time 0 is Monday 2026-01-05 00:00 UTC ([`TRACE_START`]), so cron periods of
//! policies line up with weekdays and office hours.

use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::clock::Moment;
use super::provider::lognormal;

/// Trace time 0: Monday 2026-01-05T00:00:00Z.
pub const TRACE_START: Moment = Moment(1_767_571_200_000);

/// One job of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobArrival {
    /// When the job becomes pending, seconds after trace start.
    pub at: f64,
    /// How long the job runs once started, seconds.
    pub duration: f64,
    /// The pipeline it belongs to (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<u64>,
    /// The `[[runners]]` entry (its `name`) that ran it: when several entries are simulated
    /// together the job goes to that one; without it (or naming none of them) the job waits
    /// in the queue all of them poll. Ignored when one entry is simulated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
}

/// Largest `at` or `duration` a trace may hold, in seconds.
pub const MAX_SECONDS: f64 = 1e9;

/// One job of GitLab's jobs API (`GET /projects/:id/jobs`), the fields a trace needs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ApiJob {
    /// When the job was created (became pending).
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When a runner started it (`null` for jobs that never ran).
    #[serde(default)]
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When it finished (`null` while running or never started).
    #[serde(default)]
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its pipeline (`pipeline.id`).
    #[serde(default)]
    pub pipeline: Option<ApiPipeline>,
    /// The runner that ran it (`null` for jobs no runner took).
    #[serde(default)]
    pub runner: Option<ApiRunner>,
}

/// The `runner` object of an [`ApiJob`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ApiRunner {
    /// The runner's description: the `name` of its `[[runners]]` entry.
    #[serde(default)]
    pub description: Option<String>,
}

/// The `pipeline` object of an [`ApiJob`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ApiPipeline {
    /// Pipeline id.
    pub id: u64,
}

/// Turn a project's job history into a trace: `at` = `created_at`, `duration` =
/// `finished_at − started_at` and `runner` = the runner's description (for several-runner
/// configs), with trace time 0 at the Monday 00:00 UTC of the week of the
/// earliest job, so weekdays and times of day line up with the simulator's clock (and cron
/// policies). Jobs that never started or finished are skipped; returns the trace (sorted)
/// and how many were skipped.
pub fn trace_from_jobs(jobs: &[ApiJob]) -> (Vec<JobArrival>, usize) {
    use chrono::{Datelike, Duration as ChronoDuration, TimeZone};
    let Some(first) = jobs.iter().map(|j| j.created_at).min() else { return (Vec::new(), 0) };
    let monday = first.date_naive() - ChronoDuration::days(i64::from(first.weekday().num_days_from_monday()));
    let origin = chrono::Utc.from_utc_datetime(&monday.and_hms_opt(0, 0, 0).unwrap_or_default());
    let mut skipped = 0;
    let mut out = Vec::new();
    for job in jobs {
        let (Some(started), Some(finished)) = (job.started_at, job.finished_at) else {
            skipped += 1;
            continue;
        };
        let at = (job.created_at - origin).num_milliseconds() as f64 / 1000.0;
        let duration = ((finished - started).num_milliseconds() as f64 / 1000.0).max(0.0);
        if !(at.is_finite() && (0.0..=MAX_SECONDS).contains(&at) && duration <= MAX_SECONDS) {
            skipped += 1;
            continue;
        }
        let runner = job.runner.as_ref().and_then(|r| r.description.clone()).filter(|d| !d.is_empty());
        out.push(JobArrival { at, duration, pipeline: job.pipeline.as_ref().map(|p| p.id), runner });
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    (out, skipped)
}

/// Read a JSONL trace; errors name the file and line. Jobs are returned sorted by `at`.
pub fn read_trace(path: &Path) -> anyhow::Result<Vec<JobArrival>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open trace {}", path.display()))?;
    let mut jobs = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}: cannot read", path.display(), n + 1))?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let job: JobArrival =
            serde_json::from_str(line).with_context(|| format!("{}:{}: not a trace entry", path.display(), n + 1))?;
        // Bounded so every later `Duration::from_secs_f64` holds (about 31 years).
        let valid = |v: f64| v.is_finite() && (0.0..=MAX_SECONDS).contains(&v);
        if !(valid(job.at) && valid(job.duration)) {
            anyhow::bail!(
                "{}:{}: `at` and `duration` must be numbers of seconds from 0 to {MAX_SECONDS}",
                path.display(),
                n + 1
            );
        }
        jobs.push(job);
    }
    jobs.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(jobs)
}

/// Write a trace as JSONL with a stable number format (identical input, identical bytes).
pub fn write_trace(out: &mut dyn Write, jobs: &[JobArrival]) -> std::io::Result<()> {
    for job in jobs {
        write!(out, "{{\"at\":{:.1},\"duration\":{:.0}", job.at, job.duration)?;
        if let Some(p) = job.pipeline {
            write!(out, ",\"pipeline\":{p}")?;
        }
        if let Some(runner) = &job.runner {
            write!(out, ",\"runner\":{}", serde_json::Value::from(runner.as_str()))?;
        }
        writeln!(out, "}}")?;
    }
    Ok(())
}

/// Which §3.4 trace to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// Office-hours Poisson pipelines.
    Diurnal,
    /// Diurnal plus a 04:00 cron spike, merge-train bursts and 20-way test splits.
    Bursty,
}

const DAY: f64 = 86_400.0;
const PEAK_PIPELINES_PER_HOUR: f64 = 120.0;

/// Fraction of the peak pipeline rate at `t` seconds after Monday 00:00: ramp 08–10, lunch
/// dip 12–13, tail to 19, night floor 0.03, weekends × 0.15 (never below the floor).
pub fn diurnal_rate(t: f64) -> f64 {
    const FLOOR: f64 = 0.03;
    let day = (t / DAY).floor() as i64;
    let hour = (t - day as f64 * DAY) / 3600.0;
    let weekday = day.rem_euclid(7) < 5;
    let curve = if hour < 8.0 {
        FLOOR
    } else if hour < 10.0 {
        FLOOR + (1.0 - FLOOR) * (hour - 8.0) / 2.0
    } else if hour < 12.0 {
        1.0
    } else if hour < 13.0 {
        0.6
    } else if hour < 17.0 {
        1.0
    } else if hour < 19.0 {
        1.0 - (1.0 - FLOOR) * (hour - 17.0) / 2.0
    } else {
        FLOOR
    };
    if weekday {
        curve
    } else {
        (curve * 0.15).max(FLOOR)
    }
}

/// Synthetic job duration: lognormal, median 4 min, p95 25 min, clamped to 10 s … 3 h.
fn job_duration(rng: &mut StdRng) -> f64 {
    lognormal(rng, 240.0, 1500.0).clamp(10.0, 3.0 * 3600.0).round()
}

/// Jobs per pipeline: geometric (p = 0.3) truncated to 1..=12.
fn jobs_per_pipeline(rng: &mut StdRng) -> u32 {
    let mut n = 1;
    while n < 12 && rng.random::<f64>() > 0.3 {
        n += 1;
    }
    n
}

/// Emit one pipeline starting at `start`: jobs split over 1–3 sequential stages, parallel
/// within a stage. A later stage is created when the previous one would end with no queue
/// wait (traces carry no `needs`, so stage timing is fixed up front).
fn emit_pipeline(rng: &mut StdRng, start: f64, jobs: u32, extra_parallel: u32, out: &mut Vec<JobArrival>) {
    let stages = rng.random_range(1..=jobs.min(3));
    let mut per_stage = vec![0u32; stages as usize];
    for j in 0..jobs {
        per_stage[(j % stages) as usize] += 1;
    }
    if extra_parallel > 0 {
        per_stage.push(extra_parallel);
    }
    let mut at = start;
    for count in per_stage {
        let mut longest: f64 = 0.0;
        for _ in 0..count {
            let duration = job_duration(rng);
            longest = longest.max(duration);
            out.push(JobArrival { at: (at * 10.0).round() / 10.0, duration, pipeline: None, runner: None });
        }
        at += longest;
    }
}

/// Generate a trace of `days` days (28 for the benchmark) from `seed`. Sorted by `at`.
/// Generated jobs carry no `pipeline` id, which keeps the shipped 4-week files under 5 MB.
pub fn generate(kind: TraceKind, days: u32, seed: u64) -> Vec<JobArrival> {
    let mut rng = StdRng::seed_from_u64(seed);
    let horizon = f64::from(days) * DAY;
    let mut jobs = Vec::new();
    // Non-homogeneous Poisson pipelines by thinning.
    let peak_per_second = PEAK_PIPELINES_PER_HOUR / 3600.0;
    let mut t = 0.0;
    loop {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        t += -u.ln() / peak_per_second;
        if t >= horizon {
            break;
        }
        if rng.random::<f64>() >= diurnal_rate(t) {
            continue;
        }
        let n = jobs_per_pipeline(&mut rng);
        let split = if kind == TraceKind::Bursty && rng.random::<f64>() < 0.05 { 20 } else { 0 };
        emit_pipeline(&mut rng, t, n, split, &mut jobs);
    }
    if kind == TraceKind::Bursty {
        for day in 0..days {
            let day_start = f64::from(day) * DAY;
            // (a) nightly cron spike: 400 jobs at 04:00 (GitLab.com's "4 am" case).
            for _ in 0..400 {
                let at = day_start + 4.0 * 3600.0 + rng.random::<f64>() * 10.0;
                let duration = job_duration(&mut rng);
                jobs.push(JobArrival { at: (at * 10.0).round() / 10.0, duration, pipeline: None, runner: None });
            }
            // (b) merge-train bursts: 200–300 jobs within 60 s, three times a weekday.
            if day % 7 < 5 {
                for _ in 0..3 {
                    let start = day_start + rng.random_range(9.0 * 3600.0..17.0 * 3600.0);
                    let count = rng.random_range(200..=300);
                    for _ in 0..count {
                        let at = start + rng.random::<f64>() * 60.0;
                        let duration = job_duration(&mut rng);
                        jobs.push(JobArrival {
                            at: (at * 10.0).round() / 10.0,
                            duration,
                            pipeline: None,
                            runner: None,
                        });
                    }
                }
            }
        }
    }
    jobs.retain(|j| j.at < horizon);
    jobs.sort_by(|a, b| a.at.total_cmp(&b.at));
    jobs
}

/// Seeds of the shipped traces in `examples/traces/`.
pub const DIURNAL_SEED: u64 = 34;
/// Seed of the shipped bursty trace.
pub const BURSTY_SEED: u64 = 35;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_entries_are_errors_with_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in [r#"{"at":-1,"duration":5}"#, r#"{"at":1e300,"duration":5}"#, r#"{"at":1,"duration":1e30}"#] {
            let path = dir.path().join("t.jsonl");
            std::fs::write(&path, format!("{{\"at\":0,\"duration\":1}}\n{bad}\n")).expect("write");
            let error = read_trace(&path).expect_err(bad).to_string();
            assert!(error.contains("t.jsonl:2:"), "{bad}: {error}");
        }
    }

    #[test]
    fn diurnal_rate_has_office_hours_lunch_dip_and_quiet_weekends() {
        let h = 3600.0;
        assert_eq!(diurnal_rate(3.0 * h), 0.03, "Monday night");
        assert_eq!(diurnal_rate(11.0 * h), 1.0, "Monday 11:00");
        assert_eq!(diurnal_rate(12.5 * h), 0.6, "lunch");
        assert!((diurnal_rate(5.0 * DAY + 11.0 * h) - 0.15).abs() < 1e-9, "Saturday 11:00");
        assert_eq!(diurnal_rate(6.0 * DAY + 3.0 * h), 0.03, "Sunday night");
    }

    #[test]
    fn generation_is_deterministic_and_shaped() {
        let a = generate(TraceKind::Diurnal, 7, 1);
        assert_eq!(a, generate(TraceKind::Diurnal, 7, 1));
        assert_ne!(a, generate(TraceKind::Diurnal, 7, 2));
        let weekday_office = a
            .iter()
            .filter(|j| j.at < 5.0 * DAY && (j.at % DAY) > 10.0 * 3600.0 && (j.at % DAY) < 12.0 * 3600.0)
            .count();
        let weekday_night = a.iter().filter(|j| j.at < 5.0 * DAY && (j.at % DAY) < 2.0 * 3600.0).count();
        assert!(weekday_office > 10 * weekday_night.max(1), "office {weekday_office} vs night {weekday_night}");
        let bursty = generate(TraceKind::Bursty, 7, 1);
        let four_am = bursty.iter().filter(|j| (j.at % DAY - 4.0 * 3600.0).abs() < 11.0).count();
        assert!(four_am >= 7 * 400, "nightly spike present: {four_am}");
    }

    #[test]
    fn trace_round_trips_through_jsonl_and_errors_name_the_line() {
        let jobs = generate(TraceKind::Diurnal, 1, 3);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("t.jsonl");
        let mut file = std::fs::File::create(&path).expect("create");
        write_trace(&mut file, &jobs).expect("write");
        drop(file);
        assert_eq!(read_trace(&path).expect("read"), jobs);
        // The runner that ran a job, when known, round-trips too (quotes escaped).
        let named: Vec<JobArrival> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| JobArrival { runner: (i % 2 == 0).then(|| format!("linux \"{i}\"")), ..j.clone() })
            .collect();
        let mut file = std::fs::File::create(&path).expect("create");
        write_trace(&mut file, &named).expect("write");
        drop(file);
        assert_eq!(read_trace(&path).expect("read"), named);
        std::fs::write(&path, "{\"at\":1,\"duration\":2}\n{\"at\":\"x\"}\n").expect("write");
        let err = format!("{:#}", read_trace(&path).expect_err("bad line"));
        assert!(err.contains("t.jsonl:2"), "{err}");
    }

    /// Regenerate the shipped traces: `cargo test -p runway --lib write_shipped_traces -- --ignored`.
    #[test]
    #[ignore]
    fn write_shipped_traces() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/traces");
        std::fs::create_dir_all(&dir).expect("traces dir");
        for (name, kind, seed) in [
            ("diurnal-4w.jsonl", TraceKind::Diurnal, DIURNAL_SEED),
            ("bursty-4w.jsonl", TraceKind::Bursty, BURSTY_SEED),
        ] {
            let mut out = std::io::BufWriter::new(std::fs::File::create(dir.join(name)).expect("create trace"));
            write_trace(&mut out, &generate(kind, 28, seed)).expect("write trace");
            out.flush().expect("flush");
        }
    }

    /// The traces shipped in examples/traces/ are exactly the generators' output.
    #[test]
    fn shipped_traces_match_their_generators() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/traces");
        for (name, kind, seed) in [
            ("diurnal-4w.jsonl", TraceKind::Diurnal, DIURNAL_SEED),
            ("bursty-4w.jsonl", TraceKind::Bursty, BURSTY_SEED),
        ] {
            let shipped = std::fs::read(dir.join(name)).expect("shipped trace exists");
            let mut generated = Vec::new();
            write_trace(&mut generated, &generate(kind, 28, seed)).expect("write");
            assert!(shipped == generated, "{name} differs from generate({kind:?}, 28, {seed})");
        }
    }
}
