//! The router's queue of jobs not yet given to a downstream runner, and the policies that pick
//! the next one: `fifo` (oldest first), `fair` (round robin by project, then by pipeline within
//! the project, oldest job of that pipeline) and `weighted` (oldest first; the weights choose
//! among waiting runners, see `state`).
//!
//! Owns the order only: jobs are identified by id with the project and pipeline they belong
//! to; whether a runner may take a job is a predicate the caller hands in. Must not know
//! leases, GitLab or HTTP. O(queued jobs) per pick, for a queue of at most `queue_size` jobs.

use std::collections::{BTreeMap, HashMap};

use crate::config::router::Policy;

/// One queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// GitLab's job id.
    pub id: i64,
    /// `job_info.project_id`.
    pub project: i64,
    /// `job_info.pipeline_id`.
    pub pipeline: i64,
}

/// The queue. Jobs keep their arrival order (`seq`) also when taken back and queued again.
/// Entries are keyed by arrival and job id, so two jobs that arrived with the same number (a
/// stored job from another router) both stay queued, in id order.
#[derive(Debug)]
pub struct Queue {
    policy: Policy,
    entries: BTreeMap<(u64, i64), Queued>,
    seq_of: HashMap<i64, u64>,
    /// `fair`: the project served last, and per project the pipeline served last.
    last_project: Option<i64>,
    last_pipeline: HashMap<i64, i64>,
}

impl Queue {
    /// An empty queue under `policy`.
    pub fn new(policy: Policy) -> Self {
        Queue {
            policy,
            entries: BTreeMap::new(),
            seq_of: HashMap::new(),
            last_project: None,
            last_pipeline: HashMap::new(),
        }
    }

    /// Jobs queued.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Queue `job` at position `seq` (its arrival order; a job taken back keeps its place).
    pub fn push(&mut self, seq: u64, job: Queued) {
        if let Some(old) = self.seq_of.insert(job.id, seq) {
            self.entries.remove(&(old, job.id));
        }
        self.entries.insert((seq, job.id), job);
    }

    /// Take job `id` out, wherever it is.
    pub fn remove(&mut self, id: i64) -> Option<Queued> {
        let seq = self.seq_of.remove(&id)?;
        self.entries.remove(&(seq, id))
    }

    /// Is `id` queued?
    pub fn contains(&self, id: i64) -> bool {
        self.seq_of.contains_key(&id)
    }

    /// The queued jobs in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.entries.values()
    }

    /// Take the next job the policy picks among those `eligible` says a runner may take.
    pub fn take(&mut self, eligible: impl Fn(i64) -> bool) -> Option<Queued> {
        let key = match self.policy {
            Policy::Fifo | Policy::Weighted => self.entries.iter().find(|(_, j)| eligible(j.id)).map(|(k, _)| *k),
            Policy::Fair => self.pick_fair(&eligible),
        }?;
        let job = self.entries.remove(&key)?;
        self.seq_of.remove(&job.id);
        if self.policy == Policy::Fair {
            self.last_project = Some(job.project);
            self.last_pipeline.insert(job.project, job.pipeline);
        }
        Some(job)
    }

    /// The next project after the one served last (wrapping), its next pipeline after the one
    /// served last there, and that pipeline's oldest eligible job.
    fn pick_fair(&self, eligible: &impl Fn(i64) -> bool) -> Option<(u64, i64)> {
        // project → pipeline → oldest eligible entry.
        let mut firsts: BTreeMap<i64, BTreeMap<i64, (u64, i64)>> = BTreeMap::new();
        for (key, job) in &self.entries {
            if eligible(job.id) {
                firsts.entry(job.project).or_default().entry(job.pipeline).or_insert(*key);
            }
        }
        let project = after(&firsts, self.last_project)?;
        let pipelines = firsts.get(&project)?;
        let pipeline = after(pipelines, self.last_pipeline.get(&project).copied())?;
        pipelines.get(&pipeline).copied()
    }
}

/// The first key after `last` (wrapping round to the first key).
fn after<V>(keys: &BTreeMap<i64, V>, last: Option<i64>) -> Option<i64> {
    let next = last.and_then(|l| keys.range(l.saturating_add(1)..).next().map(|(k, _)| *k));
    next.or_else(|| keys.keys().next().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, project: i64, pipeline: i64) -> Queued {
        Queued { id, project, pipeline }
    }

    #[test]
    fn fifo_takes_the_oldest_eligible_job_and_a_requeued_job_keeps_its_place() {
        let mut q = Queue::new(Policy::Fifo);
        for id in 1..=4 {
            q.push(id as u64, job(id, 1, 1));
        }
        assert_eq!(q.take(|id| id != 1).map(|j| j.id), Some(2));
        let first = q.take(|_| true).expect("job 1");
        assert_eq!(first.id, 1);
        q.push(1, first);
        assert_eq!(q.take(|_| true).map(|j| j.id), Some(1), "back in its place");
        assert_eq!(q.len(), 2);
        assert_eq!(q.take(|_| false), None);
    }

    /// The fair-share case: one pipeline's fan-out of 200 jobs queued before 10 jobs
    /// of another project; the other project's jobs all go within the first 20 dispatches.
    #[test]
    fn jobs_that_arrived_with_the_same_number_are_both_kept() {
        // Stored jobs taken over from another router keep that router's numbers, which may
        // meet; neither job may fall out of the queue.
        for policy in [Policy::Fifo, Policy::Fair, Policy::Weighted] {
            let mut q = Queue::new(policy);
            q.push(7, job(1004, 1, 1));
            q.push(7, job(1003, 1, 1));
            assert_eq!(q.len(), 2, "{policy:?}");
            let order: Vec<i64> = (0..3).filter_map(|_| q.take(|_| true)).map(|j| j.id).collect();
            assert_eq!(order, vec![1003, 1004], "{policy:?}");
        }
    }

    #[test]
    fn fair_share_serves_another_project_within_twenty_dispatches_of_a_fan_out() {
        let mut q = Queue::new(Policy::Fair);
        let mut seq = 0;
        for id in 1..=200 {
            seq += 1;
            q.push(seq, job(id, 42, 77));
        }
        for id in 1001..=1010 {
            seq += 1;
            q.push(seq, job(id, 43, 90));
        }
        let first20: Vec<i64> = (0..20).filter_map(|_| q.take(|_| true)).map(|j| j.id).collect();
        let other = first20.iter().filter(|id| **id > 1000).count();
        assert_eq!(other, 10, "{first20:?}");
        let fifo_order: Vec<i64> = first20.iter().copied().filter(|id| *id <= 200).collect();
        assert_eq!(fifo_order, (1..=10).collect::<Vec<_>>(), "oldest first within the pipeline");
    }

    #[test]
    fn fair_share_rotates_pipelines_within_a_project() {
        let mut q = Queue::new(Policy::Fair);
        for (seq, (id, pipeline)) in [(1, 10), (2, 10), (3, 10), (4, 11), (5, 11)].into_iter().enumerate() {
            q.push(seq as u64, job(id, 1, pipeline));
        }
        let order: Vec<i64> = (0..5).filter_map(|_| q.take(|_| true)).map(|j| j.id).collect();
        assert_eq!(order, vec![1, 4, 2, 5, 3]);
    }

    #[test]
    fn fair_share_skips_what_the_runner_may_not_take() {
        let mut q = Queue::new(Policy::Fair);
        q.push(1, job(1, 1, 1));
        q.push(2, job(2, 2, 2));
        q.push(3, job(3, 2, 2));
        assert_eq!(q.take(|id| id != 2).map(|j| j.id), Some(1));
        assert_eq!(q.take(|id| id != 2).map(|j| j.id), Some(3));
        assert!(q.contains(2) && !q.contains(3));
        assert_eq!(q.remove(2).map(|j| j.id), Some(2));
        assert!(q.is_empty());
    }
}
