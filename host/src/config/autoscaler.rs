//! `[runners.autoscaler]` (taskscaler, protocol reference §5.3) and the legacy
//! `[runners.machine]` (docker+machine, §5.4): parsed and validated with GitLab's defaults.
//! The engine that acts on them lives in the autoscaler module; [`AutoscalerConfig::settings`]
//! maps these keys onto its settings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::autoscaler::settings::{
    AutoscalerSettings, IdlePolicy, LegacyMachineSettings, LegacyPeriod, ScaleThrottle as EngineThrottle,
};
use crate::config::duration::duration_str;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

macro_rules! default_fn {
    ($name:ident, $ty:ty, $value:expr) => {
        fn $name() -> $ty {
            $value
        }
    };
}

default_fn!(d_capacity, u32, 1);
default_fn!(d_acquire_timeout, Duration, secs(15 * 60));
default_fn!(d_update_interval, Duration, secs(60));
default_fn!(d_update_expecting, Duration, secs(2));
default_fn!(d_deletion_retry, Duration, secs(60));
default_fn!(d_shutdown_deletion_interval, Duration, secs(10));
default_fn!(d_shutdown_deletion_retries, u32, 3);
default_fn!(d_failure_threshold, u32, 3);
default_fn!(d_true, bool, true);
default_fn!(d_periods, Vec<String>, vec!["* * * * *".to_string()]);

mod dur {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}s", d.as_secs()))
    }
}

/// `[runners.autoscaler]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AutoscalerConfig {
    /// Fleeting plugin name (a Runway plugin in `plugins_dir`, e.g. `static`).
    pub plugin: String,
    #[serde(default = "d_capacity")]
    pub capacity_per_instance: u32,
    /// Jobs per instance before it is removed (0 = unlimited).
    #[serde(default)]
    pub max_use_count: u32,
    /// All instances regardless of state (0 = unlimited).
    #[serde(default)]
    pub max_instances: u32,
    #[serde(default)]
    pub delete_instances_on_shutdown: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_ready_command: String,
    #[serde(
        default = "d_acquire_timeout",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "dur::serialize"
    )]
    pub instance_acquire_timeout: Duration,
    #[serde(
        default = "d_update_interval",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "dur::serialize"
    )]
    pub update_interval: Duration,
    #[serde(
        default = "d_update_expecting",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "dur::serialize"
    )]
    pub update_interval_when_expecting: Duration,
    #[serde(
        default = "d_deletion_retry",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "dur::serialize"
    )]
    pub deletion_retry_interval: Duration,
    #[serde(
        default = "d_shutdown_deletion_interval",
        deserialize_with = "duration_str::deserialize",
        serialize_with = "dur::serialize"
    )]
    pub shutdown_deletion_interval: Duration,
    #[serde(default = "d_shutdown_deletion_retries")]
    pub shutdown_deletion_retries: u32,
    /// Consecutive health failures before an instance is replaced.
    #[serde(default = "d_failure_threshold")]
    pub failure_threshold: u32,
    #[serde(default = "d_true")]
    pub reservation_throttling: bool,
    #[serde(default)]
    pub scale_throttle: ScaleThrottle,
    /// Given to the plugin's `init` as JSON.
    #[serde(default)]
    pub plugin_config: toml::Table,
    #[serde(default)]
    pub connector_config: ConnectorConfigToml,
    #[serde(default)]
    pub state_storage: StateStorage,
    /// `[[runners.autoscaler.policy]]`; last matching entry wins. Empty = one default policy.
    #[serde(default, rename = "policy")]
    pub policies: Vec<Policy>,
}

impl AutoscalerConfig {
    /// The engine's settings. With a `[runners.machine]` section the legacy Docker Machine
    /// semantics apply (idle counts in machines, `MaxGrowthRate`, `MaxBuilds`, the runner's
    /// `limit` as the machine limit); the taskscaler keys here still give the timings.
    pub fn settings(&self, machine: Option<&MachineConfig>, runner_limit: usize) -> AutoscalerSettings {
        let throttle = &self.scale_throttle;
        AutoscalerSettings {
            capacity_per_instance: self.capacity_per_instance,
            max_use_count: self.max_use_count,
            max_instances: self.max_instances,
            policies: self
                .policies
                .iter()
                .map(|p| IdlePolicy {
                    periods: p.periods.clone(),
                    timezone: p.timezone.clone(),
                    idle_count: p.idle_count,
                    idle_time: p.idle_time,
                    scale_factor: p.scale_factor,
                    scale_factor_limit: p.scale_factor_limit,
                    preemptive_mode: p.preemptive_mode,
                })
                .collect(),
            scale_throttle: EngineThrottle { limit: throttle.limit as f64, burst: throttle.burst },
            failure_threshold: self.failure_threshold,
            instance_acquire_timeout: self.instance_acquire_timeout,
            update_interval: self.update_interval,
            update_interval_when_expecting: self.update_interval_when_expecting,
            deletion_retry_interval: self.deletion_retry_interval,
            instance_ready_command: Some(self.instance_ready_command.clone()).filter(|c| !c.trim().is_empty()),
            keep_instance_with_acquisitions: self.state_storage.keep_instance_with_acquisitions,
            delete_instances_on_shutdown: self.delete_instances_on_shutdown,
            legacy: machine.map(|m| m.legacy_settings(runner_limit)),
            ..AutoscalerSettings::default()
        }
    }

    /// `plugin_config` as the JSON the plugin's `init` receives.
    pub fn plugin_config_json(&self) -> String {
        serde_json::to_string(&self.plugin_config).unwrap_or_else(|_| "{}".into())
    }
}

/// `[runners.autoscaler.scale_throttle]`: token bucket on instance creation.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScaleThrottle {
    /// Instances per second (0 → 100/s, -1 = unlimited).
    #[serde(default)]
    pub limit: i64,
    /// Bucket size (0 → max_instances).
    #[serde(default)]
    pub burst: u32,
}

/// `[runners.autoscaler.connector_config]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectorConfigToml {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arch: String,
    /// `ssh`, `winrm`, `winrm+https`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// 0 = the protocol's default (ssh 22, winrm 5985, winrm+https 5986).
    #[serde(default)]
    pub protocol_port: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_path: Option<PathBuf>,
    #[serde(default)]
    pub use_static_credentials: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default)]
    pub use_external_addr: bool,
}

/// `[runners.autoscaler.state_storage]`. Unlike GitLab (default off), Runway keeps state by
/// default, so a restart adopts the fleet instead of deleting it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StateStorage {
    #[serde(default = "d_true")]
    pub enabled: bool,
    /// Default `<config dir>/.taskscaler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    #[serde(default)]
    pub keep_instance_with_acquisitions: bool,
}

impl Default for StateStorage {
    fn default() -> Self {
        StateStorage { enabled: true, dir: None, keep_instance_with_acquisitions: false }
    }
}

/// `[[runners.autoscaler.policy]]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Policy {
    /// 5-field cron expressions describing when the policy applies.
    #[serde(default = "d_periods")]
    pub periods: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Idle capacity to keep, in job slots.
    #[serde(default)]
    pub idle_count: u32,
    #[serde(default, deserialize_with = "duration_str::deserialize", serialize_with = "dur::serialize")]
    pub idle_time: Duration,
    #[serde(default)]
    pub scale_factor: f64,
    #[serde(default)]
    pub scale_factor_limit: u32,
    /// Default: `idle_count > 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptive_mode: Option<bool>,
}

impl Policy {
    /// Preemptive mode as GitLab defaults it.
    pub fn preemptive(&self) -> bool {
        self.preemptive_mode.unwrap_or(self.idle_count > 0)
    }
}

/// Legacy `[runners.machine]` (docker+machine keys, CamelCase as GitLab writes them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct MachineConfig {
    /// Idle machines to keep (machines, not slots); 0 = on-demand.
    #[serde(default)]
    pub idle_count: u32,
    /// Lower bound of idle machines when IdleScaleFactor is set (effective minimum 1).
    #[serde(default)]
    pub idle_count_min: u32,
    #[serde(default)]
    pub idle_scale_factor: f64,
    /// Seconds an idle machine lives.
    #[serde(default)]
    pub idle_time: u64,
    /// Machines in creation at once (0 = unlimited).
    #[serde(default)]
    pub max_growth_rate: u32,
    /// Jobs per machine (0 = unlimited).
    #[serde(default)]
    pub max_builds: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine_driver: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_options: Vec<String>,
    #[serde(default)]
    pub max_removal_attempts: u32,
    #[serde(default, rename = "autoscaling", skip_serializing_if = "Vec::is_empty")]
    pub autoscaling: Vec<MachineAutoscaling>,
    /// Anything else GitLab accepts here (kept, not used).
    #[serde(flatten)]
    pub other: BTreeMap<String, toml::Value>,
}

impl MachineConfig {
    /// The engine's legacy settings; `runner_limit` is the runner's `limit` (machines in all
    /// states, 0 = unlimited).
    pub fn legacy_settings(&self, runner_limit: usize) -> LegacyMachineSettings {
        LegacyMachineSettings {
            idle_count: self.idle_count,
            idle_count_min: self.idle_count_min,
            idle_scale_factor: self.idle_scale_factor,
            idle_time: secs(self.idle_time),
            max_growth_rate: self.max_growth_rate,
            max_builds: self.max_builds,
            limit: u32::try_from(runner_limit).unwrap_or(u32::MAX),
            autoscaling: self
                .autoscaling
                .iter()
                .map(|a| LegacyPeriod {
                    periods: a.periods.clone(),
                    timezone: Some(a.timezone.clone()).filter(|t| !t.is_empty()),
                    idle_count: a.idle_count,
                    idle_count_min: a.idle_count_min,
                    idle_scale_factor: a.idle_scale_factor,
                    idle_time: secs(a.idle_time),
                })
                .collect(),
        }
    }
}

/// `[[runners.machine.autoscaling]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct MachineAutoscaling {
    /// 7-field cron expressions (seconds, ..., year).
    #[serde(default)]
    pub periods: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
    #[serde(default)]
    pub idle_count: u32,
    #[serde(default)]
    pub idle_count_min: u32,
    #[serde(default)]
    pub idle_scale_factor: f64,
    #[serde(default)]
    pub idle_time: u64,
}

/// Check cron periods have the right number of fields (`expected` = 5 for taskscaler
/// policies, 7 for docker+machine).
pub fn check_periods(periods: &[String], expected: usize) -> Result<(), String> {
    for period in periods {
        let fields = period.split_whitespace().count();
        if fields != expected {
            return Err(format!("period {period:?} has {fields} fields, expected {expected}"));
        }
    }
    Ok(())
}
