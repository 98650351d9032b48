//! `runway simulate`: replay a job trace against the real [`Taskscaler`] on a virtual clock,
//! with the seeded [`SimProvider`] as the cloud and a simulated GitLab queue. A runner takes
//! a queued job whenever `reserve` succeeds (pickup is immediate: no poll interval), calls
//! `acquire`, and the job starts when the slot is assigned; queue wait = start − arrival.
//! Reports queue-wait percentiles, instance-hours, idle share, churn, failures, and draws an
//! SVG of queued jobs and instances over time.
//!
//! The config is config.toml read by the one reader (`config::load_for`) and mapped by the one
//! mapping (`from_config`); see [`read_sim_config`] for the simulator's two deliberate
//! differences. The report and its chart live in `report`. Must not parse config.toml itself.

mod chart;
mod oracle;
mod report;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::clock::{Clock, Moment, VirtualClock};
use super::engine::{EngineEvent, Taskscaler};
use super::from_config::{self, Mapping};
use super::provider::{SimProvider, SimProviderSettings};
use super::settings::AutoscalerSettings;
use super::trace::{read_trace, JobArrival, TRACE_START};
use crate::config::{self, Purpose};
pub use oracle::{infinite, oracle, Baseline};
pub use report::{ChartPoint, HourRow, SimReport, Summary};

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Per hour of week (trace time 0 is Monday 00:00): waits of the jobs arriving in it, and the
/// fleet's instance-seconds and busy instance-seconds spent in it.
struct HourTable {
    waits: Vec<Vec<f64>>,
    instance_seconds: Vec<f64>,
    busy_seconds: Vec<f64>,
}

impl Default for HourTable {
    fn default() -> Self {
        HourTable { waits: vec![Vec::new(); 168], instance_seconds: vec![0.0; 168], busy_seconds: vec![0.0; 168] }
    }
}

impl HourTable {
    fn hour_of(at: Moment) -> (usize, u64) {
        let ms = at.since(TRACE_START).as_millis() as u64;
        (((ms / 3_600_000) % 168) as usize, (ms / 3_600_000 + 1) * 3_600_000)
    }

    fn job(&mut self, arrival: Moment, wait: f64) {
        self.waits[Self::hour_of(arrival).0].push(wait);
    }

    /// `instances` (of which `busy` run jobs) from `from` to `to`, split at hour boundaries.
    fn fleet(&mut self, from: Moment, to: Moment, instances: u32, busy: u32) {
        let mut t = from;
        while t < to {
            let (hour, hour_end_ms) = Self::hour_of(t);
            let end = to.min(TRACE_START.plus(Duration::from_millis(hour_end_ms)));
            let seconds = end.since(t).as_secs_f64();
            self.instance_seconds[hour] += seconds * f64::from(instances);
            self.busy_seconds[hour] += seconds * f64::from(busy);
            t = end;
        }
    }

    fn rows(mut self) -> Vec<HourRow> {
        (0..168)
            .map(|h| {
                let waits = &mut self.waits[h];
                waits.sort_by(f64::total_cmp);
                HourRow {
                    hour_of_week: h as u32,
                    jobs: waits.len() as u64,
                    p95_wait_s: percentile(waits, 0.95),
                    mean_wait_s: if waits.is_empty() { 0.0 } else { waits.iter().sum::<f64>() / waits.len() as f64 },
                    instance_hours: self.instance_seconds[h] / 3600.0,
                    busy_instance_hours: self.busy_seconds[h] / 3600.0,
                }
            })
            .collect()
    }
}

struct JobRecord {
    arrival: Moment,
    duration: Duration,
}

/// Run the real engine against the simulated provider and queue. Deterministic: identical
/// inputs give identical reports.
pub fn run_simulation(
    settings: &AutoscalerSettings,
    provider_settings: &SimProviderSettings,
    trace: &[JobArrival],
) -> anyhow::Result<SimReport> {
    provider_settings.validate().map_err(|e| anyhow::anyhow!("provider settings: {e}"))?;
    let clock = Arc::new(VirtualClock::new(TRACE_START));
    let mut engine = Taskscaler::new(settings, clock.now()).map_err(|e| anyhow::anyhow!("autoscaler settings: {e}"))?;
    let mut provider = SimProvider::new(provider_settings.clone(), clock.clone());
    let mut ready_rng = StdRng::seed_from_u64(provider_settings.seed ^ 0x005e_ed0f_7ead);
    let capacity = engine.settings().capacity;

    let mut jobs: Vec<JobRecord> = trace
        .iter()
        .map(|j| JobRecord {
            arrival: TRACE_START.plus(Duration::from_secs_f64(j.at)),
            duration: Duration::from_secs_f64(j.duration),
        })
        .collect();
    jobs.sort_by_key(|j| j.arrival);
    let last_arrival = jobs.last().map_or(TRACE_START, |j| j.arrival);
    let give_up_at = last_arrival.plus(Duration::from_secs(2 * 86_400));

    let mut next_arrival = 0usize;
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut waiting_for_slot = 0u32;
    let mut running: BinaryHeap<Reverse<(Moment, usize)>> = BinaryHeap::new();
    let mut instance_of: HashMap<usize, String> = HashMap::new();
    let mut ready_checks: BinaryHeap<Reverse<(Moment, String, bool)>> = BinaryHeap::new();
    let mut busy: HashMap<String, (u32, Moment)> = HashMap::new();
    let mut busy_seconds = 0.0f64;
    let mut job_seconds = 0.0f64;
    let mut waits: Vec<f64> = Vec::with_capacity(jobs.len());
    let mut failed_timeout = 0u64;
    let mut failed_lost = 0u64;
    let mut done = 0usize;
    let mut chart: Vec<ChartPoint> = Vec::new();
    let mut peak_instances = 0u32;
    let mut pickup = vec![0.0f64; jobs.len()];
    let mut pickup_waits: Vec<f64> = Vec::with_capacity(jobs.len());
    let mut instance_waits: Vec<f64> = Vec::with_capacity(jobs.len());
    let mut hours = HourTable::default();

    let key_of = |idx: usize| idx.to_string();
    let idx_of = |key: &str| key.parse::<usize>().ok();

    fn busy_change(
        busy: &mut HashMap<String, (u32, Moment)>,
        total: &mut f64,
        instance: &str,
        delta: i32,
        now: Moment,
    ) {
        let entry = busy.entry(instance.to_string()).or_insert((0, now));
        if delta > 0 {
            if entry.0 == 0 {
                entry.1 = now;
            }
            entry.0 += 1;
        } else if entry.0 > 0 {
            entry.0 -= 1;
            if entry.0 == 0 {
                *total += now.since(entry.1).as_secs_f64();
                busy.remove(instance);
            }
        }
    }

    loop {
        let now = clock.now();
        while next_arrival < jobs.len() && jobs[next_arrival].arrival <= now {
            queue.push_back(next_arrival);
            next_arrival += 1;
        }
        while let Some(Reverse((t, idx))) = running.peek().cloned() {
            if t > now {
                break;
            }
            running.pop();
            if let Some(instance) = instance_of.remove(&idx) {
                let _ = engine.release(&key_of(idx), now);
                busy_change(&mut busy, &mut busy_seconds, &instance, -1, now);
                job_seconds += jobs[idx].duration.as_secs_f64();
                done += 1;
            }
        }
        while let Some(Reverse((t, _, _))) = ready_checks.peek() {
            if *t > now {
                break;
            }
            let Some(Reverse((_, id, ok))) = ready_checks.pop() else { break };
            let result = if ok { Ok(()) } else { Err(super::NotReady("ready command failed".to_string())) };
            engine.ready_check_finished(&id, result, now);
        }

        for _ in 0..16 {
            engine.tick(now, &mut provider);
            // The runner asks GitLab for a job whenever a reservation succeeds.
            while let Some(&idx) = queue.front() {
                if engine.reserve(&key_of(idx), now).is_err() {
                    break;
                }
                queue.pop_front();
                pickup[idx] = now.since(jobs[idx].arrival).as_secs_f64();
                waiting_for_slot += 1;
                let _ = engine.acquire(&key_of(idx), now);
            }
            for event in engine.take_events() {
                match event {
                    EngineEvent::Acquired { key, acquisition } => {
                        let Some(idx) = idx_of(&key) else { continue };
                        waiting_for_slot = waiting_for_slot.saturating_sub(1);
                        let wait = now.since(jobs[idx].arrival).as_secs_f64();
                        waits.push(wait);
                        pickup_waits.push(pickup[idx]);
                        instance_waits.push((wait - pickup[idx]).max(0.0));
                        hours.job(jobs[idx].arrival, wait);
                        running.push(Reverse((now.plus(jobs[idx].duration), idx)));
                        busy_change(&mut busy, &mut busy_seconds, &acquisition.instance, 1, now);
                        instance_of.insert(idx, acquisition.instance);
                    }
                    EngineEvent::AcquireTimedOut { .. } => {
                        waiting_for_slot = waiting_for_slot.saturating_sub(1);
                        failed_timeout += 1;
                        done += 1;
                    }
                    EngineEvent::ReadyCheckRequested { instance } => {
                        let delay = provider_settings.ready.sample(&mut ready_rng);
                        let ok = ready_rng.random::<f64>() >= provider_settings.ready_failure_rate;
                        ready_checks.push(Reverse((now.plus(delay), instance, ok)));
                    }
                    EngineEvent::InstanceLost { keys, .. } => {
                        for key in keys {
                            let Some(idx) = idx_of(&key) else { continue };
                            if let Some(instance) = instance_of.remove(&idx) {
                                busy_change(&mut busy, &mut busy_seconds, &instance, -1, now);
                                failed_lost += 1;
                                done += 1;
                            }
                        }
                    }
                    EngineEvent::AcquisitionsAbandoned { .. }
                    | EngineEvent::InstanceRemoved { .. }
                    | EngineEvent::InstanceInterrupted { .. }
                    | EngineEvent::ProviderFailing { .. }
                    | EngineEvent::ProviderRecovered { .. } => {}
                }
            }
            if !engine.needs_tick() {
                break;
            }
        }

        let queued = queue.len() as u32 + waiting_for_slot;
        let instances = engine.instance_count();
        peak_instances = peak_instances.max(instances);
        let busy_now = busy.len() as u32;
        let point = ChartPoint { t: now.since(TRACE_START).as_secs_f64(), queued, instances, busy: busy_now };
        if chart.last().is_none_or(|p| p.queued != queued || p.instances != instances || p.busy != busy_now) {
            chart.push(point);
        }

        if done == jobs.len() && next_arrival == jobs.len() {
            break;
        }
        let mut next = engine.next_wakeup();
        if let Some(job) = jobs.get(next_arrival) {
            next = next.min(job.arrival);
        }
        if let Some(Reverse((t, _))) = running.peek() {
            next = next.min(*t);
        }
        if let Some(Reverse((t, _, _))) = ready_checks.peek() {
            next = next.min(*t);
        }
        if next <= now {
            next = now.plus(Duration::from_millis(1));
        }
        if next > give_up_at {
            break;
        }
        hours.fleet(now, next, instances, busy_now);
        clock.set(next);
    }

    let end = clock.now();
    for (_, (count, since)) in busy.drain() {
        if count > 0 {
            busy_seconds += end.since(since).as_secs_f64();
        }
    }
    waits.sort_by(f64::total_cmp);
    pickup_waits.sort_by(f64::total_cmp);
    instance_waits.sort_by(f64::total_cmp);
    let billed = provider.billed_seconds(end);
    let metrics = engine.metrics();
    let jobs_total = jobs.len() as u64;
    let started = waits.len() as u64;
    let share = |limit: f64| {
        if waits.is_empty() {
            0.0
        } else {
            waits.iter().filter(|w| **w > limit).count() as f64 / waits.len() as f64
        }
    };
    let idle_seconds = (billed - busy_seconds).max(0.0);
    Ok(SimReport {
        jobs_total,
        jobs_started: started,
        jobs_failed_acquire_timeout: failed_timeout,
        jobs_failed_instance_lost: failed_lost,
        jobs_never_started: jobs_total.saturating_sub(started + failed_timeout),
        wait_p50_s: percentile(&waits, 0.50),
        wait_p95_s: percentile(&waits, 0.95),
        wait_p99_s: percentile(&waits, 0.99),
        wait_max_s: waits.last().copied().unwrap_or(0.0),
        wait_pickup_p50_s: percentile(&pickup_waits, 0.50),
        wait_pickup_p95_s: percentile(&pickup_waits, 0.95),
        wait_instance_p50_s: percentile(&instance_waits, 0.50),
        wait_instance_p95_s: percentile(&instance_waits, 0.95),
        wait_mean_s: if waits.is_empty() { 0.0 } else { waits.iter().sum::<f64>() / waits.len() as f64 },
        share_wait_over_30s: share(30.0),
        share_wait_over_120s: share(120.0),
        instance_hours: billed / 3600.0,
        idle_instance_hours: idle_seconds / 3600.0,
        idle_share: if billed > 0.0 { idle_seconds / billed } else { 0.0 },
        slot_utilisation: if billed > 0.0 { job_seconds / (billed * f64::from(capacity)) } else { 0.0 },
        creations: provider.created_total,
        creations_per_job: if jobs_total > 0 { provider.created_total as f64 / jobs_total as f64 } else { 0.0 },
        peak_instances,
        removals: metrics.instances_removed_total.iter().map(|(r, n)| (r.as_str().to_string(), *n)).collect(),
        simulated_seconds: end.since(TRACE_START).as_secs_f64(),
        cost: billed / 3600.0 * provider_settings.price_per_hour,
        oracle: oracle::oracle(trace, provider_settings, settings.instance_ready_command.is_some(), capacity),
        infinite: oracle::infinite(trace, provider_settings, capacity),
        hours: hours.rows(),
        chart,
    })
}

/// Read the fleet settings `runway simulate` replays from a config.toml.
///
/// The file loads through [`config::load_for`] like `runway run`'s (same errors, naming file,
/// line and key, and the same warnings, logged), for [`Purpose::Simulate`]: the keys that
/// connect to GitLab or a cloud (`url`, `token`, `executor`, the fleeting `plugin`) may be left
/// out. The first `[[runners]]` entry with `[runners.autoscaler]` or `[runners.machine]` is
/// mapped by [`from_config::runner_settings`] with [`Mapping::SIMULATE`] (an unset policy
/// timezone is UTC, the virtual clock's zone), then compiled.
pub fn read_sim_config(path: &Path) -> anyhow::Result<AutoscalerSettings> {
    let loaded = config::load_for(path, Purpose::Simulate)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    let settings = loaded
        .config
        .runners
        .iter()
        .find_map(|r| from_config::runner_settings(r, Mapping::SIMULATE))
        .with_context(|| {
            format!("{}: no [[runners]] entry has a [runners.autoscaler] or [runners.machine] section", path.display())
        })?;
    settings.compile().map_err(|e| anyhow::anyhow!("{}: [runners.autoscaler] {e}", path.display()))?;
    Ok(settings)
}

/// Read `provider.toml` (all keys optional; defaults are the linux-cold profile).
pub fn read_provider_settings(path: &Path) -> anyhow::Result<SimProviderSettings> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let settings: SimProviderSettings =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    settings.validate().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(settings)
}

/// What `runway simulate` was asked for.
#[derive(Clone, Debug, Default)]
pub struct SimulateOptions {
    /// The configs to simulate: `--config`, or every file of `--compare`, side by side.
    pub configs: Vec<std::path::PathBuf>,
    /// The job trace (JSONL).
    pub trace: std::path::PathBuf,
    /// The provider profile (TOML); the linux-cold defaults when `None`.
    pub provider: Option<std::path::PathBuf>,
    /// Write the chart here (with several configs, `<stem>-<config stem>.svg` beside it).
    pub svg: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    pub json: bool,
    /// Add the per-hour-of-week table to the text output.
    pub per_hour: bool,
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
}

/// `runway simulate`: run the simulation of every config on the trace, write the charts and
/// return the report (text, or JSON with `--json`).
pub fn simulate_command(options: &SimulateOptions) -> anyhow::Result<String> {
    anyhow::ensure!(!options.configs.is_empty(), "runway simulate: no config to simulate");
    let provider = match &options.provider {
        Some(p) => read_provider_settings(p)?,
        None => SimProviderSettings::default(),
    };
    let trace = read_trace(&options.trace)?;
    let mut runs = Vec::new();
    for config in &options.configs {
        let settings = read_sim_config(config)?;
        let report = run_simulation(&settings, &provider, &trace)?;
        if let Some(svg) = &options.svg {
            let path = if options.configs.len() == 1 {
                svg.clone()
            } else {
                svg.with_file_name(format!("{}-{}.svg", stem(svg), stem(config)))
            };
            let title = format!("{} on {}", stem(config), stem(&options.trace));
            std::fs::write(&path, report.to_svg(&title)).with_context(|| format!("cannot write {}", path.display()))?;
        }
        runs.push((config.clone(), report));
    }
    if options.json {
        let entries: Vec<serde_json::Value> = runs
            .iter()
            .map(|(config, r)| {
                serde_json::json!({
                    "config": config.display().to_string(),
                    "trace": options.trace.display().to_string(),
                    "summary": r.summary(),
                    "oracle": r.oracle,
                    "infinite": r.infinite,
                    "hours": r.hours,
                    "report": r,
                })
            })
            .collect();
        let value = if entries.len() == 1 { entries[0].clone() } else { serde_json::Value::Array(entries) };
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    if runs.len() == 1 {
        let (_, r) = &runs[0];
        let mut text = r.to_text();
        if options.per_hour {
            text.push_str(&r.hours_text());
        }
        return Ok(text);
    }
    Ok(report::compare_text(&runs.iter().map(|(c, r)| (stem(c), r)).collect::<Vec<_>>()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::settings::IdlePolicy;
    use crate::autoscaler::trace::{generate, TraceKind};

    fn examples() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
    }

    fn quick_cloud() -> SimProviderSettings {
        SimProviderSettings { seed: 9, ..Default::default() }
    }

    #[test]
    fn identical_inputs_give_identical_reports() {
        let settings = read_sim_config(&examples().join("simulate/p2-scale-factor.toml")).expect("example config");
        let trace = generate(TraceKind::Bursty, 2, 5);
        let a = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
        let b = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
        assert_eq!(a, b);
        assert_eq!(a.jobs_total, trace.len() as u64);
        assert_eq!(a.jobs_started + a.jobs_failed_acquire_timeout + a.jobs_never_started, a.jobs_total);
        assert!(a.instance_hours > 0.0 && a.creations > 0);
        let c = run_simulation(&settings, &SimProviderSettings { seed: 10, ..quick_cloud() }, &trace).expect("runs");
        assert_ne!(a, c, "the seed matters");
    }

    #[test]
    fn more_idle_capacity_buys_shorter_waits_for_more_instance_hours() {
        let trace = generate(TraceKind::Diurnal, 3, 11);
        let policy = |idle_count| AutoscalerSettings {
            policies: vec![IdlePolicy {
                idle_count,
                idle_time: Duration::from_secs(1200),
                timezone: Some("UTC".into()),
                ..Default::default()
            }],
            instance_ready_command: Some("true".into()),
            ..Default::default()
        };
        let lean = run_simulation(&policy(0), &quick_cloud(), &trace).expect("runs");
        let rich = run_simulation(&policy(10), &quick_cloud(), &trace).expect("runs");
        assert!(
            rich.wait_mean_s < lean.wait_mean_s,
            "idle instances absorb arrivals: {} vs {}",
            rich.wait_mean_s,
            lean.wait_mean_s
        );
        assert!(rich.share_wait_over_30s < lean.share_wait_over_30s);
        assert!(rich.instance_hours > lean.instance_hours);
        assert!(lean.wait_max_s >= 27.0, "a job that finds no instance waits for one to be provisioned");
    }

    #[test]
    fn simulate_command_reads_config_trace_provider_and_writes_svg() {
        let dir = tempfile::tempdir().expect("temp dir");
        let trace_path = dir.path().join("trace.jsonl");
        let mut file = std::fs::File::create(&trace_path).expect("create");
        crate::autoscaler::trace::write_trace(&mut file, &generate(TraceKind::Diurnal, 1, 2)).expect("write");
        drop(file);
        let svg = dir.path().join("chart.svg");
        let text = simulate_command(&SimulateOptions {
            configs: vec![examples().join("simulate/docker-machine-seed-001.toml")],
            trace: trace_path.clone(),
            provider: Some(examples().join("simulate/linux-cold.toml")),
            svg: Some(svg.clone()),
            ..Default::default()
        })
        .expect("simulates");
        assert!(text.contains("queue wait") && text.contains("instance-hours"), "{text}");
        let chart = std::fs::read_to_string(&svg).expect("svg written");
        assert!(chart.starts_with("<svg") && chart.contains("queued jobs") && chart.contains("<path d=\"M"));
    }

    #[test]
    fn config_errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("config.toml");
        // Errors are `runway run`'s (the same loader): `file:line: key: message`.
        std::fs::write(&config, "[[runners]]\n[runners.autoscaler]\ncapacity_per_instance = \"two\"\n").expect("write");
        let err = format!("{:#}", read_sim_config(&config).expect_err("bad type"));
        assert!(
            err.contains("config.toml") && err.contains("capacity_per_instance") && err.contains("config.toml:3:"),
            "{err}"
        );
        std::fs::write(&config, "concurrent = 1\n[[runners]]\nexecutor = \"shell\"\n").expect("write");
        let err = format!("{:#}", read_sim_config(&config).expect_err("no autoscaler"));
        assert!(err.contains("no [[runners]] entry"), "{err}");
        std::fs::write(
            &config,
            "concurrent = 1\n[[runners]]\n[runners.autoscaler]\n[[runners.autoscaler.policy]]\nperiods = [\"* * *\"]\n",
        )
        .expect("write");
        let err = format!("{:#}", read_sim_config(&config).expect_err("bad cron"));
        assert!(err.contains("policy[0].periods"), "{err}");
        let provider = dir.path().join("provider.toml");
        std::fs::write(&provider, "seed = 1\ntimeout_rate = 2.0\n").expect("write");
        let err = format!("{:#}", read_provider_settings(&provider).expect_err("bad rate"));
        assert!(err.contains("provider.toml") && err.contains("timeout_rate"), "{err}");
        std::fs::write(&provider, "sead = 1\n").expect("write");
        assert!(read_provider_settings(&provider).is_err(), "unknown keys are rejected");
    }

    #[test]
    fn compare_runs_configs_side_by_side_with_the_floors() {
        let dir = tempfile::tempdir().expect("temp dir");
        let trace_path = dir.path().join("trace.jsonl");
        let mut file = std::fs::File::create(&trace_path).expect("create");
        crate::autoscaler::trace::write_trace(&mut file, &generate(TraceKind::Bursty, 1, 4)).expect("write");
        drop(file);
        let configs =
            vec![examples().join("simulate/p0-static-idle.toml"), examples().join("simulate/p3-predictive.toml")];
        let options = SimulateOptions {
            configs: configs.clone(),
            trace: trace_path.clone(),
            svg: Some(dir.path().join("chart.svg")),
            ..Default::default()
        };
        let text = simulate_command(&options).expect("simulates");
        let header = text.lines().next().unwrap_or_default();
        for column in ["p0-static-idle", "p3-predictive", "oracle", "infinite"] {
            assert!(header.contains(column), "{header}");
        }
        assert!(text.contains("p95 wait (s)") && text.contains("instance-hours"), "{text}");
        assert!(
            dir.path().join("chart-p0-static-idle.svg").exists() && dir.path().join("chart-p3-predictive.svg").exists()
        );
        let json = simulate_command(&SimulateOptions { json: true, svg: None, ..options }).expect("json");
        let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(value.as_array().map(Vec::len), Some(2));
        assert!(value[1]["config"].as_str().is_some_and(|c| c.ends_with("p3-predictive.toml")));
        assert!(value[1]["summary"]["p95_wait_s"].is_number() && value[1]["oracle"]["instance_hours"].is_number());
        assert_eq!(value[1]["hours"].as_array().map(Vec::len), Some(168));
    }

    #[test]
    fn unknown_keys_in_the_fleet_config_are_warned_about() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "concurrent = 1\n[[runners]]\n[runners.autoscaler]\n[[runners.autoscaler.policy]]\nidle_count = 2\nscale_factr = 0.2\n[runners.autoscaler.predictive]\nenabled = true\nhorizon = \"5m\"\n",
        )
        .expect("write");
        let loaded = config::load_for(&config, Purpose::Simulate).expect("loads");
        let warnings = loaded.warnings.join("\n");
        assert!(warnings.contains("scale_factr") && warnings.contains("horizon"), "{warnings}");
        let settings = read_sim_config(&config).expect("still simulates");
        assert!(settings.predictive.is_some(), "enabled = true turns the predictive policy on");
    }

    #[test]
    fn every_run_reports_the_oracle_and_infinite_floors_and_hours_of_week() {
        let settings = read_sim_config(&examples().join("simulate/p3-predictive.toml")).expect("example config");
        let trace = generate(TraceKind::Diurnal, 2, 3);
        let r = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
        assert!(r.infinite.instance_hours > 0.0 && r.oracle.instance_hours > r.infinite.instance_hours);
        assert!(r.instance_hours >= r.infinite.instance_hours, "no policy beats infinite instant capacity");
        assert_eq!(r.hours.len(), 168);
        assert_eq!(r.hours.iter().map(|h| h.jobs).sum::<u64>(), r.jobs_started);
        assert!(r.wait_pickup_p95_s <= r.wait_p95_s + 1e-9 && r.wait_instance_p95_s <= r.wait_p95_s + 1e-9);
        let svg = r.to_svg("p3 on diurnal");
        assert!(svg.contains("p3 on diurnal") && svg.contains("busy instances") && svg.contains("queued jobs"));
        assert!(svg.contains("time since trace start"), "an axis title");
    }

    /// The 4-week diurnal trace of §3.4 runs to completion under P0 (no timing assertion).
    #[test]
    fn four_week_diurnal_trace_completes() {
        let settings = read_sim_config(&examples().join("simulate/p0-static-idle.toml")).expect("example config");
        let trace = read_trace(&examples().join("traces/diurnal-4w.jsonl")).expect("shipped trace");
        let report = run_simulation(&settings, &SimProviderSettings::default(), &trace).expect("runs");
        assert_eq!(report.jobs_total, trace.len() as u64);
        assert_eq!(report.jobs_never_started, 0);
        assert!(report.simulated_seconds >= 27.0 * 86_400.0);
        assert!(report.jobs_started + report.jobs_failed_acquire_timeout == report.jobs_total);
    }

    /// The scaler-bench baseline (P0–P2 on the diurnal and bursty traces) behind
    /// docs/benchmarks-autoscaler.md. Run with
    /// `cargo test --release -p runway --lib autoscaler_benchmark -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn autoscaler_benchmark() {
        let svg_dir = std::env::var_os("RUNWAY_BENCH_SVG_DIR").map(std::path::PathBuf::from);
        for trace_name in ["diurnal-4w", "bursty-4w"] {
            let trace = read_trace(&examples().join(format!("traces/{trace_name}.jsonl"))).expect("shipped trace");
            let only = std::env::var("RUNWAY_BENCH_POLICIES").unwrap_or_default();
            // RUNWAY_BENCH_EXTRA: more config files (comma-separated) to run beside the four.
            let extra = std::env::var("RUNWAY_BENCH_EXTRA").unwrap_or_default();
            let shipped = ["p0-static-idle", "p1-cron-periods", "p2-scale-factor", "p3-predictive"]
                .map(|p| examples().join(format!("simulate/{p}.toml")));
            let all =
                shipped.into_iter().chain(extra.split(',').filter(|e| !e.is_empty()).map(std::path::PathBuf::from));
            for path in all {
                let policy = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                let policy = policy.as_str();
                if !only.is_empty() && !only.split(',').any(|p| policy.starts_with(p)) {
                    continue;
                }
                let settings = read_sim_config(&path).expect("config");
                let provider = read_provider_settings(&examples().join("simulate/linux-cold.toml")).expect("provider");
                let started = std::time::Instant::now();
                let report = run_simulation(&settings, &provider, &trace).expect("runs");
                let elapsed = started.elapsed();
                println!(
                    "== {trace_name} × {policy} ({} jobs, simulated in {:.1} s)\n{}",
                    trace.len(),
                    elapsed.as_secs_f64(),
                    report.to_text()
                );
                println!("json {}", serde_json::to_string(&report.summary()).expect("json"));
                if let Some(dir) = &svg_dir {
                    std::fs::write(
                        dir.join(format!("{trace_name}-{policy}.svg")),
                        report.to_svg(&format!("{policy} on {trace_name}")),
                    )
                    .expect("svg");
                }
            }
        }
    }
}
