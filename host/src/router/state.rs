//! What the router holds, under one lock: every job it took from GitLab and not yet finished
//! ([`Routed`]: queued, offered to a downstream, or accepted by one), the queue, the downstream
//! job requests waiting for a job ([`Waiter`]), and the upstream requests in flight. Handing a
//! job to a waiting runner, taking one back, and deciding whether to ask GitLab for more are
//! the lock-holding steps here; none awaits.
//!
//! Owns the in-memory model and its transitions. Must not do I/O (HTTP, store): callers take
//! what changed ([`Handed`], job ids) and persist or answer after releasing the lock.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::queue::{Queue, Queued};
use super::Downstream;
use crate::config::router::Policy;
use crate::payload::{JobResponse, PayloadError};

/// Where a held job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting in the queue for a downstream.
    Queued,
    /// Given to a downstream that has not accepted it yet; taken back at `deadline`.
    Offered {
        /// The downstream (index), when known (a job a restarted router learns of from a
        /// runner's ping has none).
        downstream: Option<usize>,
        /// When it is taken back unless accepted or pinged.
        deadline: Instant,
    },
    /// Accepted (running at GitLab) by a downstream, last heard of at `last_seen`.
    Accepted {
        /// The downstream (index), when known.
        downstream: Option<usize>,
        /// Its last trace patch, update or artifact call for the job.
        last_seen: Instant,
    },
}

impl Phase {
    /// `queued`, `offered`, `accepted`: the store's `stage` and the logs' word.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Offered { .. } => "offered",
            Phase::Accepted { .. } => "accepted",
        }
    }

    /// The downstream holding the job, if any.
    pub fn downstream(&self) -> Option<usize> {
        match *self {
            Phase::Queued => None,
            Phase::Offered { downstream, .. } | Phase::Accepted { downstream, .. } => downstream,
        }
    }
}

/// One job the router holds.
#[derive(Debug)]
pub struct Routed {
    /// Where it came from and what it is, as taken from GitLab.
    pub origin: Origin,
    /// Where it is.
    pub phase: Phase,
    /// Downstreams (indices) it was offered to and that gave it back or let it time out:
    /// never offered to them again.
    pub declined: BTreeSet<usize>,
    /// Arrival order.
    pub seq: u64,
    /// When it entered the queue (queue wait).
    pub enqueued: Instant,
    /// Bumped on every change that must reach the store.
    pub version: u64,
    /// The version last written to the store (`u64::MAX` once removed), and the lock that
    /// orders this job's writes.
    pub saved: std::sync::Arc<tokio::sync::Mutex<u64>>,
    /// Bytes GitLab has of the job's trace, from the last `Range` it answered a patch with.
    pub upstream_trace_size: u64,
    /// The router is failing the job upstream itself (lost runner, every runner declined).
    pub failing: bool,
    /// The runner it was offered to speaks two-phase commit (it accepts the job itself);
    /// otherwise the router accepts the job at GitLab on the runner's first call for it.
    pub two_phase: bool,
}

/// Where a job comes from and what it is, for [`Routed::new`].
#[derive(Debug, Clone)]
pub struct Origin {
    /// GitLab's job id.
    pub id: i64,
    /// The job token (authenticates the downstream's job calls; the router's own).
    pub token: String,
    /// Index of the `[[router.upstream]]` it came from.
    pub upstream: usize,
    /// The payload exactly as GitLab sent it.
    pub raw: bytes::Bytes,
    /// `job_info.project_id`.
    pub project: i64,
    /// `job_info.pipeline_id`.
    pub pipeline: i64,
    /// `job_info.project_full_path` (`group/project`, for metrics).
    pub project_path: String,
    /// The job's tags (`CI_JOB_TAGS`), empty when GitLab sent none.
    pub tags: Vec<String>,
}

impl Routed {
    /// A job just taken from GitLab: queued, offered to nobody yet, arrival number `seq`.
    pub fn new(origin: Origin, seq: u64) -> Self {
        Routed {
            origin,
            phase: Phase::Queued,
            declined: BTreeSet::new(),
            seq,
            enqueued: Instant::now(),
            version: 0,
            saved: Default::default(),
            upstream_trace_size: 0,
            failing: false,
            two_phase: true,
        }
    }

    /// A job just taken from GitLab, its payload `raw` read for what routing needs (project,
    /// pipeline, tags): queued, arrival number `seq`.
    pub fn from_payload(
        id: i64,
        token: String,
        upstream: usize,
        raw: bytes::Bytes,
        seq: u64,
    ) -> Result<Self, PayloadError> {
        let job = JobResponse::from_json(&raw)?;
        let tags = job.variable("CI_JOB_TAGS").map(parse_tags).unwrap_or_default();
        let origin = Origin {
            id,
            token,
            upstream,
            raw,
            project: job.job_info.project_id,
            pipeline: job.job_info.pipeline_id,
            project_path: job.job_info.project_full_path.clone(),
            tags,
        };
        Ok(Routed::new(origin, seq))
    }

    fn queued(&self) -> Queued {
        Queued { id: self.origin.id, project: self.origin.project, pipeline: self.origin.pipeline }
    }
}

/// `CI_JOB_TAGS` as a JSON array (`["a","b"]`) or a comma-separated list.
fn parse_tags(value: &str) -> Vec<String> {
    if let Ok(list) = serde_json::from_str::<Vec<String>>(value) {
        return list;
    }
    value.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect()
}

/// A downstream job request waiting for a job.
#[derive(Debug)]
pub struct Waiter {
    /// Arrival order of the request.
    pub seq: u64,
    /// Which downstream.
    pub downstream: usize,
    /// Where the job id goes.
    pub tx: oneshot::Sender<i64>,
    /// The `info` it sent (what the router asks GitLab with on its behalf).
    pub info: serde_json::Value,
}

/// A job handed to a waiting request, for the caller's bookkeeping.
#[derive(Debug, Clone)]
pub struct Handed {
    /// The job.
    pub id: i64,
    /// To which downstream.
    pub downstream: usize,
    /// How long it waited in the queue.
    pub waited: Duration,
    /// Its project, for metrics.
    pub project_path: String,
}

/// Everything held, under the router's lock.
#[derive(Debug)]
pub struct State {
    /// Every held job by id.
    pub jobs: HashMap<i64, Routed>,
    /// Job token → id (routing the downstream's job calls, artifacts of dependencies).
    pub by_token: HashMap<String, i64>,
    /// Queued jobs in the policy's order.
    pub queue: Queue,
    /// Waiting downstream requests, oldest first.
    pub waiters: Vec<Waiter>,
    /// Next arrival number (jobs and waiters).
    pub next_seq: u64,
    /// Upstream job requests in flight, per upstream.
    pub inflight: Vec<usize>,
    /// When a downstream last asked for a job.
    pub last_poll: Option<Instant>,
    /// The last `info` a downstream sent (asking GitLab ahead of demand).
    pub last_info: Option<serde_json::Value>,
    /// Jobs dispatched per downstream (`weighted`).
    pub dispatched: Vec<u64>,
    /// Moves on whenever a job enters the queue: the `X-GitLab-Last-Update` of a long poll
    /// that ended without a job (Rails' `runner:build_queue` value).
    pub queue_version: u64,
    policy: Policy,
}

impl State {
    /// Empty state for `upstreams` and `downstreams` under `policy`.
    pub fn new(policy: Policy, upstreams: usize, downstreams: usize) -> Self {
        State {
            jobs: HashMap::new(),
            by_token: HashMap::new(),
            queue: Queue::new(policy),
            waiters: Vec::new(),
            next_seq: 1,
            inflight: vec![0; upstreams],
            last_poll: None,
            last_info: None,
            dispatched: vec![0; downstreams],
            queue_version: rand::random(),
            policy,
        }
    }

    /// The next arrival number (for a job or a waiter); each call a new one, so two jobs fetched
    /// at once never share a place in the queue.
    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Hold `job` (its phase decides whether it is queued).
    pub fn insert(&mut self, job: Routed) {
        self.next_seq = self.next_seq.max(job.seq + 1);
        if job.phase == Phase::Queued {
            self.queue.push(job.seq, job.queued());
            self.queue_version = self.queue_version.wrapping_add(1);
        }
        self.by_token.insert(job.origin.token.clone(), job.origin.id);
        self.jobs.insert(job.origin.id, job);
    }

    /// Let go of job `id` (finished, failed, gone).
    pub fn remove(&mut self, id: i64) -> Option<Routed> {
        let job = self.jobs.remove(&id)?;
        self.queue.remove(id);
        self.by_token.remove(&job.origin.token);
        Some(job)
    }

    /// May downstream `d` take `job`? Not when it gave the job back before, and a tagged job
    /// only to a downstream with all its tags (untagged downstreams take every job).
    pub fn may_take(downstreams: &[Downstream], d: usize, job: &Routed) -> bool {
        if job.declined.contains(&d) {
            return false;
        }
        match downstreams.get(d).and_then(|x| x.tags.as_ref()) {
            None => true,
            Some(tags) => job.origin.tags.iter().all(|t| tags.contains(t)),
        }
    }

    /// Could any downstream still take `job`?
    pub fn anyone_may_take(downstreams: &[Downstream], job: &Routed) -> bool {
        (0..downstreams.len()).any(|d| Self::may_take(downstreams, d, job))
    }

    /// Take the policy's next job for downstream `d` out of the queue and offer it until
    /// `deadline`.
    pub fn take_for(&mut self, downstreams: &[Downstream], d: usize, deadline: Instant) -> Option<Handed> {
        let jobs = &self.jobs;
        let picked = self.queue.take(|id| jobs.get(&id).is_some_and(|j| Self::may_take(downstreams, d, j)))?;
        let job = self.jobs.get_mut(&picked.id)?;
        job.phase = Phase::Offered { downstream: Some(d), deadline };
        job.version += 1;
        if let Some(n) = self.dispatched.get_mut(d) {
            *n += 1;
        }
        Some(Handed {
            id: job.origin.id,
            downstream: d,
            waited: job.enqueued.elapsed(),
            project_path: job.origin.project_path.clone(),
        })
    }

    /// Put job `id` back in the queue (in its old place); `declined_by` never gets it again.
    pub fn requeue(&mut self, id: i64, declined_by: Option<usize>) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else { return false };
        if let Some(d) = declined_by {
            job.declined.insert(d);
        }
        job.phase = Phase::Queued;
        job.version += 1;
        let queued = job.queued();
        self.queue.push(job.seq, queued);
        self.queue_version = self.queue_version.wrapping_add(1);
        true
    }

    /// Give queued jobs to waiting requests, in the policy's order of waiters (oldest first;
    /// `weighted`: the one furthest below its share first). A request that went away meanwhile
    /// gives its job straight back.
    pub fn hand_out(&mut self, downstreams: &[Downstream], accept_timeout: Duration) -> Vec<Handed> {
        if self.queue.is_empty() || self.waiters.is_empty() {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..self.waiters.len()).collect();
        if self.policy == Policy::Weighted {
            let share = |w: &Waiter| {
                let weight = downstreams.get(w.downstream).map(|d| d.weight.max(1)).unwrap_or(1) as f64;
                self.dispatched.get(w.downstream).copied().unwrap_or(0) as f64 / weight
            };
            order.sort_by(|a, b| share(&self.waiters[*a]).total_cmp(&share(&self.waiters[*b])));
        }
        let mut by_waiter: HashMap<usize, Handed> = HashMap::new();
        for i in order {
            let d = self.waiters[i].downstream;
            if let Some(h) = self.take_for(downstreams, d, Instant::now() + accept_timeout) {
                by_waiter.insert(i, h);
            }
        }
        let mut delivered = Vec::new();
        let mut requeued = false;
        let mut rest = Vec::with_capacity(self.waiters.len());
        for (i, waiter) in std::mem::take(&mut self.waiters).into_iter().enumerate() {
            match by_waiter.remove(&i) {
                Some(h) => {
                    if waiter.tx.send(h.id).is_ok() {
                        delivered.push(h);
                    } else {
                        if let Some(n) = self.dispatched.get_mut(h.downstream) {
                            *n = n.saturating_sub(1);
                        }
                        self.requeue(h.id, None);
                        requeued = true;
                    }
                }
                None => rest.push(waiter),
            }
        }
        self.waiters = rest;
        if requeued && !self.waiters.is_empty() {
            delivered.extend(self.hand_out(downstreams, accept_timeout));
        }
        delivered
    }

    /// Should upstream `u` (with `concurrency` workers) ask GitLab for a job now? Only while a
    /// downstream waits or polled within `window`; as many requests as waiting requests plus the
    /// room left under `queue_size`, and never more than `queue_size` + waiting requests held.
    /// Counts the request in flight and returns the `info` to send.
    pub fn claim_fetch(&mut self, u: usize, queue_size: usize, window: Duration) -> Option<serde_json::Value> {
        let active = !self.waiters.is_empty() || self.last_poll.is_some_and(|t| t.elapsed() < window);
        if !active {
            return None;
        }
        let inflight: usize = self.inflight.iter().sum();
        let waiting = self.waiters.len();
        let demand = waiting + queue_size.saturating_sub(self.queue.len());
        if inflight >= demand || self.queue.len() + inflight >= queue_size + waiting {
            return None;
        }
        let info = self.waiters.first().map(|w| w.info.clone()).or_else(|| self.last_info.clone())?;
        *self.inflight.get_mut(u)? += 1;
        Some(info)
    }

    /// An upstream request of `u` ended.
    pub fn fetch_done(&mut self, u: usize) {
        if let Some(n) = self.inflight.get_mut(u) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_come_as_json_or_a_list() {
        assert_eq!(parse_tags(r#"["linux","docker"]"#), vec!["linux", "docker"]);
        assert_eq!(parse_tags("linux, docker,"), vec!["linux", "docker"]);
        assert!(parse_tags("").is_empty());
    }

    fn downstreams() -> Vec<Downstream> {
        vec![
            Downstream { name: "a".into(), token: "ta".into(), tags: None, weight: 1 },
            Downstream { name: "b".into(), token: "tb".into(), tags: Some(["gpu".to_string()].into()), weight: 3 },
        ]
    }

    fn job(id: i64, seq: u64, tags: &[&str]) -> Routed {
        let origin = Origin {
            id,
            token: format!("t{id}"),
            upstream: 0,
            raw: bytes::Bytes::new(),
            project: 1,
            pipeline: 1,
            project_path: "g/p".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        };
        Routed::new(origin, seq)
    }

    fn waiter(state: &mut State, d: usize) -> oneshot::Receiver<i64> {
        let (tx, rx) = oneshot::channel();
        let seq = state.take_seq();
        state.waiters.push(Waiter { seq, downstream: d, tx, info: serde_json::json!({}) });
        rx
    }

    #[test]
    fn tags_and_declines_decide_who_may_take_a_job() {
        let ds = downstreams();
        let mut j = job(1, 1, &["gpu"]);
        assert!(State::may_take(&ds, 0, &j), "an untagged downstream takes everything");
        assert!(State::may_take(&ds, 1, &j));
        j.origin.tags.push("arm".into());
        assert!(!State::may_take(&ds, 1, &j), "b lacks arm");
        j.declined.insert(0);
        assert!(!State::anyone_may_take(&ds, &j));
    }

    #[test]
    fn hand_out_serves_waiters_and_takes_back_what_a_gone_request_got() {
        let ds = downstreams();
        let mut state = State::new(Policy::Fifo, 1, 2);
        let mut rx_a = waiter(&mut state, 0);
        let rx_gone = waiter(&mut state, 0);
        drop(rx_gone);
        state.insert(job(1, 10, &[]));
        state.insert(job(2, 11, &[]));
        let handed = state.hand_out(&ds, Duration::from_secs(60));
        assert_eq!(handed.len(), 1);
        assert_eq!(rx_a.try_recv().ok(), Some(1));
        assert!(state.waiters.is_empty());
        assert!(state.queue.contains(2), "the gone request's job is queued again");
        assert_eq!(state.jobs[&2].phase, Phase::Queued);
        assert!(matches!(state.jobs[&1].phase, Phase::Offered { downstream: Some(0), .. }));
    }

    #[test]
    fn weighted_serves_the_waiter_furthest_below_its_share() {
        let ds = downstreams();
        let mut state = State::new(Policy::Weighted, 1, 2);
        state.dispatched = vec![1, 2]; // a: 1/1, b: 2/3
        let mut rx_a = waiter(&mut state, 0);
        let mut rx_b = waiter(&mut state, 1);
        state.insert(job(1, 10, &[]));
        state.hand_out(&ds, Duration::from_secs(60));
        assert_eq!(rx_b.try_recv().ok(), Some(1), "b is below its share");
        assert!(rx_a.try_recv().is_err());
    }

    #[test]
    fn upstream_requests_follow_demand_and_stay_bounded() {
        let mut state = State::new(Policy::Fair, 1, 2);
        let window = Duration::from_secs(50);
        assert_eq!(state.claim_fetch(0, 0, window), None, "nobody polls");
        let _rx = waiter(&mut state, 0);
        assert!(state.claim_fetch(0, 0, window).is_some(), "one waiting request: one upstream request");
        assert_eq!(state.claim_fetch(0, 0, window), None, "not two");
        state.fetch_done(0);
        for i in 0..3 {
            state.insert(job(i, i as u64 + 1, &["x"]));
        }
        // One for the waiting request, one to fill the queue to queue_size 4.
        assert!(state.claim_fetch(0, 4, window).is_some());
        assert!(state.claim_fetch(0, 4, window).is_some());
        assert_eq!(state.claim_fetch(0, 4, window), None, "3 queued + 2 in flight = queue_size + 1 waiting");
    }
}
