//! `runway simulate`: replay a job trace against the real [`Taskscaler`](super::engine::Taskscaler)
//! on a virtual clock, with the seeded [`SimProvider`](super::provider::SimProvider) as the
//! cloud and a simulated GitLab queue. Every `[[runners]]` entry of the config that shares the
//! first autoscaled entry's provider is simulated together (see [`read_sim_fleet`]), each with
//! its own engine and policy, against one cloud. Reports queue-wait percentiles,
//! instance-hours, idle share, churn, failures, spot interruptions and throttling, per runner
//! and in total, and draws an SVG of queued jobs and instances over time.
//!
//! The config is config.toml read by the one reader (`config::load_for`) and mapped by the one
//! mapping (`from_config`); see [`read_sim_fleet`] for the simulator's deliberate differences.
//! The loop lives in `replay`, the report and its chart in `report` and `chart`, the floors in
//! `oracle` and `online_floor`; unit tests in `tests.rs`. Must not parse config.toml itself.

mod chart;
mod online_floor;
mod oracle;
mod replay;
mod report;

use std::path::Path;

use anyhow::Context;

use super::from_config::{self, Mapping};
use super::provider::SimProviderSettings;
use super::settings::AutoscalerSettings;
use super::trace::read_trace;
use crate::config::{self, Purpose, RunnerConfig};
pub use online_floor::online_floor;
pub use oracle::{combine, infinite, oracle, Baseline};
pub use replay::{run_fleet, run_simulation, FleetReport, SimRunner};
pub use report::{ChartPoint, HourRow, SimReport, Summary};

/// The `[[runners]]` entries `runway simulate` replays together.
#[derive(Clone, Debug)]
pub struct SimFleet {
    /// What they share: the fleeting `plugin` of `[runners.autoscaler]` (`docker-machine/<driver>`
    /// for a `[runners.machine]`-only entry; empty when the config leaves it out).
    pub provider: String,
    /// The entries, in config order.
    pub runners: Vec<SimRunner>,
    /// Autoscaled entries left out because they use another provider (their names).
    pub other_providers: Vec<String>,
}

/// The provider an autoscaled entry uses: its cloud account, whose quota and rate limits the
/// entries using it share (each entry still scales its own instance group, as GitLab requires).
fn provider_of(runner: &RunnerConfig) -> String {
    match (&runner.autoscaler, &runner.machine) {
        (Some(a), _) => a.provider().to_string(),
        (None, Some(m)) => format!("docker-machine/{}", m.machine_driver),
        (None, None) => String::new(),
    }
}

/// Read the fleets `runway simulate` replays from a config.toml.
///
/// The file loads through [`config::load_for`] like `runway run`'s (same errors, naming file,
/// line and key, and the same warnings, logged), for [`Purpose::Simulate`]: the keys that
/// connect to GitLab or a cloud (`url`, `token`, `executor`, the fleeting `plugin`) may be left
/// out. Every `[[runners]]` entry with `[runners.autoscaler]` or `[runners.machine]` whose
/// provider (the fleeting `plugin`; for docker+machine, `MachineDriver`) is the first such
/// entry's is mapped by [`from_config::runner_settings`] with [`Mapping::SIMULATE`] (an unset
/// policy timezone is UTC, the virtual clock's zone), then compiled. Entries on another
/// provider are left out with a warning. Entries without a `name` are called `runner-<n>`
/// (their position in the file, from 1); names must be unique, as trace entries route by them.
pub fn read_sim_fleet(path: &Path) -> anyhow::Result<SimFleet> {
    let loaded = config::load_for(path, Purpose::Simulate)?;
    for warning in &loaded.warnings {
        tracing::warn!("{warning}");
    }
    let mut fleet: Option<SimFleet> = None;
    for (n, runner) in loaded.config.runners.iter().enumerate() {
        let Some(settings) = from_config::runner_settings(runner, Mapping::SIMULATE) else { continue };
        let name = if runner.name.is_empty() { format!("runner-{}", n + 1) } else { runner.name.clone() };
        let provider = provider_of(runner);
        let fleet = fleet.get_or_insert_with(|| SimFleet {
            provider: provider.clone(),
            runners: Vec::new(),
            other_providers: Vec::new(),
        });
        if provider != fleet.provider {
            tracing::warn!(
                "{}: [[runners]] {name:?} uses provider {provider:?}, not {:?}: not simulated with the others",
                path.display(),
                fleet.provider
            );
            fleet.other_providers.push(name);
            continue;
        }
        anyhow::ensure!(
            !fleet.runners.iter().any(|r| r.name == name),
            "{}: two [[runners]] entries are named {name:?}: the simulator routes jobs by name",
            path.display()
        );
        settings
            .compile()
            .map_err(|e| anyhow::anyhow!("{}: [[runners]] {name:?}: [runners.autoscaler] {e}", path.display()))?;
        fleet.runners.push(SimRunner { name, settings });
    }
    fleet.with_context(|| {
        format!("{}: no [[runners]] entry has a [runners.autoscaler] or [runners.machine] section", path.display())
    })
}

/// The fleet settings of the first autoscaled `[[runners]]` entry of a config.toml (see
/// [`read_sim_fleet`], which reads every entry that shares its provider).
pub fn read_sim_config(path: &Path) -> anyhow::Result<AutoscalerSettings> {
    let fleet = read_sim_fleet(path)?;
    fleet.runners.into_iter().next().map(|r| r.settings).with_context(|| format!("{}: no runner", path.display()))
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
    /// Write the chart here (with several configs, `<stem>-<config stem>.svg` beside it; with
    /// several runners, one more per runner: `<chart stem>-<runner>.svg`).
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
        let fleet = read_sim_fleet(config)?;
        let result = run_fleet(&fleet.runners, &provider, &trace)?;
        if let Some(svg) = &options.svg {
            let path = if options.configs.len() == 1 {
                svg.clone()
            } else {
                svg.with_file_name(format!("{}-{}.svg", stem(svg), stem(config)))
            };
            let title = format!("{} on {}", stem(config), stem(&options.trace));
            std::fs::write(&path, result.total.to_svg(&title))
                .with_context(|| format!("cannot write {}", path.display()))?;
            if result.runners.len() > 1 {
                // One more chart per runner beside the total's: `<stem>-<runner>.svg`.
                for (name, r) in &result.runners {
                    let file: String =
                        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
                    let one = path.with_file_name(format!("{}-{file}.svg", stem(&path)));
                    let title = format!("{} (runner {name}) on {}", stem(config), stem(&options.trace));
                    std::fs::write(&one, r.to_svg(&title))
                        .with_context(|| format!("cannot write {}", one.display()))?;
                }
            }
        }
        runs.push((config.clone(), result));
    }
    if options.json {
        let entries: Vec<serde_json::Value> = runs
            .iter()
            .map(|(config, fleet)| {
                let r = &fleet.total;
                let mut entry = serde_json::json!({
                    "config": config.display().to_string(),
                    "trace": options.trace.display().to_string(),
                    "summary": r.summary(),
                    "oracle": r.oracle,
                    "infinite": r.infinite,
                    "online_floor": r.online_floor,
                    "hours": r.hours,
                    "report": r,
                });
                if fleet.runners.len() > 1 {
                    entry["runners"] = fleet
                        .runners
                        .iter()
                        .map(|(name, r)| serde_json::json!({ "name": name, "summary": r.summary(), "report": r }))
                        .collect();
                }
                entry
            })
            .collect();
        let value = if entries.len() == 1 { entries[0].clone() } else { serde_json::Value::Array(entries) };
        return Ok(serde_json::to_string_pretty(&value)? + "\n");
    }
    if runs.len() == 1 {
        let (_, fleet) = &runs[0];
        let mut text = String::new();
        if fleet.runners.len() > 1 {
            for (name, r) in &fleet.runners {
                text.push_str(&format!("== runner {name}\n"));
                text.push_str(&r.to_text());
                text.push('\n');
            }
            text.push_str(&format!("== total ({} runners on one cloud)\n", fleet.runners.len()));
        }
        text.push_str(&fleet.total.to_text());
        if options.per_hour {
            text.push_str(&fleet.total.hours_text());
        }
        return Ok(text);
    }
    Ok(report::compare_text(&runs.iter().map(|(c, f)| (stem(c), &f.total)).collect::<Vec<_>>()))
}

#[cfg(test)]
mod tests;
