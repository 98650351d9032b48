//! [`TraceUploader`]: the client side of GitLab's trace loop (§1.10) driven through
//! [`JobApi`] — incremental `PATCH /jobs/:id/trace`, keep-alive `PUT state=running`, the remote
//! cancel/abort signals, and the final update with its 202/412/retry handling — and
//! [`SendLimit`], how far a job kept in a job store lets its trace go to GitLab.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use super::JobTrace;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, PatchOutcome, RemoteJobStatus, UpdateOutcome};

/// Timing and size knobs of the trace loop; the defaults are GitLab Runner's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadConfig {
    /// Time between patches until the server says otherwise (3 s).
    pub update_interval: Duration,
    /// Cap on a server-provided `X-GitLab-Trace-Update-Interval` (15 min).
    pub max_update_interval: Duration,
    /// Keep-alive `PUT state=running` after this long without an acknowledged call (30 s).
    pub force_send_interval: Duration,
    /// Largest PATCH body (1 MiB).
    pub patch_limit: usize,
    /// Failed final-update rounds retried this many times (`job_status_final_update_retry_limit`, 10).
    pub final_update_retry_limit: u32,
    /// First wait after a failed final-update round (1 s), doubling each time.
    pub final_backoff_base: Duration,
    /// Longest wait between final-update rounds (60 min).
    pub final_backoff_max: Duration,
    /// Before the final PUT, PATCHes of the rest of the trace that fail (or hit a 416) this
    /// many times in a row give up on the trace; the PUT is sent anyway (5).
    pub final_trace_retry_limit: u32,
    /// The longest time spent sending the rest of the trace before the final PUT goes out
    /// regardless (5 min).
    pub final_trace_timeout: Duration,
}

impl Default for UploadConfig {
    fn default() -> Self {
        UploadConfig {
            update_interval: Duration::from_secs(3),
            max_update_interval: Duration::from_secs(15 * 60),
            force_send_interval: Duration::from_secs(30),
            patch_limit: 1024 * 1024,
            final_update_retry_limit: 10,
            final_backoff_base: Duration::from_secs(1),
            final_backoff_max: Duration::from_secs(60 * 60),
            final_trace_retry_limit: 5,
            final_trace_timeout: Duration::from_secs(5 * 60),
        }
    }
}

/// How far a job's trace may go to GitLab. A job kept in a job store sends GitLab only bytes
/// the store already has: a manager restarted from the store then never holds less of the
/// trace than GitLab, so a resumed job's trace goes on from GitLab's size (the uploader's 416
/// resync) without losing a line GitLab had or overwriting it at the final 412 re-upload.
#[async_trait::async_trait]
pub trait SendLimit: Send + Sync {
    /// Make what it can of the trace durable now and say how many of its first bytes may be
    /// sent (`u64::MAX`: no limit).
    async fn sendable(&self) -> u64;
}

/// What GitLab said about the job while it runs.
#[derive(Debug, Clone, Default)]
pub struct RemoteSignals {
    /// `Job-Status: canceling`: stop the script gracefully, still run `after_script`.
    pub cancel_requested: CancellationToken,
    /// 403 or `Job-Status: canceled|failed`: kill everything now.
    pub abort: CancellationToken,
}

impl RemoteSignals {
    fn observe(&self, status: RemoteJobStatus) {
        match status {
            RemoteJobStatus::Running => {}
            RemoteJobStatus::CancelRequested => self.cancel_requested.cancel(),
            RemoteJobStatus::Abort => self.abort.cancel(),
        }
    }
}

/// Why the final job update did not get through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FinalUpdateError {
    /// GitLab no longer takes updates for this job from this runner (403/404/409 or the job
    /// was canceled): nothing more to do.
    #[error("GitLab no longer accepts updates for this job: {0}")]
    JobGone(String),
    /// Every retry failed.
    #[error("the final job update failed {attempts} times; last error: {last_error}")]
    RetriesExhausted {
        /// How many times it was tried.
        attempts: u32,
        /// What the last try answered.
        last_error: String,
    },
}

/// How one PATCH went, from the loop's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PatchStep {
    NothingToSend,
    Sent,
    /// 416: the offset was moved to the server's size (or to 0 when the server did not say).
    Resynced,
    /// 416 without a size even for a re-upload from 0: patching cannot find the server's
    /// offset. Patches stop until the final update, whose checksum settles it (a 412 resets
    /// the trace to 0; a 200 means GitLab keeps what it has).
    Desynced,
    /// 404 earlier or now: no more patches for this job.
    Stopped,
    /// 403: the job must be aborted.
    Aborted,
    Failed(String),
}

/// How sending the rest of the trace before the final PUT went.
enum Flush {
    /// Everything GitLab will take was sent.
    Complete,
    /// Given up on (attempts or time exhausted, offset unknown): the PUT goes out anyway.
    Incomplete(String),
}

/// How one round of the final update went.
enum FinalRound {
    Done,
    Gone(String),
    /// 202: ask again after this long (does not count as a failure).
    AskAgainAfter(Duration),
    /// Counts towards the retry limit; wait the update interval (412) or back off.
    Retry {
        error: String,
        back_off: bool,
    },
}

/// The loop's state; owned by the background task, handed back to `finish`.
struct UploadLoop {
    api: Arc<dyn JobApi>,
    trace: JobTrace,
    config: UploadConfig,
    signals: RemoteSignals,
    /// Bytes GitLab acknowledged (next PATCH offset); shared for [`TraceUploader::sent_offset`].
    sent: Arc<AtomicU64>,
    last_ack: Instant,
    interval: Duration,
    patching_stopped: bool,
    /// The server's offset is unknown (416 without `Range`, even from 0).
    desynced: bool,
    /// Where the trace would end at GitLab if PATCHes whose reply never came (a lost or cut
    /// reply) did arrive: the offsets to try when a 416 does not say. Cleared by an answer
    /// that says where GitLab is.
    unconfirmed: Vec<u64>,
    /// Next wait after a failed final-phase call (PATCH or PUT), doubling.
    backoff: Duration,
    /// Bytes past this are not sent yet (a job store has not got them).
    limit: Option<Arc<dyn SendLimit>>,
}

impl UploadLoop {
    fn new(
        api: Arc<dyn JobApi>,
        trace: JobTrace,
        config: UploadConfig,
        signals: RemoteSignals,
        sent: Arc<AtomicU64>,
        limit: Option<Arc<dyn SendLimit>>,
    ) -> Self {
        UploadLoop {
            limit,
            api,
            trace,
            interval: config.update_interval,
            backoff: config.final_backoff_base,
            config,
            signals,
            sent,
            last_ack: Instant::now(),
            patching_stopped: false,
            desynced: false,
            unconfirmed: Vec::new(),
        }
    }

    /// The wait after a failed final-phase call; the next one is twice as long (capped).
    fn next_backoff(&mut self) -> Duration {
        let wait = self.backoff;
        self.backoff = self.backoff.saturating_mul(2).min(self.config.final_backoff_max);
        wait
    }

    fn apply_interval(&mut self, interval: Option<Duration>) {
        if let Some(interval) = interval.filter(|i| !i.is_zero()) {
            self.interval = interval.min(self.config.max_update_interval);
        }
    }

    async fn send_patch(&mut self) -> PatchStep {
        if self.patching_stopped {
            return PatchStep::Stopped;
        }
        if self.desynced {
            return PatchStep::Desynced;
        }
        let offset = self.sent.load(Ordering::SeqCst);
        let max = match &self.limit {
            Some(limit) => {
                let sendable = limit.sendable().await.saturating_sub(offset);
                usize::try_from(sendable).unwrap_or(usize::MAX).min(self.config.patch_limit)
            }
            None => self.config.patch_limit,
        };
        let content = self.trace.read_from(offset, max);
        if content.is_empty() {
            return PatchStep::NothingToSend;
        }
        let response = self.api.patch_trace(offset, &content).await;
        self.signals.observe(response.remote_status);
        self.apply_interval(response.update_interval);
        match response.outcome {
            PatchOutcome::Accepted => {
                self.unconfirmed.clear();
                self.sent.store(offset + content.len() as u64, Ordering::SeqCst);
                self.last_ack = Instant::now();
                PatchStep::Sent
            }
            PatchOutcome::RangeMismatch { server_size } => {
                tracing::debug!(offset, server_size, "trace range mismatch; resending from the server's size");
                self.unconfirmed.clear();
                self.sent.store(server_size, Ordering::SeqCst);
                self.last_ack = Instant::now();
                PatchStep::Resynced
            }
            // A PATCH whose reply was lost probably arrived: continue after it. A wrong guess
            // costs one more 416 (GitLab appends only at its exact size), never a duplicate.
            PatchOutcome::RangeUnknown if self.unconfirmed.iter().any(|end| *end != offset) => {
                let at = self.unconfirmed.iter().rposition(|end| *end != offset).unwrap_or_default();
                let guess = self.unconfirmed.remove(at);
                tracing::warn!(offset, guess, "trace PATCH got 416 without a Range header; assuming an earlier PATCH whose reply was lost arrived");
                self.sent.store(guess, Ordering::SeqCst);
                PatchStep::Resynced
            }
            // GitLab Runner reads a missing Range as offset 0: send the whole trace again.
            PatchOutcome::RangeUnknown if offset > 0 => {
                tracing::warn!(offset, "trace PATCH got 416 without a Range header; resending the trace from 0");
                self.sent.store(0, Ordering::SeqCst);
                PatchStep::Resynced
            }
            PatchOutcome::RangeUnknown => {
                tracing::warn!("trace PATCH from 0 got 416 without a Range header; the final update's checksum will resync the trace");
                self.desynced = true;
                PatchStep::Desynced
            }
            PatchOutcome::NotFound => {
                tracing::warn!("trace PATCH returned 404; no more trace will be sent for this job");
                self.patching_stopped = true;
                PatchStep::Stopped
            }
            PatchOutcome::Abort => {
                self.signals.abort.cancel();
                self.patching_stopped = true;
                PatchStep::Aborted
            }
            PatchOutcome::Failed(error) => {
                let end = offset + content.len() as u64;
                if !self.unconfirmed.contains(&end) && self.unconfirmed.len() < 16 {
                    self.unconfirmed.push(end);
                }
                PatchStep::Failed(error)
            }
        }
    }

    /// Keep-alive `PUT state=running` when nothing was acknowledged for a while.
    async fn touch_if_idle(&mut self) {
        if self.last_ack.elapsed() < self.config.force_send_interval {
            return;
        }
        let (checksum, bytesize) = self.trace.output_info();
        let update =
            JobUpdate { checksum: Some(checksum), bytesize: Some(bytesize), ..JobUpdate::state(JobState::Running) };
        let response = self.api.update_job(&update).await;
        self.signals.observe(response.remote_status);
        self.apply_interval(response.update_interval);
        match response.outcome {
            UpdateOutcome::Accepted => self.last_ack = Instant::now(),
            UpdateOutcome::Abort | UpdateOutcome::Conflict => self.signals.abort.cancel(),
            _ => {}
        }
    }

    /// Patch every interval until `stop`; after an abort, only wait for `stop`.
    async fn watch(mut self, stop: CancellationToken) -> Self {
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return self,
                _ = sleep(self.interval) => {}
            }
            match self.send_patch().await {
                PatchStep::Sent | PatchStep::NothingToSend | PatchStep::Desynced => self.touch_if_idle().await,
                PatchStep::Failed(error) => tracing::warn!(%error, "trace PATCH failed; retrying next interval"),
                PatchStep::Resynced | PatchStep::Stopped | PatchStep::Aborted => {}
            }
            if self.signals.abort.is_cancelled() {
                stop.cancelled().await;
                return self;
            }
        }
    }

    /// Send what is left of the trace before the final PUT, giving up after
    /// `final_trace_retry_limit` attempts in a row that made no progress or at `deadline`.
    async fn flush(&mut self, deadline: Instant) -> Flush {
        let mut failures = 0u32;
        loop {
            let step = match tokio::time::timeout_at(deadline, self.send_patch()).await {
                Ok(step) => step,
                Err(_) => return Flush::Incomplete("the time for sending the trace ran out".into()),
            };
            let (error, wait) = match step {
                PatchStep::Sent => {
                    failures = 0;
                    continue;
                }
                PatchStep::NothingToSend | PatchStep::Stopped | PatchStep::Aborted => return Flush::Complete,
                PatchStep::Desynced => return Flush::Incomplete("GitLab does not say how much trace it has".into()),
                // GitLab Runner waits the update interval after a range mismatch.
                PatchStep::Resynced => ("trace range mismatch (416)".to_string(), self.interval),
                PatchStep::Failed(error) => (format!("trace PATCH failed: {error}"), self.next_backoff()),
            };
            failures += 1;
            if failures > self.config.final_trace_retry_limit {
                return Flush::Incomplete(format!("{failures} trace attempts in a row failed; last: {error}"));
            }
            tracing::warn!(%error, failures, "sending the rest of the trace failed; retrying");
            if tokio::time::timeout_at(deadline, sleep(wait)).await.is_err() {
                return Flush::Incomplete(format!("the time for sending the trace ran out; last: {error}"));
            }
        }
    }

    async fn final_round(&mut self, update: &mut JobUpdate, trace_deadline: Instant) -> FinalRound {
        if let Flush::Incomplete(why) = self.flush(trace_deadline).await {
            tracing::warn!(
                sent = self.sent.load(Ordering::SeqCst),
                "sending the final state without the rest of the trace: {why}"
            );
        }
        let (checksum, bytesize) = self.trace.output_info();
        update.checksum = Some(checksum);
        update.bytesize = Some(bytesize);
        let response = self.api.update_job(update).await;
        self.signals.observe(response.remote_status);
        self.apply_interval(response.update_interval);
        match response.outcome {
            UpdateOutcome::Accepted => FinalRound::Done,
            UpdateOutcome::AcceptedRetryLater(wait) => {
                let wait = if wait.is_zero() { self.interval } else { wait.min(self.config.max_update_interval) };
                FinalRound::AskAgainAfter(wait)
            }
            UpdateOutcome::TraceValidationFailed => {
                // GitLab wants the whole trace again; that also settles an unknown offset.
                self.sent.store(0, Ordering::SeqCst);
                self.desynced = false;
                self.unconfirmed.clear();
                FinalRound::Retry { error: "trace checksum validation failed (412)".into(), back_off: false }
            }
            UpdateOutcome::Abort => FinalRound::Gone("the job is not running on this runner any more".into()),
            UpdateOutcome::Conflict => FinalRound::Gone("the job belongs to another runner (409)".into()),
            UpdateOutcome::Unavailable(error) | UpdateOutcome::Failed(error) => {
                FinalRound::Retry { error, back_off: true }
            }
        }
    }

    async fn final_update(&mut self, mut update: JobUpdate) -> Result<(), FinalUpdateError> {
        self.interval = self.config.update_interval;
        let mut failures = 0u32;
        let mut trace_deadline = Instant::now() + self.config.final_trace_timeout;
        loop {
            match self.final_round(&mut update, trace_deadline).await {
                FinalRound::Done => return Ok(()),
                FinalRound::Gone(why) => return Err(FinalUpdateError::JobGone(why)),
                FinalRound::AskAgainAfter(wait) => sleep(wait).await,
                FinalRound::Retry { error, back_off } => {
                    failures += 1;
                    if failures > self.config.final_update_retry_limit {
                        return Err(FinalUpdateError::RetriesExhausted { attempts: failures, last_error: error });
                    }
                    tracing::warn!(%error, failures, "final job update failed; retrying");
                    if back_off {
                        sleep(self.next_backoff()).await;
                    } else {
                        // 412: GitLab asked for the trace again; give it a fresh time budget.
                        trace_deadline = Instant::now() + self.config.final_trace_timeout;
                        sleep(self.interval).await;
                    }
                }
            }
        }
    }
}

/// Uploads one job's trace while it runs and sends its final state. Must be started inside a
/// tokio runtime. Dropping it without [`finish`](Self::finish) stops the loop.
pub struct TraceUploader {
    api: Arc<dyn JobApi>,
    trace: JobTrace,
    config: UploadConfig,
    signals: RemoteSignals,
    sent: Arc<AtomicU64>,
    stop: CancellationToken,
    task: Option<JoinHandle<UploadLoop>>,
    limit: Option<Arc<dyn SendLimit>>,
}

impl TraceUploader {
    /// Start uploading `trace` from offset 0.
    pub fn start(api: Arc<dyn JobApi>, trace: JobTrace, config: UploadConfig) -> Self {
        Self::resume(api, trace, config, 0)
    }

    /// Start uploading `trace` assuming GitLab already has its first `sent_offset` bytes (a
    /// resumed job; a wrong guess is corrected by the server's 416).
    pub fn resume(api: Arc<dyn JobApi>, trace: JobTrace, config: UploadConfig, sent_offset: u64) -> Self {
        Self::within(api, trace, config, sent_offset, None)
    }

    /// [`TraceUploader::resume`], sending no byte past what `limit` allows (a job store that
    /// must have the bytes first).
    pub fn within(
        api: Arc<dyn JobApi>,
        trace: JobTrace,
        config: UploadConfig,
        sent_offset: u64,
        limit: Option<Arc<dyn SendLimit>>,
    ) -> Self {
        let signals = RemoteSignals::default();
        let sent = Arc::new(AtomicU64::new(sent_offset));
        let stop = CancellationToken::new();
        let upload_loop =
            UploadLoop::new(api.clone(), trace.clone(), config.clone(), signals.clone(), sent.clone(), limit.clone());
        let task = tokio::spawn(upload_loop.watch(stop.clone()));
        TraceUploader { api, trace, config, signals, sent, stop, task: Some(task), limit }
    }

    /// The cancel/abort signals GitLab sends through PATCH and PUT responses.
    pub fn signals(&self) -> RemoteSignals {
        self.signals.clone()
    }

    /// Bytes of the trace GitLab has acknowledged.
    pub fn sent_offset(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// A handle reading [`TraceUploader::sent_offset`] that outlives borrows of the uploader
    /// (a job store saving where GitLab's copy of the trace ends).
    pub fn sent_counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    /// Stop the loop, flush the trace's maskers, send the rest of the trace and `final_update`
    /// (its `checksum` and `bytesize` are filled in from the trace) until GitLab accepts it.
    ///
    /// The trace never holds the final state back for long: after
    /// [`UploadConfig::final_trace_retry_limit`] failed attempts in a row, or
    /// [`UploadConfig::final_trace_timeout`], or when GitLab does not say how much of the trace
    /// it has, the PUT goes out with the checksum of the whole trace (a 412 then resends it
    /// from 0).
    pub async fn finish(mut self, final_update: JobUpdate) -> Result<(), FinalUpdateError> {
        self.stop.cancel();
        let joined = match self.task.take() {
            Some(task) => task.await.ok(),
            None => None,
        };
        let mut upload_loop = match joined {
            Some(upload_loop) => upload_loop,
            // The loop task panicked: carry on from what we know was acknowledged.
            None => UploadLoop::new(
                self.api.clone(),
                self.trace.clone(),
                self.config.clone(),
                self.signals.clone(),
                self.sent.clone(),
                self.limit.clone(),
            ),
        };
        self.trace.finish();
        upload_loop.final_update(final_update).await
    }
}

impl Drop for TraceUploader {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
#[path = "upload_tests.rs"]
mod tests;
