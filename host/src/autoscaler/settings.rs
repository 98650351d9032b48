//! Plain settings for the autoscaler engine: the taskscaler keys of `[runners.autoscaler]` and
//! `[[runners.autoscaler.policy]]`, and the legacy Docker Machine keys of `[runners.machine]`.
//! These are the engine's own types; config.toml parsing maps onto them elsewhere. Compiling
//! settings ([`AutoscalerSettings::compile`]) validates them and parses cron periods and
//! timezones once, so the engine never fails at run time on bad settings.

use std::time::Duration;

use super::clock::Moment;
use super::cron::{CronDialect, CronError, CronPeriod, PolicyZone};
use super::predictive::PredictiveSettings;

/// Settings the engine cannot run with; the message names the offending key
/// (`policy[0].periods: ...`, `capacity_per_instance must be at least 1`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

/// One `[[runners.autoscaler.policy]]` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct IdlePolicy {
    /// 5-field cron expressions describing when the policy applies (default `* * * * *`).
    pub periods: Vec<String>,
    /// IANA timezone; `None` = the manager's local time.
    pub timezone: Option<String>,
    /// Idle job slots to keep.
    pub idle_count: u32,
    /// How long an instance may stay idle (since its last job, or since it became ready).
    pub idle_time: Duration,
    /// Extra idle slots as a factor of in-use slots.
    pub scale_factor: f64,
    /// Cap on the idle target from `scale_factor` (0 = no cap).
    pub scale_factor_limit: u32,
    /// Only reserve when an idle slot on a ready instance exists; `None` = `idle_count > 0`.
    pub preemptive_mode: Option<bool>,
}

impl Default for IdlePolicy {
    fn default() -> Self {
        IdlePolicy {
            periods: vec!["* * * * *".into()],
            timezone: None,
            idle_count: 0,
            idle_time: Duration::ZERO,
            scale_factor: 0.0,
            scale_factor_limit: 0,
            preemptive_mode: None,
        }
    }
}

/// `[runners.autoscaler.scale_throttle]`: a token bucket on instance creation.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleThrottle {
    /// Creations per second; 0 means the default 100/s, negative means unlimited.
    pub limit: f64,
    /// Bucket size; 0 means `max_instances` (or `limit` rounded up when that is unlimited).
    pub burst: u32,
}

impl Default for ScaleThrottle {
    fn default() -> Self {
        ScaleThrottle { limit: 0.0, burst: 0 }
    }
}

/// One `[[runners.machine.autoscaling]]` entry (legacy).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LegacyPeriod {
    /// 6- or 7-field cron expressions (`sec min hour dom mon dow [year]`).
    pub periods: Vec<String>,
    /// IANA timezone; `None` = local time.
    pub timezone: Option<String>,
    /// Idle machines to keep.
    pub idle_count: u32,
    /// Lower bound of idle machines when `idle_scale_factor` is used.
    pub idle_count_min: u32,
    /// Idle machines as a factor of machines in use, capped by `idle_count`.
    pub idle_scale_factor: f64,
    /// Idle machine lifetime.
    pub idle_time: Duration,
}

/// Legacy `docker+machine` autoscaling: one job per machine, idle counts in machines.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct LegacyMachineSettings {
    /// `IdleCount`: idle machines to keep; 0 = on-demand mode.
    pub idle_count: u32,
    /// `IdleCountMin`.
    pub idle_count_min: u32,
    /// `IdleScaleFactor`.
    pub idle_scale_factor: f64,
    /// `IdleTime`.
    pub idle_time: Duration,
    /// `MaxGrowthRate`: machines in creation at once (0 = unlimited).
    pub max_growth_rate: u32,
    /// `MaxBuilds`: jobs per machine before removal (0 = unlimited).
    pub max_builds: u32,
    /// The runner's `limit`: machines in all states (0 = unlimited).
    pub limit: u32,
    /// `[[runners.machine.autoscaling]]`, last match wins.
    pub autoscaling: Vec<LegacyPeriod>,
}

/// Everything the engine needs. Durations default to GitLab's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscalerSettings {
    /// Concurrent jobs per instance (slots).
    pub capacity_per_instance: u32,
    /// Jobs per instance before it is retired (0 = unlimited).
    pub max_use_count: u32,
    /// Instances in all states (0 = unlimited).
    pub max_instances: u32,
    /// Idle policies, last matching wins; empty = one default policy.
    pub policies: Vec<IdlePolicy>,
    /// Token bucket on creations.
    pub scale_throttle: ScaleThrottle,
    /// Consecutive heartbeat failures before an instance is replaced.
    pub failure_threshold: u32,
    /// How long `acquire` waits for a slot.
    pub instance_acquire_timeout: Duration,
    /// Provider `update()` poll interval.
    pub update_interval: Duration,
    /// Poll interval while a state change is expected (creations, deletions).
    pub update_interval_when_expecting: Duration,
    /// Retry a deletion that had no visible effect after this long.
    pub deletion_retry_interval: Duration,
    /// Heartbeat every ready instance this often (`None` = no heartbeats, GitLab's default).
    pub heartbeat_interval: Option<Duration>,
    /// `instance_ready_command`: when set, each new instance must pass a ready check.
    pub instance_ready_command: Option<String>,
    /// First back-off after a failed ready check or provisioning timeout.
    pub ready_failure_backoff: Duration,
    /// Longest back-off between creations while instances keep failing.
    pub ready_failure_backoff_max: Duration,
    /// Requested creations that never show up in `update()` are forgotten after this long.
    pub pending_request_timeout: Duration,
    /// Keep restored instances that had acquisitions when the manager stopped.
    pub keep_instance_with_acquisitions: bool,
    /// Remove idle instances on shutdown.
    pub delete_instances_on_shutdown: bool,
    /// Legacy `docker+machine` mode; when set it overrides capacity, use count and limit.
    pub legacy: Option<LegacyMachineSettings>,
    /// `[runners.autoscaler.predictive]` with `enabled = true`: forecast demand and learn
    /// idle keep-alive (see [`super::predictive`]).
    pub predictive: Option<PredictiveSettings>,
}

impl Default for AutoscalerSettings {
    fn default() -> Self {
        AutoscalerSettings {
            capacity_per_instance: 1,
            max_use_count: 0,
            max_instances: 0,
            policies: Vec::new(),
            scale_throttle: ScaleThrottle::default(),
            failure_threshold: 3,
            instance_acquire_timeout: Duration::from_secs(15 * 60),
            update_interval: Duration::from_secs(60),
            update_interval_when_expecting: Duration::from_secs(2),
            deletion_retry_interval: Duration::from_secs(60),
            heartbeat_interval: None,
            instance_ready_command: None,
            ready_failure_backoff: Duration::from_secs(5),
            ready_failure_backoff_max: Duration::from_secs(10 * 60),
            pending_request_timeout: Duration::from_secs(15 * 60),
            keep_instance_with_acquisitions: false,
            delete_instances_on_shutdown: false,
            legacy: None,
            predictive: None,
        }
    }
}

impl AutoscalerSettings {
    /// Legacy Docker Machine settings on top of the defaults.
    pub fn legacy(machine: LegacyMachineSettings) -> Self {
        AutoscalerSettings { legacy: Some(machine), ..Default::default() }
    }

    /// Validate and pre-parse. Errors name the offending key.
    pub fn compile(&self) -> Result<CompiledSettings, SettingsError> {
        if self.legacy.is_none() && self.capacity_per_instance == 0 {
            return Err(SettingsError("capacity_per_instance must be at least 1".into()));
        }
        if self.update_interval.is_zero() || self.update_interval_when_expecting.is_zero() {
            return Err(SettingsError("update_interval and update_interval_when_expecting must be positive".into()));
        }
        if let Some(p) = &self.predictive {
            p.validate().map_err(|e| SettingsError(e.0))?;
        }
        let mut policies = Vec::new();
        let (capacity, max_use, max_instances, max_growth, mode) = match &self.legacy {
            None => {
                let defaults = [IdlePolicy::default()];
                let list: &[IdlePolicy] = if self.policies.is_empty() { &defaults } else { &self.policies };
                for (i, p) in list.iter().enumerate() {
                    let periods = compile_periods(&p.periods, CronDialect::Unix)
                        .map_err(|e| SettingsError(format!("policy[{i}].periods: {e}")))?;
                    let zone = PolicyZone::parse(p.timezone.as_deref())
                        .map_err(|e| SettingsError(format!("policy[{i}].timezone: {e}")))?;
                    if !(p.scale_factor >= 0.0 && p.scale_factor.is_finite()) {
                        return Err(SettingsError(format!("policy[{i}].scale_factor must be a non-negative number")));
                    }
                    policies.push(CompiledPolicy {
                        periods,
                        zone,
                        idle_count: p.idle_count,
                        idle_count_min: 0,
                        idle_time: p.idle_time,
                        scale_factor: p.scale_factor,
                        scale_factor_limit: p.scale_factor_limit,
                        preemptive: p.preemptive_mode.unwrap_or(p.idle_count > 0),
                    });
                }
                (self.capacity_per_instance, self.max_use_count, self.max_instances, 0, Mode::Taskscaler)
            }
            Some(m) => {
                let base = LegacyPeriod {
                    periods: vec!["* * * * * *".into()],
                    timezone: None,
                    idle_count: m.idle_count,
                    idle_count_min: m.idle_count_min,
                    idle_scale_factor: m.idle_scale_factor,
                    idle_time: m.idle_time,
                };
                for (i, p) in std::iter::once(&base).chain(m.autoscaling.iter()).enumerate() {
                    let label =
                        if i == 0 { "[runners.machine]".to_string() } else { format!("autoscaling[{}]", i - 1) };
                    let periods = compile_periods(&p.periods, CronDialect::WithSeconds)
                        .map_err(|e| SettingsError(format!("{label}.Periods: {e}")))?;
                    let zone = PolicyZone::parse(p.timezone.as_deref())
                        .map_err(|e| SettingsError(format!("{label}.Timezone: {e}")))?;
                    if !(p.idle_scale_factor >= 0.0 && p.idle_scale_factor.is_finite()) {
                        return Err(SettingsError(format!("{label}.IdleScaleFactor must be a non-negative number")));
                    }
                    policies.push(CompiledPolicy {
                        periods,
                        zone,
                        idle_count: p.idle_count,
                        idle_count_min: p.idle_count_min,
                        idle_time: p.idle_time,
                        scale_factor: p.idle_scale_factor,
                        scale_factor_limit: 0,
                        // With IdleCount > 0 the runner only requests jobs when an idle machine exists.
                        preemptive: p.idle_count > 0,
                    });
                }
                (1, m.max_builds, m.limit, m.max_growth_rate, Mode::LegacyMachine)
            }
        };
        let throttle_rate = if self.scale_throttle.limit < 0.0 {
            None
        } else if self.scale_throttle.limit == 0.0 {
            Some(100.0)
        } else {
            Some(self.scale_throttle.limit)
        };
        let throttle_burst = if self.scale_throttle.burst > 0 {
            self.scale_throttle.burst
        } else if max_instances > 0 {
            max_instances
        } else {
            throttle_rate.map(|r| r.ceil().max(1.0) as u32).unwrap_or(1)
        };
        Ok(CompiledSettings {
            mode,
            capacity,
            max_use,
            max_instances,
            max_growth,
            policies,
            throttle_rate,
            throttle_burst,
            raw: self.clone(),
        })
    }
}

fn compile_periods(periods: &[String], dialect: CronDialect) -> Result<Vec<CronPeriod>, CronError> {
    if periods.is_empty() {
        let all = match dialect {
            CronDialect::Unix => "* * * * *",
            CronDialect::WithSeconds => "* * * * * * *",
        };
        return Ok(vec![CronPeriod::parse(all, dialect)?]);
    }
    periods.iter().map(|p| CronPeriod::parse(p, dialect)).collect()
}

/// Which semantics the engine follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Taskscaler: idle counts are job slots.
    Taskscaler,
    /// Docker Machine: idle counts are machines, one job per machine.
    LegacyMachine,
}

/// A validated policy.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    periods: Vec<CronPeriod>,
    zone: PolicyZone,
    /// Idle slots (taskscaler) or machines (legacy) to keep.
    pub idle_count: u32,
    /// Legacy `IdleCountMin`.
    pub idle_count_min: u32,
    /// Idle lifetime.
    pub idle_time: Duration,
    /// `scale_factor` / `IdleScaleFactor`.
    pub scale_factor: f64,
    /// `scale_factor_limit`.
    pub scale_factor_limit: u32,
    /// Preemptive reservation.
    pub preemptive: bool,
}

impl CompiledPolicy {
    /// Whether this policy's periods cover `now`.
    pub fn is_active(&self, now: Moment) -> bool {
        self.zone.any_matches(&self.periods, now.to_datetime())
    }
}

/// Settings after validation, as the engine uses them.
#[derive(Clone, Debug)]
pub struct CompiledSettings {
    /// Taskscaler or legacy semantics.
    pub mode: Mode,
    /// Slots per instance.
    pub capacity: u32,
    /// Jobs per instance (0 = unlimited).
    pub max_use: u32,
    /// Instances in all states (0 = unlimited).
    pub max_instances: u32,
    /// Legacy `MaxGrowthRate` (0 = unlimited).
    pub max_growth: u32,
    /// Policies, in order; the first is the default.
    pub policies: Vec<CompiledPolicy>,
    /// Creations per second (`None` = unlimited).
    pub throttle_rate: Option<f64>,
    /// Token bucket size.
    pub throttle_burst: u32,
    /// The settings this was compiled from.
    pub raw: AutoscalerSettings,
}

impl CompiledSettings {
    /// The policy in force at `now`: the last matching one. In taskscaler mode a default
    /// all-zero policy applies when none matches; in legacy mode the `[runners.machine]` values.
    pub fn active_policy(&self, now: Moment) -> ActivePolicy<'_> {
        match (self.active_index(now), self.mode) {
            (Some(i), _) => ActivePolicy::Listed(&self.policies[i]),
            (None, Mode::LegacyMachine) => ActivePolicy::Listed(&self.policies[0]),
            (None, Mode::Taskscaler) => ActivePolicy::Fallback,
        }
    }

    /// The index of the last policy whose periods cover `now`.
    fn active_index(&self, now: Moment) -> Option<usize> {
        self.policies.iter().rposition(|p| p.is_active(now))
    }

    /// When the active policy must next be looked at after `now` (only meaningful with several
    /// policies): the next minute boundary, as 5-field periods change only there; docker+machine
    /// periods have seconds, so in legacy mode the first second before that boundary at which
    /// another policy becomes active, as gitlab-runner evaluates them whenever it checks its
    /// machines.
    pub fn next_policy_check(&self, now: Moment) -> Moment {
        let (second, minute) = (1_000, 60_000);
        let next_minute = (now.0 / minute + 1) * minute;
        if self.mode == Mode::LegacyMachine {
            let current = self.active_index(now);
            let mut at = (now.0 / second + 1) * second;
            while at < next_minute {
                if self.active_index(Moment(at)) != current {
                    return Moment(at);
                }
                at += second;
            }
        }
        Moment(next_minute)
    }

    /// The idle target in slots for `in_use` slots under `policy`.
    ///
    /// Taskscaler: `idle_count` when `scale_factor == 0`, else
    /// `max(idle_count, ceil(in_use × scale_factor))` capped by `scale_factor_limit` when > 0.
    /// Legacy: `IdleCount`, or with `IdleScaleFactor` > 0,
    /// `min(IdleCount, max(max(IdleCountMin, 1), int(in_use × IdleScaleFactor)))`.
    pub fn idle_target(&self, policy: &ActivePolicy<'_>, in_use: u32) -> u32 {
        let Some(p) = policy.policy() else { return 0 };
        match self.mode {
            Mode::Taskscaler => {
                if p.scale_factor == 0.0 {
                    return p.idle_count;
                }
                let scaled = (f64::from(in_use) * p.scale_factor).ceil() as u32;
                let target = p.idle_count.max(scaled);
                if p.scale_factor_limit > 0 {
                    target.min(p.scale_factor_limit.max(p.idle_count))
                } else {
                    target
                }
            }
            Mode::LegacyMachine => {
                if p.scale_factor == 0.0 {
                    return p.idle_count;
                }
                let scaled = (f64::from(in_use) * p.scale_factor) as u32;
                p.idle_count.min(p.idle_count_min.max(1).max(scaled))
            }
        }
    }
}

/// The policy in force.
#[derive(Clone, Copy, Debug)]
pub enum ActivePolicy<'a> {
    /// A configured policy matched.
    Listed(&'a CompiledPolicy),
    /// No configured policy matched: keep nothing idle, no preemption.
    Fallback,
}

impl<'a> ActivePolicy<'a> {
    /// The matched policy, if any.
    pub fn policy(&self) -> Option<&'a CompiledPolicy> {
        match self {
            ActivePolicy::Listed(p) => Some(p),
            ActivePolicy::Fallback => None,
        }
    }

    /// Idle lifetime under this policy.
    pub fn idle_time(&self) -> Duration {
        self.policy().map(|p| p.idle_time).unwrap_or(Duration::ZERO)
    }

    /// Whether reservations need a ready idle slot.
    pub fn preemptive(&self) -> bool {
        self.policy().map(|p| p.preemptive).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(idle_count: u32, scale_factor: f64, limit: u32) -> AutoscalerSettings {
        AutoscalerSettings {
            policies: vec![IdlePolicy {
                idle_count,
                scale_factor,
                scale_factor_limit: limit,
                timezone: Some("UTC".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn taskscaler_idle_target_follows_scale_factor_and_limit() {
        let now = Moment(0);
        let c = policy(2, 0.0, 0).compile().expect("valid");
        assert_eq!(c.idle_target(&c.active_policy(now), 100), 2);
        let c = policy(2, 0.2, 20).compile().expect("valid");
        assert_eq!(c.idle_target(&c.active_policy(now), 5), 2, "ceil(1.0) < idle_count");
        assert_eq!(c.idle_target(&c.active_policy(now), 11), 3, "ceil(2.2)");
        assert_eq!(c.idle_target(&c.active_policy(now), 1000), 20, "capped");
        assert!(c.active_policy(now).preemptive(), "default preemptive = idle_count > 0");
    }

    #[test]
    fn legacy_idle_target_is_capped_by_idle_count() {
        let c = AutoscalerSettings::legacy(LegacyMachineSettings {
            idle_count: 40,
            idle_count_min: 5,
            idle_scale_factor: 0.2,
            ..Default::default()
        })
        .compile()
        .expect("valid");
        let p = c.active_policy(Moment(0));
        assert_eq!(c.idle_target(&p, 200), 40, "MR 3179: 200 busy × 0.2 = 40");
        assert_eq!(c.idle_target(&p, 1000), 40, "capped by IdleCount");
        assert_eq!(c.idle_target(&p, 10), 5, "IdleCountMin floor");
    }

    #[test]
    fn last_matching_policy_wins() {
        let settings = AutoscalerSettings {
            policies: vec![
                IdlePolicy { idle_count: 1, timezone: Some("UTC".into()), ..Default::default() },
                IdlePolicy {
                    periods: vec!["* 8-18 * * mon-fri".into()],
                    timezone: Some("UTC".into()),
                    idle_count: 10,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let c = settings.compile().expect("valid");
        let monday_9 = Moment(1_767_603_600_000); // 2026-01-05T09:00:00Z
        let monday_20 = Moment(1_767_643_200_000); // 2026-01-05T20:00:00Z
        assert_eq!(c.idle_target(&c.active_policy(monday_9), 0), 10);
        assert_eq!(c.idle_target(&c.active_policy(monday_20), 0), 1);
    }

    #[test]
    fn invalid_settings_name_the_key() {
        let mut s = policy(1, 0.0, 0);
        s.policies[0].periods = vec!["* * *".into()];
        assert!(s.compile().expect_err("bad cron").to_string().contains("policy[0].periods"));
        let s = AutoscalerSettings { capacity_per_instance: 0, ..Default::default() };
        assert!(s.compile().expect_err("zero").to_string().contains("capacity_per_instance"));
    }
}
