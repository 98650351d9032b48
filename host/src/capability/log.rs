//! `runway:host/log`: plugin log lines into the runner's `tracing` output, bounded and made
//! harmless.
//!
//! - A token bucket per plugin ([`LogLimiter`], `[plugins.NAME] log_lines_per_second`, a burst
//!   of five seconds' worth): a line costs one token per started KiB, lines without a token are
//!   dropped and counted, and the count is reported in the runner's log (when dropping starts,
//!   then at most every [`REPORT_EVERY`] with the plugin's next line).
//! - Control characters (newlines, carriage returns, escape sequences) are escaped, so a
//!   plugin cannot forge runner-log lines or rewrite the terminal.
//! - Lines over 64 KiB are cut (the WIT contract).
//!
//! Owns: [`LogCtx`], [`LogLimiter`] and the `log` host trait. Must not touch: plugins or stores
//! (the plugin host links this interface by projecting its store data onto a `&mut LogCtx`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::bindings::executor::runway::host0_1_0::log::{Host, Level};

/// Longest line kept; the rest is cut.
const MAX_LINE: usize = 64 * 1024;

/// Seconds of rate a burst may use.
const BURST_SECONDS: f64 = 5.0;

/// Least time between two reports of dropped lines.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

struct Bucket {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
    /// When the current run of dropped lines started (reported then).
    dropping_since: Option<Instant>,
    last_report: Instant,
}

/// What the limiter decided about one line.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Log it, after reporting `dropped` lines dropped since `since` when that is not zero.
    Log { dropped: u64, since: Duration },
    /// Drop it; `announce` when it starts a run of dropped lines.
    Drop { announce: bool },
}

/// One plugin's log budget: a token bucket shared by all its instances.
pub struct LogLimiter {
    rate: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
}

impl LogLimiter {
    /// `lines_per_second` lines (of up to 1 KiB) per second, bursts of five seconds' worth.
    pub fn new(lines_per_second: u64) -> Self {
        let rate = lines_per_second as f64;
        let burst = (rate * BURST_SECONDS).max(if rate > 0.0 { 1.0 } else { 0.0 });
        let now = Instant::now();
        LogLimiter {
            rate,
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                refilled: now,
                dropped: 0,
                dropping_since: None,
                last_report: now,
            }),
        }
    }

    fn admit(&self, bytes: usize, now: Instant) -> Verdict {
        let cost = bytes.div_ceil(1024).max(1) as f64;
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(b.refilled).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.refilled = now;
        if b.tokens >= cost {
            b.tokens -= cost;
            let mut verdict = Verdict::Log { dropped: 0, since: Duration::ZERO };
            if b.dropped > 0 && now.saturating_duration_since(b.last_report) >= REPORT_EVERY {
                let since = b.dropping_since.map(|s| now.saturating_duration_since(s)).unwrap_or_default();
                verdict = Verdict::Log { dropped: b.dropped, since };
                b.dropped = 0;
                b.dropping_since = None;
                b.last_report = now;
            }
            verdict
        } else {
            b.dropped += 1;
            let announce = b.dropping_since.is_none();
            if announce {
                b.dropping_since = Some(now);
            }
            Verdict::Drop { announce }
        }
    }
}

/// `message` with control characters escaped (`\n`, `\r`, `\u{1b}`, ...) and cut to 64 KiB.
pub fn sanitize(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_LINE) + 16);
    for c in message.chars() {
        if out.len() >= MAX_LINE {
            out.push_str(" [truncated]");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The `log` capability's state: the name its lines are tagged with and the plugin's budget.
pub struct LogCtx {
    plugin: Arc<str>,
    limiter: Arc<LogLimiter>,
}

impl LogCtx {
    /// Log lines of `plugin`, within `limiter`'s budget.
    pub fn new(plugin: Arc<str>, limiter: Arc<LogLimiter>) -> Self {
        LogCtx { plugin, limiter }
    }
}

impl Host for LogCtx {
    async fn write(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let plugin = &*self.plugin;
        match self.limiter.admit(message.len().min(MAX_LINE), Instant::now()) {
            Verdict::Drop { announce: true } => {
                let rate = self.limiter.rate;
                tracing::warn!(plugin, "plugin log lines dropped from here on: over log_lines_per_second = {rate}");
                return Ok(());
            }
            Verdict::Drop { announce: false } => return Ok(()),
            Verdict::Log { dropped, since } => {
                if dropped > 0 {
                    let rate = self.limiter.rate;
                    tracing::warn!(
                        plugin,
                        "{dropped} plugin log lines dropped in {:.0?} (log_lines_per_second = {rate})",
                        since
                    );
                }
            }
        }
        let message = sanitize(&message);
        match level {
            Level::Trace => tracing::trace!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Error => tracing::error!(plugin, "{message}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(sanitize("a\nFORGED\r\x1b[2K\tb"), "a\\nFORGED\\r\\u{1b}[2K\\tb");
        assert_eq!(sanitize("plain é"), "plain é");
        assert!(sanitize(&"x".repeat(100_000)).len() <= MAX_LINE + 16);
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate_and_reports_drops() {
        let limiter = LogLimiter::new(10);
        let start = Instant::now();
        let logged = (0..200).filter(|_| matches!(limiter.admit(10, start), Verdict::Log { .. })).count();
        assert_eq!(logged, 50, "a burst of five seconds");
        assert_eq!(limiter.admit(10, start), Verdict::Drop { announce: false });
        // A long line costs one token per started KiB.
        let later = start + Duration::from_secs(1);
        assert!(matches!(limiter.admit(10 * 1024 + 1, later), Verdict::Drop { .. }));
        assert!(matches!(limiter.admit(10 * 1024, later), Verdict::Log { dropped: 0, .. }));
        // After REPORT_EVERY, the next line carries the count.
        let much_later = start + REPORT_EVERY + Duration::from_secs(1);
        assert!(matches!(limiter.admit(1, much_later), Verdict::Log { dropped: 152, .. }));
        assert_eq!(LogLimiter::new(0).admit(1, start), Verdict::Drop { announce: true });
    }
}
