//! config.toml in GitLab Runner's format (protocol reference §5), plus Runway's plugin keys.
//!
//! Owns the model and its defaults, loading with errors that name file, line and key,
//! warnings for unknown keys, `$VAR` expansion in `url`/`token`, atomic saving (mode 0600),
//! the default config path and `.runner_system_id`. Loading is pure and cheap so SIGHUP can
//! simply load again.

pub mod autoscaler;
pub mod cache;
pub mod docker_machine;
pub mod duration;
pub mod edit;
mod error;
pub mod fidelity;
pub mod grant;
pub mod hosts;
pub mod instance;
pub mod limits;
mod lines;
pub mod router;
pub mod session_server;
pub mod ssh;
pub mod store;
mod system_id;
mod timestamp;
pub mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::duration::duration_str;
use crate::config::fidelity::{ConfigWarning, WarningKind};
use crate::config::grant::PluginGrant;
pub use error::{ConfigError, Invalid};
use lines::{key_at_line, line_of_key, line_of_offset, runner_header_line, sub_table_line, text_has_shell_section};
pub use system_id::{router_id, short_token, system_id, token_digest};

/// Executor config sections kept as tables and handed to the plugin as JSON (the executors
/// Runway has; another executor's section is warned about, see [`fidelity`]).
pub const EXECUTOR_SECTIONS: &[&str] = fidelity::RUNWAY_EXECUTOR_SECTIONS;

/// Executors served by another executor's plugin: `executor = "docker-autoscaler"` is the
/// `docker` plugin, configured by `[runners.docker]`, on the fleet of `[runners.autoscaler]`;
/// `"docker+machine"` the same on the fleet [`docker_machine`] derives from `[runners.machine]`.
pub const EXECUTOR_ALIASES: &[(&str, &str)] = &[("docker-autoscaler", "docker"), ("docker+machine", "docker")];

/// `[runners.*]` tables of older gitlab-runner releases: loaded with a warning, not an error.
pub const GITLAB_RUNNER_SECTIONS: &[&str] = &["steps"];

/// The whole file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Config {
    /// Most jobs running at once across all runners (> 0; 1 when absent, as gitlab-runner).
    #[serde(default = "default_concurrent")]
    pub concurrent: usize,
    /// Seconds between job requests of a runner when idle (≤ 0 means 3).
    #[serde(default = "default_check_interval")]
    pub check_interval: i64,
    /// `debug`, `info`, `warn`, `error`, `fatal` or `panic`.
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// `runner`, `text` or `json`.
    #[serde(default = "default_log_format")]
    pub log_format: String,
    /// `host:port` for `/metrics` and `/health/*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_address: Option<String>,
    /// Seconds a forceful shutdown waits for aborted jobs.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout: u64,
    /// How long a GitLab connection is reused (duration string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_max_age: Option<String>,
    /// Directory of plugin `.wasm` files (default `<config dir>/plugins`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins_dir: Option<PathBuf>,
    /// Compiled plugin cache (default `<config dir>/.plugin-cache`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_cache_dir: Option<PathBuf>,
    /// Runway's own state: plugin key-value data (default `<config dir>/.runway-state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The user shell executor jobs run as (`su -s /bin/bash <user> -c ...`), as
    /// gitlab-runner's `user`; `runway run --user` overrides it. Unset: the runner's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default labels of every runner.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `[plugins.NAME]` sandbox grants.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: BTreeMap<String, PluginGrant>,
    /// `[session_server]`: the interactive web terminal's HTTPS server.
    #[serde(default, skip_serializing_if = "session_server::SessionServerConfig::is_unset")]
    pub session_server: session_server::SessionServerConfig,
    /// `[[runners]]` entries.
    #[serde(default)]
    pub runners: Vec<RunnerConfig>,
}

fn default_concurrent() -> usize {
    1
}
fn default_check_interval() -> i64 {
    3
}
fn default_log_level() -> String {
    "info".into()
}
fn default_log_format() -> String {
    "runner".into()
}
fn default_shutdown_timeout() -> u64 {
    30
}
fn default_request_concurrency() -> usize {
    1
}
fn default_output_limit() -> u64 {
    4096
}
fn default_unhealthy_requests_limit() -> u32 {
    3
}
fn default_unhealthy_interval() -> Duration {
    Duration::from_secs(3600)
}
fn default_final_update_retry_limit() -> u32 {
    10
}
fn is_default_unhealthy_interval(d: &Duration) -> bool {
    *d == default_unhealthy_interval()
}

/// One `[[runners]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunnerConfig {
    /// Runner description (shown in GitLab and in logs).
    #[serde(default)]
    pub name: String,
    /// GitLab URL (required unless [`Purpose::Simulate`]).
    #[serde(default)]
    pub url: String,
    /// GitLab's runner ID (0 when unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub id: i64,
    /// Runner authentication token (required unless [`Purpose::Simulate`]).
    #[serde(default)]
    pub token: String,
    /// When the token was obtained.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "timestamp")]
    pub token_obtained_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When the token expires (none = never).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "timestamp")]
    pub token_expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// CA certificates to trust for GitLab (PEM).
    #[serde(rename = "tls-ca-file", default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate for GitLab (PEM).
    #[serde(rename = "tls-cert-file", default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of the client certificate (PEM).
    #[serde(rename = "tls-key-file", default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// `shell` runs the shell plugin; any other name runs the plugin of that name (required
    /// unless [`Purpose::Simulate`]).
    #[serde(default)]
    pub executor: String,
    /// The shell scripts are generated for (`bash`). In config.toml `shell` may instead be
    /// the `[runners.shell]` table of the shell executor plugin; that lands in `sections`.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "shell_name_or_section")]
    pub shell: Option<String>,
    /// Most jobs of this runner at once (0 = unlimited).
    #[serde(default)]
    pub limit: usize,
    /// Job requests of this runner in flight at once (≥ 1).
    #[serde(default = "default_request_concurrency")]
    pub request_concurrency: usize,
    /// Always wait `check_interval` between requests, even after a job was received.
    #[serde(default)]
    pub strict_check_interval: bool,
    /// Trace size limit in KiB.
    #[serde(default = "default_output_limit")]
    pub output_limit: u64,
    /// Where builds are checked out (default per executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builds_dir: Option<String>,
    /// Where caches are kept (default per executor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// Overrides the URL git clones from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_url: Option<String>,
    /// `KEY=value` variables added to every job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment: Vec<String>,
    /// Script run before fetching sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_get_sources_script: Option<String>,
    /// Script run after fetching sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_get_sources_script: Option<String>,
    /// Script run before the job's script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_build_script: Option<String>,
    /// Script run after the job's script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_build_script: Option<String>,
    /// Ignore `CI_DEBUG_TRACE` from jobs.
    #[serde(default)]
    pub debug_trace_disabled: bool,
    /// Remove git configs and hooks of the checkout before and after each job (default: on,
    /// except for the shell executor and `GIT_STRATEGY: none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_git_config: Option<bool>,
    /// Add the job's directory to git's global `safe.directory` (default: on for the docker
    /// executors, off for shell and instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_directory_checkout: Option<bool>,
    /// `FF_*` feature flags for every job of this runner.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_flags: BTreeMap<String, bool>,
    /// Failed requests in a row before the runner is treated as unhealthy.
    #[serde(default = "default_unhealthy_requests_limit")]
    pub unhealthy_requests_limit: u32,
    /// How long an unhealthy runner stops requesting jobs.
    #[serde(
        default = "default_unhealthy_interval",
        with = "duration_str",
        skip_serializing_if = "is_default_unhealthy_interval"
    )]
    pub unhealthy_interval: Duration,
    /// Retries of the final job update before giving up.
    #[serde(default = "default_final_update_retry_limit")]
    pub job_status_final_update_retry_limit: u32,
    /// This runner's labels (over the global ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `[runners.autoscaler]` (instance executors on an autoscaled fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<autoscaler::AutoscalerConfig>,
    /// Legacy `[runners.machine]` (docker+machine keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<autoscaler::MachineConfig>,
    /// `[runners.store]` (the job store); absent means the defaults: the file store, on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<store::StoreConfig>,
    /// `[runners.cache]` (the distributed cache); absent or without `Type`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<cache::CacheConfig>,
    /// Executor sections: `[runners.shell]`, `[runners.docker]`, `[runners.<plugin>]`, ...
    #[serde(flatten)]
    pub sections: BTreeMap<String, toml::Value>,
    /// Why this runner cannot ask GitLab for jobs (no usable `url`, `token`, `executor` or
    /// fleeting `plugin`), set by the loader for [`Purpose::Run`] with a warning naming the
    /// key. gitlab-runner loads such a file and logs the failing runner; so does Runway,
    /// which leaves that runner out and serves the others.
    #[serde(skip)]
    pub unusable: Option<String>,
}

thread_local! {
    /// `[runners.shell]` tables met while deserializing, by runner order.
    static SHELL_SECTIONS: std::cell::RefCell<Vec<Option<toml::Value>>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn shell_name_or_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Shell {
        Name(String),
        Section(toml::Value),
    }
    match Shell::deserialize(d)? {
        Shell::Name(name) => Ok(Some(name)),
        Shell::Section(table) => {
            SHELL_SECTIONS.with(|s| s.borrow_mut().push(Some(table)));
            Ok(None)
        }
    }
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl RunnerConfig {
    /// A runner entry with defaults.
    pub fn new(name: &str, url: &str, token: &str, executor: &str) -> Self {
        RunnerConfig {
            name: name.into(),
            url: url.into(),
            id: 0,
            token: token.into(),
            token_obtained_at: None,
            token_expires_at: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            executor: executor.into(),
            shell: None,
            limit: 0,
            request_concurrency: 1,
            strict_check_interval: false,
            output_limit: default_output_limit(),
            builds_dir: None,
            cache_dir: None,
            clone_url: None,
            environment: Vec::new(),
            pre_get_sources_script: None,
            post_get_sources_script: None,
            pre_build_script: None,
            post_build_script: None,
            debug_trace_disabled: false,
            clean_git_config: None,
            safe_directory_checkout: None,
            feature_flags: BTreeMap::new(),
            unhealthy_requests_limit: default_unhealthy_requests_limit(),
            unhealthy_interval: default_unhealthy_interval(),
            job_status_final_update_retry_limit: default_final_update_retry_limit(),
            labels: BTreeMap::new(),
            autoscaler: None,
            machine: None,
            store: None,
            cache: None,
            sections: BTreeMap::new(),
            unusable: None,
        }
    }

    /// `url` with `$VAR`/`${VAR}` expanded from the environment and a legacy `/ci` dropped.
    pub fn resolved_url(&self) -> String {
        let url = expand_env(&self.url);
        let trimmed = url.trim_end_matches('/');
        trimmed.strip_suffix("/ci").unwrap_or(trimmed).to_string()
    }

    /// `token` with `$VAR`/`${VAR}` expanded from the environment.
    pub fn resolved_token(&self) -> String {
        expand_env(&self.token)
    }

    /// `[runners.store]` as the job store needs it (the defaults when the section is absent):
    /// the file path with its variables expanded and made absolute against the directory of
    /// `config_path` (the config file, also named in errors), the Redis URL expanded from the
    /// environment and its namespace set to the token digest. `vars` are what config cannot know.
    pub fn store_settings(
        &self,
        config_path: &Path,
        vars: &store::StorePathVariables<'_>,
    ) -> Result<crate::store::jobs::StoreSettings, ConfigError> {
        let dir = config_path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let token = self.resolved_token();
        let identity = store::RunnerIdentity {
            id: self.id,
            short_token: &short_token(&token),
            token_digest: &token_digest(&token),
            environment: &self.environment,
        };
        self.store.clone().unwrap_or_default().settings(dir, &identity, vars).map_err(|(key, message)| {
            ConfigError::new(config_path, format!("runner {:?}: {message}", self.name))
                .with_key(format!("runners.store.{key}"))
        })
    }

    /// The plugin serving this runner's executor: its name, unless it is an alias
    /// ([`EXECUTOR_ALIASES`]).
    pub fn executor_plugin(&self) -> &str {
        EXECUTOR_ALIASES.iter().find(|(alias, _)| *alias == self.executor).map_or(self.executor.as_str(), |(_, p)| p)
    }

    /// The executor's section (`[runners.<executor plugin>]`) as JSON, `{}` when absent.
    pub fn executor_config_json(&self) -> String {
        self.sections
            .get(self.executor_plugin())
            .and_then(|v| serde_json::to_string(v).ok())
            .unwrap_or_else(|| "{}".to_string())
    }
}

/// A config file that loaded, with what it warned about.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The parsed file.
    pub config: Config,
    /// Warnings (unknown keys, long polling issues), each naming file, line and key.
    pub warnings: Vec<ConfigWarning>,
    /// The file it was loaded from.
    pub path: PathBuf,
}

impl Loaded {
    /// Directory of the config file (base of relative defaults).
    pub fn dir(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."))
    }
    /// `check_interval` as a duration (≤ 0 → 3 s).
    pub fn check_interval(&self) -> Duration {
        Duration::from_secs(if self.config.check_interval <= 0 { 3 } else { self.config.check_interval as u64 })
    }
    /// `shutdown_timeout` as a duration (0 → 30 s, as gitlab-runner's `GetShutdownTimeout`).
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(if self.config.shutdown_timeout == 0 { 30 } else { self.config.shutdown_timeout })
    }
    /// Directory of plugin `.wasm` files (default `<config dir>/plugins`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.config.plugins_dir.clone().unwrap_or_else(|| self.dir().join("plugins"))
    }
    /// Compiled plugin cache: `plugin_cache_dir`, else `RUNWAY_PLUGIN_CACHE_DIR` (one cache for
    /// several config files: compiled code is keyed by plugin content and engine, written
    /// atomically), else `<config dir>/.plugin-cache`.
    pub fn plugin_cache_dir(&self) -> PathBuf {
        self.config
            .plugin_cache_dir
            .clone()
            .or_else(plugin_cache_from_env)
            .unwrap_or_else(|| self.dir().join(".plugin-cache"))
    }
    /// Runway's own state (default `<config dir>/.runway-state`).
    pub fn state_dir(&self) -> PathBuf {
        self.config.state_dir.clone().unwrap_or_else(|| self.dir().join(".runway-state"))
    }
}

/// What a config file is loaded for, which decides the keys it must have.
///
/// `runway simulate` reads the same file as `runway run` through the same loader, with the
/// same errors and warnings; it only models fleets, so the keys that connect to GitLab or to a
/// cloud may be left out there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Purpose {
    /// Running runners: every runner needs `url`, `token` and `executor`, and a
    /// `[runners.autoscaler]` section needs its fleeting `plugin`.
    #[default]
    Run,
    /// Simulating fleets (`runway simulate`): `url`, `token`, `executor` and
    /// `[runners.autoscaler] plugin` may be absent (they are read as empty); every other key
    /// is checked as for [`Purpose::Run`].
    Simulate,
}

/// The environment variable naming the compiled-plugin cache when config.toml names none.
pub const PLUGIN_CACHE_ENV: &str = "RUNWAY_PLUGIN_CACHE_DIR";

/// The directory [`PLUGIN_CACHE_ENV`] names, when set and not empty.
pub fn plugin_cache_from_env() -> Option<PathBuf> {
    std::env::var_os(PLUGIN_CACHE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The config file when none is named: gitlab-runner's — `/etc/gitlab-runner/config.toml`
/// as root, `~/.gitlab-runner/config.toml` otherwise — when it exists, else Runway's own
/// (`./config.toml`, then `~/.runway/config.toml`) when one exists, else gitlab-runner's (where
/// `register` writes and `run` waits for it).
pub fn default_path() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    default_path_for(root, home.as_deref(), &|p: &Path| p.exists())
}

fn default_path_for(root: bool, home: Option<&Path>, exists: &dyn Fn(&Path) -> bool) -> PathBuf {
    let gitlab_runner = match (root, home) {
        (false, Some(home)) => home.join(".gitlab-runner").join("config.toml"),
        _ => PathBuf::from("/etc/gitlab-runner/config.toml"),
    };
    let ours = [Some(PathBuf::from("config.toml")), home.map(|h| h.join(".runway").join("config.toml"))];
    std::iter::once(gitlab_runner.clone())
        .chain(ours.into_iter().flatten())
        .find(|p| exists(p))
        .unwrap_or(gitlab_runner)
}

fn expand_env(value: &str) -> String {
    crate::payload::variables::expand(value, &|k| std::env::var(k).ok())
}

/// Parse config text for [`Purpose::Run`]; `path` is used in messages only.
pub fn parse(text: &str, path: &Path) -> Result<Loaded, ConfigError> {
    parse_for(text, path, Purpose::Run)
}

/// Parse config text for `purpose`; `path` is used in messages only.
pub fn parse_for(text: &str, path: &Path, purpose: Purpose) -> Result<Loaded, ConfigError> {
    let mut unknown = Vec::new();
    let deserializer = toml::Deserializer::new(text);
    let mut track = |p: serde_ignored::Path<'_>| unknown.push(p.to_string());
    let ignored = serde_ignored::Deserializer::new(deserializer, &mut track);
    SHELL_SECTIONS.with(|s| s.borrow_mut().clear());
    let result: Result<Config, _> = serde_path_to_error::deserialize(ignored);
    let shell_sections: Vec<Option<toml::Value>> = SHELL_SECTIONS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let mut config = match result {
        Ok(c) => c,
        Err(e) => {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let line = inner.span().map(|s| line_of_offset(text, s.start)).or_else(|| line_of_key(text, &key));
            let message = inner.message().to_string();
            let key = if key == "." || key.is_empty() { line.and_then(|l| key_at_line(text, l)) } else { Some(key) };
            return Err(ConfigError { path: path.to_path_buf(), line, key, message });
        }
    };
    let mut warnings: Vec<ConfigWarning> =
        unknown.iter().filter_map(|k| fidelity::warning(path, line_of_key(text, k), k)).collect();
    // gitlab-runner reads an empty `builds_dir`, `cache_dir` or `shell` as unset (its docs'
    // examples write `builds_dir = ""`).
    for runner in &mut config.runners {
        for value in [&mut runner.builds_dir, &mut runner.cache_dir, &mut runner.shell] {
            if value.as_deref() == Some("") {
                *value = None;
            }
        }
    }
    if purpose == Purpose::Run {
        for (i, e) in missing_connection_keys(text, path, &config) {
            mark_unusable(&mut config.runners[i], e, &mut warnings);
        }
    }
    if config.connection_max_age.is_some() {
        warnings.extend(fidelity::warning(path, line_of_key(text, "connection_max_age"), "connection_max_age"));
    }
    warnings.extend(nested_warnings(text, path, &unknown));
    let err = |key: String, message: String| {
        let line = line_of_key(text, &key);
        ConfigError { path: path.to_path_buf(), line, key: Some(key), message }
    };
    if config.concurrent == 0 {
        return Err(err("concurrent".into(), "must be greater than 0".into()));
    }
    if !["debug", "info", "warn", "warning", "error", "fatal", "panic"].contains(&config.log_level.as_str()) {
        return Err(err(
            "log_level".into(),
            format!("{:?} is not one of debug, info, warn, error, fatal, panic", config.log_level),
        ));
    }
    if !["runner", "text", "json"].contains(&config.log_format.as_str()) {
        return Err(err("log_format".into(), format!("{:?} is not one of runner, text, json", config.log_format)));
    }
    // Re-attach `[runners.shell]` tables to their runners (the `shell` key is both GitLab's
    // shell name and, in Runway, the shell executor's section).
    let mut sections = shell_sections.into_iter();
    for (i, runner) in config.runners.iter_mut().enumerate() {
        if runner.shell.is_none() && text_has_shell_section(text, i) {
            if let Some(Some(table)) = sections.next() {
                runner.sections.insert("shell".into(), table);
            }
        }
    }
    for runner in config.runners.iter_mut() {
        if let Some(a) = runner.autoscaler.as_mut() {
            a.zero_means_default();
        }
    }
    for (i, runner) in config.runners.iter_mut().enumerate() {
        // `url` and `token` keep what the file says (so saving never writes a secret taken
        // from the environment); `resolved_url`/`resolved_token` expand them for use.
        let url = runner.resolved_url();
        if purpose == Purpose::Run && runner.unusable.is_none() {
            let problem = if !(url.starts_with("http://") || url.starts_with("https://")) {
                Some(err(format!("runners[{i}].url"), format!("{url:?} must be an http:// or https:// URL")))
            } else if runner.resolved_token().is_empty() {
                Some(err(format!("runners[{i}].token"), "must not be empty".into()))
            } else if runner.executor.is_empty() {
                Some(err(format!("runners[{i}].executor"), "must name an executor plugin (e.g. \"shell\")".into()))
            } else {
                None
            };
            if let Some(problem) = problem {
                mark_unusable(runner, problem, &mut warnings);
            }
        }
        if purpose == Purpose::Run && runner.executor == "docker-autoscaler" && runner.autoscaler.is_none() {
            return Err(err(
                format!("runners[{i}].executor"),
                "\"docker-autoscaler\" runs jobs on an autoscaled fleet: add a [runners.autoscaler] section".into(),
            ));
        }
        if purpose == Purpose::Run && runner.executor == "docker+machine" && runner.unusable.is_none() {
            docker_machine::derive(runner, i, &err, &mut warnings);
        }
        if runner.request_concurrency == 0 {
            return Err(err(format!("runners[{i}].request_concurrency"), "must be at least 1".into()));
        }
        let no_plugin = runner.autoscaler.as_ref().is_some_and(|a| a.plugin.is_empty());
        if purpose == Purpose::Run && no_plugin && runner.unusable.is_none() {
            let problem = err(format!("runners[{i}].autoscaler.plugin"), "must name a fleeting plugin".into());
            mark_unusable(runner, problem, &mut warnings);
        }
        if let Some(a) = &runner.autoscaler {
            if a.capacity_per_instance == 0 {
                return Err(err(format!("runners[{i}].autoscaler.capacity_per_instance"), "must be at least 1".into()));
            }
            for (p, policy) in a.policies.iter().enumerate() {
                autoscaler::check_periods(&policy.periods, 5)
                    .map_err(|m| err(format!("runners[{i}].autoscaler.policy[{p}].periods"), m.0))?;
            }
        }
        if let Some(m) = &runner.machine {
            for (p, entry) in m.autoscaling.iter().enumerate() {
                autoscaler::check_periods(&entry.periods, 7)
                    .map_err(|msg| err(format!("runners[{i}].machine.autoscaling[{p}].Periods"), msg.0))?;
            }
        }
        if let Some(c) = &runner.cache {
            cache::check(i, c, text, path)?;
        }
        warnings.extend(instance::warnings(i, runner, text, path));
        for (name, value) in &runner.sections {
            let key = format!("runners[{i}].{name}");
            let plugin_section = fidelity::RUNWAY_EXECUTOR_SECTIONS.contains(&name.as_str())
                || *name == runner.executor
                || *name == runner.executor_plugin();
            if plugin_section && value.is_table() {
                continue;
            }
            // gitlab-runner's keys and sections Runway does not act on (kubernetes,
            // virtualbox, custom_build_dir, referees, ...): named, never silently absorbed.
            if fidelity::is_gitlab_runner_key(&key) || fidelity::is_honoured_elsewhere(&key) {
                warnings.extend(fidelity::warning(path, line_of_key(text, &key), &key));
                continue;
            }
            let known = GITLAB_RUNNER_SECTIONS.contains(&name.as_str());
            if value.is_table() && !known {
                return Err(err(
                    format!("runners[{i}].{name}"),
                    format!(
                        "unknown section [runners.{name}]: not this runner's executor ({:?}), an executor section ({}) or a GitLab runner section ({})",
                        runner.executor,
                        EXECUTOR_SECTIONS.join(", "),
                        GITLAB_RUNNER_SECTIONS.join(", ")
                    ),
                ));
            }
            warnings.extend(fidelity::warning(path, line_of_key(text, &key), &key));
        }
        let executor = runner.executor.clone();
        let plugin = runner.executor_plugin().to_string();
        runner.sections.retain(|name, v| {
            v.is_table()
                && (fidelity::RUNWAY_EXECUTOR_SECTIONS.contains(&name.as_str()) || *name == executor || *name == plugin)
        });
    }
    for (i, runner) in config.runners.iter().enumerate() {
        let token = runner.resolved_token();
        let url = runner.resolved_url();
        let first = config.runners[..i].iter().position(|r| r.resolved_token() == token && r.resolved_url() == url);
        if let (Some(first), false) = (first, token.is_empty()) {
            return Err(err(
                format!("runners[{i}].token"),
                format!("runners[{first}] has the same url and token: a runner must be configured once"),
            ));
        }
    }
    limits::check(&config, text, path, purpose)?;
    if config.concurrent < config.runners.len() {
        warnings.push(ConfigWarning::new(
            WarningKind::Other,
            format!(
                "{}: CONFIGURATION: Long polling issues detected: concurrent ({}) is lower than the number of runners ({}); some runners' long polls will wait for capacity",
                path.display(),
                config.concurrent,
                config.runners.len()
            ),
        ));
    }
    Ok(Loaded { config, warnings, path: path.to_path_buf() })
}

/// Warnings for keys of the runners' typed sub-tables (`[runners.cache]`,
/// `[runners.autoscaler]`, `[runners.machine]`, `[runners.store]`) their models do not read,
/// leaving out what `already` reported.
fn nested_warnings(text: &str, path: &Path, already: &[String]) -> Vec<ConfigWarning> {
    let Ok(table) = text.parse::<toml::Table>() else { return Vec::new() };
    let Some(runners) = table.get("runners").and_then(toml::Value::as_array) else { return Vec::new() };
    let seen: std::collections::BTreeSet<String> = already.iter().map(|k| fidelity::normalize(k)).collect();
    let mut out = Vec::new();
    for (i, runner) in runners.iter().enumerate() {
        let Some(runner) = runner.as_table() else { continue };
        for (section, value) in runner {
            let ignored = match section.as_str() {
                "cache" => fidelity::ignored_keys::<cache::CacheConfig>(value),
                "autoscaler" => {
                    let mut keys = fidelity::ignored_keys::<autoscaler::AutoscalerConfig>(value);
                    // Read, but Runway's engine has no reservation throttle to turn off or on.
                    keys.extend(value.get("reservation_throttling").map(|_| "reservation_throttling".to_string()));
                    keys
                }
                "machine" => {
                    // The legacy keys Runway maps onto fleets; the rest is kept unread.
                    let other = value.clone().try_into::<autoscaler::MachineConfig>().map(|m| m.other);
                    let mut keys: Vec<String> = other.map(|o| o.into_keys().collect()).unwrap_or_default();
                    keys.extend(value.get("MaxRemovalAttempts").map(|_| "MaxRemovalAttempts".to_string()));
                    // Only docker+machine creates machines with a driver; elsewhere they say nothing.
                    if runner.get("executor").and_then(toml::Value::as_str) != Some("docker+machine") {
                        let driver = ["MachineDriver", "MachineName", "MachineOptions"];
                        keys.extend(driver.into_iter().filter(|k| value.get(*k).is_some()).map(str::to_string));
                    }
                    keys
                }
                "store" => fidelity::ignored_keys::<store::StoreConfig>(value),
                _ => continue,
            };
            for key in ignored {
                let key = format!("runners.{i}.{section}.{key}");
                let normalized = fidelity::normalize(&key);
                if seen.iter().any(|s| *s == normalized) {
                    continue;
                }
                out.extend(fidelity::warning(path, line_of_key(text, &key), &key));
            }
        }
    }
    out
}

/// Read and parse a config file for [`Purpose::Run`].
pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
    load_for(path, Purpose::Run)
}

/// Read and parse a config file for `purpose`.
pub fn load_for(path: &Path, purpose: Purpose) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, e.to_string()))?;
    parse_for(&text, path, purpose)
}

/// The keys [`Purpose::Run`] needs that the model reads as empty when absent: for each runner,
/// the first absent one, as serde would report a missing field of its table. Keys present but
/// empty are left to the value checks of [`parse_for`].
fn missing_connection_keys(text: &str, path: &Path, config: &Config) -> Vec<(usize, ConfigError)> {
    let suspect = config.runners.iter().any(|r| {
        r.url.is_empty()
            || r.token.is_empty()
            || r.executor.is_empty()
            || r.autoscaler.as_ref().is_some_and(|a| a.plugin.is_empty())
    });
    let Some(runners) = suspect
        .then(|| toml::from_str::<toml::Table>(text).ok())
        .flatten()
        .and_then(|t| t.get("runners").and_then(toml::Value::as_array).cloned())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, runner) in runners.iter().enumerate() {
        let Some(runner) = runner.as_table() else { continue };
        let header = runner_header_line(text, i);
        if let Some(key) = ["url", "token", "executor"].into_iter().find(|k| !runner.contains_key(*k)) {
            out.push((
                i,
                ConfigError::new(path, format!("missing field `{key}`"))
                    .at_line(header)
                    .with_key(format!("runners[{i}]")),
            ));
            continue;
        }
        if let Some(autoscaler) = runner.get("autoscaler").and_then(toml::Value::as_table) {
            if !autoscaler.contains_key("plugin") {
                let line = header.and_then(|h| sub_table_line(text, h, "[runners.autoscaler]"));
                out.push((
                    i,
                    ConfigError::new(path, "missing field `plugin`")
                        .at_line(line)
                        .with_key(format!("runners[{i}].autoscaler")),
                ));
            }
        }
    }
    out
}

/// Leave `runner` out of `runway run` for `problem` (its file, line and key), with a warning
/// saying so; the other runners serve.
fn mark_unusable(runner: &mut RunnerConfig, problem: ConfigError, warnings: &mut Vec<ConfigWarning>) {
    warnings.push(ConfigWarning::new(
        WarningKind::Other,
        format!("{problem}: runner {:?} cannot ask GitLab for jobs and is left out", runner.name),
    ));
    runner.unusable = Some(problem.to_string());
}

/// Write `config` to `path` atomically with mode 0600 (it holds tokens).
pub fn save(path: &Path, config: &Config) -> anyhow::Result<()> {
    let text = toml::to_string_pretty(config)?;
    crate::store::atomic::write_private(path, text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests;
