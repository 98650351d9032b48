//! `[runners.store]` (seed 003): which job store a runner keeps its running jobs in, and the
//! intervals of its heartbeats, takeovers and cleanup. Unlike GitLab (opt-in, alpha), the store
//! is on by default with the file backend; `name = "none"` turns it off.
//!
//! Owns the model, its defaults and ranges, the expansion of the file path's variables and the
//! mapping onto [`StoreSettings`]. Must not open a store (the manager and `runway store` do)
//! or know what an entry holds.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::duration::duration_secs;
use crate::config::Invalid;
use crate::store::jobs::{Backend, StoreSettings};

/// Longest `health_interval`, `health_timeout` and `cleanup_interval`.
pub const MAX_STORE_INTERVAL: Duration = Duration::from_secs(86_400);
/// Longest `stale_timeout`: 30 days.
pub const MAX_STALE_TIMEOUT: Duration = Duration::from_secs(30 * 86_400);
/// Most resumes of one job (`max_retries`).
pub const MAX_STORE_RETRIES: u32 = 1000;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
fn d_health_interval() -> Duration {
    secs(5)
}
fn d_health_timeout() -> Duration {
    secs(30)
}
fn d_stale_timeout() -> Duration {
    secs(10_800)
}
fn d_cleanup_interval() -> Duration {
    secs(300)
}
fn d_max_retries() -> u32 {
    10
}

/// `[runners.store] name`: the backend.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreName {
    /// One directory per runner (`[runners.store.file]`), one manager per directory.
    #[default]
    File,
    /// A Redis database (`[runners.store.redis]`) shared by several managers.
    Redis,
    /// No store: a manager that dies takes its running jobs with it.
    None,
}

/// `[runners.store]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoreConfig {
    /// The backend (default `file`).
    #[serde(default)]
    pub name: StoreName,
    /// Heartbeat of each running job (seconds or a duration string).
    #[serde(default = "d_health_interval", with = "duration_secs")]
    pub health_interval: Duration,
    /// A job whose heartbeat is older is resumed by a manager.
    #[serde(default = "d_health_timeout", with = "duration_secs")]
    pub health_timeout: Duration,
    /// Entries older than this are failed and removed.
    #[serde(default = "d_stale_timeout", with = "duration_secs")]
    pub stale_timeout: Duration,
    /// How often the store is swept for stale entries.
    #[serde(default = "d_cleanup_interval", with = "duration_secs")]
    pub cleanup_interval: Duration,
    /// Resumes of one job before it is failed.
    #[serde(default = "d_max_retries")]
    pub max_retries: u32,
    /// `[runners.store.file]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileStoreConfig>,
    /// `[runners.store.redis]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisStoreConfig>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            name: StoreName::File,
            health_interval: d_health_interval(),
            health_timeout: d_health_timeout(),
            stale_timeout: d_stale_timeout(),
            cleanup_interval: d_cleanup_interval(),
            max_retries: d_max_retries(),
            file: None,
            redis: None,
        }
    }
}

/// `[runners.store.file]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FileStoreConfig {
    /// The runner's store directory; `$CI_RUNNER_*` and the runner's `environment` variables
    /// are expanded, a relative path is relative to the config directory. Default
    /// `<config dir>/.runway/store/<token digest>` ([`super::token_digest`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// `[runners.store.redis]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RedisStoreConfig {
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS; `$VAR` expanded from
    /// the environment (so a password need not be written in config.toml).
    #[serde(default)]
    pub url: String,
}

/// The directory of the default file store paths, relative to the config directory.
pub const DEFAULT_FILE_DIR: &str = ".runway/store";

/// What the file store path may name that config does not know itself (the build's version
/// and revision belong to `buildinfo`, which config does not import).
#[derive(Debug, Clone, Copy, Default)]
pub struct StorePathVariables<'a> {
    /// `CI_RUNNER_VERSION`.
    pub version: &'a str,
    /// `CI_RUNNER_REVISION`.
    pub revision: &'a str,
    /// `CI_RUNNER_TAGS` (comma-separated; empty when the runner's tags live in GitLab).
    pub tags: &'a str,
}

/// The identity of a runner the store path and namespace are derived from.
pub(super) struct RunnerIdentity<'a> {
    pub id: i64,
    pub short_token: &'a str,
    /// [`super::token_digest`] of the whole token: the default store's name.
    pub token_digest: &'a str,
    pub environment: &'a [String],
}

impl StoreConfig {
    /// The range and consistency problems of this section: `(key below [runners.store], message)`.
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        let range = |key: &str, value: Duration, min: Duration, max: Duration| {
            if value < min || value > max {
                return Err((key.to_string(), format!("{value:?} is out of range (must be {min:?}..={max:?})")));
            }
            Ok(())
        };
        let second = secs(1);
        range("health_interval", self.health_interval, second, MAX_STORE_INTERVAL)?;
        range("health_timeout", self.health_timeout, second, MAX_STORE_INTERVAL)?;
        range("stale_timeout", self.stale_timeout, second, MAX_STALE_TIMEOUT)?;
        range("cleanup_interval", self.cleanup_interval, second, MAX_STORE_INTERVAL)?;
        if self.max_retries > MAX_STORE_RETRIES {
            return Err((
                "max_retries".into(),
                format!("{} is out of range (must be 0..={MAX_STORE_RETRIES})", self.max_retries),
            ));
        }
        if self.health_interval >= self.health_timeout {
            return Err((
                "health_interval".into(),
                format!(
                    "{:?} must be shorter than health_timeout ({:?}): a live job would look dead between two heartbeats",
                    self.health_interval, self.health_timeout
                ),
            ));
        }
        if self.stale_timeout <= self.health_timeout {
            return Err((
                "stale_timeout".into(),
                format!(
                    "{:?} must be longer than health_timeout ({:?}): a job would be failed before it could be resumed",
                    self.stale_timeout, self.health_timeout
                ),
            ));
        }
        if let Some(path) = self.file.as_ref().and_then(|f| f.path.as_deref()) {
            if path.trim().is_empty() || path.contains('\0') {
                return Err(("file.path".into(), "must be a directory path (not empty)".into()));
            }
        }
        if self.name == StoreName::Redis {
            let Some(redis) = &self.redis else {
                return Err(("name".into(), "\"redis\" needs a [runners.store.redis] section with a url".into()));
            };
            check_redis_url(&expand_env(&redis.url)).map_err(|m| ("redis.url".to_string(), m.0))?;
        }
        Ok(())
    }

    /// The settings the store and its users need, the file path expanded (see
    /// [`FileStoreConfig::path`]) and made absolute against `config_dir`, the Redis URL expanded
    /// from the environment and the Redis namespace set to the runner's token digest. Where an
    /// earlier version kept the same store under the short token (the default directory, the
    /// Redis namespace), that place is `migrate_from`.
    pub(super) fn settings(
        &self,
        config_dir: &Path,
        runner: &RunnerIdentity<'_>,
        vars: &StorePathVariables<'_>,
    ) -> Result<StoreSettings, (String, String)> {
        let mut migrate_from = None;
        let backend = match self.name {
            StoreName::None => None,
            StoreName::File => match self.file.as_ref().and_then(|f| f.path.as_deref()) {
                Some(raw) => {
                    let expanded = expand_path(raw, runner, vars);
                    if expanded.trim().is_empty() {
                        return Err(("file.path".into(), format!("{raw:?} expands to an empty path")));
                    }
                    let path = PathBuf::from(expanded);
                    Some(Backend::File { path: if path.is_absolute() { path } else { config_dir.join(path) } })
                }
                None => {
                    let dir = config_dir.join(DEFAULT_FILE_DIR);
                    // Before the digest, the default was named by the short token.
                    if !runner.short_token.is_empty() {
                        migrate_from = Some(Backend::File { path: dir.join(runner.short_token) });
                    }
                    Some(Backend::File { path: dir.join(runner.token_digest) })
                }
            },
            StoreName::Redis => {
                let url = expand_env(self.redis.as_ref().map(|r| r.url.as_str()).unwrap_or_default());
                check_redis_url(&url).map_err(|m| ("redis.url".to_string(), m.0))?;
                if runner.short_token.is_empty() {
                    return Err(("name".into(), "the Redis store needs the runner's token (its namespace)".into()));
                }
                migrate_from = Some(Backend::Redis { url: url.clone(), namespace: runner.short_token.to_string() });
                Some(Backend::Redis { url, namespace: runner.token_digest.to_string() })
            }
        };
        Ok(StoreSettings {
            backend,
            migrate_from,
            health_interval: self.health_interval,
            health_timeout: self.health_timeout,
            stale_timeout: self.stale_timeout,
            cleanup_interval: self.cleanup_interval,
            max_retries: self.max_retries,
        })
    }
}

fn expand_env(value: &str) -> String {
    crate::payload::variables::expand(value, &|k| std::env::var(k).ok())
}

/// Seed 003's variables: `CI_RUNNER_ID`, `CI_RUNNER_REVISION`, `CI_RUNNER_SHORT_TOKEN`,
/// `CI_RUNNER_TAGS`, `CI_RUNNER_VERSION` and the runner's `environment` entries (the
/// `CI_RUNNER_*` names win over an `environment` entry of the same name). Others expand to "".
fn expand_path(path: &str, runner: &RunnerIdentity<'_>, vars: &StorePathVariables<'_>) -> String {
    let lookup = |name: &str| -> Option<String> {
        match name {
            "CI_RUNNER_ID" => Some(runner.id.to_string()),
            "CI_RUNNER_REVISION" => Some(vars.revision.to_string()),
            "CI_RUNNER_SHORT_TOKEN" => Some(runner.short_token.to_string()),
            "CI_RUNNER_TAGS" => Some(vars.tags.to_string()),
            "CI_RUNNER_VERSION" => Some(vars.version.to_string()),
            _ => runner.environment.iter().rev().find_map(|entry| {
                entry.split_once('=').filter(|(key, _)| *key == name).map(|(_, value)| value.to_string())
            }),
        }
    };
    crate::payload::variables::expand(path, &lookup)
}

fn check_redis_url(url: &str) -> Result<(), Invalid> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Invalid("must be a redis:// or rediss:// URL".into()));
    };
    if !matches!(scheme, "redis" | "rediss") {
        return Err(Invalid(format!("must be a redis:// or rediss:// URL, not {scheme}://")));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host.is_empty() {
        return Err(Invalid("names no host (redis://HOST:PORT/DB)".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner<'a>(environment: &'a [String]) -> RunnerIdentity<'a> {
        RunnerIdentity { id: 42, short_token: "abcDEF123", token_digest: "0123456789abcdef", environment }
    }

    #[test]
    fn defaults_are_seed_003s_with_the_file_store_on() {
        let c = StoreConfig::default();
        let vars = StorePathVariables { version: "1.0", revision: "deadbeef", tags: "" };
        let s = c.settings(Path::new("/etc/runway"), &runner(&[]), &vars).expect("settings");
        assert_eq!(
            s.backend,
            Some(Backend::File { path: PathBuf::from("/etc/runway/.runway/store/0123456789abcdef") })
        );
        assert_eq!(s.migrate_from, Some(Backend::File { path: PathBuf::from("/etc/runway/.runway/store/abcDEF123") }));
        assert_eq!(
            (s.health_interval, s.health_timeout, s.stale_timeout, s.cleanup_interval, s.max_retries),
            (secs(5), secs(30), secs(10_800), secs(300), 10)
        );
        c.check().expect("defaults are in range");
    }

    #[test]
    fn the_path_expands_seed_003s_variables_and_the_runner_environment() {
        let env = vec!["STORE_ROOT=/var/lib/runway".to_string(), "CI_RUNNER_ID=spoofed".to_string()];
        let c = StoreConfig {
            file: Some(FileStoreConfig {
                path: Some("$STORE_ROOT/${CI_RUNNER_ID}-$CI_RUNNER_SHORT_TOKEN-$CI_RUNNER_VERSION-$CI_RUNNER_REVISION-$CI_RUNNER_TAGS$UNSET".into()),
            }),
            ..StoreConfig::default()
        };
        let vars = StorePathVariables { version: "1.0", revision: "deadbeef", tags: "a,b" };
        let s = c.settings(Path::new("/etc/runway"), &runner(&env), &vars).expect("settings");
        assert_eq!(
            s.backend,
            Some(Backend::File { path: PathBuf::from("/var/lib/runway/42-abcDEF123-1.0-deadbeef-a,b") })
        );
        let relative = StoreConfig { file: Some(FileStoreConfig { path: Some("store".into()) }), ..c.clone() };
        let s = relative.settings(Path::new("/etc/runway"), &runner(&env), &vars).expect("settings");
        assert_eq!(s.backend, Some(Backend::File { path: PathBuf::from("/etc/runway/store") }));
        assert_eq!(s.migrate_from, None, "a path the administrator set is theirs");
        let empty = StoreConfig { file: Some(FileStoreConfig { path: Some("$UNSET".into()) }), ..c };
        let (key, message) = empty.settings(Path::new("/etc"), &runner(&env), &vars).expect_err("empty");
        assert_eq!(key, "file.path");
        assert!(message.contains("empty"), "{message}");
    }

    #[test]
    fn redis_takes_the_token_digest_as_namespace_and_none_turns_the_store_off() {
        let c = StoreConfig {
            name: StoreName::Redis,
            redis: Some(RedisStoreConfig { url: "redis://127.0.0.1:6379/0".into() }),
            ..StoreConfig::default()
        };
        c.check().expect("valid");
        let s = c.settings(Path::new("/etc"), &runner(&[]), &StorePathVariables::default()).expect("settings");
        assert_eq!(
            s.backend,
            Some(Backend::Redis { url: "redis://127.0.0.1:6379/0".into(), namespace: "0123456789abcdef".into() })
        );
        assert_eq!(
            s.migrate_from,
            Some(Backend::Redis { url: "redis://127.0.0.1:6379/0".into(), namespace: "abcDEF123".into() })
        );
        let off = StoreConfig { name: StoreName::None, ..StoreConfig::default() };
        let s = off.settings(Path::new("/etc"), &runner(&[]), &StorePathVariables::default()).expect("off");
        assert_eq!(s.backend, None);
    }

    #[test]
    fn checks_name_the_key_below_the_section() {
        let bad = |c: StoreConfig| c.check().expect_err("bad").0;
        let d = StoreConfig::default;
        assert_eq!(bad(StoreConfig { health_interval: secs(30), ..d() }), "health_interval");
        assert_eq!(bad(StoreConfig { health_interval: Duration::ZERO, ..d() }), "health_interval");
        assert_eq!(bad(StoreConfig { stale_timeout: secs(30), ..d() }), "stale_timeout");
        assert_eq!(bad(StoreConfig { cleanup_interval: secs(86_401), ..d() }), "cleanup_interval");
        assert_eq!(bad(StoreConfig { max_retries: 1001, ..d() }), "max_retries");
        assert_eq!(bad(StoreConfig { name: StoreName::Redis, ..d() }), "name");
        let redis = |url: &str| StoreConfig {
            name: StoreName::Redis,
            redis: Some(RedisStoreConfig { url: url.into() }),
            ..d()
        };
        assert_eq!(bad(redis("http://x")), "redis.url");
        assert_eq!(bad(redis("redis:///0")), "redis.url");
        redis("rediss://:pw@cache.internal:6380/2").check().expect("TLS with a password");
        let file = |p: &str| StoreConfig { file: Some(FileStoreConfig { path: Some(p.into()) }), ..d() };
        assert_eq!(bad(file(" ")), "file.path");
    }
}
