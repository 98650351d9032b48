//! Unit tests of `runway simulate`: determinism, configs, the command, the floors, several
//! runners on one cloud, spot interruptions and throttling.

use std::time::Duration;

use super::*;
use crate::autoscaler::settings::IdlePolicy;
use crate::autoscaler::trace::{generate, JobArrival, TraceKind};

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
    let configs = vec![examples().join("simulate/p0-static-idle.toml"), examples().join("simulate/p3-predictive.toml")];
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
fn every_run_reports_the_oracle_online_and_infinite_floors_and_hours_of_week() {
    let settings = read_sim_config(&examples().join("simulate/p3-predictive.toml")).expect("example config");
    let trace = generate(TraceKind::Diurnal, 2, 3);
    let r = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
    assert!(r.infinite.instance_hours > 0.0 && r.oracle.instance_hours > r.infinite.instance_hours);
    assert!(r.instance_hours >= r.infinite.instance_hours, "no policy beats infinite instant capacity");
    // The online floor is at the run's own share of waiting jobs, between the job time
    // and whatever holding every rise would cost.
    let waited = r.share_waited;
    assert!((0.0..=1.0).contains(&waited));
    let floor = online_floor(&trace, &quick_cloud(), settings.instance_ready_command.is_some(), 1, waited);
    assert_eq!(r.online_floor, floor);
    assert!(floor.instance_hours >= r.infinite.instance_hours);
    let strict = online_floor(&trace, &quick_cloud(), settings.instance_ready_command.is_some(), 1, 0.0);
    assert!(strict.instance_hours >= floor.instance_hours, "fewer waits never cost less");
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
        let all = shipped.into_iter().chain(extra.split(',').filter(|e| !e.is_empty()).map(std::path::PathBuf::from));
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

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Two entries on the `aws` plugin, one on `gcp`: the first two are simulated together.
const FLEET: &str = r#"concurrent = 50
[[runners]]
  name = "linux"
  [runners.autoscaler]
    plugin = "aws"
    max_instances = 40
    [[runners.autoscaler.policy]]
      idle_count = 2
      idle_time = "10m"
[[runners]]
  name = "gpu"
  [runners.autoscaler]
    plugin = "aws"
    capacity_per_instance = 2
    max_instances = 10
[[runners]]
  name = "elsewhere"
  [runners.autoscaler]
    plugin = "gcp"
"#;

fn routed(trace: &[JobArrival], every: usize) -> Vec<JobArrival> {
    // Every `every`-th job names "gpu", the one after it "linux", the rest name no runner.
    trace
        .iter()
        .enumerate()
        .map(|(i, j)| JobArrival {
            runner: match i % every {
                0 => Some("gpu".into()),
                1 => Some("linux".into()),
                _ => None,
            },
            ..j.clone()
        })
        .collect()
}

#[test]
fn entries_sharing_a_provider_are_read_together() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = read_sim_fleet(&write(dir.path(), "config.toml", FLEET)).expect("reads");
    assert_eq!(fleet.provider, "aws");
    let names: Vec<&str> = fleet.runners.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["linux", "gpu"]);
    assert_eq!(fleet.other_providers, ["elsewhere"]);
    assert_eq!(fleet.runners[1].settings.capacity_per_instance, 2);
    let first = read_sim_config(&write(dir.path(), "config.toml", FLEET)).expect("reads");
    assert_eq!(first.max_instances, 40, "read_sim_config is the first entry");
    let twice = FLEET.replace("name = \"gpu\"", "name = \"linux\"");
    let err = format!("{:#}", read_sim_fleet(&write(dir.path(), "dup.toml", &twice)).expect_err("duplicate"));
    assert!(err.contains("dup.toml") && err.contains("\"linux\""), "{err}");
    let unnamed = "concurrent = 1\n[[runners]]\n[runners.autoscaler]\n[[runners]]\n[runners.autoscaler]\n";
    let fleet = read_sim_fleet(&write(dir.path(), "unnamed.toml", unnamed)).expect("reads");
    let names: Vec<&str> = fleet.runners.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["runner-1", "runner-2"], "no plugin (allowed when simulating) is one provider");
}

#[test]
fn runners_on_one_cloud_each_scale_their_own_jobs_and_add_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = read_sim_fleet(&write(dir.path(), "config.toml", FLEET)).expect("reads");
    let trace = routed(&generate(TraceKind::Diurnal, 2, 7), 4);
    let result = run_fleet(&fleet.runners, &quick_cloud(), &trace).expect("runs");
    assert_eq!(result, run_fleet(&fleet.runners, &quick_cloud(), &trace).expect("runs"), "deterministic");
    let [(linux_name, linux), (gpu_name, gpu)] = &result.runners[..] else { panic!("two runners") };
    assert_eq!((linux_name.as_str(), gpu_name.as_str()), ("linux", "gpu"));
    let t = &result.total;
    assert_eq!(t.jobs_total, trace.len() as u64);
    assert_eq!(linux.jobs_total + gpu.jobs_total, t.jobs_total);
    let named = |n: &str| trace.iter().filter(|j| j.runner.as_deref() == Some(n)).count() as u64;
    assert!(gpu.jobs_total >= named("gpu") && linux.jobs_total >= named("linux"));
    assert!(gpu.jobs_total > named("gpu") && linux.jobs_total > named("linux"), "both take unrouted jobs");
    assert_eq!(t.jobs_started, linux.jobs_started + gpu.jobs_started);
    assert_eq!(t.creations, linux.creations + gpu.creations);
    assert!((t.instance_hours - linux.instance_hours - gpu.instance_hours).abs() < 1e-6);
    assert!((t.oracle.instance_hours - linux.oracle.instance_hours - gpu.oracle.instance_hours).abs() < 1e-6);
    let online = linux.online_floor.instance_hours + gpu.online_floor.instance_hours;
    assert!((t.online_floor.instance_hours - online).abs() < 1e-6);
    assert!(linux.peak_instances <= 40 && gpu.peak_instances <= 10, "each runner's own max_instances");
    assert!(t.peak_instances <= linux.peak_instances + gpu.peak_instances);
    assert!(t.peak_instances >= linux.peak_instances.max(gpu.peak_instances));
    assert_eq!(t.hours.iter().map(|h| h.jobs).sum::<u64>(), t.jobs_started);
    assert!(!t.chart.is_empty());
}

#[test]
fn one_runner_ignores_the_runner_field_of_the_trace() {
    let settings = read_sim_config(&examples().join("simulate/p2-scale-factor.toml")).expect("example config");
    let trace = generate(TraceKind::Bursty, 1, 5);
    let plain = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
    let named = run_simulation(&settings, &quick_cloud(), &routed(&trace, 3)).expect("runs");
    assert_eq!(plain, named);
    let fleet = run_fleet(&[SimRunner { name: "bench".into(), settings }], &quick_cloud(), &trace).expect("runs");
    assert_eq!(fleet.runners.len(), 1);
    assert_eq!(fleet.runners[0].1, plain);
    assert_eq!(fleet.total, plain);
}

#[test]
fn the_quota_of_the_cloud_is_shared_by_its_runners() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = read_sim_fleet(&write(dir.path(), "config.toml", FLEET)).expect("reads");
    let small = SimProviderSettings { max_size: 4, ..quick_cloud() };
    let result = run_fleet(&fleet.runners, &small, &generate(TraceKind::Bursty, 1, 3)).expect("runs");
    assert!(result.total.peak_instances <= 4, "peak {}", result.total.peak_instances);
    assert!(result.total.capacity_refusals > 0);
    assert!(result.total.to_text().contains("quota refusals"), "{}", result.total.to_text());
}

#[test]
fn spot_interruptions_cost_jobs_and_are_reported() {
    let settings = read_sim_config(&examples().join("simulate/p0-static-idle.toml")).expect("example config");
    let trace: Vec<JobArrival> = generate(TraceKind::Diurnal, 2, 5)
        .into_iter()
        .map(|j| JobArrival { duration: j.duration.max(1800.0), ..j })
        .collect();
    let calm = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
    assert_eq!((calm.interruptions, calm.jobs_interrupted), (0, 0));
    assert!(!calm.to_text().contains("spot interruptions"), "nothing to say without them");
    let spot = SimProviderSettings { interruption_rate_per_hour: 0.2, ..quick_cloud() };
    let r = run_simulation(&settings, &spot, &trace).expect("runs");
    assert_eq!(r, run_simulation(&settings, &spot, &trace).expect("runs"), "deterministic from the seed");
    assert!(r.interruptions > 0 && r.jobs_interrupted > 0, "{} {}", r.interruptions, r.jobs_interrupted);
    assert!(r.jobs_interrupted <= r.jobs_failed_instance_lost);
    assert!(r.removals.get("interrupted").is_some_and(|n| *n > 0), "{:?}", r.removals);
    assert!(r.creations > calm.creations, "interrupted instances are replaced");
    assert!(r.to_text().contains("spot interruptions"));
}

#[test]
fn throttled_creations_wait_and_are_reported() {
    let settings = read_sim_config(&examples().join("simulate/p0-static-idle.toml")).expect("example config");
    let trace = generate(TraceKind::Bursty, 1, 8);
    let free = run_simulation(&settings, &quick_cloud(), &trace).expect("runs");
    assert_eq!((free.throttled_requests, free.throttled_wait_s), (0, 0.0));
    let slow = SimProviderSettings { create_rate_per_s: 0.05, create_burst: 2, ..quick_cloud() };
    let r = run_simulation(&settings, &slow, &trace).expect("runs");
    assert!(r.throttled_requests > 0 && r.throttled_wait_s > 0.0);
    assert!(r.wait_p99_s > free.wait_p99_s, "{} vs {}", r.wait_p99_s, free.wait_p99_s);
    assert!(r.to_text().contains("throttled creation requests"));
}

#[test]
fn simulate_command_reports_each_runner_and_the_total() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "config.toml", FLEET);
    let trace_path = dir.path().join("trace.jsonl");
    let mut file = std::fs::File::create(&trace_path).expect("create");
    crate::autoscaler::trace::write_trace(&mut file, &routed(&generate(TraceKind::Diurnal, 1, 2), 3)).expect("write");
    drop(file);
    let svg = dir.path().join("chart.svg");
    let options =
        SimulateOptions { configs: vec![config], trace: trace_path, svg: Some(svg.clone()), ..Default::default() };
    let text = simulate_command(&options).expect("simulates");
    for chart in ["chart.svg", "chart-linux.svg", "chart-gpu.svg"] {
        let svg = std::fs::read_to_string(dir.path().join(chart)).expect("chart written");
        assert!(svg.starts_with("<svg") && svg.contains("<path d=\"M"), "{chart}");
    }
    assert!(std::fs::read_to_string(dir.path().join("chart-gpu.svg")).is_ok_and(|s| s.contains("runner gpu")));
    assert!(text.contains("== runner linux") && text.contains("== runner gpu"), "{text}");
    assert!(text.contains("== total (2 runners on one cloud)") && !text.contains("elsewhere"), "{text}");
    let options = SimulateOptions { svg: None, ..options };
    let json = simulate_command(&SimulateOptions { json: true, ..options.clone() }).expect("json");
    let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let runners = value["runners"].as_array().expect("runners");
    assert_eq!(runners.len(), 2);
    assert_eq!(runners[1]["name"], "gpu");
    let total = value["report"]["jobs_total"].as_u64();
    let sum = runners.iter().map(|r| r["report"]["jobs_total"].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(total, Some(sum));
    let single = SimulateOptions { configs: vec![examples().join("simulate/p0-static-idle.toml")], ..options };
    let json = simulate_command(&SimulateOptions { json: true, ..single }).expect("json");
    let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert!(value.get("runners").is_none(), "one runner: the output is as before");
}

#[test]
fn shipped_examples_of_the_new_keys_load() {
    let spot = read_provider_settings(&examples().join("simulate/aws-spot.toml")).expect("aws-spot.toml");
    assert!(spot.interruption_rate_per_hour > 0.0 && spot.create_rate_per_s > 0.0);
    let cold = read_provider_settings(&examples().join("simulate/linux-cold.toml")).expect("linux-cold.toml");
    assert_eq!(cold, SimProviderSettings { price_per_hour: cold.price_per_hour, ..Default::default() });
    let fleet = read_sim_fleet(&examples().join("simulate/two-runners-one-cloud.toml")).expect("example");
    assert_eq!(fleet.runners.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["linux", "gpu"]);
}
