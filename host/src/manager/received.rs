//! A job from the moment GitLab handed it over to its final update: the pending keep-alives
//! while it waits for capacity, the two-phase commit ([`Acceptance`]), its entry in the job
//! store, running it, and the tail every job shares ([`report_and_clean_up`]: final update,
//! executor cleanup, the store entry removed). Jobs whose payload does not decode are failed
//! here too ([`fail_bad_payload`]).
//!
//! Owns: running one received job. Must not touch: polling (`super`), resuming stored jobs
//! (`super::resume`, which reuses [`Acceptance`] and [`report_and_clean_up`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::observe::{FinishedJob, Observer, ProcessingFailure};
use super::persist::JobRecord;
use super::{fleet, Runner, Shared};
use crate::executor::InstanceLease;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, UpdateOutcome};
use crate::gitlab::client::{BadJob, JobClient, ReceivedJob};
use crate::gitlab::retry::RetryPolicy;
use crate::job::{self, fail_unplannable, run_job_until_cleanup, JobCleanup, JobControl, JobHooks, JobOutcome};
use crate::job::{JobEnvironment, JobProgress, Progress};
use crate::payload::{flags, JobResponse};
use crate::store::jobs::EntryMeta;
use crate::trace::format::RunnerIdentity;
use crate::trace::upload::{TraceUploader, UploadConfig};
use crate::trace::{wire_reason, FailureReason, JobTrace, TraceOptions};

/// The two-phase commit point: stop the pending keep-alives, `PUT state=running`, and start
/// uploading the trace. Also the job's hooks for saving its progress to the store.
pub(super) struct Acceptance {
    pub(super) api: Arc<dyn JobApi>,
    /// Backoff between acceptance attempts GitLab did not answer (the client's policy).
    pub(super) retry: RetryPolicy,
    pub(super) trace: JobTrace,
    pub(super) upload: UploadConfig,
    pub(super) control: JobControl,
    pub(super) keepalive: CancellationToken,
    pub(super) uploader: Mutex<Option<TraceUploader>>,
    pub(super) accepted: AtomicBool,
    /// The job's store entry, when the runner has a store.
    pub(super) record: Option<Arc<JobRecord>>,
    /// Heartbeat of the store entry.
    pub(super) health_interval: Duration,
    pub(super) heartbeat: AtomicBool,
    /// Where the job's stages are reported (metrics), when they are.
    pub(super) stages: Option<StageReport>,
}

/// Reports a job's stages to the manager's observer.
pub(super) struct StageReport {
    pub(super) observer: Arc<dyn Observer>,
    pub(super) runner: RunnerIdentity,
    pub(super) job: i64,
    /// The job's `FF_EXPORT_HIGH_CARDINALITY_METRICS`.
    pub(super) detailed: bool,
}

impl StageReport {
    pub(super) fn new(observer: Arc<dyn Observer>, env: &JobEnvironment, job: &JobResponse) -> Self {
        let detailed = flags::is_on(flags::EXPORT_HIGH_CARDINALITY_METRICS, &env.settings.feature_flags, job);
        StageReport { observer, runner: env.identity.clone(), job: job.id, detailed }
    }
}

/// Why GitLab did not take a job's acceptance (`PUT state=running`).
#[derive(Debug, thiserror::Error)]
pub(super) enum AcceptError {
    /// 403/404/409: the job is gone or someone else's.
    #[error("GitLab no longer assigns this job to us")]
    Gone,
    /// Any other answer.
    #[error("accepting the job failed: {0:?}")]
    Failed(UpdateOutcome),
}

impl Acceptance {
    /// Hooks for job `api` writing to `trace`, not accepted yet.
    pub(super) fn new(
        api: Arc<dyn JobApi>,
        retry: RetryPolicy,
        trace: JobTrace,
        upload: UploadConfig,
        control: JobControl,
    ) -> Self {
        Acceptance {
            api,
            retry,
            trace,
            upload,
            control,
            keepalive: CancellationToken::new(),
            uploader: Mutex::new(None),
            accepted: false.into(),
            record: None,
            health_interval: Duration::from_secs(5),
            heartbeat: false.into(),
            stages: None,
        }
    }

    pub(super) async fn accept(&self) -> Result<(), AcceptError> {
        if self.accepted.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.keepalive.cancel();
        // A reset connection or an overloaded GitLab is no answer: ask again, with the same
        // backoff as every other request, until GitLab decides (or the job is aborted).
        let mut attempt = 0u32;
        loop {
            let response = self.api.update_job(&JobUpdate::state(JobState::Running)).await;
            match response.outcome {
                UpdateOutcome::Accepted | UpdateOutcome::AcceptedRetryLater(_) => break,
                UpdateOutcome::Abort | UpdateOutcome::Conflict => return Err(AcceptError::Gone),
                UpdateOutcome::Unavailable(error) => {
                    attempt += 1;
                    let wait = self.retry.backoff(attempt);
                    tracing::warn!(%error, attempt, ?wait, "accepting the job got no answer; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.control.abort.cancelled() => {
                            return Err(AcceptError::Failed(UpdateOutcome::Unavailable(error)));
                        }
                    }
                }
                outcome @ (UpdateOutcome::TraceValidationFailed | UpdateOutcome::Failed(_)) => {
                    return Err(AcceptError::Failed(outcome));
                }
            }
        }
        self.start_uploader(0);
        Ok(())
    }

    /// The job is GitLab's running job: upload its trace from `sent_offset` (what GitLab has)
    /// and turn GitLab's cancel and abort into the job's.
    pub(super) fn start_uploader(&self, sent_offset: u64) {
        self.accepted.store(true, Ordering::SeqCst);
        let uploader = TraceUploader::resume(self.api.clone(), self.trace.clone(), self.upload.clone(), sent_offset);
        if let Some(record) = &self.record {
            record.set_acked(uploader.sent_counter());
        }
        let signals = uploader.signals();
        let control = self.control.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = signals.cancel_requested.cancelled() => control.cancel.cancel(),
                _ = signals.abort.cancelled() => control.abort_with(FailureReason::JobCanceled),
                _ = control.abort.cancelled() => {}
            }
            // A cancel may be followed by an abort (force cancel).
            tokio::select! {
                _ = signals.abort.cancelled() => control.abort_with(FailureReason::JobCanceled),
                _ = control.abort.cancelled() => {}
            }
        });
        if let Ok(mut slot) = self.uploader.lock() {
            *slot = Some(uploader);
        }
    }
}

#[async_trait]
impl JobHooks for Acceptance {
    async fn prepared(&self) -> Result<(), job::AcceptError> {
        self.accept().await.map_err(|e| job::AcceptError(e.to_string()))
    }

    fn progress(&self) -> Option<Progress> {
        self.record.as_ref().map(|r| r.progress())
    }

    fn stage_started(&self, stage: &str) {
        if let Some(r) = &self.stages {
            r.observer.stage_started(&r.runner, r.job, stage);
        }
    }

    fn stage_ended(&self, stage: &str, duration: Duration) {
        if let Some(r) = &self.stages {
            r.observer.stage_ended(&r.runner, r.job, stage, duration, r.detailed);
        }
    }

    async fn checkpoint(&self) {
        let Some(record) = &self.record else { return };
        record.save_logged().await;
        if !self.heartbeat.swap(true, Ordering::SeqCst) {
            record.start_heartbeat(self.health_interval);
        }
    }
}

fn start_pending_keepalive(api: Arc<dyn JobApi>, every: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => return,
            }
            let _ = api.update_job(&JobUpdate::state(JobState::Pending)).await;
        }
    });
}

/// A fleet slot reserved for a job request; given back on drop unless the job finished it.
pub(super) struct Reservation {
    fleet: Arc<fleet::Fleet>,
    key: String,
    open: bool,
}

impl Reservation {
    pub(super) fn new(fleet: Arc<fleet::Fleet>, key: String) -> Self {
        Reservation { fleet, key, open: true }
    }

    /// The job ended: free the slot (after probing the instance on a system failure).
    async fn finish(mut self, system_failure: bool) {
        self.open = false;
        self.fleet.finish(&self.key, system_failure).await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.open {
            self.fleet.unreserve(&self.key);
        }
    }
}

/// Now as unix seconds.
pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The trace options of `job` on `runner`.
pub(super) fn trace_options(job: &JobResponse, runner: &Runner) -> TraceOptions {
    TraceOptions {
        masked_phrases: job.masked_values(),
        token_prefixes: job.features.token_mask_prefixes.clone(),
        output_limit_kib: runner.settings.output_limit_kib,
        timestamps: flags::is_on(flags::TIMESTAMPS, &runner.settings.env.settings.feature_flags, job),
        only_personal_tokens: !flags::is_on(
            flags::MASK_ALL_DEFAULT_TOKENS,
            &runner.settings.env.settings.feature_flags,
            job,
        ),
    }
}

/// The API of job `id` with `token` on `runner`'s GitLab.
pub(super) fn job_api(runner: &Runner, job: &JobResponse) -> Option<Arc<dyn JobApi>> {
    let settings = &runner.settings;
    match JobClient::new(runner.client.clone(), &settings.credentials.url, job.id, &job.token, runner.info.clone()) {
        Ok(c) => Some(Arc::new(c.with_debug_trace(job.variable("CI_DEBUG_TRACE") == Some("true")))),
        Err(e) => {
            tracing::error!(job = job.id, "cannot talk to GitLab about job: {e}");
            None
        }
    }
}

pub(super) async fn run_received(
    runner: Arc<Runner>,
    shared: Arc<Shared>,
    received: ReceivedJob,
    reservation: Option<Reservation>,
) {
    let job = received.job;
    let declinable = received.declinable;
    let settings = &runner.settings;
    // Never run a job whose secrets cannot be masked: fail it with only the error in its log.
    let trace = match JobTrace::new(&trace_options(&job, &runner)) {
        Ok(t) => t,
        Err(e) => {
            let error = format!("cannot set up masking for this job's log: {e}");
            let bad = BadJob {
                id: job.id,
                token: job.token.clone(),
                error,
                failure_reasons: job.features.failure_reasons.clone(),
            };
            return fail_bad_payload(runner, shared, bad).await;
        }
    };
    let Some(api) = job_api(&runner, &job) else { return };
    let keepalive = CancellationToken::new();
    start_pending_keepalive(api.clone(), shared.settings.pending_keepalive, keepalive.clone());

    // Wait for capacity while the job stays pending at GitLab.
    let Some(permits) = super::capacity(&runner, &shared).await else {
        keepalive.cancel();
        return;
    };
    let _running = super::Running::start(&shared, &runner, job.id);

    let mut upload = shared.settings.upload.clone();
    upload.final_update_retry_limit = settings.final_update_retry_limit;
    let control = JobControl::default();
    let interrupt = super::interrupt_on_shutdown(&shared, &control);
    let mut hooks =
        Acceptance::new(api.clone(), runner.client.retry_policy().clone(), trace.clone(), upload, control.clone());
    hooks.keepalive = keepalive.clone();
    let observer = shared.settings.observer.clone();
    observer.job_received(&settings.env.identity, job.id, &job.job_info);
    for message in flags::notice_unsupported(flags::job_flags(&job)) {
        tracing::warn!(job = job.id, "{message}");
    }
    hooks.stages = Some(StageReport::new(observer.clone(), &settings.env, &job));
    if let Some(store) = &settings.store {
        let meta = EntryMeta {
            job_id: u64::try_from(job.id).unwrap_or_default(),
            owner: settings.credentials.system_id.clone(),
            created: unix_now(),
            heartbeat: 0,
            resumes: 0,
            stage: String::new(),
            project: job.job_info.project_full_path.clone(),
        };
        let payload = String::from_utf8_lossy(&received.raw).into_owned();
        let progress = Progress::new(JobProgress::default());
        hooks.record = Some(Arc::new(JobRecord::new(
            store.store.clone(),
            meta,
            payload,
            trace.clone(),
            progress,
            0,
            shared.stats.clone(),
        )));
        hooks.health_interval = store.settings.health_interval;
    }
    let slot = runner.slots.take(job.job_info.project_id);
    let mut env = settings.env.clone();
    env.settings.concurrent_id = slot.concurrent_id;
    env.settings.concurrent_project_id = slot.concurrent_project_id;
    if let Some(reservation) = &reservation {
        reservation.fleet.track(&reservation.key, control.clone(), Arc::new(trace.clone()));
        env.instance = Some(InstanceLease { source: reservation.fleet.clone(), key: reservation.key.clone() });
    }

    let started = std::time::Instant::now();
    let lost = hooks.record.as_ref().map(|r| r.lost()).unwrap_or_default();
    let run = run_job_until_cleanup(&job, &env, Arc::new(trace.clone()), &control, &hooks);
    let (outcome, cleanup) = tokio::select! {
        ended = run => ended,
        _ = lost.cancelled() => {
            // Another manager resumed the job: it is theirs now, trace, update and cleanup.
            keepalive.cancel();
            interrupt.abort();
            return;
        }
    };
    if declinable && outcome.preparation_failed && !hooks.accepted.load(Ordering::SeqCst) {
        // Behind a Runway router: hand the job back so another runner can take it.
        match decline(&runner, &job, &outcome.message).await {
            Ok(()) => {
                tracing::warn!(job = job.id, error = %outcome.message, "preparation failed; job declined back to the router");
                drop(slot);
                interrupt.abort();
                keepalive.cancel();
                cleanup.run().await;
                if let Some(record) = &hooks.record {
                    record.finish().await;
                }
                if let Some(reservation) = reservation {
                    reservation.finish(true).await;
                }
                drop(permits);
                return;
            }
            Err(e) => tracing::warn!(job = job.id, "declining the job failed ({e}); failing it instead"),
        }
    }
    let wire_failure = outcome.failure.map(|r| wire_reason(Some(r), &job.features.failure_reasons));
    shared.stats.record(wire_failure.as_deref(), started.elapsed());
    let finished = FinishedJob {
        id: job.id,
        executor: &settings.env.settings.executor,
        duration: started.elapsed(),
        failure: wire_failure.as_deref(),
    };
    observer.job_finished(&settings.env.identity, &finished);
    if wire_failure.is_some() {
        observer.processing_failure(&settings.env.identity, ProcessingFailure::JobFailure);
    }
    drop(slot);
    interrupt.abort();
    report_and_clean_up(job.id, &hooks, &outcome, &job.features.failure_reasons, cleanup).await;
    if let Some(reservation) = reservation {
        reservation.finish(outcome.failure == Some(FailureReason::RunnerSystemFailure)).await;
    }
    drop(permits);
}

/// `POST /jobs/:id/runner_provisioning` `status=declined` to the router `job` came from.
async fn decline(runner: &Runner, job: &JobResponse, reason: &str) -> Result<(), String> {
    let settings = &runner.settings;
    let client =
        JobClient::new(runner.client.clone(), &settings.credentials.url, job.id, &job.token, runner.info.clone())
            .map_err(|e| e.to_string())?;
    client.decline(reason).await.map_err(|e| e.to_string())
}

/// The tail every job shares: accept a job that failed before acceptance (so its trace and
/// failure reach GitLab), send the final update, then clean up the executor (a plugin whose
/// `cleanup` hangs holds this slot until its call_timeout, never the job's state) and drop
/// the job's store entry.
pub(super) async fn report_and_clean_up(
    job_id: i64,
    hooks: &Acceptance,
    outcome: &JobOutcome,
    failure_reasons: &[String],
    cleanup: JobCleanup,
) {
    if let Err(e) = hooks.accept().await {
        tracing::warn!(job = job_id, "job dropped: {e}");
    } else {
        let update = JobUpdate {
            state: if outcome.succeeded() { JobState::Success } else { JobState::Failed },
            failure_reason: outcome.failure.map(|r| wire_reason(Some(r), failure_reasons)),
            exit_code: outcome.exit_code.filter(|c| *c != 0),
            checksum: None,
            bytesize: None,
        };
        let uploader = hooks.uploader.lock().ok().and_then(|mut u| u.take());
        if let Some(uploader) = uploader {
            match uploader.finish(update).await {
                Ok(()) => tracing::info!(job = job_id, state = ?outcome.failure, "job finished"),
                Err(e) => tracing::warn!(job = job_id, "final job update failed: {e:?}"),
            }
        }
    }
    hooks.keepalive.cancel();
    cleanup.run().await;
    if let Some(record) = &hooks.record {
        record.finish().await;
    }
}

/// A job whose payload does not decode: accept it, write why, fail it with
/// `runner_system_failure` — never leave it running until GitLab's timeout.
pub(super) async fn fail_bad_payload(runner: Arc<Runner>, shared: Arc<Shared>, bad: BadJob) {
    let settings = &runner.settings;
    let api: Arc<dyn JobApi> =
        match JobClient::new(runner.client.clone(), &settings.credentials.url, bad.id, &bad.token, runner.info.clone())
        {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::error!(job = bad.id, "cannot report bad job payload: {e}");
                return;
            }
        };
    tracing::error!(job = bad.id, "{}", bad.error);
    let Ok(trace) = JobTrace::new(&TraceOptions {
        masked_phrases: vec![bad.token.clone()],
        token_prefixes: Vec::new(),
        output_limit_kib: settings.output_limit_kib,
        timestamps: true,
        only_personal_tokens: false,
    }) else {
        return;
    };
    let hooks = Acceptance::new(
        api,
        runner.client.retry_policy().clone(),
        trace.clone(),
        shared.settings.upload.clone(),
        JobControl::default(),
    );
    let outcome = fail_unplannable(&trace, &settings.env.identity, &bad.error);
    if let Err(e) = hooks.accept().await {
        tracing::warn!(job = bad.id, "bad job dropped: {e}");
        return;
    }
    let update = JobUpdate {
        state: JobState::Failed,
        failure_reason: outcome.failure.map(|r| wire_reason(Some(r), &bad.failure_reasons)),
        exit_code: None,
        checksum: None,
        bytesize: None,
    };
    let uploader = hooks.uploader.lock().ok().and_then(|mut u| u.take());
    if let Some(uploader) = uploader {
        if let Err(e) = uploader.finish(update).await {
            tracing::warn!(job = bad.id, "final job update failed: {e:?}");
        }
    }
}
