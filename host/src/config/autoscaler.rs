//! `[runners.autoscaler]` (taskscaler, protocol reference §5.3) and the legacy
//! `[runners.machine]` (docker+machine, §5.4): parsed and validated with GitLab's defaults.
//! A pure model of the file: the engine that acts on these keys, and the mapping onto its
//! settings (`autoscaler::from_config`), live in the autoscaler module, which this module must
//! not import.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::duration::{duration_secs, duration_str};
use crate::config::Invalid;

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

/// `[runners.autoscaler]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AutoscalerConfig {
    /// Fleeting plugin name (a Runway plugin in `plugins_dir`, e.g. `static`, or a reference
    /// to one of GitLab's fleeting plugins, see [`builtin_provider`]); required unless the
    /// file is loaded for [`super::Purpose::Simulate`].
    #[serde(default)]
    pub plugin: String,
    /// Concurrent jobs per instance (job slots).
    #[serde(default = "d_capacity")]
    pub capacity_per_instance: u32,
    /// Jobs per instance before it is removed (0 = unlimited).
    #[serde(default)]
    pub max_use_count: u32,
    /// All instances regardless of state (0 = unlimited).
    #[serde(default)]
    pub max_instances: u32,
    /// Remove idle instances when the manager shuts down.
    #[serde(default)]
    pub delete_instances_on_shutdown: bool,
    /// Command run on each new instance before it takes jobs (empty = none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_ready_command: String,
    /// How long a job waits for a slot.
    #[serde(default = "d_acquire_timeout", with = "duration_str")]
    pub instance_acquire_timeout: Duration,
    /// How often the plugin's `update()` is polled.
    #[serde(default = "d_update_interval", with = "duration_str")]
    pub update_interval: Duration,
    /// Poll interval while a state change is expected.
    #[serde(default = "d_update_expecting", with = "duration_str")]
    pub update_interval_when_expecting: Duration,
    /// Retry a deletion that had no visible effect after this long.
    #[serde(default = "d_deletion_retry", with = "duration_str")]
    pub deletion_retry_interval: Duration,
    /// Interval between deletion rounds on shutdown.
    #[serde(default = "d_shutdown_deletion_interval", with = "duration_str")]
    pub shutdown_deletion_interval: Duration,
    /// Deletion rounds on shutdown before giving up.
    #[serde(default = "d_shutdown_deletion_retries")]
    pub shutdown_deletion_retries: u32,
    /// Consecutive health failures before an instance is replaced.
    #[serde(default = "d_failure_threshold")]
    pub failure_threshold: u32,
    /// Throttle reservations while instances are being created.
    #[serde(default = "d_true")]
    pub reservation_throttling: bool,
    /// Token bucket on instance creation.
    #[serde(default)]
    pub scale_throttle: ScaleThrottle,
    /// Given to the plugin's `init` as JSON.
    #[serde(default)]
    pub plugin_config: toml::Table,
    /// How to connect to instances.
    #[serde(default)]
    pub connector_config: ConnectorConfigToml,
    /// Where and whether fleet state is kept across restarts.
    #[serde(default)]
    pub state_storage: StateStorage,
    /// `[[runners.autoscaler.policy]]`; last matching entry wins. Empty = one default policy.
    #[serde(default, rename = "policy")]
    pub policies: Vec<Policy>,
    /// `[runners.autoscaler.predictive]`: Runway's predictive policy (absent = off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictive: Option<Predictive>,
    /// Histogram buckets (seconds) of the instance timings, as gitlab-runner reads them:
    /// each of the specific lists, else `instance_operation_time_buckets` (not for the life
    /// duration), else [`DEFAULT_OPERATION_BUCKETS`] / [`DEFAULT_LIFE_BUCKETS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_operation_time_buckets: Vec<f64>,
    /// Buckets of the creation time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_creation_time_buckets: Vec<f64>,
    /// Buckets of the time to running.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_is_running_time_buckets: Vec<f64>,
    /// Buckets of the deletion time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_deletion_time_buckets: Vec<f64>,
    /// Buckets of the time to ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_readiness_time_buckets: Vec<f64>,
    /// Buckets of the instance life (not defaulted from `instance_operation_time_buckets`,
    /// as in gitlab-runner).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_life_duration_buckets: Vec<f64>,
    /// Set when this section was derived from a docker+machine runner's `[runners.machine]`
    /// (never read from or written to the file).
    #[serde(skip)]
    pub docker_machine: Option<DockerMachine>,
}

/// What a docker+machine runner's provider needs of `[runners.machine]` besides the policy
/// (derived by `super::docker_machine`, which also reads the flags): the driver, the machine
/// name template (`runner-<short token>-<MachineName>`) and the driver flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DockerMachine {
    /// `MachineDriver`.
    pub driver: String,
    /// `runner-<short token>-<MachineName>`, `%s` where the unique part goes.
    pub name_template: String,
    /// `MachineOptions`, as written.
    pub options: Vec<String>,
}

impl DockerMachine {
    /// The provider's `plugin_config` for manager `manager` (its system id): the machines it
    /// launches are tagged with it, and a restarted manager finds them by it.
    pub fn plugin_config(&self, manager: &str) -> serde_json::Value {
        serde_json::json!({
            "machine": { "name": self.name_template, "manager": manager, "options": self.options }
        })
    }
}

/// Operation-time buckets when none are configured (seconds: a cloud VM's create, boot and
/// delete; fleeting's own defaults are not documented).
pub const DEFAULT_OPERATION_BUCKETS: [f64; 11] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0];
/// Life-duration buckets when none are configured (seconds: a minute to a day).
pub const DEFAULT_LIFE_BUCKETS: [f64; 9] = [60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0];

impl AutoscalerConfig {
    /// gitlab-runner writes the ints and durations of `[runners.autoscaler]` it was not given
    /// as 0 (`register` does, its encoder keeps zero ints and durations), and taskscaler then
    /// uses its defaults: a 0 here means the default too.
    pub fn zero_means_default(&mut self) {
        let zero = |d: &mut Duration, default: Duration| {
            if d.is_zero() {
                *d = default;
            }
        };
        if self.capacity_per_instance == 0 {
            self.capacity_per_instance = d_capacity();
        }
        if self.failure_threshold == 0 {
            self.failure_threshold = d_failure_threshold();
        }
        zero(&mut self.instance_acquire_timeout, d_acquire_timeout());
        zero(&mut self.update_interval, d_update_interval());
        zero(&mut self.update_interval_when_expecting, d_update_expecting());
        zero(&mut self.deletion_retry_interval, d_deletion_retry());
        zero(&mut self.shutdown_deletion_interval, d_shutdown_deletion_interval());
    }
}

default_fn!(d_history_days, u32, 28);
default_fn!(d_headroom_quantile, f64, 0.8);
default_fn!(d_recent_window, Duration, secs(300));
default_fn!(d_keep_alive_quantile, f64, 0.95);
default_fn!(d_max_idle_time, Duration, secs(20 * 60));
default_fn!(d_min_idle_time, Duration, secs(60));
default_fn!(d_slot_length, Duration, secs(300));
default_fn!(d_min_recurrence, u32, 1);

/// `[runners.autoscaler.predictive]` (Runway only): forecast slots from the runner's own
/// history and learn idle keep-alive per hour of week.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Predictive {
    /// Turn the predictive policy on.
    #[serde(default)]
    pub enabled: bool,
    /// Days of history kept.
    #[serde(default = "d_history_days")]
    pub history_days: u32,
    /// Quantile of past days' demand provisioned ahead (0–1).
    #[serde(default = "d_headroom_quantile")]
    pub headroom_quantile: f64,
    /// Request → first job time of an instance; unset = learned.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "duration_opt")]
    pub lead_time: Option<Duration>,
    /// Window of the current arrival rate.
    #[serde(default = "d_recent_window", with = "duration_str")]
    pub recent_window: Duration,
    /// Quantile of an hour's arrival gaps idle instances are kept for (0–1).
    #[serde(default = "d_keep_alive_quantile")]
    pub keep_alive_quantile: f64,
    /// Longest learned keep-alive.
    #[serde(default = "d_max_idle_time", with = "duration_str")]
    pub max_idle_time: Duration,
    /// Shortest learned keep-alive.
    #[serde(default = "d_min_idle_time", with = "duration_str")]
    pub min_idle_time: Duration,
    /// Width of a forecast slot (the granularity of the learned day profile).
    #[serde(default = "d_slot_length", with = "duration_str")]
    pub slot_length: Duration,
    /// Past days a slot's rise must have been seen on before it is provisioned ahead.
    #[serde(default = "d_min_recurrence")]
    pub min_recurrence: u32,
    /// Scale-down to the forecast level: idle instances beyond the rise forecast within this
    /// horizon leave at once; unset = off (keep-alive timers only).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "duration_opt")]
    pub release_horizon: Option<Duration>,
}

mod duration_opt {
    //! An optional duration string.
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => crate::config::duration::duration_str::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "crate::config::duration::duration_str")] Duration);
        Ok(Some(Wrapped::deserialize(d)?.0))
    }
}

/// Where gitlab-runner (`gitlab-runner fleeting install`) finds GitLab's own fleeting plugins
/// when `plugin` names no registry.
const GITLAB_PLUGIN_NAMESPACES: [&str; 4] =
    ["", "gitlab", "gitlab-org/fleeting/plugins", "registry.gitlab.com/gitlab-org/fleeting/plugins"];

/// The built-in Runway provider a gitlab-runner `plugin` reference names, when it names one of
/// GitLab's own fleeting plugins: `aws`, `fleeting-plugin-aws`, `gitlab/fleeting-plugin-aws`,
/// `aws:latest`, `registry.gitlab.com/gitlab-org/fleeting/plugins/aws:1.0.0` (a tag or digest
/// is left aside) → `aws`; the same for `googlecloud` (or `googlecompute`, the binary's older
/// name) → `googlecompute` and `azure` → `azure`. `None` for anything else (a plugin of
/// another registry, a Runway plugin such as `static`).
pub fn builtin_provider(reference: &str) -> Option<&'static str> {
    let reference = reference.trim();
    let reference = reference.split_once('@').map_or(reference, |(name, _digest)| name);
    let (namespace, last) = reference.rsplit_once('/').unwrap_or(("", reference));
    let name = last.split_once(':').map_or(last, |(name, _tag)| name);
    if !GITLAB_PLUGIN_NAMESPACES.contains(&namespace) {
        return None;
    }
    match name.strip_prefix("fleeting-plugin-").unwrap_or(name) {
        "aws" => Some("aws"),
        "googlecloud" | "googlecompute" => Some("googlecompute"),
        "azure" => Some("azure"),
        _ => None,
    }
}

impl AutoscalerConfig {
    /// The provider plugin Runway starts for `plugin`: its built-in one when `plugin` names
    /// one of GitLab's fleeting plugins ([`builtin_provider`]), else `plugin` as written.
    pub fn provider(&self) -> &str {
        builtin_provider(&self.plugin).unwrap_or(&self.plugin)
    }

    /// `plugin_config` as the JSON the plugin's `init` receives from manager `manager` (its
    /// system id; a docker+machine provider tags its machines with it).
    pub fn plugin_config_json(&self, manager: &str) -> String {
        let value = match &self.docker_machine {
            Some(dm) => dm.plugin_config(manager),
            None => serde_json::to_value(&self.plugin_config).unwrap_or_default(),
        };
        serde_json::to_string(&value).unwrap_or_else(|_| "{}".into())
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
    /// Instance OS (`linux`, `windows`, `darwin`) when the plugin does not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os: String,
    /// Instance architecture (`amd64`, `arm64`) when the plugin does not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arch: String,
    /// `ssh`, `winrm`, `winrm+https`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// 0 = the protocol's default (ssh 22, winrm 5985, winrm+https 5986).
    #[serde(default)]
    pub protocol_port: u16,
    /// User to connect as.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// Password (WinRM, or SSH password authentication).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    /// Private key file for SSH.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_path: Option<PathBuf>,
    /// Use these credentials instead of the ones the plugin provides.
    #[serde(default)]
    pub use_static_credentials: bool,
    /// SSH keepalive interval (duration string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<String>,
    /// Connection timeout (duration string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Connect to the instance's external address rather than its internal one.
    #[serde(default)]
    pub use_external_addr: bool,
}

/// `[runners.autoscaler.state_storage]`. Unlike GitLab (default off), Runway keeps state by
/// default, so a restart adopts the fleet instead of deleting it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StateStorage {
    /// Keep fleet state across restarts (Runway default: on).
    #[serde(default = "d_true")]
    pub enabled: bool,
    /// Default `<config dir>/.taskscaler`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// On restart, keep instances that had jobs when the manager stopped.
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
    /// IANA timezone of `periods`; unset = the manager's local time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Idle capacity to keep, in job slots.
    #[serde(default)]
    pub idle_count: u32,
    /// How long an instance may stay idle.
    #[serde(default, with = "duration_str")]
    pub idle_time: Duration,
    /// Extra idle slots as a factor of in-use slots.
    #[serde(default)]
    pub scale_factor: f64,
    /// Cap on the idle target from `scale_factor` (0 = no cap).
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
    /// Idle machines as a factor of machines in use, capped by `IdleCount`.
    #[serde(default)]
    pub idle_scale_factor: f64,
    /// How long an idle machine lives (seconds, or a duration string like `"30m"`).
    #[serde(default, with = "duration_secs")]
    pub idle_time: Duration,
    /// Machines in creation at once (0 = unlimited).
    #[serde(default)]
    pub max_growth_rate: u32,
    /// Jobs per machine (0 = unlimited).
    #[serde(default)]
    pub max_builds: u32,
    /// Docker Machine driver (kept, not used).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine_driver: String,
    /// Docker Machine name template (kept, not used).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine_name: String,
    /// Docker Machine driver options (kept, not used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_options: Vec<String>,
    /// Removal attempts before a machine is given up (kept, not used).
    #[serde(default)]
    pub max_removal_attempts: u32,
    /// `[[runners.machine.autoscaling]]` periods; the last matching entry wins.
    #[serde(default, rename = "autoscaling", skip_serializing_if = "Vec::is_empty")]
    pub autoscaling: Vec<MachineAutoscaling>,
    /// Anything else GitLab accepts here (kept, not used).
    #[serde(flatten)]
    pub other: BTreeMap<String, toml::Value>,
}

/// `[[runners.machine.autoscaling]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct MachineAutoscaling {
    /// 7-field cron expressions (seconds, ..., year).
    #[serde(default)]
    pub periods: Vec<String>,
    /// IANA timezone of `Periods`; empty = local time.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
    /// Idle machines to keep in this period.
    #[serde(default)]
    pub idle_count: u32,
    /// Lower bound of idle machines when `IdleScaleFactor` is set.
    #[serde(default)]
    pub idle_count_min: u32,
    /// Idle machines as a factor of machines in use, capped by `IdleCount`.
    #[serde(default)]
    pub idle_scale_factor: f64,
    /// Idle machine lifetime in this period (seconds, or a duration string).
    #[serde(default, with = "duration_secs")]
    pub idle_time: Duration,
}

/// Check cron periods have the right number of fields (`expected` = 5 for taskscaler
/// policies, 7 for docker+machine). Only the shape: the autoscaler parses the fields.
pub(super) fn check_periods(periods: &[String], expected: usize) -> Result<(), Invalid> {
    for period in periods {
        let fields = period.split_whitespace().count();
        if fields != expected {
            return Err(Invalid(format!("period {period:?} has {fields} fields, expected {expected}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::builtin_provider;

    #[test]
    fn gitlabs_fleeting_plugins_select_the_builtin_providers() {
        for (reference, provider) in [
            ("aws", "aws"),
            ("aws:latest", "aws"),
            ("fleeting-plugin-aws", "aws"),
            ("gitlab/fleeting-plugin-aws", "aws"),
            ("registry.gitlab.com/gitlab-org/fleeting/plugins/aws:latest", "aws"),
            ("registry.gitlab.com/gitlab-org/fleeting/plugins/aws@sha256:0123abcd", "aws"),
            ("googlecloud", "googlecompute"),
            ("googlecloud:latest", "googlecompute"),
            ("fleeting-plugin-googlecompute", "googlecompute"),
            ("fleeting-plugin-googlecloud", "googlecompute"),
            ("gitlab/fleeting-plugin-googlecloud:1.0.0", "googlecompute"),
            ("registry.gitlab.com/gitlab-org/fleeting/plugins/googlecloud:0.3.0", "googlecompute"),
            ("azure", "azure"),
            ("azure:latest", "azure"),
            ("fleeting-plugin-azure", "azure"),
            ("gitlab/fleeting-plugin-azure", "azure"),
            ("registry.gitlab.com/gitlab-org/fleeting/plugins/azure:1", "azure"),
        ] {
            assert_eq!(builtin_provider(reference), Some(provider), "{reference}");
        }
        for unknown in [
            "static",
            "my-plugin",
            "example.com/team/aws:1",
            "someone/fleeting-plugin-aws",
            "fleeting-plugin-vsphere",
            "",
        ] {
            assert_eq!(builtin_provider(unknown), None, "{unknown}");
        }
    }
}
