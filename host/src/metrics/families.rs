//! GitLab Runner's metric families, with its names, help texts, types, labels and buckets
//! (gitlab-runner 19.x: `commands/builds_helper.go`, `commands/multi.go`,
//! `network/api_requests_collector.go`, `helpers/prometheus/`, `commands/internal/configfile/`,
//! `common/version.go`), registered in one Prometheus registry with the process collector.
//!
//! Owns the definitions only; what feeds them is `super::observer` (the manager's events),
//! `super` (API requests, configuration, scrape-time gauges).

use prometheus::{
    CounterVec, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// `gitlab_runner_job_duration_seconds` buckets.
const JOB_DURATION_BUCKETS: &[f64] = &[30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 10800.0, 18000.0, 36000.0];
/// Queue and stage duration buckets.
const QUEUE_BUCKETS: &[f64] = &[1.0, 3.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0];
/// API request duration buckets.
const REQUEST_BUCKETS: &[f64] = &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

const RUNNER: &[&str] = &["runner", "runner_name", "system_id"];

/// Every family Runway exports under GitLab Runner's name.
pub(super) struct Families {
    pub registry: Registry,
    pub version_info: IntGaugeVec,
    pub concurrent: IntGauge,
    pub limit: IntGaugeVec,
    pub jobs: IntGaugeVec,
    pub jobs_total: IntCounterVec,
    pub job_execution_mode_total: IntCounterVec,
    pub job_duration: HistogramVec,
    pub job_queue_duration: HistogramVec,
    pub job_queue_size: GaugeVec,
    pub job_queue_depth: GaugeVec,
    pub acceptable_queuing_exceeded: IntCounterVec,
    pub job_stage_duration: HistogramVec,
    pub failed_jobs_total: IntCounterVec,
    pub request_concurrency: IntGaugeVec,
    pub request_concurrency_exceeded: IntCounterVec,
    pub request_concurrency_hard_limit: IntGaugeVec,
    pub request_concurrency_adaptive_limit: GaugeVec,
    pub request_concurrency_used_limit: IntGaugeVec,
    pub worker_feeds: IntCounterVec,
    pub worker_feed_failures: IntCounterVec,
    pub worker_slots: IntGauge,
    pub worker_slot_operations: IntCounterVec,
    pub worker_processing_failures: IntCounterVec,
    pub api_request_statuses: IntCounterVec,
    pub api_request_duration: HistogramVec,
    pub api_request_retries: CounterVec,
    pub configuration_loaded: IntCounter,
    pub configuration_loading_error: IntCounter,
    pub configuration_saved: IntCounter,
    pub configuration_saving_error: IntCounter,
}

fn histogram(name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
}

impl Families {
    /// The families, registered (with `process_*` on Linux).
    pub(super) fn new() -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels);
        let gauge = |name: &str, help: &str, labels: &[&str]| IntGaugeVec::new(Opts::new(name, help), labels);
        let fgauge = |name: &str, help: &str, labels: &[&str]| GaugeVec::new(Opts::new(name, help), labels);
        let runner_system = &["runner", "system_id"][..];
        let f = Families {
            registry: Registry::new(),
            version_info: gauge(
                "gitlab_runner_version_info",
                "A metric with a constant '1' value labeled by different build stats fields.",
                &["name", "version", "revision", "branch", "go_version", "built_at", "os", "architecture"],
            )?,
            concurrent: IntGauge::new("gitlab_runner_concurrent", "The current value of concurrent setting")?,
            limit: gauge("gitlab_runner_limit", "The current value of limit setting", RUNNER)?,
            jobs: gauge(
                "gitlab_runner_jobs",
                "The current number of running builds.",
                &["runner", "runner_name", "system_id", "state", "stage", "executor_stage"],
            )?,
            jobs_total: counter("gitlab_runner_jobs_total", "Total number of handled jobs", RUNNER)?,
            job_execution_mode_total: counter(
                "gitlab_runner_job_execution_mode_total",
                "Total number of jobs grouped by execution mode and executor",
                &["mode", "executor"],
            )?,
            job_duration: histogram(
                "gitlab_runner_job_duration_seconds",
                "Histogram of job durations",
                JOB_DURATION_BUCKETS,
                &["runner", "runner_name", "system_id", "mode"],
            )?,
            job_queue_duration: histogram(
                "gitlab_runner_job_queue_duration_seconds",
                "A histogram representing job queue duration.",
                QUEUE_BUCKETS,
                &["runner", "runner_name", "system_id", "project_jobs_running"],
            )?,
            job_queue_size: fgauge(
                "gitlab_runner_job_queue_size",
                "A gauge representing the size of the queue for the runner",
                RUNNER,
            )?,
            job_queue_depth: fgauge(
                "gitlab_runner_job_queue_depth",
                "A gauge representing the search depth in the queue for the runner",
                RUNNER,
            )?,
            acceptable_queuing_exceeded: counter(
                "gitlab_runner_acceptable_job_queuing_duration_exceeded_total",
                "Counts how often jobs exceed the configured queuing time threshold",
                RUNNER,
            )?,
            job_stage_duration: histogram(
                "gitlab_runner_job_stage_duration_seconds",
                "Histogram of each job stage duration",
                QUEUE_BUCKETS,
                &["runner", "runner_name", "system_id", "stage"],
            )?,
            failed_jobs_total: counter(
                "gitlab_runner_failed_jobs_total",
                "Total number of failed jobs",
                &["runner", "runner_name", "failure_reason", "mode"],
            )?,
            request_concurrency: gauge(
                "gitlab_runner_request_concurrency",
                "The current number of concurrent requests for a new job",
                runner_system,
            )?,
            request_concurrency_exceeded: counter(
                "gitlab_runner_request_concurrency_exceeded_total",
                "Count of excess requests above the configured request_concurrency limit",
                runner_system,
            )?,
            request_concurrency_hard_limit: gauge(
                "gitlab_runner_request_concurrency_hard_limit",
                "Configured request_concurrency limit",
                runner_system,
            )?,
            request_concurrency_adaptive_limit: fgauge(
                "gitlab_runner_request_concurrency_adaptive_limit",
                "Computed adaptive request concurrency limit",
                runner_system,
            )?,
            request_concurrency_used_limit: gauge(
                "gitlab_runner_request_concurrency_used_limit",
                "Used request concurrency limit",
                runner_system,
            )?,
            worker_feeds: counter(
                "gitlab_runner_worker_feeds_total",
                "Total number of times that runner worker is fed to the main loop",
                RUNNER,
            )?,
            worker_feed_failures: counter(
                "gitlab_runner_worker_feed_failures_total",
                "Total number of times that runner worker feeding have failed",
                RUNNER,
            )?,
            worker_slots: IntGauge::new("gitlab_runner_worker_slots_number", "Current number of runner worker slots")?,
            worker_slot_operations: counter(
                "gitlab_runner_worker_slot_operations_total",
                "Total number of runner workers slot operations (starting and stopping slots)",
                &["operation"],
            )?,
            worker_processing_failures: counter(
                "gitlab_runner_worker_processing_failures_total",
                "Total number of failures when processing runner worker",
                &["failure_type", "runner", "runner_name", "system_id"],
            )?,
            api_request_statuses: counter(
                "gitlab_runner_api_request_statuses_total",
                "The total number of API requests made by GitLab Runner, partitioned by runner, system_id, endpoint, status and method.",
                &["runner", "system_id", "endpoint", "status", "method"],
            )?,
            api_request_duration: histogram(
                "gitlab_runner_api_request_duration_seconds",
                "Latency histogram of API requests made by GitLab Runner, partitioned by runner, system_id, endpoint, status_class and method.",
                REQUEST_BUCKETS,
                &["runner", "system_id", "endpoint", "status_class", "method"],
            )?,
            api_request_retries: CounterVec::new(
                Opts::new(
                    "gitlab_runner_api_request_retries_total",
                    "The total number of retries made by GitLab Runner in process of completing a request, partitioned by path and method.",
                ),
                &["path", "method"],
            )?,
            configuration_loaded: IntCounter::new(
                "gitlab_runner_configuration_loaded_total",
                "Total number of times the configuration file was loaded by Runner process",
            )?,
            configuration_loading_error: IntCounter::new(
                "gitlab_runner_configuration_loading_error_total",
                "Total number of times the configuration file was not loaded by Runner process due to errors",
            )?,
            configuration_saved: IntCounter::new(
                "gitlab_runner_configuration_saved_total",
                "Total number of times the configuration file was saved by Runner process",
            )?,
            configuration_saving_error: IntCounter::new(
                "gitlab_runner_configuration_saving_error_total",
                "Total number of times the configuration file was not saved by Runner process due to errors",
            )?,
        };
        f.register_all()?;
        Ok(f)
    }

    fn register_all(&self) -> prometheus::Result<()> {
        let r = &self.registry;
        r.register(Box::new(self.version_info.clone()))?;
        r.register(Box::new(self.concurrent.clone()))?;
        r.register(Box::new(self.limit.clone()))?;
        r.register(Box::new(self.jobs.clone()))?;
        r.register(Box::new(self.jobs_total.clone()))?;
        r.register(Box::new(self.job_execution_mode_total.clone()))?;
        r.register(Box::new(self.job_duration.clone()))?;
        r.register(Box::new(self.job_queue_duration.clone()))?;
        r.register(Box::new(self.job_queue_size.clone()))?;
        r.register(Box::new(self.job_queue_depth.clone()))?;
        r.register(Box::new(self.acceptable_queuing_exceeded.clone()))?;
        r.register(Box::new(self.job_stage_duration.clone()))?;
        r.register(Box::new(self.failed_jobs_total.clone()))?;
        r.register(Box::new(self.request_concurrency.clone()))?;
        r.register(Box::new(self.request_concurrency_exceeded.clone()))?;
        r.register(Box::new(self.request_concurrency_hard_limit.clone()))?;
        r.register(Box::new(self.request_concurrency_adaptive_limit.clone()))?;
        r.register(Box::new(self.request_concurrency_used_limit.clone()))?;
        r.register(Box::new(self.worker_feeds.clone()))?;
        r.register(Box::new(self.worker_feed_failures.clone()))?;
        r.register(Box::new(self.worker_slots.clone()))?;
        r.register(Box::new(self.worker_slot_operations.clone()))?;
        r.register(Box::new(self.worker_processing_failures.clone()))?;
        r.register(Box::new(self.api_request_statuses.clone()))?;
        r.register(Box::new(self.api_request_duration.clone()))?;
        r.register(Box::new(self.api_request_retries.clone()))?;
        r.register(Box::new(self.configuration_loaded.clone()))?;
        r.register(Box::new(self.configuration_loading_error.clone()))?;
        r.register(Box::new(self.configuration_saved.clone()))?;
        r.register(Box::new(self.configuration_saving_error.clone()))?;
        #[cfg(target_os = "linux")]
        r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
        Ok(())
    }
}
