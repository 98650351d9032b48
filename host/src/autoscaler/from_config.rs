//! The one mapping from config.toml's fleet keys (`[runners.autoscaler]`, the legacy
//! `[runners.machine]` and the runner's `limit`, modelled in `config::autoscaler`) onto the
//! engine's [`AutoscalerSettings`]. `runway run` and `runway simulate` both map through here;
//! where they deliberately differ, the difference is a parameter ([`Mapping`]).
//!
//! Owns the mapping only: reading and validating the file is `config`'s business, validating
//! the settings is [`AutoscalerSettings::compile`]'s. Must not read files or touch the engine.

use crate::config::autoscaler::{AutoscalerConfig, MachineConfig};
use crate::config::RunnerConfig;

use super::predictive::PredictiveSettings;
use super::settings::{AutoscalerSettings, IdlePolicy, LegacyMachineSettings, LegacyPeriod, ScaleThrottle};

/// What an idle policy without a `timezone` (or a `[[runners.machine.autoscaling]]` entry
/// without a `Timezone`) means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnsetTimezone {
    /// The manager's local time: GitLab's meaning, used by `runway run`.
    #[default]
    Local,
    /// UTC: used by `runway simulate`, whose virtual clock has no meaningful local time and
    /// whose report must not depend on the machine it runs on.
    Utc,
}

/// The parameters of the mapping: the deliberate differences between its callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Mapping {
    /// How an unset policy timezone is read.
    pub unset_timezone: UnsetTimezone,
}

impl Mapping {
    /// `runway run`: GitLab's semantics throughout.
    pub const RUN: Mapping = Mapping { unset_timezone: UnsetTimezone::Local };
    /// `runway simulate`: unset timezones are UTC (the virtual clock's zone).
    pub const SIMULATE: Mapping = Mapping { unset_timezone: UnsetTimezone::Utc };

    fn timezone(&self, configured: Option<&str>) -> Option<String> {
        match (configured.filter(|t| !t.is_empty()), self.unset_timezone) {
            (Some(zone), _) => Some(zone.to_string()),
            (None, UnsetTimezone::Local) => None,
            (None, UnsetTimezone::Utc) => Some("UTC".into()),
        }
    }
}

/// The engine's settings for a runner's fleet: its `[runners.autoscaler]` section (with the
/// legacy semantics when `[runners.machine]` is also present), else its `[runners.machine]`
/// section alone on the engine's default timings. `None` when the runner has neither.
pub fn runner_settings(runner: &RunnerConfig, mapping: Mapping) -> Option<AutoscalerSettings> {
    match (&runner.autoscaler, &runner.machine) {
        (Some(config), machine) => Some(settings(config, machine.as_ref(), runner.limit, mapping)),
        (None, Some(machine)) => Some(AutoscalerSettings::legacy(legacy_settings(machine, runner.limit, mapping))),
        (None, None) => None,
    }
}

/// The engine's settings for `[runners.autoscaler]`. With a `[runners.machine]` section the
/// legacy Docker Machine semantics apply (idle counts in machines, `MaxGrowthRate`,
/// `MaxBuilds`, the runner's `limit` as the machine limit); the taskscaler keys still give the
/// timings.
pub fn settings(
    config: &AutoscalerConfig,
    machine: Option<&MachineConfig>,
    runner_limit: usize,
    mapping: Mapping,
) -> AutoscalerSettings {
    let throttle = &config.scale_throttle;
    AutoscalerSettings {
        capacity_per_instance: config.capacity_per_instance,
        max_use_count: config.max_use_count,
        max_instances: config.max_instances,
        policies: config
            .policies
            .iter()
            .map(|p| IdlePolicy {
                periods: p.periods.clone(),
                timezone: mapping.timezone(p.timezone.as_deref()),
                idle_count: p.idle_count,
                idle_time: p.idle_time,
                scale_factor: p.scale_factor,
                scale_factor_limit: p.scale_factor_limit,
                preemptive_mode: p.preemptive_mode,
            })
            .collect(),
        scale_throttle: ScaleThrottle { limit: throttle.limit as f64, burst: throttle.burst },
        failure_threshold: config.failure_threshold,
        instance_acquire_timeout: config.instance_acquire_timeout,
        update_interval: config.update_interval,
        update_interval_when_expecting: config.update_interval_when_expecting,
        deletion_retry_interval: config.deletion_retry_interval,
        instance_ready_command: Some(config.instance_ready_command.clone()).filter(|c| !c.trim().is_empty()),
        keep_instance_with_acquisitions: config.state_storage.keep_instance_with_acquisitions,
        delete_instances_on_shutdown: config.delete_instances_on_shutdown,
        legacy: machine.map(|m| legacy_settings(m, runner_limit, mapping)),
        predictive: config.predictive.as_ref().filter(|p| p.enabled).map(|p| PredictiveSettings {
            history_days: p.history_days,
            headroom_quantile: p.headroom_quantile,
            lead_time: p.lead_time,
            recent_window: p.recent_window,
            keep_alive_quantile: p.keep_alive_quantile,
            max_idle_time: p.max_idle_time,
            min_idle_time: p.min_idle_time,
            slot_length: p.slot_length,
            min_recurrence: p.min_recurrence,
            release_horizon: p.release_horizon,
        }),
        ..AutoscalerSettings::default()
    }
}

/// The engine's legacy settings for `[runners.machine]`; `runner_limit` is the runner's
/// `limit` (machines in all states, 0 = unlimited).
pub fn legacy_settings(machine: &MachineConfig, runner_limit: usize, mapping: Mapping) -> LegacyMachineSettings {
    LegacyMachineSettings {
        idle_count: machine.idle_count,
        idle_count_min: machine.idle_count_min,
        idle_scale_factor: machine.idle_scale_factor,
        idle_time: machine.idle_time,
        max_growth_rate: machine.max_growth_rate,
        max_builds: machine.max_builds,
        limit: u32::try_from(runner_limit).unwrap_or(u32::MAX),
        autoscaling: machine
            .autoscaling
            .iter()
            .map(|a| LegacyPeriod {
                periods: a.periods.clone(),
                timezone: mapping.timezone(Some(&a.timezone)),
                idle_count: a.idle_count,
                idle_count_min: a.idle_count_min,
                idle_scale_factor: a.idle_scale_factor,
                idle_time: a.idle_time,
            })
            .collect(),
    }
}
