//! A received job's side at GitLab while it runs, as [`crate::job`] sees it through
//! [`JobHooks`]: the pending keep-alives until it is accepted, the two-phase commit
//! (`PUT state=running`, then the trace uploader and GitLab's cancel and abort turned into the
//! job's), its store entry saved at every boundary with a heartbeat, its stages reported to
//! the observer, its web terminal ([`JobTerminal`]), and the final update
//! ([`GitLabSide::report`]).
//!
//! Owns: [`GitLabSide`], [`StageReport`]. Must not touch: capacity and fleet slots
//! (`super::context`), how a job ends (`super::Received::end` decides what is called here).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::terminal::JobTerminal;
use crate::executor::TerminalPlace;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, UpdateOutcome};
use crate::gitlab::retry::RetryPolicy;
use crate::job::{self, Boundary, JobControl, JobEnvironment, JobHooks, JobOutcome, Progress};
use crate::manager::observe::Observer;
use crate::manager::persist::JobRecord;
use crate::payload::{flags, JobResponse};
use crate::trace::format::RunnerIdentity;
use crate::trace::upload::{SendLimit, TraceUploader, UploadConfig};
use crate::trace::{wire_reason, FailureReason, JobTrace};

/// Why GitLab did not take a job's acceptance (`PUT state=running`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AcceptError {
    /// 403/404/409: the job is gone or someone else's.
    #[error("GitLab no longer assigns this job to us")]
    Gone,
    /// Any other answer.
    #[error("accepting the job failed: {0:?}")]
    Failed(UpdateOutcome),
}

/// Reports a job's stages to the manager's observer.
pub(crate) struct StageReport {
    observer: Arc<dyn Observer>,
    runner: RunnerIdentity,
    job: i64,
    /// The job's `FF_EXPORT_HIGH_CARDINALITY_METRICS`.
    detailed: bool,
}

impl StageReport {
    /// The stages of `job` on a runner with `env`, told to `observer`.
    pub(crate) fn new(observer: Arc<dyn Observer>, env: &JobEnvironment, job: &JobResponse) -> Self {
        let detailed = flags::is_on(flags::EXPORT_HIGH_CARDINALITY_METRICS, &env.settings.feature_flags, job);
        StageReport { observer, runner: env.identity.clone(), job: job.id, detailed }
    }
}

/// A job's entry in the job store, saved at every boundary and by a heartbeat.
struct StoreEntry {
    record: Arc<JobRecord>,
    /// Heartbeat interval (`health_interval`).
    health_interval: Duration,
    /// The heartbeat runs (it starts at the first boundary).
    heartbeat: AtomicBool,
}

/// One job at GitLab: its API, its trace and uploader, its acceptance, its store entry.
pub(crate) struct GitLabSide {
    api: Arc<dyn JobApi>,
    /// Backoff between acceptance attempts GitLab did not answer (the client's policy).
    retry: RetryPolicy,
    trace: JobTrace,
    upload: UploadConfig,
    control: JobControl,
    /// Stops the pending keep-alives.
    keepalive: CancellationToken,
    uploader: Mutex<Option<TraceUploader>>,
    accepted: AtomicBool,
    entry: Option<StoreEntry>,
    stages: Option<StageReport>,
    terminal: Option<JobTerminal>,
}

impl GitLabSide {
    /// Job `api` writing to `trace`, controlled by `control`; not accepted yet, kept in no
    /// store, its stages reported to nobody, no keep-alives.
    pub(crate) fn new(
        api: Arc<dyn JobApi>,
        trace: JobTrace,
        control: JobControl,
        retry: RetryPolicy,
        upload: UploadConfig,
    ) -> Self {
        GitLabSide {
            api,
            retry,
            trace,
            upload,
            control,
            keepalive: CancellationToken::new(),
            uploader: Mutex::new(None),
            accepted: false.into(),
            entry: None,
            stages: None,
            terminal: None,
        }
    }

    /// Keep the job `PUT state=pending` every `every` until it is accepted or ends.
    pub(crate) fn keeping_pending(self, every: Duration) -> Self {
        let (api, stop) = (self.api.clone(), self.keepalive.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.cancelled() => return,
                }
                let _ = api.update_job(&JobUpdate::state(JobState::Pending)).await;
            }
        });
        self
    }

    /// Save the job to `record` at every boundary, with a heartbeat every `health_interval`.
    pub(crate) fn stored_in(self, record: JobRecord, health_interval: Duration) -> Self {
        let entry = StoreEntry { record: Arc::new(record), health_interval, heartbeat: false.into() };
        GitLabSide { entry: Some(entry), ..self }
    }

    /// Serve the job's web terminal in `terminal`.
    pub(crate) fn with_terminal(self, terminal: JobTerminal) -> Self {
        GitLabSide { terminal: Some(terminal), ..self }
    }

    /// Report the job's stages through `report`.
    pub(crate) fn reporting_stages(self, report: StageReport) -> Self {
        GitLabSide { stages: Some(report), ..self }
    }

    /// Fires when another manager took the job over (never without a store entry).
    pub(crate) fn lost(&self) -> CancellationToken {
        self.entry.as_ref().map(|e| e.record.lost()).unwrap_or_default()
    }

    /// Did GitLab take the job (`PUT state=running`)?
    pub(crate) fn accepted(&self) -> bool {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The two-phase commit point: stop the pending keep-alives, `PUT state=running` until
    /// GitLab decides, and start uploading the trace.
    pub(crate) async fn accept(&self) -> Result<(), AcceptError> {
        if self.accepted() {
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
    pub(crate) fn start_uploader(&self, sent_offset: u64) {
        self.accepted.store(true, Ordering::SeqCst);
        // A stored job's trace goes to GitLab only once the store has it.
        let limit = self.entry.as_ref().map(|e| e.record.clone() as Arc<dyn SendLimit>);
        let uploader =
            TraceUploader::within(self.api.clone(), self.trace.clone(), self.upload.clone(), sent_offset, limit);
        if let Some(entry) = &self.entry {
            entry.record.set_acked(uploader.sent_counter());
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

    /// The final update of job `id`: accept a job that failed before acceptance (so its
    /// trace and failure reach GitLab), then stop the uploader with the job's final state.
    pub(crate) async fn report(&self, id: i64, outcome: &JobOutcome, failure_reasons: &[String]) {
        if let Err(e) = self.accept().await {
            tracing::warn!(job = id, "job dropped: {e}");
            return;
        }
        let update = JobUpdate {
            state: if outcome.succeeded() { JobState::Success } else { JobState::Failed },
            failure_reason: outcome.failure.map(|r| wire_reason(Some(r), failure_reasons)),
            exit_code: outcome.exit_code.filter(|c| *c != 0),
            checksum: None,
            bytesize: None,
        };
        let uploader = self.uploader.lock().ok().and_then(|mut u| u.take());
        if let Some(uploader) = uploader {
            match uploader.finish(update).await {
                Ok(()) => tracing::info!(job = id, state = ?outcome.failure, "job finished"),
                Err(e) => tracing::warn!(job = id, "final job update failed: {e:?}"),
            }
        }
    }

    /// Nothing more goes to GitLab before the final update: stop the pending keep-alives.
    pub(crate) fn stop_keepalive(&self) {
        self.keepalive.cancel();
    }

    /// The job is over for this manager: stop its heartbeat and remove its store entry
    /// (unless another manager owns it now).
    pub(crate) async fn forget(&self) {
        if let Some(entry) = &self.entry {
            entry.record.finish().await;
        }
    }
}

#[async_trait]
impl JobHooks for GitLabSide {
    async fn prepared(&self) -> Result<(), job::AcceptError> {
        self.accept().await.map_err(|e| job::AcceptError(e.to_string()))
    }

    fn progress(&self) -> Option<Progress> {
        self.entry.as_ref().map(|e| e.record.progress())
    }

    async fn boundary(&self, boundary: Boundary<'_>) {
        if let (Boundary::StageEnded(stage, duration), Some(r)) = (boundary, &self.stages) {
            r.observer.stage_ended(&r.runner, r.job, stage, duration, r.detailed);
        }
        if let Some(entry) = &self.entry {
            entry.record.save_logged().await;
            if !entry.heartbeat.swap(true, Ordering::SeqCst) {
                entry.record.start_heartbeat(entry.health_interval);
            }
        }
        if let (Boundary::StageStarted(stage), Some(r)) = (boundary, &self.stages) {
            r.observer.stage_started(&r.runner, r.job, stage);
        }
    }

    fn wants_terminal(&self) -> bool {
        self.terminal.is_some()
    }

    fn terminal(&self, place: TerminalPlace) {
        if let Some(terminal) = &self.terminal {
            terminal.attach(place);
        }
    }

    async fn stages_over(&self, left: Duration) {
        if let Some(terminal) = &self.terminal {
            terminal.wait(left).await;
        }
    }
}
