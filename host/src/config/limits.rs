//! The ranges of every number and duration in config.toml, checked once at load so that no
//! value reaches a semaphore, `Duration` arithmetic, a float-to-duration conversion or an
//! allocation unbounded, and no value that would fail every job is accepted.
//!
//! Owns the limits (documented in docs/configuration.md) and the checks; the model and the
//! structural checks (required keys, URLs, enums) stay in the parent module. Errors name file,
//! line and key like every other config error.

use std::path::Path;
use std::time::Duration;

use super::autoscaler::{AutoscalerConfig, MachineConfig};
use super::duration::parse_duration;
use super::grant::PluginGrant;
use super::Invalid;
use super::{line_of_key, Config, ConfigError, Purpose, RunnerConfig};

/// Most jobs at once (`concurrent`) and most jobs of one runner (`limit`).
pub const MAX_JOBS: usize = 10_000;
/// Most job requests of one runner in flight at once (`request_concurrency`).
pub const MAX_REQUEST_CONCURRENCY: usize = 100;
/// Longest pause between job requests (`check_interval`, seconds).
pub const MAX_CHECK_INTERVAL_SECS: i64 = 3600;
/// Longest `shutdown_timeout` (seconds).
pub const MAX_SHUTDOWN_TIMEOUT_SECS: u64 = 86_400;
/// Largest job log (`output_limit`, KiB): 1 GiB.
pub const MAX_OUTPUT_LIMIT_KIB: u64 = 1 << 20;
/// Most retries of the final job update (`job_status_final_update_retry_limit`).
pub const MAX_FINAL_UPDATE_RETRIES: u32 = 1000;
/// Longest interval or timeout (`unhealthy_interval`, `connection_max_age`, autoscaler
/// intervals and timeouts, connector timeouts, `call_timeout`).
pub const MAX_INTERVAL: Duration = Duration::from_secs(86_400);
/// Longest idle time of a fleet instance (`idle_time`, `IdleTime`).
pub const MAX_IDLE_TIME: Duration = Duration::from_secs(30 * 86_400);
/// Shortest `call_timeout`: less than this fails every plugin call.
pub const MIN_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// Largest plugin memory (`memory_mb`): a 32-bit wasm memory cannot grow past 4 GiB.
pub const MAX_MEMORY_MB: u64 = 4096;
/// Largest per-call host buffer (`max_buffer_mb`).
pub const MAX_BUFFER_MB: u64 = 1024;
/// Largest autoscaler count (`max_instances`, `capacity_per_instance`, idle counts, ...).
pub const MAX_FLEET_COUNT: u32 = 100_000;
/// Largest scale factor (`scale_factor`, `IdleScaleFactor`).
pub const MAX_SCALE_FACTOR: f64 = 1000.0;

/// Checks against one file's text, so every error carries its line.
struct Checker<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Checker<'_> {
    fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.path, message).at_line(line_of_key(self.text, key)).with_key(key)
    }

    fn int<T: PartialOrd + std::fmt::Display + Copy>(
        &self,
        key: &str,
        value: T,
        min: T,
        max: T,
    ) -> Result<(), ConfigError> {
        if value < min || value > max {
            return Err(self.error(key, format!("{value} is out of range (must be {min}..={max})")));
        }
        Ok(())
    }

    fn duration(&self, key: &str, value: Duration, min: Duration, max: Duration) -> Result<(), ConfigError> {
        if value < min || value > max {
            return Err(self.error(key, format!("{value:?} is out of range (must be {min:?}..={max:?})")));
        }
        Ok(())
    }

    /// A duration kept as text (`connection_max_age`, connector timeouts).
    fn duration_text(&self, key: &str, value: Option<&str>, min: Duration) -> Result<(), ConfigError> {
        let Some(text) = value else { return Ok(()) };
        let parsed = parse_duration(text).map_err(|e| self.error(key, e.to_string()))?;
        self.duration(key, parsed, min, MAX_INTERVAL)
    }

    fn factor(&self, key: &str, value: f64) -> Result<(), ConfigError> {
        if !value.is_finite() || !(0.0..=MAX_SCALE_FACTOR).contains(&value) {
            return Err(self.error(key, format!("{value} is out of range (must be 0..={MAX_SCALE_FACTOR})")));
        }
        Ok(())
    }

    fn global(&self, c: &Config) -> Result<(), ConfigError> {
        self.int("concurrent", c.concurrent, 1, MAX_JOBS)?;
        // GitLab reads 0 or less as the default (3 s); only the upper end is bounded.
        if c.check_interval > MAX_CHECK_INTERVAL_SECS {
            return Err(self.error(
                "check_interval",
                format!(
                    "{} is out of range (must be at most {MAX_CHECK_INTERVAL_SECS} seconds; 0 means 3)",
                    c.check_interval
                ),
            ));
        }
        self.int("shutdown_timeout", c.shutdown_timeout, 0, MAX_SHUTDOWN_TIMEOUT_SECS)?;
        self.duration_text("connection_max_age", c.connection_max_age.as_deref(), Duration::ZERO)?;
        if let Some(address) = &c.listen_address {
            check_listen_address(address).map_err(|m| self.error("listen_address", m.0))?;
        }
        for (key, dir) in
            [("plugins_dir", &c.plugins_dir), ("plugin_cache_dir", &c.plugin_cache_dir), ("state_dir", &c.state_dir)]
        {
            if let Some(dir) = dir {
                check_local_dir(dir).map_err(|m| self.error(key, m.0))?;
            }
        }
        for (name, grant) in &c.plugins {
            self.grant(&format!("plugins.{name}"), grant)?;
        }
        Ok(())
    }

    fn grant(&self, key: &str, g: &PluginGrant) -> Result<(), ConfigError> {
        self.int(&format!("{key}.memory_mb"), g.memory_mb, 1, MAX_MEMORY_MB)?;
        self.int(&format!("{key}.max_buffer_mb"), g.max_buffer_mb, 1, MAX_BUFFER_MB)?;
        self.duration(&format!("{key}.call_timeout"), g.call_timeout, MIN_CALL_TIMEOUT, MAX_INTERVAL)
    }

    fn runner(&self, i: usize, r: &RunnerConfig, purpose: Purpose) -> Result<(), ConfigError> {
        let key = |k: &str| format!("runners[{i}].{k}");
        self.int(&key("limit"), r.limit, 0, MAX_JOBS)?;
        self.int(&key("request_concurrency"), r.request_concurrency, 1, MAX_REQUEST_CONCURRENCY)?;
        self.int(&key("output_limit"), r.output_limit, 0, MAX_OUTPUT_LIMIT_KIB)?;
        self.int(
            &key("job_status_final_update_retry_limit"),
            r.job_status_final_update_retry_limit,
            0,
            MAX_FINAL_UPDATE_RETRIES,
        )?;
        self.duration(&key("unhealthy_interval"), r.unhealthy_interval, Duration::ZERO, MAX_INTERVAL)?;
        for (name, dir) in [("builds_dir", &r.builds_dir), ("cache_dir", &r.cache_dir)] {
            let Some(dir) = dir else { continue };
            if dir.trim().is_empty() || dir.contains('\0') {
                return Err(self.error(&key(name), "must be a directory path (not empty)"));
            }
            // On a fleet the directory is the instance's; here only a local one can be looked at.
            if purpose == Purpose::Run && r.autoscaler.is_none() && Path::new(dir).is_absolute() {
                check_local_dir(Path::new(dir)).map_err(|m| self.error(&key(name), m.0))?;
            }
        }
        if let Some(a) = &r.autoscaler {
            self.autoscaler(&key("autoscaler"), a)?;
        }
        if let Some(m) = &r.machine {
            self.machine(&key("machine"), m)?;
        }
        if let Some(store) = &r.store {
            store.check().map_err(|(k, message)| self.error(&key(&format!("store.{k}")), message))?;
        }
        Ok(())
    }

    fn autoscaler(&self, key: &str, a: &AutoscalerConfig) -> Result<(), ConfigError> {
        let k = |name: &str| format!("{key}.{name}");
        self.int(&k("capacity_per_instance"), a.capacity_per_instance, 1, MAX_FLEET_COUNT)?;
        self.int(&k("max_use_count"), a.max_use_count, 0, u32::MAX)?;
        self.int(&k("max_instances"), a.max_instances, 0, MAX_FLEET_COUNT)?;
        self.int(&k("failure_threshold"), a.failure_threshold, 1, MAX_FLEET_COUNT)?;
        self.int(&k("shutdown_deletion_retries"), a.shutdown_deletion_retries, 0, MAX_FINAL_UPDATE_RETRIES)?;
        let tick = Duration::from_millis(100);
        self.duration(
            &k("instance_acquire_timeout"),
            a.instance_acquire_timeout,
            Duration::from_secs(1),
            MAX_INTERVAL,
        )?;
        self.duration(&k("update_interval"), a.update_interval, tick, MAX_INTERVAL)?;
        self.duration(&k("update_interval_when_expecting"), a.update_interval_when_expecting, tick, MAX_INTERVAL)?;
        self.duration(&k("deletion_retry_interval"), a.deletion_retry_interval, tick, MAX_INTERVAL)?;
        self.duration(&k("shutdown_deletion_interval"), a.shutdown_deletion_interval, Duration::ZERO, MAX_INTERVAL)?;
        self.int(&k("scale_throttle.limit"), a.scale_throttle.limit, -1, i64::from(MAX_FLEET_COUNT))?;
        self.int(&k("scale_throttle.burst"), a.scale_throttle.burst, 0, MAX_FLEET_COUNT)?;
        let connector = &a.connector_config;
        self.duration_text(&k("connector_config.keepalive"), connector.keepalive.as_deref(), Duration::ZERO)?;
        self.duration_text(&k("connector_config.timeout"), connector.timeout.as_deref(), Duration::ZERO)?;
        for (p, policy) in a.policies.iter().enumerate() {
            let k = |name: &str| format!("{key}.policy[{p}].{name}");
            self.int(&k("idle_count"), policy.idle_count, 0, MAX_FLEET_COUNT)?;
            self.int(&k("scale_factor_limit"), policy.scale_factor_limit, 0, MAX_FLEET_COUNT)?;
            self.duration(&k("idle_time"), policy.idle_time, Duration::ZERO, MAX_IDLE_TIME)?;
            self.factor(&k("scale_factor"), policy.scale_factor)?;
        }
        Ok(())
    }

    fn machine(&self, key: &str, m: &MachineConfig) -> Result<(), ConfigError> {
        let k = |name: &str| format!("{key}.{name}");
        self.int(&k("IdleCount"), m.idle_count, 0, MAX_FLEET_COUNT)?;
        self.int(&k("IdleCountMin"), m.idle_count_min, 0, MAX_FLEET_COUNT)?;
        self.int(&k("MaxGrowthRate"), m.max_growth_rate, 0, MAX_FLEET_COUNT)?;
        self.factor(&k("IdleScaleFactor"), m.idle_scale_factor)?;
        self.duration(&k("IdleTime"), m.idle_time, Duration::ZERO, MAX_IDLE_TIME)?;
        for (p, a) in m.autoscaling.iter().enumerate() {
            let k = |name: &str| format!("{key}.autoscaling[{p}].{name}");
            self.int(&k("IdleCount"), a.idle_count, 0, MAX_FLEET_COUNT)?;
            self.int(&k("IdleCountMin"), a.idle_count_min, 0, MAX_FLEET_COUNT)?;
            self.factor(&k("IdleScaleFactor"), a.idle_scale_factor)?;
            self.duration(&k("IdleTime"), a.idle_time, Duration::ZERO, MAX_IDLE_TIME)?;
        }
        Ok(())
    }
}

/// `host:port` (or `[v6]:port`) with a numeric port; the host may be a name. `:port` (no
/// host) is every address, as gitlab-runner's docs write it.
fn check_listen_address(address: &str) -> Result<(), Invalid> {
    let hint = "must be host:port, e.g. \"127.0.0.1:9252\", or \":9252\" for every address";
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(Invalid(format!("{address:?} {hint}")));
    };
    if port.parse::<u16>().is_err() {
        return Err(Invalid(format!("{address:?} {hint}")));
    }
    if host.is_empty() {
        return Ok(());
    }
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let plain_name = host.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if !plain_name && host.parse::<std::net::IpAddr>().is_err() {
        return Err(Invalid(format!("{address:?} {hint}")));
    }
    Ok(())
}

/// A directory the runner will use: absent (created when needed) or a directory.
fn check_local_dir(dir: &Path) -> Result<(), Invalid> {
    if dir.as_os_str().is_empty() {
        return Err(Invalid("must be a directory path (not empty)".into()));
    }
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(Invalid(format!("{} exists and is not a directory", dir.display()))),
        _ => Ok(()),
    }
}

/// Check every number, duration, address and directory of a parsed config.
pub(super) fn check(config: &Config, text: &str, path: &Path, purpose: Purpose) -> Result<(), ConfigError> {
    let checker = Checker { text, path };
    checker.global(config)?;
    for (i, runner) in config.runners.iter().enumerate() {
        checker.runner(i, runner, purpose)?;
    }
    Ok(())
}
