//! The floors every simulated policy is read against, computed from the trace and the
//! provider profile alone (no engine):
//!
//! - **oracle** (P4): every job starts the moment it arrives, on an instance requested one
//!   cold start (median provisioning + median ready command) before it; an instance that falls
//!   idle is reused by the next arrival when the gap costs less than deleting it and
//!   cold-starting another (median deletion + cold start), else it is deleted. Jobs take the
//!   most recently freed slot (the shortest gap). Billed as the simulated cloud bills
//!   (creation → deletion, at least the billing minimum). Its instance-hours are the least a
//!   zero-wait fleet with these cold starts pays, up to the greedy reuse rule;
//! - **infinite** (P5): infinite instant capacity: zero wait, billed only the job-seconds.
//!
//! Slots are instances' slots: with `capacity_per_instance` > 1 both floors divide slot-hours
//! by the capacity (a lower bound). Owns these two computations only; the third floor, for
//! policies that cannot see the future, is `online_floor`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::autoscaler::provider::{DelayDistribution, SimProviderSettings};
use crate::autoscaler::trace::JobArrival;

/// A floor's summary, in the units of the simulator's report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Baseline {
    /// Queue wait percentiles (zero for both floors).
    pub p50_wait_s: f64,
    /// 95th percentile.
    pub p95_wait_s: f64,
    /// 99th percentile.
    pub p99_wait_s: f64,
    /// Billed instance-hours.
    pub instance_hours: f64,
    /// Billed hours without a job (cold starts, reuse gaps, deletions) over billed hours.
    pub idle_share: f64,
    /// Instances created per job.
    pub creations_per_job: f64,
    /// `instance_hours × price_per_hour`.
    pub cost: f64,
}

fn median(d: &DelayDistribution) -> f64 {
    match *d {
        DelayDistribution::Fixed { seconds, jitter_s } => seconds + jitter_s / 2.0,
        DelayDistribution::Lognormal { median_s, shift_s, .. } => median_s + shift_s,
    }
}

/// One cold start: median provisioning, plus the median ready command when there is one.
pub(super) fn cold_start(provider: &SimProviderSettings, ready_command: bool) -> f64 {
    median(&provider.provisioning) + if ready_command { median(&provider.ready) } else { 0.0 }
}

/// The oracle for `trace` on `provider`; `ready_command` says whether the ready delay applies.
pub fn oracle(trace: &[JobArrival], provider: &SimProviderSettings, ready_command: bool, capacity: u32) -> Baseline {
    let cold = cold_start(provider, ready_command);
    let deletion = median(&provider.deletion);
    let reuse_limit = cold + deletion;
    let mut jobs: Vec<(f64, f64)> = trace.iter().map(|j| (j.at, j.duration)).collect();
    jobs.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Slots still running: (end, slot); idle slots: freed time, newest on top.
    let mut running: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut free: Vec<(f64, usize)> = Vec::new();
    let mut slot_started: Vec<f64> = Vec::new();
    let mut billed = 0.0f64;
    let mut busy = 0.0f64;
    let ms = |s: f64| (s * 1000.0).round().max(0.0) as u64;
    let close = |started: f64, freed: f64| (freed + deletion - (started - cold)).max(provider.billing_minimum_s);
    for (at, duration) in &jobs {
        while let Some(Reverse((end, slot))) = running.peek().copied() {
            if end > ms(*at) {
                break;
            }
            running.pop();
            free.push((end as f64 / 1000.0, slot));
        }
        busy += duration;
        // Newest freed first; older free slots whose gap is too long are deleted.
        let reuse = match free.last() {
            Some((freed, _)) if at - freed <= reuse_limit => free.pop().map(|(_, s)| s),
            _ => None,
        };
        let slot = match reuse {
            Some(s) => s,
            None => {
                slot_started.push(*at);
                slot_started.len() - 1
            }
        };
        // Slots idle longer than the reuse limit are deleted when they fell idle.
        free.retain(|(freed, s)| {
            if at - freed > reuse_limit {
                billed += close(slot_started[*s], *freed);
                false
            } else {
                true
            }
        });
        running.push(Reverse((ms(at + duration), slot)));
    }
    while let Some(Reverse((end, slot))) = running.pop() {
        free.push((end as f64 / 1000.0, slot));
    }
    for (freed, s) in free {
        billed += close(slot_started[s], freed);
    }
    let capacity = f64::from(capacity.max(1));
    let hours = billed / 3600.0 / capacity;
    Baseline {
        p50_wait_s: 0.0,
        p95_wait_s: 0.0,
        p99_wait_s: 0.0,
        instance_hours: hours,
        idle_share: if billed > 0.0 { (billed - busy).max(0.0) / billed } else { 0.0 },
        creations_per_job: if jobs.is_empty() { 0.0 } else { slot_started.len() as f64 / capacity / jobs.len() as f64 },
        cost: hours * provider.price_per_hour,
    }
}

/// Infinite instant capacity: billed exactly the job-seconds.
pub fn infinite(trace: &[JobArrival], provider: &SimProviderSettings, capacity: u32) -> Baseline {
    let seconds: f64 = trace.iter().map(|j| j.duration).sum();
    let hours = seconds / 3600.0 / f64::from(capacity.max(1));
    Baseline {
        p50_wait_s: 0.0,
        p95_wait_s: 0.0,
        p99_wait_s: 0.0,
        instance_hours: hours,
        idle_share: 0.0,
        creations_per_job: 0.0,
        cost: hours * provider.price_per_hour,
    }
}

/// The floor of several runners' fleets side by side: each `(floor, jobs)` is one runner's
/// floor on the jobs it ran. Instance-hours and cost add up; the idle share is weighted by
/// instance-hours and creations per job by jobs.
pub fn combine(parts: &[(Baseline, u64)]) -> Baseline {
    let hours: f64 = parts.iter().map(|(b, _)| b.instance_hours).sum();
    let jobs: u64 = parts.iter().map(|(_, j)| j).sum();
    let idle: f64 = parts.iter().map(|(b, _)| b.idle_share * b.instance_hours).sum();
    let creations: f64 = parts.iter().map(|(b, j)| b.creations_per_job * *j as f64).sum();
    Baseline {
        p50_wait_s: 0.0,
        p95_wait_s: 0.0,
        p99_wait_s: 0.0,
        instance_hours: hours,
        idle_share: if hours > 0.0 { idle / hours } else { 0.0 },
        creations_per_job: if jobs > 0 { creations / jobs as f64 } else { 0.0 },
        cost: parts.iter().map(|(b, _)| b.cost).sum(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A cloud with fixed delays: 30 s provisioning, 10 s deletion, no billing minimum.
    pub(in crate::autoscaler::simulate) fn cloud() -> SimProviderSettings {
        SimProviderSettings {
            provisioning: DelayDistribution::Fixed { seconds: 30.0, jitter_s: 0.0 },
            deletion: DelayDistribution::Fixed { seconds: 10.0, jitter_s: 0.0 },
            billing_minimum_s: 0.0,
            ..Default::default()
        }
    }

    /// A job arriving at `at` running `duration` seconds.
    pub(in crate::autoscaler::simulate) fn job(at: f64, duration: f64) -> JobArrival {
        JobArrival { at, duration, pipeline: None, runner: None }
    }

    #[test]
    fn close_jobs_share_an_instance_and_far_ones_do_not() {
        // Gap 20 s < 30 + 10: reused. Gap 100 s: a new instance.
        let trace = [job(100.0, 60.0), job(180.0, 60.0), job(340.0, 60.0)];
        let o = oracle(&trace, &cloud(), false, 1);
        // First instance: 70 → 240 + 10 = 180 s; second: 310 → 400 + 10 = 100 s.
        assert!((o.instance_hours * 3600.0 - 280.0).abs() < 1e-6, "{}", o.instance_hours * 3600.0);
        assert!((o.creations_per_job - 2.0 / 3.0).abs() < 1e-9);
        let inf = infinite(&trace, &cloud(), 1);
        assert!((inf.instance_hours * 3600.0 - 180.0).abs() < 1e-6);
        assert!(o.instance_hours > inf.instance_hours);
    }

    #[test]
    fn concurrent_jobs_need_concurrent_instances() {
        let trace = [job(100.0, 60.0), job(100.0, 60.0), job(100.0, 60.0)];
        let o = oracle(&trace, &cloud(), false, 1);
        assert!((o.creations_per_job - 1.0).abs() < 1e-9);
        assert!((o.instance_hours * 3600.0 - 3.0 * 100.0).abs() < 1e-6);
    }
}
