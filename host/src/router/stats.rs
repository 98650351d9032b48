//! The router's counters: downstream job requests and dispatches, declines and lost runners by
//! downstream, upstream job requests by result, and the queue wait by project (a histogram).
//!
//! Owns the numbers only; `metrics::router` renders them. Must not know HTTP or the queue.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the queue wait histogram, seconds.
pub const WAIT_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0];

/// One histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    /// Observations at or below each of [`WAIT_BUCKETS`].
    pub buckets: Vec<u64>,
    /// Sum of observations, seconds.
    pub sum: f64,
    /// Observations.
    pub count: u64,
}

impl Histogram {
    fn observe(&mut self, value: f64) {
        if self.buckets.len() != WAIT_BUCKETS.len() {
            self.buckets = vec![0; WAIT_BUCKETS.len()];
        }
        for (i, le) in WAIT_BUCKETS.iter().enumerate() {
            if value <= *le {
                self.buckets[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

/// Why a job went back to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DeclineReason {
    /// The runner said so (`runner_provisioning` `status=declined`).
    Declined,
    /// The runner neither accepted nor pinged within `accept_timeout`.
    Timeout,
}

impl DeclineReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::Declined => "declined",
            DeclineReason::Timeout => "timeout",
        }
    }
}

/// A copy of every counter.
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    /// Downstream job requests, per downstream index.
    pub polls: Vec<u64>,
    /// Jobs given out, per downstream index.
    pub dispatches: Vec<u64>,
    /// Jobs accepted (running at GitLab), per downstream index.
    pub accepts: Vec<u64>,
    /// Jobs given back, per (downstream index, reason).
    pub declines: BTreeMap<(usize, DeclineReason), u64>,
    /// Accepted jobs failed because their runner went silent, per downstream index.
    pub lost: Vec<u64>,
    /// Jobs the router failed upstream itself, by reason word.
    pub failed: BTreeMap<&'static str, u64>,
    /// Upstream job requests per (upstream index, result word).
    pub upstream_requests: BTreeMap<(usize, &'static str), u64>,
    /// Queue wait per project path.
    pub queue_wait: BTreeMap<String, Histogram>,
}

/// The counters, behind one lock (updated a few times per job).
pub struct RouterStats {
    inner: Mutex<StatsSnapshot>,
}

impl RouterStats {
    /// Counters for `downstreams` downstream entries.
    pub fn new(downstreams: usize) -> Self {
        RouterStats {
            inner: Mutex::new(StatsSnapshot {
                polls: vec![0; downstreams],
                dispatches: vec![0; downstreams],
                accepts: vec![0; downstreams],
                lost: vec![0; downstreams],
                ..StatsSnapshot::default()
            }),
        }
    }

    fn with(&self, f: impl FnOnce(&mut StatsSnapshot)) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s);
    }

    fn bump(list: &mut [u64], i: usize) {
        if let Some(n) = list.get_mut(i) {
            *n += 1;
        }
    }

    /// A downstream job request arrived.
    pub fn poll(&self, downstream: usize) {
        self.with(|s| Self::bump(&mut s.polls, downstream));
    }

    /// A job was given to `downstream` after `waited` in the queue.
    pub fn dispatched(&self, downstream: usize, project: &str, waited: Duration) {
        self.with(|s| {
            Self::bump(&mut s.dispatches, downstream);
            s.queue_wait.entry(project.to_string()).or_default().observe(waited.as_secs_f64());
        });
    }

    /// A downstream accepted a job (it runs at GitLab now).
    pub fn accepted(&self, downstream: Option<usize>) {
        if let Some(d) = downstream {
            self.with(|s| Self::bump(&mut s.accepts, d));
        }
    }

    /// A job went back to the queue.
    pub fn declined(&self, downstream: usize, reason: DeclineReason) {
        self.with(|s| *s.declines.entry((downstream, reason)).or_default() += 1);
    }

    /// An accepted job's runner went silent.
    pub fn lost(&self, downstream: Option<usize>) {
        if let Some(d) = downstream {
            self.with(|s| Self::bump(&mut s.lost, d));
        }
    }

    /// The router failed a job upstream (`lost_runner`, `declined_by_all`, `no_downstream`,
    /// `bad_payload`).
    pub fn failed(&self, why: &'static str) {
        self.with(|s| *s.failed.entry(why).or_default() += 1);
    }

    /// An upstream job request ended with `result` (`job`, `no_job`, `error`).
    pub fn upstream_request(&self, upstream: usize, result: &'static str) {
        self.with(|s| *s.upstream_requests.entry((upstream, result)).or_default() += 1);
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let stats = RouterStats::new(2);
        stats.dispatched(1, "g/p", Duration::from_millis(30));
        stats.dispatched(1, "g/p", Duration::from_secs(2));
        stats.poll(7); // an unknown index is ignored, never a panic
        let s = stats.snapshot();
        assert_eq!(s.dispatches, vec![0, 2]);
        let h = &s.queue_wait["g/p"];
        assert_eq!(h.count, 2);
        assert_eq!(h.buckets[0], 0);
        assert_eq!(h.buckets[1], 1, "≤ 0.05 s");
        assert_eq!(h.buckets[WAIT_BUCKETS.len() - 1], 2);
    }
}
