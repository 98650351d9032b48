//! The **online floor**: an estimate of the fewest instance-hours any policy pays that learns
//! from history but cannot see a job before GitLab hands it out, at a given share of jobs
//! that wait for an instance. It answers "how far could a better policy get" where the
//! oracle (which knows every arrival in advance) cannot: on a trace whose jobs arrive at
//! random, a fleet must hold idle slots for the arrivals of the next cold start, and the
//! oracle's zero-idle schedule is out of reach for any real policy.
//!
//! The model, favourable to the policy at every step:
//! - jobs run at once on arrival (the infinite schedule), so `busy(t)` is the number of jobs
//!   running at `t`;
//! - a job arriving at `t` starts at once iff its *rise* `busy(t) − busy(t − cold)` (itself
//!   included) is at most the idle slots `b` the fleet held: what was running one cold
//!   start ago, plus `b`, is what could be ready at `t` (cold = median provisioning + median
//!   ready command, as for the oracle, never the slower tail);
//! - `b` is chosen per 5-minute slot of the week **with knowledge of this very trace's rise
//!   distribution in that slot** (in-sample, so better than any forecast), spending idle
//!   slots where they serve the most jobs until the waiting jobs fit the share: a greedy walk
//!   over each slot's upper concave hull (a burst competes by its average);
//! - idle slots cost only their time: creations, deletions, billing minimums and failures are
//!   free, and instances freed by finished jobs are deleted at once at no cost.
//!
//! A policy could beat it only by predicting arrivals or job durations within one cold
//! start better than this trace's own statistics do. Billed hours = job time + the held idle
//! slots; divided by `capacity_per_instance` like the other floors. Owns this computation only.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::oracle::{cold_start, Baseline};
use crate::autoscaler::provider::SimProviderSettings;
use crate::autoscaler::trace::JobArrival;

/// Width of the floor's slots of the week.
const SLOT_S: f64 = 300.0;
const SLOTS_PER_WEEK: usize = 2016;

/// One step of a slot's hull: `to` idle slots serve `gain` more jobs for `cost` more
/// slot-seconds.
struct Step {
    slot: usize,
    to: u32,
    gain: f64,
    cost: f64,
}

/// The online floor for `trace` on `provider` when at most `wait_share` (0–1) of the jobs
/// may wait for an instance; `ready_command` says whether the ready delay is part of a cold
/// start. Its waiting jobs wait one cold start.
pub fn online_floor(
    trace: &[JobArrival],
    provider: &SimProviderSettings,
    ready_command: bool,
    capacity: u32,
    wait_share: f64,
) -> Baseline {
    let cold = cold_start(provider, ready_command);
    let mut jobs: Vec<(f64, f64)> = trace.iter().map(|j| (j.at, j.duration)).collect();
    jobs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let rises = rises(&jobs, cold);
    // Per slot of the week: jobs by rise (rises ≤ 0 were served by instances freed within
    // the cold start and need no idle slot).
    let mut by_slot: Vec<Vec<u32>> = vec![Vec::new(); SLOTS_PER_WEEK];
    for (&(at, _), &rise) in jobs.iter().zip(&rises) {
        if rise > 0 {
            by_slot[week_slot(at)].push(rise as u32);
        }
    }
    let end = jobs.iter().map(|(at, d)| at + d).fold(0.0f64, f64::max);
    let slots_in_trace = (end / SLOT_S).ceil() as usize;
    let mut steps = Vec::new();
    for (slot, rises) in by_slot.iter_mut().enumerate() {
        // How many times this slot of the week occurs in the trace: what holding one idle
        // slot in it costs.
        let occurrences = slots_in_trace.saturating_sub(slot).div_ceil(SLOTS_PER_WEEK) as f64;
        rises.sort_unstable();
        hull_steps(slot, rises, occurrences * SLOT_S, &mut steps);
    }
    steps.sort_by(|a, b| {
        (b.gain / b.cost).total_cmp(&(a.gain / a.cost)).then(a.to.cmp(&b.to)).then(a.slot.cmp(&b.slot))
    });
    let needing: f64 = by_slot.iter().map(|r| r.len() as f64).sum();
    let allowed = wait_share.clamp(0.0, 1.0) * jobs.len() as f64;
    let (mut waiting, mut idle_seconds) = (needing, 0.0);
    for step in steps {
        if waiting <= allowed {
            break;
        }
        waiting -= step.gain;
        idle_seconds += step.cost;
    }
    let busy: f64 = jobs.iter().map(|(_, d)| d).sum();
    let billed = busy + idle_seconds;
    let capacity = f64::from(capacity.max(1));
    let hours = billed / 3600.0 / capacity;
    let waits = waiting.round().max(0.0) as usize;
    let at_rank = |q: f64| {
        let rank = (q * jobs.len() as f64).ceil() as usize;
        if rank > jobs.len().saturating_sub(waits) {
            cold
        } else {
            0.0
        }
    };
    Baseline {
        p50_wait_s: at_rank(0.50),
        p95_wait_s: at_rank(0.95),
        p99_wait_s: at_rank(0.99),
        instance_hours: hours,
        idle_share: if billed > 0.0 { idle_seconds / billed } else { 0.0 },
        creations_per_job: 0.0,
        cost: hours * provider.price_per_hour,
    }
}

fn week_slot(at: f64) -> usize {
    ((at.max(0.0) / SLOT_S) as usize) % SLOTS_PER_WEEK
}

/// Each job's rise: jobs running just after it arrived (itself included) less jobs running
/// one cold start before, on the zero-wait schedule. Jobs ending at an instant free their
/// slot before jobs arriving at it take one.
fn rises(jobs: &[(f64, f64)], cold: f64) -> Vec<i64> {
    let ms = |s: f64| (s * 1000.0).round().max(0.0) as u64;
    // Running count just after each arrival, and the count at each arrival's `at − cold`.
    let mut ends: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
    let mut after: Vec<i64> = Vec::with_capacity(jobs.len());
    for &(at, duration) in jobs {
        while ends.peek().is_some_and(|Reverse(e)| *e <= ms(at)) {
            ends.pop();
        }
        ends.push(Reverse(ms(at + duration)));
        after.push(ends.len() as i64);
    }
    // Running at `t` = arrivals at or before t − ends at or before t (half-open [at, end)).
    let mut starts: Vec<u64> = jobs.iter().map(|(at, _)| ms(*at)).collect();
    let mut finishes: Vec<u64> = jobs.iter().map(|(at, d)| ms(at + d)).collect();
    starts.sort_unstable();
    finishes.sort_unstable();
    let running_at = |t: u64| {
        let started = starts.partition_point(|s| *s <= t);
        let ended = finishes.partition_point(|e| *e <= t);
        started as i64 - ended as i64
    };
    let cold_ms = ms(cold);
    jobs.iter()
        .zip(after)
        .map(|(&(at, _), now)| {
            let before = ms(at).checked_sub(cold_ms).map_or(0, &running_at);
            now - before
        })
        .collect()
}

/// The upper concave hull of (idle slots held, jobs served) for one slot whose sorted rises
/// are `rises`, from (0, 0), as steps with falling jobs per idle slot; `unit` is what one
/// idle slot held in it costs.
fn hull_steps(slot: usize, rises: &[u32], unit: f64, steps: &mut Vec<Step>) {
    let mut hull: Vec<(f64, f64)> = vec![(0.0, 0.0)];
    let mut i = 0;
    while i < rises.len() {
        let rise = rises[i];
        while i < rises.len() && rises[i] == rise {
            i += 1;
        }
        let point = (f64::from(rise), i as f64);
        while hull.len() >= 2 {
            let (a, b) = (hull[hull.len() - 2], hull[hull.len() - 1]);
            // Drop `b` when it lies on or below the line from `a` to the new point.
            if (b.0 - a.0) * (point.1 - a.1) - (b.1 - a.1) * (point.0 - a.0) >= 0.0 {
                hull.pop();
            } else {
                break;
            }
        }
        hull.push(point);
    }
    for pair in hull.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        steps.push(Step { slot, to: b.0 as u32, gain: b.1 - a.1, cost: (b.0 - a.0) * unit });
    }
}

#[cfg(test)]
mod tests {
    use super::super::oracle::tests::{cloud, job};
    use super::*;

    #[test]
    fn a_rise_counts_the_jobs_of_the_last_cold_start() {
        // Cold start 30 s. Two jobs at 100 s: rises 1 and 2. One at 120 s: 3 (all within
        // 30 s). One at 200 s after the first three ended at 160 s: 1 (nothing ran at 170 s).
        let jobs = [(100.0, 60.0), (100.0, 60.0), (120.0, 40.0), (200.0, 10.0)];
        assert_eq!(rises(&jobs, 30.0), vec![1, 2, 3, 1]);
        // A job arriving as another ends takes its place: rise 0 (served by the freed slot).
        let jobs = [(100.0, 50.0), (150.0, 10.0)];
        assert_eq!(rises(&jobs, 10.0), vec![1, 0]);
    }

    #[test]
    fn no_waiting_holds_every_rise_and_a_full_share_holds_nothing() {
        let trace = [job(100.0, 60.0), job(100.0, 60.0), job(100.0, 60.0)];
        let strict = online_floor(&trace, &cloud(), false, 1, 0.0);
        // Three idle slots held in that 5-minute slot (one occurrence), plus 180 s of jobs.
        assert!((strict.instance_hours * 3600.0 - (180.0 + 3.0 * SLOT_S)).abs() < 1e-6, "{strict:?}");
        assert_eq!(strict.p99_wait_s, 0.0);
        let lax = online_floor(&trace, &cloud(), false, 1, 1.0);
        assert!((lax.instance_hours * 3600.0 - 180.0).abs() < 1e-6);
        assert_eq!(lax.p50_wait_s, 30.0, "every job waits one cold start");
    }

    #[test]
    fn idle_slots_go_where_they_serve_the_most_jobs() {
        // A busy slot of the week (ten short jobs one after another: one idle slot serves all
        // ten) and a quiet one (one job): with one job allowed to wait, the quiet slot's job
        // waits and the busy slot holds its one idle slot.
        let mut trace: Vec<JobArrival> = (0..10).map(|i| job(f64::from(i) * 20.0, 10.0)).collect();
        trace.push(job(3000.0, 10.0));
        let floor = online_floor(&trace, &cloud(), false, 1, 0.1);
        assert!((floor.instance_hours * 3600.0 - (110.0 + SLOT_S)).abs() < 1e-6, "{floor:?}");
        assert_eq!(floor.p99_wait_s, 30.0, "the quiet job waits a cold start");
        assert_eq!(floor.p50_wait_s, 0.0);
    }
}
