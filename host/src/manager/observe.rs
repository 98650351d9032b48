//! What the manager tells an observer while it works: runners fed to the request loop, job
//! requests in flight, jobs received, their stages and how they ended, processing failures.
//!
//! Owns the [`Observer`] trait (every method a no-op by default) and [`NoObserver`]. The
//! manager calls it at the points GitLab Runner counts the same things, so `metrics` can
//! export them under GitLab Runner's names; this module must not count, store or render
//! anything itself, and the manager must never wait on an observer.

use std::time::Duration;

use super::requests::RequestLimits;
use crate::payload::JobInfo;
use crate::trace::format::RunnerIdentity;

/// Why a runner's turn in the request loop produced no job, as GitLab Runner's
/// `gitlab_runner_worker_processing_failures_total{failure_type}` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessingFailure {
    /// No executor capacity to ask with (a fleet runner without an idle slot).
    NoFreeExecutor,
    /// The job ran and failed.
    JobFailure,
    /// Anything else (the request failed).
    Other,
}

impl ProcessingFailure {
    /// GitLab Runner's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessingFailure::NoFreeExecutor => "no_free_executor",
            ProcessingFailure::JobFailure => "job_failure",
            ProcessingFailure::Other => "other",
        }
    }
}

/// A job that ended, as the manager saw it.
#[derive(Debug, Clone)]
pub struct FinishedJob<'a> {
    /// The job ID.
    pub id: i64,
    /// The runner's `executor` (as configured).
    pub executor: &'a str,
    /// From the moment the job had capacity to its end.
    pub duration: Duration,
    /// The failure reason sent to GitLab; `None` when the job succeeded.
    pub failure: Option<&'a str>,
}

/// Receives the manager's events. Implementations must be quick and never block.
pub trait Observer: Send + Sync {
    /// A runner's turn in the request loop: `fed` when it asks GitLab for a job, not fed
    /// when it is skipped (unhealthy, paused, not resolved yet).
    fn fed(&self, runner: &RunnerIdentity, fed: bool) {
        let _ = (runner, fed);
    }

    /// A job request of `runner` was admitted, ended, or (`refused`) not made because
    /// `limits.used` requests were in flight; `hard` is its `request_concurrency`.
    fn requests(&self, runner: &RunnerIdentity, hard: usize, limits: RequestLimits, refused: bool) {
        let _ = (runner, hard, limits, refused);
    }

    /// A runner's turn ended without running a job, or its job failed.
    fn processing_failure(&self, runner: &RunnerIdentity, failure: ProcessingFailure) {
        let _ = (runner, failure);
    }

    /// GitLab handed `runner` job `id`, which now has capacity to run.
    fn job_received(&self, runner: &RunnerIdentity, id: i64, job: &JobInfo) {
        let _ = (runner, id, job);
    }

    /// A stage of job `job` started.
    fn stage_started(&self, runner: &RunnerIdentity, job: i64, stage: &str) {
        let _ = (runner, job, stage);
    }

    /// A stage of job `job` ended after `duration`. `detailed` is the job's
    /// `FF_EXPORT_HIGH_CARDINALITY_METRICS`.
    fn stage_ended(&self, runner: &RunnerIdentity, job: i64, stage: &str, duration: Duration, detailed: bool) {
        let _ = (runner, job, stage, duration, detailed);
    }

    /// A job of `runner` ended.
    fn job_finished(&self, runner: &RunnerIdentity, job: &FinishedJob<'_>) {
        let _ = (runner, job);
    }
}

/// Observes nothing (tests, `runway exec`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl Observer for NoObserver {}
