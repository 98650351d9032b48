//! Runners that cannot serve yet, and the health of every runner: a `[[runners]]` entry whose
//! executor plugin is missing or unusable (a truncated file, an `info()` that traps, loops or
//! fails) does not stop the manager. It is reported unhealthy (log, [`HealthBoard`] for the
//! metrics and health endpoints), requests no jobs, and its resolution is retried until the
//! plugin works (hot reload), when the runner starts serving.
//!
//! Owns: the [`RunnerEntry`] a manager is built from and the per-runner health record. Must not
//! touch: plugins or config (the resolver closure comes from `cli`), metrics rendering.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::RunnerSettings;

/// Why a runner cannot serve (its executor could not be resolved).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unusable(pub String);

/// Longest error text kept for logs, metrics and health (a plugin may return megabytes).
const MAX_ERROR_CHARS: usize = 500;

impl Unusable {
    /// `message`, shortened to a few hundred characters, control characters escaped.
    pub fn new(message: &str) -> Self {
        let mut text: String = message.chars().take(MAX_ERROR_CHARS).flat_map(char::escape_default).collect();
        if message.chars().nth(MAX_ERROR_CHARS).is_some() {
            text.push_str(&format!("… ({} bytes in all)", message.len()));
        }
        Unusable(text)
    }
}

/// A future resolving a runner's settings.
pub type ResolveFuture = Pin<Box<dyn Future<Output = Result<RunnerSettings, Unusable>> + Send>>;

/// Resolves a runner's settings (its executor plugin first); called again after a failure.
pub type Resolve = Arc<dyn Fn() -> ResolveFuture + Send + Sync>;

/// A runner whose settings are resolved by the manager, retried until they resolve.
#[derive(Clone)]
pub struct PendingRunner {
    /// `name` from config.toml (for logs and metrics).
    pub name: String,
    /// The runner's short token (the metrics label).
    pub short_token: String,
    /// Builds the settings; an error leaves the runner unhealthy until the next try.
    pub resolve: Resolve,
    /// Wait between tries.
    pub retry_every: Duration,
}

/// One `[[runners]]` entry as the manager receives it.
pub enum RunnerEntry {
    /// Resolved already: serve at once.
    Ready(Box<RunnerSettings>),
    /// To be resolved by the manager (and retried while it fails).
    Pending(PendingRunner),
}

/// What the manager knows about one runner's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerStatus {
    /// `name` from config.toml.
    pub name: String,
    /// Serving (requesting jobs) or not.
    pub healthy: bool,
    /// Why not, when unhealthy.
    pub error: Option<String>,
    /// Failed resolution attempts so far (GitLab Runner's
    /// `gitlab_runner_worker_health_check_failures_total`).
    pub failures: u64,
}

/// The health of every runner of a manager, by short token.
#[derive(Debug, Default)]
pub struct HealthBoard {
    runners: Mutex<BTreeMap<String, RunnerStatus>>,
}

impl HealthBoard {
    fn update(&self, short_token: &str, name: &str, change: impl FnOnce(&mut RunnerStatus)) {
        let mut runners = self.runners.lock().unwrap_or_else(|p| p.into_inner());
        let status = runners.entry(short_token.to_string()).or_insert_with(|| RunnerStatus {
            name: name.to_string(),
            healthy: false,
            error: None,
            failures: 0,
        });
        change(status);
    }

    /// The runner serves.
    pub fn set_healthy(&self, short_token: &str, name: &str) {
        self.update(short_token, name, |s| {
            s.healthy = true;
            s.error = None;
        });
    }

    /// The runner cannot serve, because of `error`.
    pub fn set_unhealthy(&self, short_token: &str, name: &str, error: &Unusable) {
        self.update(short_token, name, |s| {
            s.healthy = false;
            s.error = Some(error.0.clone());
            s.failures += 1;
        });
    }

    /// Every runner's status, by short token.
    pub fn snapshot(&self) -> BTreeMap<String, RunnerStatus> {
        self.runners.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_errors_are_shortened_and_escaped() {
        let e = Unusable::new(&format!("bad\nline {}", "x".repeat(10_000)));
        assert!(e.0.starts_with("bad\\nline xxx"), "{}", e.0);
        assert!(e.0.len() < 700 && e.0.ends_with("(10009 bytes in all)"), "{}", e.0);
        assert_eq!(Unusable::new("short").0, "short");
    }

    #[test]
    fn board_tracks_failures_and_recovery() {
        let board = HealthBoard::default();
        board.set_unhealthy("abc", "r", &Unusable::new("missing"));
        board.set_unhealthy("abc", "r", &Unusable::new("missing"));
        let s = &board.snapshot()["abc"];
        assert_eq!((s.healthy, s.failures, s.error.as_deref()), (false, 2, Some("missing")));
        board.set_healthy("abc", "r");
        let s = &board.snapshot()["abc"];
        assert_eq!((s.healthy, s.failures, s.error.as_deref()), (true, 2, None));
    }
}
