//! The manager's events ([`Observer`]) turned into GitLab Runner's job, queue, stage, feed and
//! request-concurrency metrics, with its label values (`runner` is the short token, `mode`
//! is `traditional`: Runway runs scripts, not steps).
//!
//! Owns only the mapping from events to families; must not keep job state beyond what the
//! `gitlab_runner_jobs` gauge needs.

use std::time::Duration;

use super::{Metrics, RunningJob};
use crate::manager::observe::{FinishedJob, Observer, ProcessingFailure};
use crate::payload::JobInfo;
use crate::trace::format::RunnerIdentity;

/// GitLab Runner's execution mode of a job run from `script:` lines.
const MODE: &str = "traditional";

impl Observer for Metrics {
    fn fed(&self, runner: &RunnerIdentity, fed: bool) {
        let family = if fed { &self.families.worker_feeds } else { &self.families.worker_feed_failures };
        family.with_label_values(&[&runner.short_token, &runner.name, &runner.system_id]).inc();
    }

    fn request_in_flight(&self, runner: &RunnerIdentity, started: bool) {
        let Ok(mut inner) = self.inner.lock() else { return };
        let n = inner.in_flight.entry(runner.short_token.clone()).or_default();
        *n = if started { *n + 1 } else { (*n - 1).max(0) };
        let n = *n;
        self.families.request_concurrency.with_label_values(&[&runner.short_token, &runner.system_id]).set(n);
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
