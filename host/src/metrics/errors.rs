//! `gitlab_runner_errors_total{level}`: the warnings and errors the runner logged, counted
//! by a `tracing` layer installed with the log subscriber at start (before any metrics
//! exist), so the count covers the whole process.
//!
//! Owns the layer and its counters; must not format or filter log output (the subscriber's
//! other layers do).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

static WARNINGS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);

/// Counts every `WARN` and `ERROR` event that passes the subscriber's filter.
#[derive(Debug, Default, Clone, Copy)]
pub struct ErrorCounter;

impl<S: Subscriber> Layer<S> for ErrorCounter {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        match *event.metadata().level() {
            Level::ERROR => ERRORS.fetch_add(1, Ordering::Relaxed),
            Level::WARN => WARNINGS.fetch_add(1, Ordering::Relaxed),
            _ => return,
        };
    }
}

/// The family in Prometheus text, with GitLab Runner's four levels (`panic` and `fatal`
/// stay 0: a Rust runner has no such log levels).
pub(super) fn render(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP gitlab_runner_errors_total The number of caught errors.\n# TYPE gitlab_runner_errors_total counter"
    );
    for (level, count) in [
        ("error", ERRORS.load(Ordering::Relaxed)),
        ("fatal", 0),
        ("panic", 0),
        ("warning", WARNINGS.load(Ordering::Relaxed)),
    ] {
        let _ = writeln!(out, "gitlab_runner_errors_total{{level=\"{level}\"}} {count}");
    }
}
