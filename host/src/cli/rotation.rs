//! Automatic token rotation of `runway run` (gitlab-runner's `resetRunnerTokens`): for the
//! runner whose rotation is due first — `token_obtained_at + 0.75 × (token_expires_at −
//! token_obtained_at)` — the token is reset through `POST /runners/reset_authentication_token`,
//! written into config.toml in place (every other key and comment kept), and the manager is
//! told to reload, so its pollers go on with the new token while running jobs finish.
//! `FF_DISABLE_AUTOMATIC_TOKEN_ROTATION` in a runner's `feature_flags` only warns.
//!
//! Owns the schedule; the reset itself and the edit are `setup::reset_runner_token`'s.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc::UnboundedSender;

use crate::config::{self, Config};
use crate::manager::Shutdown;

/// gitlab-runner's `TokenResetIntervalFactor`.
const RESET_FACTOR: f64 = 0.75;
/// Longest sleep before the file is read again (a reload or `reset-token` may change it).
const RECHECK: Duration = Duration::from_secs(60);
/// Longest wait between two failed resets of one token.
const MAX_RETRY: Duration = Duration::from_secs(30 * 60);

/// When the token of `runner` is due for a reset; `None` when it does not expire. A token
/// without `token_obtained_at` is due at once (its lifetime is unknown).
pub(super) fn reset_time(
    obtained_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    let expires = expires_at?;
    let Some(obtained) = obtained_at else { return Some(DateTime::<Utc>::UNIX_EPOCH) };
    let lifetime = (expires - obtained).num_milliseconds().max(0) as f64;
    Some(obtained + chrono::Duration::milliseconds((lifetime * RESET_FACTOR) as i64))
}

/// The runner whose reset is due first (index, time), leaving out tokens in `skip`.
pub(super) fn next_reset(config: &Config, skip: &HashSet<String>) -> Option<(usize, DateTime<Utc>)> {
    config
        .runners
        .iter()
        .enumerate()
        .filter(|(_, r)| !skip.contains(&r.token))
        .filter_map(|(i, r)| reset_time(r.token_obtained_at, r.token_expires_at).map(|at| (i, at)))
        .min_by_key(|(_, at)| *at)
}

async fn sleep_or_stop(wait: Duration, shutdown: &Shutdown) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(wait) => true,
        _ = shutdown.graceful.cancelled() => false,
        _ = shutdown.forceful.cancelled() => false,
    }
}

/// Rotate tokens until shut down; `reload` is sent after every rotation written.
pub(super) async fn rotate_tokens(path: PathBuf, system_id: String, reload: UnboundedSender<()>, shutdown: Shutdown) {
    let mut skip: HashSet<String> = HashSet::new();
    let mut failures: HashMap<String, u32> = HashMap::new();
    loop {
        let loaded = match config::load(&path) {
            Ok(loaded) => loaded,
            Err(e) => {
                tracing::debug!("token rotation: {e}");
                if !sleep_or_stop(RECHECK, &shutdown).await {
                    return;
                }
                continue;
            }
        };
        let Some((index, at)) = next_reset(&loaded.config, &skip) else {
            if !sleep_or_stop(RECHECK, &shutdown).await {
                return;
            }
            continue;
        };
        let runner = &loaded.config.runners[index];
        let short = config::short_token(&runner.resolved_token());
        let retry_at = failures.get(&runner.token).map(|n| {
            let wait = Duration::from_secs(60u64.saturating_mul(1 << (*n).min(10))).min(MAX_RETRY);
            Utc::now() + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX)
        });
        let due = retry_at.map_or(at, |r| r.max(at));
        let wait = (due - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        if !wait.is_zero() {
            if !sleep_or_stop(wait.min(RECHECK), &shutdown).await {
                return;
            }
            continue;
        }
        if runner.feature_flags.get("FF_DISABLE_AUTOMATIC_TOKEN_ROTATION") == Some(&true) {
            tracing::warn!(
                runner = %short,
                name = %runner.name,
                "Automatic token rotation is disabled for this runner (FF_DISABLE_AUTOMATIC_TOKEN_ROTATION); its token expires at {}",
                runner.token_expires_at.map(|t| t.to_rfc3339()).unwrap_or_default()
            );
            skip.insert(runner.token.clone());
            continue;
        }
        match super::setup::reset_runner_token(&path, index, runner, &system_id, None).await {
            Ok(update) => {
                failures.remove(&runner.token);
                tracing::info!(
                    runner = %short,
                    name = %runner.name,
                    new_runner = %config::short_token(&update.token),
                    expires_at = %update.expires_at.map(|t| t.to_rfc3339()).unwrap_or_else(|| "never".into()),
                    "runner authentication token rotated; {} updated",
                    path.display()
                );
                let _ = reload.send(());
            }
            Err(e) => {
                let n = failures.entry(runner.token.clone()).or_default();
                *n += 1;
                tracing::error!(
                    runner = %short,
                    name = %runner.name,
                    "Resetting runner authentication token... failed (attempt {n}): {e:#}; the token expires at {}",
                    runner.token_expires_at.map(|t| t.to_rfc3339()).unwrap_or_default()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().expect("datetime")
    }

    #[test]
    fn the_reset_is_due_at_three_quarters_of_the_lifetime_earliest_first() {
        assert_eq!(
            reset_time(Some(at("2026-01-01T00:00:00Z")), Some(at("2026-01-05T00:00:00Z"))),
            Some(at("2026-01-04T00:00:00Z"))
        );
        assert_eq!(reset_time(Some(at("2026-01-01T00:00:00Z")), None), None);
        assert_eq!(reset_time(None, Some(at("2026-01-05T00:00:00Z"))), Some(DateTime::<Utc>::UNIX_EPOCH));
        let text = "concurrent = 1\n[[runners]]\nurl = \"https://x\"\ntoken = \"a\"\nexecutor = \"shell\"\ntoken_obtained_at = 2026-01-01T00:00:00Z\ntoken_expires_at = 2026-03-01T00:00:00Z\n[[runners]]\nurl = \"https://x\"\ntoken = \"b\"\nexecutor = \"shell\"\ntoken_obtained_at = 2026-01-01T00:00:00Z\ntoken_expires_at = 2026-02-01T00:00:00Z\n[[runners]]\nurl = \"https://x\"\ntoken = \"c\"\nexecutor = \"shell\"\n";
        let config = config::parse(text, std::path::Path::new("c.toml")).expect("loads").config;
        let (index, when) = next_reset(&config, &HashSet::new()).expect("due");
        assert_eq!((index, when), (1, at("2026-01-24T06:00:00Z")));
        let (index, _) = next_reset(&config, &HashSet::from(["b".to_string()])).expect("due");
        assert_eq!(index, 0);
    }
}
