//! `router.toml`, the file of `runway router -c`: where the router serves the runner API to
//! downstream runners, which GitLab registrations it polls upstream, which downstream runners
//! may ask it for jobs (tokens, tags, weights), its queue policy and timeouts, and where its
//! queue lives (`[router.store]`, the job store's backends).
//!
//! Owns the model, its defaults and ranges, and errors that name file, line and key (unknown
//! keys are errors here: the file is Runway's own, so a typo must not pass silently). Must not
//! open sockets or stores, or know how the router uses a value (the `router` module does).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::duration::duration_secs;
use crate::config::lines::{key_at_line, line_of_key, line_of_offset};
use crate::config::store::{StoreConfig, StoreName};
use crate::config::ConfigError;
use crate::store::jobs::{Backend, StoreSettings};

/// The whole `router.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterFile {
    /// Metrics and health endpoints (`/metrics`, `/health`, `/ready`), as for `run`.
    #[serde(default)]
    pub listen_address: Option<String>,
    /// Log level, as in config.toml.
    #[serde(default)]
    pub log_level: Option<String>,
    /// Log format, as in config.toml.
    #[serde(default)]
    pub log_format: Option<String>,
    /// `[router]`.
    pub router: RouterConfig,
}

/// How the router picks the next job for a downstream runner.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Oldest job first.
    Fifo,
    /// Round robin by project, then by pipeline within a project; oldest job of that pipeline.
    #[default]
    Fair,
    /// Oldest job first, and among several waiting runners the one furthest below its share
    /// (`weight`) of dispatches.
    Weighted,
}

fn d_request_concurrency() -> usize {
    4
}
fn d_weight() -> u32 {
    1
}
fn d_long_poll() -> Duration {
    Duration::from_secs(50)
}
fn d_accept_timeout() -> Duration {
    Duration::from_secs(120)
}
fn d_lease_timeout() -> Duration {
    Duration::from_secs(120)
}
fn d_keepalive() -> Duration {
    Duration::from_secs(30)
}
fn d_queue_size() -> usize {
    100
}
fn d_store() -> StoreConfig {
    StoreConfig::default()
}

/// `[router]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    /// Address the runner API is served on to downstream runners (`host:port`).
    pub listen: String,
    /// PEM certificate chain for serving the runner API over TLS (with `tls_key_file`).
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// `fifo`, `fair` or `weighted`.
    #[serde(default)]
    pub policy: Policy,
    /// How long a downstream job request is held when there is no job for it (Workhorse's
    /// long poll; gitlab-runner's default 50 s).
    #[serde(default = "d_long_poll", with = "duration_secs")]
    pub long_poll_timeout: Duration,
    /// How long a downstream has, after it got a job, to accept it (`PUT state=running`) or to
    /// ping it (`PUT state=pending`) before the job is taken back and offered to another one.
    #[serde(default = "d_accept_timeout", with = "duration_secs")]
    pub accept_timeout: Duration,
    /// How long a downstream that accepted a job may stay silent (no trace patch, no update)
    /// before the job is failed upstream with `runner_system_failure`. Must be longer than the
    /// downstream's keep-alive (gitlab-runner and Runway touch a silent job every 30 s).
    #[serde(default = "d_lease_timeout", with = "duration_secs")]
    pub lease_timeout: Duration,
    /// How often jobs held for downstreams are kept `pending` upstream (`PUT state=pending`).
    #[serde(default = "d_keepalive", with = "duration_secs")]
    pub keepalive_interval: Duration,
    /// How many jobs the router may hold upstream, not yet given to a downstream, while
    /// downstreams are polling: room for the policy to choose (0: strictly one job per
    /// waiting downstream request).
    #[serde(default = "d_queue_size")]
    pub queue_size: usize,
    /// `[[router.upstream]]`.
    #[serde(default)]
    pub upstream: Vec<UpstreamConfig>,
    /// `[[router.downstream]]`.
    #[serde(default)]
    pub downstream: Vec<DownstreamConfig>,
    /// `[router.store]`: where the queue and the leases survive a restart.
    #[serde(default = "d_store")]
    pub store: StoreConfig,
}

/// `[[router.upstream]]`: one GitLab runner registration the router polls for jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// GitLab's URL.
    pub url: String,
    /// The runner authentication token (`glrt-…`); `$VAR` is expanded from the environment.
    pub token: String,
    /// Job requests in flight at once to this registration.
    #[serde(default = "d_request_concurrency")]
    pub request_concurrency: usize,
    /// Extra CA certificates (PEM) to trust for this GitLab.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
}

/// `[[router.downstream]]`: a runner (or a group sharing one token) allowed to ask for jobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownstreamConfig {
    /// Name in logs and metrics.
    pub name: String,
    /// The token that runner has as `token` in its own config.toml; `$VAR` is expanded.
    pub token: String,
    /// Job tags this downstream takes: a tagged job goes only to a downstream having all its
    /// tags. Absent: every job.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
    /// Share of dispatches under `policy = "weighted"`.
    #[serde(default = "d_weight")]
    pub weight: u32,
}

/// The loaded file: the model and where it was read from.
#[derive(Debug, Clone)]
pub struct LoadedRouter {
    /// The file's path.
    pub path: PathBuf,
    /// Its content.
    pub file: RouterFile,
}

impl LoadedRouter {
    /// The directory of the file (identity, store key, default store path).
    pub fn dir(&self) -> PathBuf {
        match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }

    /// `[router.store]` as the store takes it: the file backend under
    /// `<dir>/.runway/router-store` unless `[router.store.file] path` says otherwise (relative
    /// to the file's directory), Redis in namespace `router`.
    pub fn store_settings(&self) -> StoreSettings {
        let store = &self.file.router.store;
        let backend = match store.name {
            StoreName::None => None,
            StoreName::File => {
                let path = store.file.as_ref().and_then(|f| f.path.clone()).map(|p| expand_env(&p));
                let path = match path {
                    Some(p) if Path::new(&p).is_absolute() => PathBuf::from(p),
                    Some(p) => self.dir().join(p),
                    None => self.dir().join(".runway").join("router-store"),
                };
                Some(Backend::File { path })
            }
            StoreName::Redis => Some(Backend::Redis {
                url: expand_env(&store.redis.as_ref().map(|r| r.url.clone()).unwrap_or_default()),
                namespace: "router".into(),
            }),
        };
        StoreSettings {
            migrate_from: None,
            backend,
            health_interval: store.health_interval,
            health_timeout: store.health_timeout,
            stale_timeout: store.stale_timeout,
            cleanup_interval: store.cleanup_interval,
            max_retries: store.max_retries,
        }
    }
}

fn expand_env(value: &str) -> String {
    crate::payload::variables::expand(value, &|k| std::env::var(k).ok())
}

/// Read and check `router.toml` at `path`.
pub fn load(path: &Path) -> Result<LoadedRouter, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::new(path, format!("cannot read: {e}")))?;
    parse(&text, path)
}

/// Parse and check router.toml text; `path` is used in messages only.
pub fn parse(text: &str, path: &Path) -> Result<LoadedRouter, ConfigError> {
    let deserializer = toml::Deserializer::new(text);
    let file: RouterFile = match serde_path_to_error::deserialize(deserializer) {
        Ok(f) => f,
        Err(e) => {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let line = inner.span().map(|s| line_of_offset(text, s.start)).or_else(|| line_of_key(text, &key));
            let key = if key == "." || key.is_empty() { line.and_then(|l| key_at_line(text, l)) } else { Some(key) };
            return Err(ConfigError { path: path.to_path_buf(), line, key, message: inner.message().to_string() });
        }
    };
    let err = |key: String, message: String| ConfigError {
        path: path.to_path_buf(),
        line: line_of_key(text, &key),
        key: Some(key),
        message,
    };
    let r = &file.router;
    if r.listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(err("router.listen".into(), format!("{:?} is not an address like 0.0.0.0:8080", r.listen)));
    }
    if r.tls_cert_file.is_some() != r.tls_key_file.is_some() {
        return Err(err("router.tls_cert_file".into(), "tls_cert_file and tls_key_file go together".into()));
    }
    if r.upstream.is_empty() {
        return Err(err("router".into(), "needs at least one [[router.upstream]]".into()));
    }
    if r.downstream.is_empty() {
        return Err(err("router".into(), "needs at least one [[router.downstream]]".into()));
    }
    for (key, d) in [
        ("router.long_poll_timeout", r.long_poll_timeout),
        ("router.accept_timeout", r.accept_timeout),
        ("router.lease_timeout", r.lease_timeout),
        ("router.keepalive_interval", r.keepalive_interval),
    ] {
        if d.is_zero() || d > Duration::from_secs(86_400) {
            return Err(err(key.into(), format!("{d:?} must be more than 0 and at most 24h")));
        }
    }
    if r.queue_size > 100_000 {
        return Err(err("router.queue_size".into(), "must be at most 100000".into()));
    }
    for (i, u) in r.upstream.iter().enumerate() {
        let url = expand_env(&u.url);
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(err(
                format!("router.upstream[{i}].url"),
                format!("{url:?} must be an http:// or https:// URL"),
            ));
        }
        if expand_env(&u.token).is_empty() {
            return Err(err(format!("router.upstream[{i}].token"), "must not be empty".into()));
        }
        if u.request_concurrency == 0 || u.request_concurrency > 1000 {
            return Err(err(format!("router.upstream[{i}].request_concurrency"), "must be 1 to 1000".into()));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    let mut tokens = std::collections::BTreeSet::new();
    for (i, d) in r.downstream.iter().enumerate() {
        if d.name.is_empty() || !names.insert(d.name.clone()) {
            return Err(err(
                format!("router.downstream[{i}].name"),
                format!("{:?} must be non-empty and unique", d.name),
            ));
        }
        let token = expand_env(&d.token);
        if token.is_empty() || !tokens.insert(token) {
            return Err(err(format!("router.downstream[{i}].token"), "must be non-empty and unique".into()));
        }
        if d.weight == 0 {
            return Err(err(format!("router.downstream[{i}].weight"), "must be at least 1".into()));
        }
    }
    if r.store.name == StoreName::Redis && r.store.redis.as_ref().is_none_or(|x| x.url.is_empty()) {
        return Err(err("router.store.redis.url".into(), "name = \"redis\" needs [router.store.redis] url".into()));
    }
    Ok(LoadedRouter { path: path.to_path_buf(), file })
}

/// The token of an upstream or downstream with `$VAR` expanded.
pub fn resolved(token: &str) -> String {
    expand_env(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen_address = "127.0.0.1:9253"
[router]
  listen = "127.0.0.1:8080"
  policy = "weighted"
  [[router.upstream]]
    url = "https://gitlab.example.com/"
    token = "glrt-abc"
  [[router.downstream]]
    name = "fleet-a"
    token = "a"
    tags = ["linux"]
    weight = 3
  [[router.downstream]]
    name = "fleet-b"
    token = "b"
"#;

    #[test]
    fn a_full_file_loads_with_defaults() {
        let loaded = parse(GOOD, Path::new("/etc/runway/router.toml")).expect("loads");
        let r = &loaded.file.router;
        assert_eq!(r.policy, Policy::Weighted);
        assert_eq!(r.upstream[0].request_concurrency, 4);
        assert_eq!(r.downstream[0].weight, 3);
        assert_eq!(r.downstream[1].tags, None);
        assert_eq!(r.long_poll_timeout, Duration::from_secs(50));
        assert_eq!(r.queue_size, 100);
        let settings = loaded.store_settings();
        assert_eq!(settings.backend, Some(Backend::File { path: PathBuf::from("/etc/runway/.runway/router-store") }));
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let typo = GOOD.replace("policy = \"weighted\"", "polcy = \"weighted\"");
        let e = parse(&typo, Path::new("r.toml")).expect_err("unknown key");
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("polcy"), "{e}");
        let bad = GOOD.replace("weight = 3", "weight = 0");
        let e = parse(&bad, Path::new("r.toml")).expect_err("weight 0");
        assert_eq!(e.key.as_deref(), Some("router.downstream[0].weight"));
        assert_eq!(e.line, Some(13), "{e}");
        let dup = GOOD.replace("token = \"b\"", "token = \"a\"");
        let e = parse(&dup, Path::new("r.toml")).expect_err("duplicate token");
        assert_eq!(e.key.as_deref(), Some("router.downstream[1].token"));
        let listen = GOOD.replace("127.0.0.1:8080", "localhost");
        assert!(parse(&listen, Path::new("r.toml")).expect_err("listen").to_string().contains("router.listen"));
        let policy = GOOD.replace("\"weighted\"", "\"random\"");
        let e = parse(&policy, Path::new("r.toml")).expect_err("policy");
        assert_eq!(e.line, Some(5), "{e}");
    }
}
