//! The runner manager behind `runway run`: per `[[runners]]` entry, `request_concurrency`
//! pollers asking GitLab for jobs; `concurrent` and `limit` enforced with semaphores; two-phase
//! job commit; graceful and forceful shutdown.
//!
//! A long poll never holds capacity: a poller asks only while a slot is free and releases it
//! before the request, so a poll blocked for 50 s costs nothing another runner could use. A
//! job that arrives when capacity was taken meanwhile stays `pending` at GitLab (two-phase
//! commit, with keep-alives) until a slot frees up.

pub mod fleet;
pub mod health;
pub mod signals;
pub mod slots;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::autoscaler::ReserveError;
use crate::executor::ExecutorFeatures;
use crate::executor::InstanceLease;
use crate::gitlab::api::{JobApi, JobState, JobUpdate, UpdateOutcome};
use crate::gitlab::client::{
    BadJob, FeaturesInfo, GitLabClient, JobClient, RequestJobResult, RunnerCredentials, VersionInfo,
};
use crate::gitlab::retry::RetryPolicy;
use crate::job::{self, fail_unplannable, run_job_until_cleanup, JobControl, JobEnvironment, JobHooks};
use crate::payload::JobResponse;
use crate::trace::format::RunnerIdentity;
use crate::trace::upload::{TraceUploader, UploadConfig};
use crate::trace::{wire_reason, FailureReason, JobTrace, TraceOptions};
use health::{HealthBoard, PendingRunner, RunnerEntry, Unusable};
use slots::SlotAllocator;

/// Everything the manager needs about one `[[runners]]` entry.
#[derive(Clone)]
pub struct RunnerSettings {
    /// URL, token and system id the runner talks to GitLab with.
    pub credentials: RunnerCredentials,
    /// A client of its own when the runner has TLS settings (`tls-ca-file`, client
    /// certificate); otherwise the manager's shared client is used.
    pub client: Option<Arc<GitLabClient>>,
    /// Job environment template (executor, plugin host, script settings, identity).
    pub env: JobEnvironment,
    /// `limit`: 0 = unlimited.
    pub limit: usize,
    /// `request_concurrency`: job requests in flight at once.
    pub request_concurrency: usize,
    /// `output_limit`: the job log limit, KiB.
    pub output_limit_kib: u64,
    /// `unhealthy_requests_limit`: failed requests before the runner pauses.
    pub unhealthy_requests_limit: u32,
    /// `unhealthy_interval`: how long an unhealthy runner pauses.
    pub unhealthy_interval: Duration,
    /// `job_status_final_update_retry_limit`.
    pub final_update_retry_limit: u32,
    /// `strict_check_interval`: never re-poll early.
    pub strict_check_interval: bool,
    /// The autoscaled fleet jobs run on (`[runners.autoscaler]`).
    pub fleet: Option<Arc<fleet::Fleet>>,
}

/// Global settings.
#[derive(Clone)]
pub struct ManagerSettings {
    /// `concurrent`: jobs at once across all runners.
    pub concurrent: usize,
    /// `check_interval`: pause between job requests.
    pub check_interval: Duration,
    /// `shutdown_timeout`: how long a forceful stop waits for jobs.
    pub shutdown_timeout: Duration,
    /// Keep-alive `PUT state=pending` interval while a job waits for capacity or prepares.
    pub pending_keepalive: Duration,
    /// Trace loop timing (GitLab's defaults; tests shorten them).
    pub upload: UploadConfig,
}

impl Default for ManagerSettings {
    fn default() -> Self {
        ManagerSettings {
            concurrent: 1,
            check_interval: Duration::from_secs(3),
            shutdown_timeout: Duration::from_secs(30),
            pending_keepalive: Duration::from_secs(10),
            upload: UploadConfig::default(),
        }
    }
}

/// How the manager is told to stop.
#[derive(Clone, Default)]
pub struct Shutdown {
    /// Stop requesting jobs; let running jobs finish (SIGQUIT).
    pub graceful: CancellationToken,
    /// Abort running jobs with `runner_interrupted` (SIGTERM/SIGINT).
    pub forceful: CancellationToken,
}

/// Counters for tests and metrics.
#[derive(Default, Debug)]
pub struct ManagerStats {
    /// Jobs running now.
    pub running: std::sync::atomic::AtomicUsize,
    /// Most jobs that ran at once.
    pub max_running: std::sync::atomic::AtomicUsize,
    /// Jobs finished.
    pub finished: std::sync::atomic::AtomicUsize,
    /// Failed jobs by failure reason (as sent to GitLab).
    pub failed: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Durations of finished jobs, seconds.
    pub durations: Mutex<Vec<f64>>,
}

impl ManagerStats {
    fn record(&self, failure_reason: Option<&str>, duration: Duration) {
        if let Some(reason) = failure_reason {
            if let Ok(mut failed) = self.failed.lock() {
                *failed.entry(reason.to_string()).or_default() += 1;
            }
        }
        if let Ok(mut durations) = self.durations.lock() {
            durations.push(duration.as_secs_f64());
        }
    }
}

struct Shared {
    settings: ManagerSettings,
    global: Arc<Semaphore>,
    shutdown: Shutdown,
    stats: Arc<ManagerStats>,
}

struct Runner {
    settings: RunnerSettings,
    client: Arc<GitLabClient>,
    info: VersionInfo,
    limit: Arc<Semaphore>,
    slots: Arc<SlotAllocator>,
}

/// The features Runway's job path really supports, for `info.features` (§1.6).
pub fn features(executor: ExecutorFeatures) -> FeaturesInfo {
    FeaturesInfo {
        variables: executor.variables,
        image: executor.image,
        services: executor.services,
        shared: executor.shared,
        session: false,
        terminal: false,
        cache: true,
        refspecs: true,
        masking: true,
        raw_variables: true,
        multi_build_steps: true,
        return_exit_code: true,
        trace_reset: true,
        trace_checksum: true,
        trace_size: true,
        cancelable: true,
        cancel_gracefully: true,
        two_phase_job_commit: true,
        ..FeaturesInfo::default()
    }
}

/// The runner manager.
pub struct Manager {
    shared: Arc<Shared>,
    runners: Vec<Arc<Runner>>,
    pending: Vec<PendingRunner>,
    client: Arc<GitLabClient>,
    health: Arc<HealthBoard>,
}

fn make_runner(r: RunnerSettings, client: &Arc<GitLabClient>) -> Arc<Runner> {
    let executor = &r.env.executor;
    let info = VersionInfo::this_runner(&executor.info.name, &r.env.settings.shell, features(executor.features()));
    let limit = if r.limit == 0 { Semaphore::MAX_PERMITS } else { r.limit };
    let runner_client = r.client.clone().unwrap_or_else(|| client.clone());
    Arc::new(Runner {
        info,
        client: runner_client,
        limit: Arc::new(Semaphore::new(limit)),
        slots: Arc::default(),
        settings: r,
    })
}

impl Manager {
    /// A manager for `runners` talking through `client`.
    pub fn new(
        settings: ManagerSettings,
        runners: Vec<RunnerSettings>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
    ) -> Self {
        let global = Arc::new(Semaphore::new(settings.concurrent.max(1)));
        Self::with_capacity(settings, runners, client, shutdown, global)
    }

    /// A manager sharing `global` capacity with others (a config reload starts a new manager
    /// while the old one's jobs finish; together they still respect `concurrent`).
    pub fn with_capacity(
        settings: ManagerSettings,
        runners: Vec<RunnerSettings>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
        global: Arc<Semaphore>,
    ) -> Self {
        let entries = runners.into_iter().map(|r| RunnerEntry::Ready(Box::new(r))).collect();
        Self::with_entries(settings, entries, client, shutdown, global)
    }

    /// A manager whose runners may still have to be resolved: a [`RunnerEntry::Pending`]
    /// runner is resolved in the background, reported unhealthy while that fails, and serves
    /// once it succeeds; the other runners serve meanwhile.
    pub fn with_entries(
        settings: ManagerSettings,
        entries: Vec<RunnerEntry>,
        client: Arc<GitLabClient>,
        shutdown: Shutdown,
        global: Arc<Semaphore>,
    ) -> Self {
        let health = Arc::new(HealthBoard::default());
        let mut runners = Vec::new();
        let mut pending = Vec::new();
        for entry in entries {
            match entry {
                RunnerEntry::Ready(r) => {
                    health.set_healthy(&r.env.identity.short_token, &r.env.identity.name);
                    runners.push(make_runner(*r, &client));
                }
                RunnerEntry::Pending(p) => pending.push(p),
            }
        }
        Manager {
            shared: Arc::new(Shared { settings, global, shutdown, stats: Arc::default() }),
            runners,
            pending,
            client,
            health,
        }
    }

    /// The health of this manager's runners (for metrics and health endpoints).
    pub fn health(&self) -> Arc<HealthBoard> {
        self.health.clone()
    }

    /// Counters of running and finished jobs.
    pub fn stats(&self) -> Arc<ManagerStats> {
        self.shared.stats.clone()
    }

    /// Poll and run jobs until shut down. Returns when every job has ended (graceful) or the
    /// shutdown timeout expired (forceful).
    pub async fn run(self) {
        let mut jobs = JoinSet::new();
        let (job_tx, mut job_rx) = tokio::sync::mpsc::unbounded_channel::<tokio::task::JoinHandle<()>>();
        let mut pollers = JoinSet::new();
        for runner in &self.runners {
            for _ in 0..runner.settings.request_concurrency.max(1) {
                pollers.spawn(poll(runner.clone(), self.shared.clone(), job_tx.clone()));
            }
        }
        for pending in &self.pending {
            let (shared, client, health) = (self.shared.clone(), self.client.clone(), self.health.clone());
            pollers.spawn(resolve_then_poll(pending.clone(), shared, client, health, job_tx.clone()));
        }
        drop(job_tx);
        let stop = self.shared.shutdown.graceful.clone();
        let forceful = self.shared.shutdown.forceful.clone();
        // Collect job handles until the pollers are gone.
        loop {
            tokio::select! {
                handle = job_rx.recv() => match handle {
                    Some(h) => { jobs.spawn(async move { let _ = h.await; }); }
                    None => break,
                },
                _ = stop.cancelled() => {},
                _ = forceful.cancelled() => {},
            }
            if stop.is_cancelled() || forceful.is_cancelled() {
                pollers.shutdown().await;
                while let Ok(h) = job_rx.try_recv() {
                    jobs.spawn(async move {
                        let _ = h.await;
                    });
                }
                break;
            }
        }
        if forceful.is_cancelled() {
            let deadline = self.shared.settings.shutdown_timeout;
            if tokio::time::timeout(deadline, async { while jobs.join_next().await.is_some() {} }).await.is_err() {
                tracing::warn!("shutdown_timeout expired with jobs still running");
            }
        } else {
            tracing::info!("graceful shutdown: waiting for running jobs");
            loop {
                tokio::select! {
                    next = jobs.join_next() => if next.is_none() { break },
                    _ = forceful.cancelled() => {
                        let deadline = self.shared.settings.shutdown_timeout;
                        let _ = tokio::time::timeout(deadline, async { while jobs.join_next().await.is_some() {} }).await;
                        break;
                    }
                }
            }
        }
    }
}

async fn sleep_or_stop(duration: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(duration) => true,
        _ = stop.cancelled() => false,
    }
}

/// Resolve a pending runner, retrying while it fails (unhealthy, no job requests), then
/// poll for it like any other.
async fn resolve_then_poll(
    pending: PendingRunner,
    shared: Arc<Shared>,
    client: Arc<GitLabClient>,
    health: Arc<HealthBoard>,
    jobs: tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>,
) {
    let stop = shared.shutdown.graceful.clone();
    let forceful = shared.shutdown.forceful.clone();
    let mut last_error: Option<Unusable> = None;
    let settings = loop {
        let attempt = tokio::select! {
            r = (pending.resolve)() => r,
            _ = stop.cancelled() => return,
            _ = forceful.cancelled() => return,
        };
        match attempt {
            Ok(settings) => break settings,
            Err(error) => {
                if last_error.as_ref() != Some(&error) {
                    tracing::error!(
                        runner = %pending.short_token,
                        name = %pending.name,
                        "runner is unhealthy and requests no jobs: {error}; retrying every {:?}",
                        pending.retry_every
                    );
                }
                health.set_unhealthy(&pending.short_token, &pending.name, &error);
                last_error = Some(error);
                if !sleep_or_stop(pending.retry_every, &stop).await || forceful.is_cancelled() {
                    return;
                }
            }
        }
    };
    if last_error.is_some() {
        tracing::info!(runner = %pending.short_token, name = %pending.name, "runner recovered; requesting jobs");
    }
    health.set_healthy(&pending.short_token, &pending.name);
    let runner = make_runner(settings, &client);
    let pollers = (0..runner.settings.request_concurrency.max(1))
        .map(|_| poll(runner.clone(), shared.clone(), jobs.clone()))
        .collect::<Vec<_>>();
    drop(jobs);
    futures::future::join_all(pollers).await;
}

async fn poll(
    runner: Arc<Runner>,
    shared: Arc<Shared>,
    jobs: tokio::sync::mpsc::UnboundedSender<tokio::task::JoinHandle<()>>,
) {
    let stop = shared.shutdown.graceful.clone();
    let forceful = shared.shutdown.forceful.clone();
    let stop_requesting = CancellationToken::new();
    {
        let (s, f, r) = (stop.clone(), forceful.clone(), stop_requesting.clone());
        tokio::spawn(async move {
            tokio::select! { _ = s.cancelled() => {}, _ = f.cancelled() => {} }
            r.cancel();
        });
    }
    let mut unhealthy = 0u32;
    let check = shared.settings.check_interval;
    loop {
        if stop_requesting.is_cancelled() {
            return;
        }
        // Ask only while capacity exists; don't hold it during the (long) poll.
        let capacity = tokio::select! {
            g = shared.global.clone().acquire_owned() => g.ok(),
            _ = stop_requesting.cancelled() => return,
        };
        let limit = tokio::select! {
            l = runner.limit.clone().acquire_owned() => l.ok(),
            _ = stop_requesting.cancelled() => return,
        };
        drop((capacity, limit));
        // A fleet runner asks only with a slot reserved (in preemptive mode: an idle slot
        // on a ready instance), and gives it back when GitLab has nothing.
        let reservation = match &runner.settings.fleet {
            None => None,
            Some(fleet) => {
                let key = fleet.next_key();
                match fleet.reserve(&key) {
                    Ok(()) => Some(Reservation::new(fleet.clone(), key)),
                    Err(ReserveError::ShuttingDown) => return,
                    Err(e) => {
                        tracing::debug!(runner = %runner.settings.env.identity.short_token, "not requesting a job: {e}");
                        if !sleep_or_stop(check.min(Duration::from_secs(1)), &stop_requesting).await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };
        let result = tokio::select! {
            r = runner.client.request_job(&runner.settings.credentials, &runner.info) => r,
            _ = stop_requesting.cancelled() => return,
        };
        let reservation = match result {
            RequestJobResult::Job(_) => reservation,
            _ => {
                drop(reservation);
                None
            }
        };
        match result {
            RequestJobResult::Job(received) => {
                unhealthy = 0;
                let handle = tokio::spawn(run_received(runner.clone(), shared.clone(), received.job, reservation));
                if jobs.send(handle).is_err() {
                    return;
                }
                if runner.settings.strict_check_interval && !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::BadPayload(bad) => {
                unhealthy = 0;
                let handle = tokio::spawn(fail_bad_payload(runner.clone(), shared.clone(), *bad));
                if jobs.send(handle).is_err() {
                    return;
                }
            }
            RequestJobResult::PollAgain => unhealthy = 0,
            RequestJobResult::NoJob => {
                unhealthy = 0;
                if !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::Unhealthy(message) => {
                unhealthy += 1;
                tracing::warn!(runner = %runner.settings.env.identity.short_token, "job request failed: {message}");
                let limit = runner.settings.unhealthy_requests_limit.max(1);
                let wait = if unhealthy >= limit {
                    tracing::error!(
                        runner = %runner.settings.env.identity.short_token,
                        "{unhealthy} consecutive unhealthy requests: pausing this runner for {:?}",
                        runner.settings.unhealthy_interval
                    );
                    unhealthy = 0;
                    runner.settings.unhealthy_interval
                } else {
                    check
                };
                if !sleep_or_stop(wait, &stop_requesting).await {
                    return;
                }
            }
            RequestJobResult::Failed(message) => {
                tracing::warn!(runner = %runner.settings.env.identity.short_token, "job request failed: {message}");
                if !sleep_or_stop(check, &stop_requesting).await {
                    return;
                }
            }
        }
    }
}

/// The two-phase commit point: stop the pending keep-alives, `PUT state=running`, and start
/// uploading the trace.
struct Acceptance {
    api: Arc<dyn JobApi>,
    /// Backoff between acceptance attempts GitLab did not answer (the client's policy).
    retry: RetryPolicy,
    trace: JobTrace,
    upload: UploadConfig,
    control: JobControl,
    keepalive: CancellationToken,
    uploader: Mutex<Option<TraceUploader>>,
    accepted: std::sync::atomic::AtomicBool,
}

/// Why GitLab did not take a job's acceptance (`PUT state=running`).
#[derive(Debug, thiserror::Error)]
enum AcceptError {
    /// 403/404/409: the job is gone or someone else's.
    #[error("GitLab no longer assigns this job to us")]
    Gone,
    /// Any other answer.
    #[error("accepting the job failed: {0:?}")]
    Failed(UpdateOutcome),
}

impl Acceptance {
    async fn accept(&self) -> Result<(), AcceptError> {
        if self.accepted.load(std::sync::atomic::Ordering::SeqCst) {
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
        self.accepted.store(true, std::sync::atomic::Ordering::SeqCst);
        let uploader = TraceUploader::start(self.api.clone(), self.trace.clone(), self.upload.clone());
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
        Ok(())
    }
}

#[async_trait]
impl JobHooks for Acceptance {
    async fn prepared(&self) -> Result<(), job::AcceptError> {
        self.accept().await.map_err(|e| job::AcceptError(e.to_string()))
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
struct Reservation {
    fleet: Arc<fleet::Fleet>,
    key: String,
    open: bool,
}

impl Reservation {
    fn new(fleet: Arc<fleet::Fleet>, key: String) -> Self {
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

async fn run_received(runner: Arc<Runner>, shared: Arc<Shared>, job: JobResponse, reservation: Option<Reservation>) {
    let settings = &runner.settings;
    // Never run a job whose secrets cannot be masked: fail it with only the error in its log.
    let trace = match JobTrace::new(&TraceOptions {
        masked_phrases: job.masked_values(),
        token_prefixes: job.features.token_mask_prefixes.clone(),
        output_limit_kib: settings.output_limit_kib,
    }) {
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
    let api: Arc<dyn JobApi> =
        match JobClient::new(runner.client.clone(), &settings.credentials.url, job.id, &job.token, runner.info.clone())
        {
            Ok(c) => Arc::new(c.with_debug_trace(job.variable("CI_DEBUG_TRACE") == Some("true"))),
            Err(e) => {
                tracing::error!(job = job.id, "cannot talk to GitLab about job: {e}");
                return;
            }
        };
    let keepalive = CancellationToken::new();
    start_pending_keepalive(api.clone(), shared.settings.pending_keepalive, keepalive.clone());

    // Wait for capacity while the job stays pending at GitLab.
    let permits = tokio::select! {
        g = shared.global.clone().acquire_owned() => g.ok().map(|g| (g, runner.limit.clone())),
        _ = shared.shutdown.forceful.cancelled() => None,
    };
    let Some((global, limit)) = permits else {
        keepalive.cancel();
        return;
    };
    let Ok(limit) = limit.acquire_owned().await else {
        keepalive.cancel();
        return;
    };
    let running = shared.stats.running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
    shared.stats.max_running.fetch_max(running, std::sync::atomic::Ordering::SeqCst);

    let mut upload = shared.settings.upload.clone();
    upload.final_update_retry_limit = settings.final_update_retry_limit;
    let control = JobControl::default();
    let forceful = shared.shutdown.forceful.clone();
    let interrupt = {
        let control = control.clone();
        tokio::spawn(async move {
            forceful.cancelled().await;
            control.abort_with(FailureReason::RunnerInterrupted);
        })
    };
    let hooks = Acceptance {
        api: api.clone(),
        retry: runner.client.retry_policy().clone(),
        trace: trace.clone(),
        upload,
        control: control.clone(),
        keepalive: keepalive.clone(),
        uploader: Mutex::new(None),
        accepted: false.into(),
    };
    let slot = runner.slots.take(job.job_info.project_id);
    let mut env = settings.env.clone();
    env.settings.concurrent_id = slot.concurrent_id;
    env.settings.concurrent_project_id = slot.concurrent_project_id;
    if let Some(reservation) = &reservation {
        reservation.fleet.track(&reservation.key, control.clone());
        env.instance = Some(InstanceLease { source: reservation.fleet.clone(), key: reservation.key.clone() });
    }

    let started = std::time::Instant::now();
    let (outcome, cleanup) = run_job_until_cleanup(&job, &env, Arc::new(trace.clone()), &control, &hooks).await;
    let wire_failure = outcome.failure.map(|r| wire_reason(Some(r), &job.features.failure_reasons));
    shared.stats.record(wire_failure.as_deref(), started.elapsed());
    drop(slot);
    interrupt.abort();

    // A job that failed before acceptance (preparation failed) is accepted now, so its trace
    // and failure reach GitLab.
    if let Err(e) = hooks.accept().await {
        tracing::warn!(job = job.id, "job dropped: {e}");
    } else {
        let update = JobUpdate {
            state: if outcome.succeeded() { JobState::Success } else { JobState::Failed },
            failure_reason: wire_failure,
            exit_code: outcome.exit_code.filter(|c| *c != 0),
            checksum: None,
            bytesize: None,
        };
        let uploader = hooks.uploader.lock().ok().and_then(|mut u| u.take());
        if let Some(uploader) = uploader {
            match uploader.finish(update).await {
                Ok(()) => tracing::info!(job = job.id, state = ?outcome.failure, "job finished"),
                Err(e) => tracing::warn!(job = job.id, "final job update failed: {e:?}"),
            }
        }
    }
    keepalive.cancel();
    // GitLab has the final state: only now clean up the executor (a plugin whose `cleanup`
    // hangs holds this slot until its call_timeout, never the job's state), then free the
    // instance it ran on.
    cleanup.run().await;
    if let Some(reservation) = reservation {
        reservation.finish(outcome.failure == Some(FailureReason::RunnerSystemFailure)).await;
    }
    shared.stats.running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    shared.stats.finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    drop((global, limit));
}

/// A job whose payload does not decode: accept it, write why, fail it with
/// `runner_system_failure` — never leave it running until GitLab's timeout.
async fn fail_bad_payload(runner: Arc<Runner>, shared: Arc<Shared>, bad: BadJob) {
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
    }) else {
        return;
    };
    let hooks = Acceptance {
        api,
        retry: runner.client.retry_policy().clone(),
        trace: trace.clone(),
        upload: shared.settings.upload.clone(),
        control: JobControl::default(),
        keepalive: CancellationToken::new(),
        uploader: Mutex::new(None),
        accepted: false.into(),
    };
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

/// The identity printed in job headers.
pub fn identity(name: &str, short_token: &str, system_id: &str) -> RunnerIdentity {
    RunnerIdentity {
        version: crate::buildinfo::VERSION.into(),
        revision: crate::buildinfo::REVISION.into(),
        name: name.into(),
        short_token: short_token.into(),
        system_id: system_id.into(),
    }
}
