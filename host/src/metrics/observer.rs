//! The manager's events ([`Observer`]) turned into GitLab Runner's job, queue, stage, feed and
//! request-concurrency metrics, with its label values (`runner` is the short token, `mode`
//! is `traditional`: Runway runs scripts, not steps).
//!
//! Owns only the mapping from events to families; must not keep job state beyond what the
//! `gitlab_runner_jobs` gauge needs.

use std::time::Duration;

use super::{Metrics, RunningJob};
use crate::manager::observe::{FinishedJob, Observer, ProcessingFailure};
use crate::manager::requests::RequestLimits;
use crate::payload::JobInfo;
use crate::trace::format::RunnerIdentity;

/// GitLab Runner's execution mode of a job run from `script:` lines.
const MODE: &str = "traditional";

impl Observer for Metrics {
    fn fed(&self, runner: &RunnerIdentity, fed: bool) {
        let family = if fed { &self.families.worker_feeds } else { &self.families.worker_feed_failures };
        family.with_label_values(&[&runner.short_token, &runner.name, &runner.system_id]).inc();
    }

    fn requests(&self, runner: &RunnerIdentity, hard: usize, limits: RequestLimits, refused: bool) {
        let f = &self.families;
        let labels = [runner.short_token.as_str(), runner.system_id.as_str()];
        let int = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        f.request_concurrency.with_label_values(&labels).set(int(limits.in_flight));
        f.request_concurrency_hard_limit.with_label_values(&labels).set(int(hard));
        f.request_concurrency_adaptive_limit.with_label_values(&labels).set(limits.adaptive);
        f.request_concurrency_used_limit.with_label_values(&labels).set(int(limits.used));
        if refused {
            f.request_concurrency_exceeded.with_label_values(&labels).inc();
        }
    }

    fn processing_failure(&self, runner: &RunnerIdentity, failure: ProcessingFailure) {
        self.families
            .worker_processing_failures
            .with_label_values(&[failure.as_str(), &runner.short_token, &runner.name, &runner.system_id])
            .inc();
    }

    fn job_received(&self, runner: &RunnerIdentity, id: i64, job: &JobInfo) {
        let f = &self.families;
        let labels = [runner.short_token.as_str(), runner.name.as_str(), runner.system_id.as_str()];
        f.jobs_total.with_label_values(&labels).inc();
        let running = job.project_jobs_running_on_instance_runners_count.as_str();
        f.job_queue_duration
            .with_label_values(&[labels[0], labels[1], labels[2], running])
            .observe(job.time_in_queue_seconds);
        f.job_queue_size.with_label_values(&labels).set(job.queue_size as f64);
        f.job_queue_depth.with_label_values(&labels).set(job.queue_depth as f64);
        if let Ok(mut inner) = self.inner.lock() {
            let entry = RunningJob {
                runner: runner.short_token.clone(),
                runner_name: runner.name.clone(),
                stage: String::new(),
            };
            inner.running.insert(id, entry);
        }
    }

    fn stage_started(&self, _runner: &RunnerIdentity, job: i64, stage: &str) {
        if let Ok(mut inner) = self.inner.lock() {
            if let Some(running) = inner.running.get_mut(&job) {
                running.stage = stage.to_string();
            }
        }
    }

    fn stage_ended(&self, runner: &RunnerIdentity, _job: i64, stage: &str, duration: Duration, detailed: bool) {
        if detailed {
            self.families
                .job_stage_duration
                .with_label_values(&[&runner.short_token, &runner.name, &runner.system_id, stage])
                .observe(duration.as_secs_f64());
        }
    }

    fn job_finished(&self, runner: &RunnerIdentity, job: &FinishedJob<'_>) {
        let f = &self.families;
        f.job_duration
            .with_label_values(&[&runner.short_token, &runner.name, &runner.system_id, MODE])
            .observe(job.duration.as_secs_f64());
        let executor = if job.executor.is_empty() { "unknown" } else { job.executor };
        f.job_execution_mode_total.with_label_values(&[MODE, executor]).inc();
        if let Some(reason) = job.failure {
            f.failed_jobs_total.with_label_values(&[&runner.short_token, &runner.name, reason, MODE]).inc();
        }
        if let Ok(mut inner) = self.inner.lock() {
            inner.running.remove(&job.id);
        }
    }
}
