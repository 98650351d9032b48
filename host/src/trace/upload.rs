//! [`TraceUploader`]: the client side of GitLab's trace loop (§1.10) driven through
//! [`JobApi`] — incremental `PATCH /jobs/:id/trace`, keep-alive `PUT state=running`, the remote
//! cancel/abort signals, and the final update with its 202/412/retry handling.

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
        }
    }
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
    /// 416: the offset was moved to the server's size.
    Resynced,
    /// 404 earlier or now: no more patches for this job.
    Stopped,
    /// 403: the job must be aborted.
    Aborted,
    Failed(String),
}

/// How one round of the final update went.
enum FinalRound {
    Done,
    Gone(String),
    /// 202: ask again after this long (does not count as a failure).
    AskAgainAfter(Duration),
    /// Counts towards the retry limit; wait the update interval (416/412) or back off.
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
}

impl UploadLoop {
    fn apply_interval(&mut self, interval: Option<Duration>) {
        if let Some(interval) = interval.filter(|i| !i.is_zero()) {
            self.interval = interval.min(self.config.max_update_interval);
        }
    }

    async fn send_patch(&mut self) -> PatchStep {
        if self.patching_stopped {
            return PatchStep::Stopped;
        }
        let offset = self.sent.load(Ordering::SeqCst);
        let content = self.trace.read_from(offset, self.config.patch_limit);
        if content.is_empty() {
            return PatchStep::NothingToSend;
        }
        let response = self.api.patch_trace(offset, &content).await;
        self.signals.observe(response.remote_status);
        self.apply_interval(response.update_interval);
        match response.outcome {
            PatchOutcome::Accepted => {
                self.sent.store(offset + content.len() as u64, Ordering::SeqCst);
                self.last_ack = Instant::now();
                PatchStep::Sent
            }
            PatchOutcome::RangeMismatch { server_size } => {
                tracing::debug!(offset, server_size, "trace range mismatch; resending from the server's size");
                self.sent.store(server_size, Ordering::SeqCst);
                self.last_ack = Instant::now();
                PatchStep::Resynced
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
            PatchOutcome::Failed(error) => PatchStep::Failed(error),
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
                PatchStep::Sent | PatchStep::NothingToSend => self.touch_if_idle().await,
                PatchStep::Failed(error) => tracing::warn!(%error, "trace PATCH failed; retrying next interval"),
                PatchStep::Resynced | PatchStep::Stopped | PatchStep::Aborted => {}
            }
            if self.signals.abort.is_cancelled() {
                stop.cancelled().await;
                return self;
            }
        }
    }

    async fn final_round(&mut self, update: &mut JobUpdate) -> FinalRound {
        loop {
            match self.send_patch().await {
                PatchStep::Sent => continue,
                // Aborted stops patching; the PUT below tells whether the job is really gone.
                PatchStep::NothingToSend | PatchStep::Stopped | PatchStep::Aborted => break,
                PatchStep::Resynced => {
                    return FinalRound::Retry { error: "trace range mismatch (416)".into(), back_off: false }
                }
                PatchStep::Failed(error) => {
                    return FinalRound::Retry { error: format!("trace PATCH failed: {error}"), back_off: true }
                }
            }
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
                self.sent.store(0, Ordering::SeqCst);
                FinalRound::Retry { error: "trace checksum validation failed (412)".into(), back_off: false }
            }
            UpdateOutcome::Abort => FinalRound::Gone("the job is not running on this runner any more".into()),
            UpdateOutcome::Conflict => FinalRound::Gone("the job belongs to another runner (409)".into()),
            UpdateOutcome::Failed(error) => FinalRound::Retry { error, back_off: true },
        }
    }

    async fn final_update(&mut self, mut update: JobUpdate) -> Result<(), FinalUpdateError> {
        self.interval = self.config.update_interval;
        let mut failures = 0u32;
        let mut backoff = self.config.final_backoff_base;
        loop {
            match self.final_round(&mut update).await {
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
                        sleep(backoff).await;
                        backoff = backoff.saturating_mul(2).min(self.config.final_backoff_max);
                    } else {
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
}

impl TraceUploader {
    /// Start uploading `trace` from offset 0.
    pub fn start(api: Arc<dyn JobApi>, trace: JobTrace, config: UploadConfig) -> Self {
        Self::resume(api, trace, config, 0)
    }

    /// Start uploading `trace` assuming GitLab already has its first `sent_offset` bytes (a
    /// resumed job; a wrong guess is corrected by the server's 416).
    pub fn resume(api: Arc<dyn JobApi>, trace: JobTrace, config: UploadConfig, sent_offset: u64) -> Self {
        let signals = RemoteSignals::default();
        let sent = Arc::new(AtomicU64::new(sent_offset));
        let stop = CancellationToken::new();
        let upload_loop = UploadLoop {
            api: api.clone(),
            trace: trace.clone(),
            interval: config.update_interval,
            config: config.clone(),
            signals: signals.clone(),
            sent: sent.clone(),
            last_ack: Instant::now(),
            patching_stopped: false,
        };
        let task = tokio::spawn(upload_loop.watch(stop.clone()));
        TraceUploader { api, trace, config, signals, sent, stop, task: Some(task) }
    }

    /// The cancel/abort signals GitLab sends through PATCH and PUT responses.
    pub fn signals(&self) -> RemoteSignals {
        self.signals.clone()
    }

    /// Bytes of the trace GitLab has acknowledged.
    pub fn sent_offset(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stop the loop, flush the trace's maskers, send the rest of the trace and `final_update`
    /// (its `checksum` and `bytesize` are filled in from the trace) until GitLab accepts it.
    pub async fn finish(mut self, final_update: JobUpdate) -> Result<(), FinalUpdateError> {
        self.stop.cancel();
        let joined = match self.task.take() {
            Some(task) => task.await.ok(),
            None => None,
        };
        let mut upload_loop = match joined {
            Some(upload_loop) => upload_loop,
            None => UploadLoop {
                // The loop task panicked: carry on from what we know was acknowledged.
                api: self.api.clone(),
                trace: self.trace.clone(),
                config: self.config.clone(),
                signals: self.signals.clone(),
                sent: self.sent.clone(),
                last_ack: Instant::now(),
                interval: self.config.update_interval,
                patching_stopped: false,
            },
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::gitlab::api::{PatchResponse, UpdateResponse};
    use crate::trace::{TraceOptions, TraceSink};

    /// What the scripted server does with the next PATCH.
    enum PatchScript {
        /// Append like GitLab: 202 if the offset is the current size (or 0: re-upload), else 416.
        Normal,
        /// Normal, but the response carries this `Job-Status` and update interval.
        NormalWith(RemoteJobStatus, Option<Duration>),
        /// Store the bytes with the first one altered and answer 202 (a corrupted upload).
        Corrupt,
        /// The server loses everything after `n` bytes, then handles the patch normally.
        LoseAfter(usize),
        /// Answer this without storing anything.
        Respond(PatchOutcome),
    }

    /// What the scripted server does with the next PUT.
    enum UpdateScript {
        /// 200 for `running`; for a final state 200 if checksum and bytesize match the stored
        /// log, else 412.
        Normal,
        NormalWith(RemoteJobStatus),
        Respond(UpdateOutcome),
    }

    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Patch { offset: u64, content: Vec<u8>, at: Duration },
        Update { update: JobUpdate, at: Duration },
    }

    #[derive(Default)]
    struct Server {
        log: Vec<u8>,
        patches: VecDeque<PatchScript>,
        updates: VecDeque<UpdateScript>,
        calls: Vec<Call>,
    }

    /// A test double of the HTTP client: records calls and answers per script.
    struct ScriptedGitLab {
        started: Instant,
        server: Mutex<Server>,
    }

    impl ScriptedGitLab {
        fn new() -> Arc<Self> {
            Arc::new(ScriptedGitLab { started: Instant::now(), server: Mutex::new(Server::default()) })
        }
        fn script_patch(&self, step: PatchScript) {
            self.server.lock().expect("server lock").patches.push_back(step);
        }
        fn script_update(&self, step: UpdateScript) {
            self.server.lock().expect("server lock").updates.push_back(step);
        }
        fn log(&self) -> Vec<u8> {
            self.server.lock().expect("server lock").log.clone()
        }
        fn calls(&self) -> Vec<Call> {
            self.server.lock().expect("server lock").calls.clone()
        }
        fn patches(&self) -> Vec<(u64, Vec<u8>, Duration)> {
            self.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Patch { offset, content, at } => Some((offset, content, at)),
                    Call::Update { .. } => None,
                })
                .collect()
        }
        fn updates(&self) -> Vec<(JobUpdate, Duration)> {
            self.calls()
                .into_iter()
                .filter_map(|c| match c {
                    Call::Update { update, at } => Some((update, at)),
                    Call::Patch { .. } => None,
                })
                .collect()
        }
    }

    fn append(log: &mut Vec<u8>, offset: u64, content: &[u8]) -> PatchOutcome {
        let offset = offset as usize;
        if offset == log.len() || offset == 0 {
            log.truncate(offset);
            log.extend_from_slice(content);
            PatchOutcome::Accepted
        } else {
            PatchOutcome::RangeMismatch { server_size: log.len() as u64 }
        }
    }

    fn crc(bytes: &[u8]) -> String {
        format!("crc32:{:08x}", crc32fast::hash(bytes))
    }

    #[async_trait::async_trait]
    impl JobApi for ScriptedGitLab {
        async fn patch_trace(&self, offset: u64, content: &[u8]) -> PatchResponse {
            let mut server = self.server.lock().expect("server lock");
            let at = self.started.elapsed();
            server.calls.push(Call::Patch { offset, content: content.to_vec(), at });
            let step = server.patches.pop_front().unwrap_or(PatchScript::Normal);
            let (outcome, remote_status, update_interval) = match step {
                PatchScript::Normal => (append(&mut server.log, offset, content), RemoteJobStatus::Running, None),
                PatchScript::NormalWith(status, interval) => {
                    (append(&mut server.log, offset, content), status, interval)
                }
                PatchScript::Corrupt => {
                    let mut bad = content.to_vec();
                    bad[0] ^= 0xff;
                    (append(&mut server.log, offset, &bad), RemoteJobStatus::Running, None)
                }
                PatchScript::LoseAfter(n) => {
                    server.log.truncate(n);
                    (append(&mut server.log, offset, content), RemoteJobStatus::Running, None)
                }
                PatchScript::Respond(outcome) => (outcome, RemoteJobStatus::Running, None),
            };
            PatchResponse { outcome, remote_status, update_interval }
        }

        async fn update_job(&self, update: &JobUpdate) -> UpdateResponse {
            let mut server = self.server.lock().expect("server lock");
            let at = self.started.elapsed();
            server.calls.push(Call::Update { update: update.clone(), at });
            let normal = |server: &Server| {
                let matches = update.checksum.as_deref() == Some(crc(&server.log).as_str())
                    && update.bytesize == Some(server.log.len() as u64);
                if update.state == JobState::Running || matches {
                    UpdateOutcome::Accepted
                } else {
                    UpdateOutcome::TraceValidationFailed
                }
            };
            let (outcome, remote_status) = match server.updates.pop_front().unwrap_or(UpdateScript::Normal) {
                UpdateScript::Normal => (normal(&server), RemoteJobStatus::Running),
                UpdateScript::NormalWith(status) => (normal(&server), status),
                UpdateScript::Respond(outcome) => (outcome, RemoteJobStatus::Running),
            };
            UpdateResponse { outcome, remote_status, update_interval: None }
        }
    }

    fn job_trace(phrases: &[&str]) -> JobTrace {
        JobTrace::new(&TraceOptions {
            masked_phrases: phrases.iter().map(|s| s.to_string()).collect(),
            ..TraceOptions::default()
        })
        .expect("patterns compile")
    }

    fn start(api: &Arc<ScriptedGitLab>, trace: &JobTrace, config: UploadConfig) -> TraceUploader {
        TraceUploader::start(api.clone(), trace.clone(), config)
    }

    fn success() -> JobUpdate {
        JobUpdate::state(JobState::Success)
    }

    async fn wait(secs: u64) {
        sleep(Duration::from_secs(secs)).await;
    }

    /// The server holds exactly the trace and the last PUT carried its checksum and size.
    fn assert_server_has_trace(api: &ScriptedGitLab, trace: &JobTrace) {
        assert_eq!(api.log(), trace.contents(), "server log == trace");
        let (last, _) = api.updates().pop().expect("a final update was sent");
        assert_eq!(last.checksum, Some(crc(&api.log())));
        assert_eq!(last.bytesize, Some(api.log().len() as u64));
        assert!(api.patches().iter().all(|(_, content, _)| !content.is_empty()), "no empty patch");
    }

    #[tokio::test(start_paused = true)]
    async fn secret_split_across_writes_and_patches_is_masked() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&["TOPSECRET"]);
        let uploader = start(&api, &trace, UploadConfig::default());
        trace.write(b"token is TOPS");
        wait(4).await;
        trace.write(b"ECRET, ok\n");
        wait(3).await;
        let patches = api.patches();
        assert_eq!(patches.len(), 2, "one patch per interval: {patches:?}");
        assert_eq!(patches[0].1, b"token is ", "the partial secret is held back");
        assert_eq!(patches[1].1, b"[MASKED], ok\n");
        uploader.finish(success()).await.expect("final update accepted");
        assert_eq!(api.log(), b"token is [MASKED], ok\n");
        assert_server_has_trace(&api, &trace);
        let (last, _) = api.updates().pop().expect("final update");
        assert_eq!(last.state, JobState::Success);
    }

    #[tokio::test(start_paused = true)]
    async fn partial_secret_at_the_end_is_released_by_finish() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&["TOPSECRET"]);
        let uploader = start(&api, &trace, UploadConfig::default());
        trace.write(b"ends with TOP");
        wait(4).await;
        uploader.finish(success()).await.expect("final update accepted");
        assert_eq!(api.log(), b"ends with TOP");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn range_mismatch_resends_from_the_server_size() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        trace.write(&[b'a'; 100]);
        wait(4).await;
        trace.write(&[b'b'; 50]);
        api.script_patch(PatchScript::LoseAfter(60));
        wait(3).await; // 416: the server has 60 bytes
        wait(3).await; // resend from 60
        let offsets: Vec<(u64, usize)> = api.patches().iter().map(|(o, c, _)| (*o, c.len())).collect();
        assert_eq!(offsets, vec![(0, 100), (100, 50), (60, 90)]);
        assert_eq!(uploader.sent_offset(), 150);
        uploader.finish(success()).await.expect("final update accepted");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn checksum_mismatch_reuploads_everything_from_zero() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        api.script_patch(PatchScript::Corrupt);
        trace.write(b"first part\n");
        wait(4).await;
        trace.write(b"second part\n");
        uploader.finish(success()).await.expect("final update accepted after re-upload");
        let offsets: Vec<u64> = api.patches().iter().map(|(o, _, _)| *o).collect();
        assert_eq!(offsets, vec![0, 11, 0], "after 412 the whole trace is sent again from 0");
        assert_eq!(api.patches()[2].1, b"first part\nsecond part\n");
        let updates = api.updates();
        assert_eq!(updates.len(), 2, "412, then accepted");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_patch_is_retried_on_the_next_tick() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        api.script_patch(PatchScript::Respond(PatchOutcome::Failed("500 Internal Server Error".into())));
        trace.write(b"hello\n");
        wait(4).await;
        assert_eq!(uploader.sent_offset(), 0);
        wait(3).await;
        assert_eq!(uploader.sent_offset(), 6);
        let patches = api.patches();
        assert_eq!(
            patches.iter().map(|(o, c, _)| (*o, c.clone())).collect::<Vec<_>>(),
            vec![(0, b"hello\n".to_vec()), (0, b"hello\n".to_vec())]
        );
        uploader.finish(success()).await.expect("final update accepted");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_final_patch_and_put_back_off_then_recover() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        trace.write(b"output\n");
        api.script_patch(PatchScript::Respond(PatchOutcome::Failed("502 Bad Gateway".into())));
        api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("500".into())));
        api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("503".into())));
        uploader.finish(success()).await.expect("recovers");
        let calls = api.calls();
        let kinds: Vec<&str> = calls
            .iter()
            .map(|c| match c {
                Call::Patch { .. } => "patch",
                Call::Update { .. } => "put",
            })
            .collect();
        assert_eq!(kinds, vec!["patch", "patch", "put", "put", "put"]);
        let at: Vec<Duration> = calls
            .iter()
            .map(|c| match c {
                Call::Patch { at, .. } | Call::Update { at, .. } => *at,
            })
            .collect();
        // Exponential backoff 1 s, 2 s, 4 s between failed rounds (virtual time).
        assert!(at[1] - at[0] >= Duration::from_secs(1), "{at:?}");
        assert!(at[3] - at[2] >= Duration::from_secs(2), "{at:?}");
        assert!(at[4] - at[3] >= Duration::from_secs(4), "{at:?}");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn final_update_gives_up_after_the_retry_limit() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let config = UploadConfig { final_update_retry_limit: 2, ..UploadConfig::default() };
        let uploader = start(&api, &trace, config);
        for _ in 0..5 {
            api.script_update(UpdateScript::Respond(UpdateOutcome::Failed("500".into())));
        }
        let err = uploader.finish(success()).await.expect_err("gives up");
        assert_eq!(err, FinalUpdateError::RetriesExhausted { attempts: 3, last_error: "500".into() });
        assert_eq!(api.updates().len(), 3, "first try plus two retries");
    }

    #[tokio::test(start_paused = true)]
    async fn accepted_retry_later_waits_the_given_interval() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        trace.write(b"done\n");
        api.script_update(UpdateScript::Respond(UpdateOutcome::AcceptedRetryLater(Duration::from_secs(8))));
        uploader
            .finish(JobUpdate { exit_code: Some(2), ..JobUpdate::state(JobState::Failed) })
            .await
            .expect("accepted");
        let updates = api.updates();
        assert_eq!(updates.len(), 2);
        assert!(updates[1].1 - updates[0].1 >= Duration::from_secs(8), "{updates:?}");
        assert_eq!(updates[1].0.state, JobState::Failed);
        assert_eq!(updates[1].0.exit_code, Some(2));
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn canceling_then_abort_surface_as_signals() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        let signals = uploader.signals();
        api.script_patch(PatchScript::NormalWith(RemoteJobStatus::CancelRequested, None));
        trace.write(b"running\n");
        wait(4).await;
        assert!(signals.cancel_requested.is_cancelled());
        assert!(!signals.abort.is_cancelled());
        api.script_patch(PatchScript::Respond(PatchOutcome::Abort));
        trace.write(b"after_script\n");
        wait(3).await;
        assert!(signals.abort.is_cancelled());
        trace.write(b"more\n");
        wait(30).await;
        assert_eq!(api.patches().len(), 2, "no patches after abort");
        api.script_update(UpdateScript::Respond(UpdateOutcome::Abort));
        let err = uploader.finish(success()).await.expect_err("job is gone");
        assert!(matches!(err, FinalUpdateError::JobGone(_)), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn keep_alive_put_after_idle_and_its_status_is_observed() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        let signals = uploader.signals();
        wait(29).await;
        assert!(api.updates().is_empty(), "no keep-alive before 30 s idle");
        api.script_update(UpdateScript::NormalWith(RemoteJobStatus::CancelRequested));
        wait(5).await;
        let updates = api.updates();
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].0.state, JobState::Running);
        assert_eq!(updates[0].0.checksum.as_deref(), Some("crc32:00000000"));
        assert_eq!(updates[0].0.bytesize, Some(0));
        assert!(signals.cancel_requested.is_cancelled());
        // Acknowledged patches count as activity: no keep-alive while output flows.
        for _ in 0..20 {
            trace.write(b"tick\n");
            wait(3).await;
        }
        assert_eq!(api.updates().len(), 1, "patches acknowledged every 3 s keep the job alive");
        uploader.finish(success()).await.expect("accepted");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn server_interval_is_honoured_and_capped() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        api.script_patch(PatchScript::NormalWith(RemoteJobStatus::Running, Some(Duration::from_secs(3600))));
        trace.write(b"one\n");
        wait(4).await;
        trace.write(b"two\n");
        wait(14 * 60).await;
        assert_eq!(api.patches().len(), 1, "the next patch waits the server's interval");
        wait(2 * 60).await;
        let patches = api.patches();
        assert_eq!(patches.len(), 2, "but never more than 15 minutes");
        assert_eq!(patches[1].2 - patches[0].2, Duration::from_secs(15 * 60));
        uploader.finish(success()).await.expect("accepted");
        assert_server_has_trace(&api, &trace);
    }

    #[tokio::test(start_paused = true)]
    async fn not_found_stops_patching_but_final_put_is_sent() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let uploader = start(&api, &trace, UploadConfig::default());
        api.script_patch(PatchScript::Respond(PatchOutcome::NotFound));
        trace.write(b"x\n");
        wait(10).await;
        assert_eq!(api.patches().len(), 1);
        api.script_update(UpdateScript::Respond(UpdateOutcome::Accepted));
        uploader.finish(success()).await.expect("accepted");
        assert_eq!(api.patches().len(), 1, "no patch after 404");
        assert_eq!(api.updates().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn large_trace_goes_in_limited_chunks() {
        let api = ScriptedGitLab::new();
        let trace = job_trace(&[]);
        let config = UploadConfig { patch_limit: 10, ..UploadConfig::default() };
        let uploader = start(&api, &trace, config);
        trace.write(b"0123456789abcdefghijKLMNO");
        wait(4).await;
        assert_eq!(api.patches().len(), 1, "one patch per tick while running");
        uploader.finish(success()).await.expect("accepted");
        let chunks: Vec<(u64, Vec<u8>)> = api.patches().into_iter().map(|(o, c, _)| (o, c)).collect();
        assert_eq!(chunks, vec![(0, b"0123456789".to_vec()), (10, b"abcdefghij".to_vec()), (20, b"KLMNO".to_vec())]);
        assert_server_has_trace(&api, &trace);
    }
}
